"""Two-process (gloo, CPU) data-parallel updates equal one process on the combined batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("dp_worker.py")
REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        DS_ACCELERATOR="cpu",
        # DeepSpeed builds its shm_comm op on first init (~70 s once); keep the build cached
        TORCH_EXTENSIONS_DIR=env.get(
            "TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions")
        ),
        PYTHONPATH=f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}",
    )
    return env


def _run(engine: str, out: Path, procs: int, objective: str = "ppo") -> list[torch.Tensor]:
    out.mkdir(parents=True, exist_ok=True)
    if procs == 1:
        cmd = [sys.executable, str(WORKER), engine, str(out), objective]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs),
               "--master_port", str(29500 + os.getpid() % 1000), str(WORKER), engine, str(out), objective]  # fmt: skip
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    files = sorted(out.glob("rank*.pt"))
    # judged by the per-rank result files: gloo teardown may abort after the work is done
    assert len(files) == procs, (
        f"{engine}: {len(files)} result files\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    return [torch.load(f)["params"] for f in files]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return _run("single", tmp_path_factory.mktemp("single"), 1)[0]


def _check(single: torch.Tensor, ranks: list[torch.Tensor]) -> None:
    initial = _run_initial()
    assert (single - initial).abs().mean() > 1e-4, "the update did nothing"
    for params in ranks:
        torch.testing.assert_close(params, ranks[0], rtol=0, atol=0)  # ranks agree exactly
        # equal up to fp32 summation order, amplified at most lr/eps by Adam's first steps
        torch.testing.assert_close(params, single, rtol=0, atol=5e-6)


def _run_initial() -> torch.Tensor:
    sys.path.insert(0, str(WORKER.parent))
    from train_helpers import tiny_lm

    return torch.cat([p.detach().flatten() for p in tiny_lm(seed=11).parameters()])


@pytest.mark.slow
def test_ddp_two_process_equals_single(single, tmp_path):
    _check(single, _run("ddp", tmp_path, 2))


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_zero_two_process_equals_single(single, tmp_path, stage):
    _check(single, _run(f"zero{stage}", tmp_path, 2))


@pytest.mark.slow
def test_ddp_stppo_correction_with_a_rank_that_clips_nothing_equals_single(tmp_path):
    """The clipping-bias norm is all-reduced over ranks; rank 0 (advantage 0 everywhere) skips its
    backward and still takes part in every all-reduce: same update as one process, no hang."""
    one = _run("single", tmp_path / "one", 1, "stppo")[0]
    _check(one, _run("ddp", tmp_path / "two", 2, "stppo"))


@pytest.mark.slow
def test_deepspeed_zero3_stppo_correction_equals_single(tmp_path):
    """ZeRO-3 shards the parameters, so no rank skips the correction's backward there; the update
    still equals one process's."""
    one = _run("single", tmp_path / "one", 1, "stppo")[0]
    _check(one, _run("zero3", tmp_path / "two", 2, "stppo"))
