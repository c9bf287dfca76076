"""Learner precision on this machine: ``train.bf16_autocast: auto`` measured, not guessed.

bfloat16 autocast made the learner 1.75x faster on one 2-core CPU with bf16 units (2026-11-22) and a
GPU, ~2x *slower* on an Intel Xeon that lists AVX512-BF16 but no AMX (probe: 0.51x at [4, 128],
2026-11-26), and ~10-100x slower on an AVX2-only CPU, where torch falls back to a generic GEMM. A
CPU-flag table cannot tell these apart, so :func:`probe_bf16` times
one real decoder block of the loaded model forward + backward in float32 and under bf16 autocast
and :func:`decide` picks the faster one:

1. a tiny pass (``[1, 32]`` tokens, one thread; float32 and bf16 alternate, best of two each):
   bf16 more than ``SLOW_RATIO`` x slower means no fast bf16 kernels; stop there (~1 s on an
   AVX2-only CPU, where bf16 measures 8-10x slower);
2. otherwise ``[rows, 128]`` tokens the same way: bf16 wins only when it is at least
   ``MIN_GAIN`` x faster.

``true``/``false`` in the config skip the probe; a resumed run keeps the decision it made at its
start (:func:`resumed_bf16`). With several ranks, every rank uses rank 0's
decision. The decision (both timings, the reason) is printed by the trainer and saved in
``summary.json`` and ``resolved_config.yaml``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

#: Stage 1: bf16 this many times slower than float32 on a tiny pass = no fast bf16 kernels here.
SLOW_RATIO = 2.5
#: Stage 2: bf16 must be at least this much faster to be worth its rounding.
MIN_GAIN = 1.1
#: Tokens of the stage-1 and stage-2 passes.
TINY_TOKENS, PROBE_TOKENS = 32, 128


@dataclass(frozen=True)
class Timing:
    """Best seconds of one decoder block forward + backward at ``rows x tokens``."""

    rows: int
    tokens: int
    fp32_s: float
    bf16_s: float | None  # None: bf16 autocast raised on this device

    @property
    def ratio(self) -> float:
        """bf16 time / float32 time (> 1: bf16 slower)."""
        return float("inf") if self.bf16_s is None else self.bf16_s / max(self.fp32_s, 1e-9)


@dataclass(frozen=True)
class Decision:
    """What ``train.bf16_autocast`` resolved to, and why."""

    bf16: bool
    source: str  # "config" (forced true/false) | "probe" | "resumed" (the run's own, from its start)
    reason: str
    timings: tuple[Timing, ...] = ()
    cpu: str = ""
    device: str = ""  # where the timed block ran ("" = the CPU above)

    @property
    def bf16_kernels(self) -> bool:
        """Whether the probe found bf16 kernels worth timing (stage 1 passed) or bf16 was forced."""
        return self.bf16 or len(self.timings) > 1

    def line(self) -> str:
        """One line for the console and the log."""
        shown = "  ".join(
            f"[{t.rows},{t.tokens}] fp32 {t.fp32_s * 1e3:.1f} ms, bf16 "
            + ("failed" if t.bf16_s is None else f"{t.bf16_s * 1e3:.1f} ms")
            for t in self.timings
        )
        where = f" on {self.device or self.cpu}" if (self.device or self.cpu) else ""
        return (
            f"precision: train.bf16_autocast={str(self.bf16).lower()} ({self.source}{where}: {self.reason})"
            + (f"; one decoder block fwd+bwd {shown}" if shown else "")
        )

    def as_dict(self) -> dict[str, Any]:
        return {"bf16_autocast": self.bf16, "source": self.source, "reason": self.reason, "cpu": self.cpu,
                "device": self.device or self.cpu, "timings": [dataclasses.asdict(t) for t in self.timings]}  # fmt: skip


def decide(timings: list[Timing], *, on_gpu: bool = False) -> tuple[bool, str]:
    """The rule, on measured timings (stage 1 first, stage 2 if it ran)."""
    where = "this GPU" if on_gpu else "this CPU"
    if not timings:
        raise ValueError("decide() needs at least the stage-1 timing")
    tiny = timings[0]
    if tiny.bf16_s is None:
        return False, "bf16 autocast is not supported on this device"
    if tiny.ratio > SLOW_RATIO:
        return False, f"bf16 {tiny.ratio:.1f}x slower than float32: no fast bf16 kernels on {where}"
    if len(timings) < 2:
        raise ValueError("stage 1 did not rule bf16 out: decide() needs the stage-2 timing too")
    full = timings[1]
    if full.bf16_s is not None and full.ratio * MIN_GAIN <= 1.0:
        return True, f"bf16 {1 / full.ratio:.2f}x faster than float32"
    return False, f"bf16 not faster than float32 ({1 / full.ratio:.2f}x; needs {MIN_GAIN:.2f}x)"


def cpu_name() -> str:
    """CPU model and the vector ISA torch dispatches to (e.g. ``AMD EPYC 7B13, AVX2``)."""
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "")
    except OSError:
        pass
    isa = torch.backends.cpu.get_cpu_capability()
    return ", ".join(x for x in (model, isa) if x)


def device_name(model: nn.Module) -> str:
    """The accelerator the model's weights live on (``NVIDIA H200``), or "" on the CPU."""
    param = next(model.parameters(), None) if model is not None else None
    if param is not None and param.device.type == "cuda":
        return torch.cuda.get_device_name(param.device)
    return ""


def _block_pass(model: nn.Module, rows: int, tokens: int, bf16: bool) -> float | None:
    """Seconds of block 0 forward + backward on random ``[rows, tokens, H]`` hidden states."""
    decoder = model.get_decoder()
    block, rotary = decoder.layers[0], decoder.rotary_emb
    param = next(block.parameters())
    hidden = torch.randn(rows, tokens, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    hidden = hidden.to(param.device, param.dtype).requires_grad_()  # [rows, tokens, H]
    positions = torch.arange(tokens, device=param.device)[None].expand(rows, -1)  # [rows, tokens]
    grads = [p.requires_grad for p in block.parameters()]
    block.requires_grad_(True)
    try:
        if param.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(param.device.type, dtype=torch.bfloat16, enabled=bf16):
            out = block(hidden, position_embeddings=rotary(hidden, positions), position_ids=positions)
            out = out[0] if isinstance(out, tuple) else out  # [rows, tokens, H]
        out.float().square().mean().backward()
        if param.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0
    except RuntimeError:
        if bf16:
            return None  # no bf16 autocast for these ops on this device
        raise
    finally:
        for p, flag in zip(block.parameters(), grads, strict=True):
            p.grad = None
            p.requires_grad_(flag)


def _paired(model: nn.Module, rows: int, tokens: int) -> Timing:
    """float32 and bf16 passes alternate (a busy machine slows both alike), two each; the best
    of each counts (the first pass also sets kernels up)."""
    fp32: list[float] = []
    bf16: list[float] = []
    for _ in range(2):
        fp32_s = _block_pass(model, rows, tokens, False)
        assert fp32_s is not None  # float32 errors raise
        fp32.append(fp32_s)
        bf16_s = _block_pass(model, rows, tokens, True)
        if bf16_s is None:
            return Timing(rows, tokens, min(fp32), None)
        bf16.append(bf16_s)
    return Timing(rows, tokens, min(fp32), min(bf16))


def probe_bf16(model: nn.Module, rows: int = 2) -> Decision:
    """Time one decoder block of ``model`` in float32 and bf16 autocast; see the module docstring."""
    threads = torch.get_num_threads()
    try:
        # one thread: on shared, oversubscribed cores multi-thread barriers swamp a pass this small,
        # while the float32/bf16 ratio (what decides) is a property of the kernels
        torch.set_num_threads(1)
        with torch.random.fork_rng(devices=[]):  # the probe must not move the run's random stream
            timings = [_paired(model, 1, TINY_TOKENS)]
            if timings[0].bf16_s is not None and timings[0].ratio <= SLOW_RATIO:
                timings.append(_paired(model, rows, PROBE_TOKENS))
    except Exception as exc:  # noqa: BLE001 - an unusual block signature must not stop the run
        reason = f"the probe could not run one block of this model ({type(exc).__name__}: {exc}); float32"
        return Decision(False, "probe", reason, (), cpu_name(), device_name(model))
    finally:
        torch.set_num_threads(threads)
    bf16, reason = decide(timings, on_gpu=bool(device_name(model)))
    return Decision(bf16, "probe", reason, tuple(timings), cpu_name(), device_name(model))


def resolve_bf16(setting: bool | str, model: nn.Module, rows: int = 2, resumed_from: Path | None = None) -> Decision:
    """``train.bf16_autocast`` -> a :class:`Decision` (``auto`` probes, true/false are forced; a run
    resumed from ``resumed_from`` keeps the decision saved there, :func:`resumed_bf16`)."""
    if isinstance(setting, bool):
        return Decision(
            setting, "config", f"train.bf16_autocast={str(setting).lower()} forces it", cpu=cpu_name(),
            device=device_name(model),
        )
    if setting != "auto":
        raise ValueError(f"train.bf16_autocast must be true, false or auto, got {setting!r}")
    kept = resumed_bf16(setting, resumed_from, model) if resumed_from is not None else None
    return _same_on_every_rank(kept or probe_bf16(model, rows))


def resumed_bf16(setting: bool | str, run_dir: Path, model: nn.Module) -> Decision | None:
    """The precision a resumed run chose at its start, when its setting is ``auto``: the bool in
    ``run_dir/resolved_config.yaml``. A fresh probe could decide otherwise (on a busy machine the
    ratio moves around ``MIN_GAIN``), and a run that switched precision halfway would not be the run
    it would have been unstopped. None when the setting is forced or nothing was saved."""
    path = Path(run_dir) / "resolved_config.yaml"
    if setting != "auto" or not path.exists():
        return None
    saved = (yaml.safe_load(path.read_text()) or {}).get("train", {}).get("bf16_autocast")
    if not isinstance(saved, bool):
        return None
    reason = f"this run's own decision at its start, read from {path}: a resumed run keeps its precision"
    return Decision(saved, "resumed", reason, cpu=cpu_name(), device=device_name(model))


def _same_on_every_rank(decision: Decision) -> Decision:
    """Rank 0's measured decision on every rank (each rank's own timing could differ)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return decision
    shared = [decision]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


__all__ = ["Decision", "Timing", "cpu_name", "decide", "probe_bf16", "resolve_bf16", "resumed_bf16"]
