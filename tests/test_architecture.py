"""Architecture rules as tests (STYLE.md): layering that keeps envs light and Docker contained."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _py_files(*folders: str) -> list[Path]:
    return [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))]


@pytest.mark.parametrize("path", _py_files("envs", "tools"), ids=lambda p: str(p.relative_to(ROOT)))
def test_envs_and_tools_do_not_import_torch_or_the_trainer(path):
    bad = {m for m in _imports(path) if m.split(".")[0] == "torch" or m.startswith("agentrl.train")}
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


@pytest.mark.parametrize("path", _py_files("agentrl", "envs", "tools", "benchmarks"), ids=lambda p: str(p.relative_to(ROOT)))
def test_docker_sdk_only_in_sandboxes(path):
    assert not {m for m in _imports(path) if m.split(".")[0] == "docker"}, f"{path.relative_to(ROOT)} imports docker"


def test_importing_agentrl_and_all_envs_stays_light():
    code = "import sys, agentrl; agentrl.registered_ids(); print(sorted(m for m in ('torch','transformers','docker') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_test_module_basenames_are_unique():
    # pytest's default import mode keys modules by basename outside packages: two test_env.py collide
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py") if not (p.parent / "__init__.py").exists()]
    assert sorted(names) == sorted(set(names)), sorted({n for n in names if names.count(n) > 1})
