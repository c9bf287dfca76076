"""The benchmark data ships with the package: manifests checked at load, AGENTRL_DATA overrides,
and a non-editable install run from another directory finds it (through `agentrl eval`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import agentrl
from agentrl.errors import ConfigError, EnvError
from agentrl.paths import BENCHMARKS, benchmark_dir, benchmark_file, read_manifest, verify_benchmarks

ROOT = Path(__file__).resolve().parent.parent


def test_every_shipped_set_matches_its_manifest_and_says_where_it_is_from(monkeypatch) -> None:
    monkeypatch.delenv("AGENTRL_DATA", raising=False)
    assert verify_benchmarks() == {"math": 3, "search_qa": 7, "webshop": 3}
    for name, package in BENCHMARKS.items():
        folder = benchmark_dir(name)
        assert folder == ROOT / "envs" / package.split(".")[-1] / "data" / name  # editable: the source tree
        listed = set(read_manifest(folder))
        assert listed == {p.name for p in folder.iterdir()} - {"SHA256SUMS", "README.md"}
        readme = (folder / "README.md").read_text()
        assert "License" in readme and all(f in readme for f in listed)  # provenance of every file


def test_a_changed_or_unlisted_file_is_an_error_naming_it(tmp_path, monkeypatch) -> None:
    shutil.copytree(benchmark_dir("math"), tmp_path / "math")
    monkeypatch.setenv("AGENTRL_DATA", str(tmp_path))
    assert benchmark_file("math", "aime2024.jsonl") == tmp_path / "math" / "aime2024.jsonl"
    with open(tmp_path / "math" / "aime2024.jsonl", "a") as handle:
        handle.write('{"id": 99, "source": "x", "problem": "1+1", "answer": "2"}\n')
    with pytest.raises(
        EnvError, match=r"math/aime2024.jsonl does not match its manifest: sha256 [0-9a-f]{64}"
    ):
        benchmark_file("math", "aime2024.jsonl")
    (tmp_path / "math" / "extra.jsonl").write_text("{}\n")
    with pytest.raises(EnvError, match=r"extra.jsonl is not listed in .*SHA256SUMS"):
        benchmark_file("math", "extra.jsonl")
    (tmp_path / "math" / "SHA256SUMS").write_text("abc  aime2024.jsonl\n")
    with pytest.raises(EnvError, match=r"SHA256SUMS:1: expected '<sha256>  <file>'"):
        benchmark_file("math", "aime2024.jsonl")


def test_agentrl_data_overrides_the_shipped_copy(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("AGENTRL_DATA", str(tmp_path))
    with pytest.raises(ConfigError, match=r"'AGENTRL_DATA': .* has no math/ folder"):
        benchmark_dir("math")
    (tmp_path / "math").mkdir()
    rows = [{"id": i, "source": "mine", "problem": f"What is {i}+1?", "answer": str(i + 1)} for i in range(2)]
    (tmp_path / "math" / "aime2024.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level("WARNING"):
        env = agentrl.make("agentrl/CodeAIME24-v0")
        tasks = env.unwrapped.tasks("test")  # no manifest there: used as is, and said so
    assert [t.question for t in tasks] == ["What is 0+1?", "What is 1+1?"]
    assert (
        f"reading benchmark data from {tmp_path / 'math'} (not checked: no SHA256SUMS there)" in caplog.text
    )
    env.close()


def _tracked_tree(dest: Path) -> Path:
    """The files a clone would hold (tracked + untracked-not-ignored), copied to ``dest``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.mark.slow
def test_a_non_editable_install_evaluates_from_any_directory(tmp_path, sandbox_backend) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.fail("this test copies the checkout's files with git; run it from a git checkout")
    source = _tracked_tree(tmp_path / "clone")
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target), str(source)],
        check=True, capture_output=True, cwd=tmp_path,
    )  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "AGENTRL_DATA"} | {"PYTHONPATH": str(target)}
    where = "import agentrl.paths as p, sys; print(p.benchmark_dir('math')); print(p.verify_benchmarks())"
    out = subprocess.run(
        [sys.executable, "-c", where], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        str(target / "agentrl" / "envs" / "code" / "data" / "math"),
        "{'math': 3, 'search_qa': 7, 'webshop': 3}",
    ]
    cli = "import sys; from agentrl.cli import main; sys.argv[0] = 'agentrl'; main()"
    math = f"math:sandbox_backend={sandbox_backend}"  # 3 parts x 2 tasks
    for suite, tasks in (("search-qa-real", 2), ("webshop", 2), (math, 6)):
        argv = ["eval", "--suite", suite, "--agent", "oracle", "--limit", "2", "--json", "--out", str(tmp_path / suite[:4])]  # fmt: skip
        out = subprocess.run(
            [sys.executable, "-c", cli, *argv], cwd=elsewhere, env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, f"{suite}: {out.stdout[-2000:]}\n{out.stderr[-2000:]}"
        overall = json.loads(out.stdout)["overall"]
        assert (overall["tasks"], overall["success_rate"]) == (tasks, 1.0), f"{suite}: {overall}"
