"""bm25s runs a JAX op when it is imported (where JAX is installed): on a CUDA machine that op made
JAX preallocate 75% of the GPU in every process importing bm25s (measured on an H200: 107,918 MiB
for a bare ``import bm25s``; 0 MiB through ``import_bm25s``). JAX is not installed here, so a
stand-in ``jax`` package records the platform its op would start on, in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_JAX = """
import json, os
def top_k(x, k):
    with open(os.environ["JAX_RECORD"], "a") as f:
        f.write(json.dumps(os.environ.get("JAX_PLATFORMS")) + "\\n")
    return x[:k], list(range(k))
"""


def _run(tmp_path: Path, code: str, **env: str) -> tuple[list, str]:
    fake = tmp_path / "fake"
    (fake / "jax").mkdir(parents=True, exist_ok=True)
    (fake / "jax" / "__init__.py").write_text("from . import lax\n")
    (fake / "jax" / "lax.py").write_text(FAKE_JAX)
    record = tmp_path / "record.jsonl"
    record.unlink(missing_ok=True)
    child = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    child.update(env, JAX_RECORD=str(record), PYTHONPATH=os.pathsep.join([str(fake), str(ROOT)]))
    out = subprocess.run([sys.executable, "-c", code], env=child, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return seen, out.stdout.strip()


def test_the_stand_in_sees_what_a_bare_import_would_do(tmp_path: Path) -> None:
    # the premise: bm25s calls jax.lax.top_k at import, with whatever platform the process has
    seen, _ = _run(tmp_path, "import bm25s")
    assert seen == [None]


def test_import_bm25s_starts_jax_on_the_cpu_and_restores_the_environment(tmp_path: Path) -> None:
    code = "import os; from agentrl.tools.search import import_bm25s; import_bm25s(); print(os.environ.get('JAX_PLATFORMS'))"
    seen, printed = _run(tmp_path, code)
    assert seen == ["cpu"]
    assert printed == "None"  # children of this process get the environment it was given


def test_a_platform_the_user_set_is_left_alone(tmp_path: Path) -> None:
    code = "from agentrl.tools.search import import_bm25s; import_bm25s()"
    seen, _ = _run(tmp_path, code, JAX_PLATFORMS="cuda")
    assert seen == ["cuda"]


@pytest.mark.parametrize("code", [
    "from agentrl.envs.web.server import SearchIndex; from agentrl.envs.web.catalog import Catalog; "
    "SearchIndex(Catalog(seed=0, n_products=50, data_dir='builtin').products)",
    "from agentrl.tools.search import BM25Retriever, Doc; BM25Retriever([Doc('d1', 'Paris', 'capital of France')])",
])  # fmt: skip
def test_the_shop_and_the_search_tool_go_through_it(tmp_path: Path, code: str) -> None:
    seen, _ = _run(tmp_path, code)
    assert seen == ["cpu"]


def test_threads_importing_at_once_both_get_it_and_the_environment_is_restored(tmp_path: Path) -> None:
    code = (
        "import os, threading; from agentrl.tools.search import import_bm25s\n"
        "got = []\n"
        "ts = [threading.Thread(target=lambda: got.append(import_bm25s().BM25)) for _ in range(4)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "print(len(got), os.environ.get('JAX_PLATFORMS'))"
    )
    seen, printed = _run(tmp_path, code)
    assert seen == ["cpu"]  # bm25s ran its import-time op once, on the CPU
    assert printed == "4 None"
