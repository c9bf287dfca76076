"""Where agentrl finds its data: the benchmark files it ships (checked at load) and caches.

The real benchmark files are package data of the env family that reads them (DESIGN.md: each
family "ships or generates its data"): ``envs/code/data/math/``, ``envs/search/data/search_qa/``,
``envs/web/data/webshop/``. Each set folder has a ``README.md`` (provenance, licences) and a
``SHA256SUMS`` manifest; :func:`benchmark_file` checks a file against it on first use and stops
with an error naming the file when it does not match. ``AGENTRL_DATA=<folder>`` replaces every
set with ``<folder>/<set>/`` (the old ``shared/data`` layout), checked against that folder's own
``SHA256SUMS`` when it has one.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import logging
import os
from pathlib import Path

from agentrl.errors import ConfigError, EnvError

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
# set name -> the env family package that ships it (under <package>/data/<set>/)
BENCHMARKS: dict[str, str] = {
    "math": "agentrl.envs.code",
    "search_qa": "agentrl.envs.search",
    "webshop": "agentrl.envs.web",
}
MANIFEST = "SHA256SUMS"


def benchmark_dir(name: str) -> Path:
    """The folder of one benchmark set: ``$AGENTRL_DATA/<name>`` when set, else the shipped copy."""
    if name not in BENCHMARKS:
        raise ConfigError("benchmark", f"unknown benchmark set {name!r}", f"one of {', '.join(BENCHMARKS)}")
    override = os.environ.get("AGENTRL_DATA")
    if override:
        folder = Path(override) / name
        if not folder.is_dir():
            raise ConfigError(
                "AGENTRL_DATA",
                f"{override} has no {name}/ folder",
                f"unset AGENTRL_DATA to use the copy shipped with agentrl, or add {folder}",
            )
        _note_override(str(folder))
        return folder
    folder = Path(str(importlib.resources.files(BENCHMARKS[name]) / "data" / name))
    if not (folder / MANIFEST).is_file():
        raise EnvError(
            f"the {name} data shipped with agentrl is missing ({folder / MANIFEST} not found): "
            "reinstall agentrl (`pip install .` from a full clone) or set AGENTRL_DATA"
        )
    return folder


def benchmark_file(name: str, filename: str) -> Path:
    """One file of a benchmark set, checked against the set's manifest (once per process)."""
    path = benchmark_dir(name) / filename
    if not path.is_file():
        raise EnvError(f"benchmark file {path} is missing; restore it or point AGENTRL_DATA at a full copy")
    check_file(path)
    return path


def check_file(path: Path) -> None:
    """Check ``path`` against the ``SHA256SUMS`` beside it (a folder without one is not checked)."""
    stat = path.stat()
    _check(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _check(path_text: str, size: int, mtime_ns: int) -> None:  # size/mtime: a changed file is re-checked
    path = Path(path_text)
    expected = read_manifest(path.parent).get(path.name) if (path.parent / MANIFEST).is_file() else None
    if expected is None:
        if (path.parent / MANIFEST).is_file():
            raise EnvError(f"{path} is not listed in {path.parent / MANIFEST}; add its `sha256sum` line")
        return
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    if actual != expected:
        raise EnvError(
            f"benchmark file {path} does not match its manifest: sha256 {actual}, {MANIFEST} says "
            f"{expected}. The file was changed or truncated; restore it (git checkout, or reinstall "
            "agentrl) or point AGENTRL_DATA at an intact copy"
        )


def read_manifest(folder: Path) -> dict[str, str]:
    """``SHA256SUMS`` of ``folder`` as {file name: sha256}; bad lines fail naming the line."""
    manifest: dict[str, str] = {}
    for line_no, line in enumerate((folder / MANIFEST).read_text().splitlines(), 1):
        if not line.strip():
            continue
        digest, _, filename = line.partition("  ")
        if len(digest) != 64 or not filename:
            raise EnvError(f"{folder / MANIFEST}:{line_no}: expected '<sha256>  <file>', got {line!r}")
        manifest[filename.strip()] = digest
    return manifest


def verify_benchmarks() -> dict[str, int]:
    """Check every file of every set (the CLI and CI use this); returns {set: files checked}."""
    counts = {}
    for name in BENCHMARKS:
        folder = benchmark_dir(name)
        listed = read_manifest(folder) if (folder / MANIFEST).is_file() else {}
        for filename in listed:
            benchmark_file(name, filename)
        counts[name] = len(listed)
    return counts


@functools.cache
def _note_override(folder: str) -> None:
    checked = (
        "checked against its SHA256SUMS"
        if (Path(folder) / MANIFEST).is_file()
        else "not checked: no SHA256SUMS there"
    )
    log.warning("AGENTRL_DATA: reading benchmark data from %s (%s)", folder, checked)


def cache_dir() -> Path:
    """Per-user cache (generated corpora, converted databases); ``AGENTRL_CACHE`` overrides."""
    path = Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl"))
    path.mkdir(parents=True, exist_ok=True)
    return path
