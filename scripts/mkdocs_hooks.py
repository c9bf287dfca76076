"""MkDocs hook (mkdocs.yml ``hooks:``): the package tree as it is installed, for mkdocstrings.

``agentrl.envs``, ``agentrl.tools`` and ``agentrl.sandboxes`` live in the top-level folders
``envs/``, ``tools/`` and ``sandboxes/`` (setup.py's ``package_dir``), which static analysis does not
read. This builds ``.cache/api-src/agentrl/`` from symlinks (``agentrl/*`` plus the three folders)
when mkdocs loads its config, before mkdocstrings reads ``.cache/api-src``.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TREE = REPO / ".cache" / "api-src" / "agentrl"
MAPPED = ("envs", "tools", "sandboxes")


def build_tree() -> Path:
    TREE.mkdir(parents=True, exist_ok=True)
    wanted = {p.name: p for p in (REPO / "agentrl").iterdir() if p.name != "__pycache__"}
    wanted.update({name: REPO / name for name in MAPPED})
    for link in TREE.iterdir():
        if link.name not in wanted or not link.is_symlink() or link.resolve() != wanted[link.name].resolve():
            link.unlink()
    for name, target in wanted.items():
        if not (TREE / name).is_symlink():
            (TREE / name).symlink_to(target)
    return TREE.parent


build_tree()  # at import: mkdocs loads hooks with its config, before the plugins start
