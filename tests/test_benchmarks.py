"""The benchmark scripts run in quick mode so they cannot rot; the runner survives broken ones.

One test per ``benchmarks/bench_*.py``: run it with ``--quick --json`` in a subprocess and check the
JSON follows the shared format with finite values. No timing assertions: timings are for the
printed tables, never for tests.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))
from run_all import EXPECTED, check_rows  # noqa: E402

NAMES = sorted(set(EXPECTED) | {p.stem.removeprefix("bench_") for p in BENCH_DIR.glob("bench_*.py")})
# Scripts that need a Docker engine for their rows (skipped without one, failures under CI's
# AGENTRL_REQUIRE_DOCKER=1).
NEEDS_DOCKER = {"sandbox", "code_sql"}


def bench_param(name: str):
    marks = [pytest.mark.slow]
    if name in NEEDS_DOCKER:
        marks.append(pytest.mark.docker)
    return pytest.param(name, marks=marks, id=name)


def check_peers(rows: dict[str, dict]) -> None:
    """bench_peers answers every comparison issue 10 asks for, with a value or the reason it has none."""
    for needle in (
        "search env step p50: agentrl",
        "search env step p50: GEM",
        "search env step p50: SkyRL",
        "GEM PythonCodeTool",
        "SkyRL-Gym python tool",
        "agentrl bubblewrap",
        "batch building",
        "GRPO loss",
        "agentrl chunked",
        "needs GPU",
    ):
        assert any(needle in name or needle in r.get("note", "") for name, r in rows.items()), needle
    ours = rows["search env step p50: agentrl Search-v0 (remote)"]
    assert ours["value"] > 0 and "; 0 failed searches" in ours["note"], ours
    for name, row in rows.items():
        if name.startswith("GRPO loss") and row["baseline_value"] is not None:
            # the same tensors through TRL's own loss code and ours: the values must agree
            d_loss = float(row["note"].split("max |dloss| ")[1].split(",")[0])
            d_grad = float(row["note"].split("max |dgrad| ")[1].split(";")[0])
            assert d_loss < 1e-5 and d_grad < 1e-6, row["note"]


EXTRA_CHECKS = {"peers": check_peers}


@pytest.mark.parametrize("name", [bench_param(n) for n in NAMES])
def test_bench_quick_json(name: str, tmp_path: Path) -> None:
    script = BENCH_DIR / f"bench_{name}.py"
    if not script.exists():
        pytest.skip(f"{script.name} has not landed yet")
    out = tmp_path / f"{name}.json"
    proc = subprocess.run(
        [sys.executable, str(script), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=840,  # a hang guard under pytest's 900 s: bench_learner --quick took 13 min beside a study
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, (
        f"{script.name} --quick failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    data = json.loads(out.read_text())
    assert check_rows(data) == [], "the JSON does not follow the shared format (INTERFACES.md)"
    assert data.get("quick") is True, "the JSON says it was a quick run"
    assert data.get("bench"), "the JSON names its bench"
    for row in data["rows"]:
        if row.get("ratio") is not None:
            assert math.isfinite(row["ratio"]), row
            assert row.get("baseline_value") is not None, f"a ratio needs its baseline value: {row}"
    assert proc.stdout.strip(), "the script also prints a human-readable table"
    if name in EXTRA_CHECKS:
        EXTRA_CHECKS[name]({r["name"]: r for r in data["rows"]})


def test_run_all_reports_broken_and_missing_benches(tmp_path: Path) -> None:
    """A crashing script, a script writing bad JSON and a missing one are rows; the runner finishes."""
    good = {
        "bench": "good",
        "machine": "m",
        "quick": True,
        "rows": [
            {
                "name": "thing",
                "value": 2.0,
                "unit": "ms",
                "baseline": "base",
                "baseline_value": 4.0,
                "ratio": 0.5,
                "note": "",
            },
            {
                "name": "gpu thing",
                "value": None,
                "unit": "ms",
                "baseline": None,
                "baseline_value": None,
                "ratio": None,
                "note": "needs GPU",
            },
        ],
    }
    (tmp_path / "bench_good.py").write_text(
        textwrap.dedent(f"""
        import json, sys
        path = sys.argv[sys.argv.index("--json") + 1]
        assert "--quick" in sys.argv
        json.dump({good!r}, open(path, "w"))
        print("| thing | 2.0 |")
    """)
    )
    (tmp_path / "bench_crash.py").write_text("raise RuntimeError('boom in the bench')\n")
    (tmp_path / "bench_badjson.py").write_text(
        textwrap.dedent("""
        import json, sys
        json.dump({"rows": [{"name": "x", "value": "fast"}]}, open(sys.argv[sys.argv.index("--json") + 1], "w"))
    """)
    )
    out = tmp_path / "results" / "merged.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH_DIR / "run_all.py"),
            "--quick",
            "--dir",
            str(tmp_path),
            "--expected",
            "good,crash,gone",
            "--out",
            str(out),
            "--timeout",
            "60",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr  # a bench broke: reported, exit code says so
    merged = json.loads(out.read_text())
    status = {name: b["status"] for name, b in merged["benches"].items()}
    assert status == {"good": "ok", "crash": "failed", "gone": "missing", "badjson": "bad-json"}
    assert "boom in the bench" in merged["benches"]["crash"]["error"]
    assert [r["name"] for r in merged["rows"] if r["bench"] == "good"] == ["thing", "gpu thing"]
    table = proc.stdout
    assert "| good | thing | 2 | ms | base (4) | 0.5 |" in table
    assert "| crash | **failed** |" in table and "| gone | **missing** |" in table
    assert "needs GPU" in table
    assert out.with_suffix(".md").read_text().count("\n|") >= 5


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal where no GPU is")
def test_the_gpu_study_script_refuses_at_once_without_a_gpu() -> None:
    """benchmarks/gpu_study_empg_webshop.sh (the EMPG-on-WebShop study, GPU only) stops before anything runs,
    saying why, and writes no records."""
    dest = BENCH_DIR / "results" / "study_empg_webshop_gpu"
    proc = subprocess.run(["bash", str(BENCH_DIR / "gpu_study_empg_webshop.sh")], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable}, timeout=120)  # fmt: skip
    assert proc.returncode == 1
    assert "no CUDA device here; this study (WebShop, 15 turns, 3 seeds) needs a GPU" in proc.stderr
    assert not dest.exists() and not (REPO / "runs" / "studies" / "empg_vs_grpo_gpu").exists()
