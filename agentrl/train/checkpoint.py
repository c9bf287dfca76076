"""Exact save/resume: model (trainable tensors), optimizer, scheduler, RNG states, data position, step.

Layout under ``out_dir/checkpoints/``::

    step-000010/
        engine.pt | engine/      # TorchEngine state, or DeepSpeed's own checkpoint folder
        trainer-rank0.pt         # step, trainer state (task sampler position, history), RNG states
    latest                       # name of the newest complete checkpoint

A checkpoint is written to a temporary folder and renamed into place, then ``latest`` is updated,
so a run killed mid-save resumes from the previous complete checkpoint. Resuming restores every
RNG the run draws from (Python, NumPy, torch CPU/CUDA), so a resumed run continues with the same
random stream as one that was never interrupted.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int, *, strict: bool = False) -> None:
    """Seed Python, NumPy and torch; with ``strict``, also make torch refuse nondeterministic kernels.

    CPU runs are bit-reproducible without ``strict`` (same machine, same thread count). On GPU,
    some kernels (atomics in scatter/index_add backward, cuBLAS split-K) are not; ``strict`` turns
    on ``torch.use_deterministic_algorithms`` (an op without a deterministic kernel then raises
    instead of silently differing), deterministic cuDNN, and cuBLAS's fixed workspace.
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if strict:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def rng_state() -> dict[str, Any]:
    """Every global RNG state the trainer depends on."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder under ``out_dir``, or None.

    ``latest`` names it; if that folder is gone (a kill between replacing a folder and updating
    the marker), the newest ``step-*`` folder is used: folders get that name only when complete.
    """
    root = checkpoint_root(out_dir)
    marker = root / "latest"
    if marker.exists():
        path = root / marker.read_text().strip()
        if path.is_dir():
            return path
    done = sorted(p for p in root.glob("step-*") if p.is_dir()) if root.is_dir() else []
    return done[-1] if done else None


def save_checkpoint(out_dir: str | Path, step: int, engine: Any, trainer_state: dict[str, Any],
                    *, keep: int = 2) -> Path:  # fmt: skip
    """Write checkpoint ``step`` (all ranks call this; rank 0 publishes it).

    Args:
        out_dir: the run folder.
        step: completed RL steps.
        engine: a TorchEngine or DeepSpeedEngine (``save(dir)``).
        trainer_state: picklable trainer state (task sampler state, counters, history).
        keep: how many checkpoints to keep (older ones are deleted).
    """
    root = checkpoint_root(out_dir)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}"
    if engine.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    engine.barrier()
    engine.save(tmp)
    torch.save(
        {"step": step, "trainer": trainer_state, "rng": rng_state()}, tmp / f"trainer-rank{engine.rank}.pt"
    )
    engine.barrier()
    if engine.rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        (root / "latest.tmp").write_text(final.name)
        (root / "latest.tmp").replace(root / "latest")
        done = sorted(p for p in root.glob("step-*") if p.is_dir())
        for old in done[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    engine.barrier()
    return final


def load_checkpoint(path: str | Path, engine: Any) -> tuple[int, dict[str, Any]]:
    """Restore engine state and RNGs from ``path``; returns ``(step, trainer_state)``."""
    path = Path(path)
    engine.load(path)
    record = torch.load(path / f"trainer-rank{engine.rank}.pt", map_location="cpu", weights_only=False)
    set_rng_state(record["rng"])
    return int(record["step"]), record["trainer"]


__all__ = [
    "latest_checkpoint",
    "load_checkpoint",
    "rng_state",
    "save_checkpoint",
    "seed_everything",
    "set_rng_state",
]
