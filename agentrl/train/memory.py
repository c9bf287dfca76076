"""Peak memory of this process, phase by phase: ``perf/rss_peak_<phase>_gib`` in ``metrics.jsonl``
and the run's maxima in ``summary.json`` (``peak_rss_gib``).

On Linux the kernel keeps the process's peak resident set (``VmHWM`` in ``/proc/self/status``) and
resets it to the current RSS when ``5`` is written to ``/proc/self/clear_refs``; each phase resets
it at its start and reads it at its end. The peak of a phase includes what earlier phases left
resident (the heap keeps freed memory), which is what decides whether the phase fits the machine.
Elsewhere (no ``/proc``) nothing is logged. Child processes (sandboxes, Ray actors) are not counted.
The kernel hands the same high-water mark to the parent at exit, so ``/usr/bin/time -v``'s maximum
RSS shows only what followed the last reset (2.45 GB for a quickstart whose learner peaked at 4.59 GiB):
read these per-phase figures instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from pathlib import Path

STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


@functools.cache
def _libc_malloc_trim():  # glibc's malloc_trim, or None (musl, macOS)
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_heap() -> bool:
    """Give the heap's free memory back to the OS (glibc ``malloc_trim(0)``); False where there is no
    glibc. Freed tensors stay in the allocator's arenas otherwise, and a phase's K/V or activations of
    other sizes than the next phase's pile up: without it a tree-rollout run's resident memory grew by
    ~2 GiB a step (5.3 -> 14.3 GiB over 5 steps, AMD EPYC, 2026-11-27)."""
    trim = _libc_malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


KERNEL_CACHES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's, PyTorch's ideep's


def cap_kernel_caches(entries: int) -> str:
    """Bound oneDNN's primitive cache and PyTorch's ideep cache to ``entries`` each (0: the libraries'
    default, 1024) through their environment variables, which both read on first use: call it before
    the first CPU matmul. A bfloat16 matmul caches a packed copy of its weight per input shape, so a
    run's distinct sequence lengths pile up ~2 MB per linear layer each (200 lengths through one
    576 x 1536 layer, forward and backward: +380 MB with the defaults, +28 MB with 16 entries each).
    Kernels that fall out of a capped cache are re-created when used again (a decode-like step 4%
    slower at 64, quiet AVX512-BF16 CPU). A variable already set in the environment wins. Returns the
    line that says what holds."""
    preset = {name: os.environ[name] for name in KERNEL_CACHES if name in os.environ}
    if entries == 0:
        given = "".join(f", {k}={v} from the environment" for k, v in preset.items())
        return f"kernel caches: the libraries' defaults (train.kernel_cache=0){given}"
    for name in KERNEL_CACHES:
        os.environ.setdefault(name, str(entries))
    if preset:
        given = ", ".join(f"{k}={v}" for k, v in preset.items())
        return f"kernel caches: {given} from the environment (above train.kernel_cache={entries})"
    return f"kernel caches: {entries} entries each in oneDNN's and PyTorch's (train.kernel_cache)"


def peak_rss_gib() -> float | None:
    """The process's peak RSS since the last reset (GiB), or None where the kernel does not say."""
    try:
        with STATUS.open() as fh:
            kib = next((int(x.split()[1]) for x in fh if x.startswith("VmHWM:")), None)
    except OSError:
        return None
    return None if kib is None else kib / 2**20


def reset_peak() -> bool:
    """Peak RSS back to the current RSS; False where that is not possible."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


class PhasePeaks:
    """Peak RSS per phase: :meth:`start` before a phase, :meth:`end` after it (a metrics dict)."""

    def __init__(self) -> None:
        self.enabled = peak_rss_gib() is not None and reset_peak()
        self.peaks: dict[str, float] = {}  # the run's maximum per phase

    def start(self) -> None:
        """Start a phase: free heap back to the OS (:func:`release_heap`), then reset the peak."""
        release_heap()
        if self.enabled:
            reset_peak()

    def end(self, phase: str) -> dict[str, float]:
        """``{perf/rss_peak_<phase>_gib: peak since start()}`` (empty where not measurable)."""
        if not self.enabled:
            return {}
        value = peak_rss_gib()
        release_heap()  # the next phase starts from what this one still holds, not from its peak
        reset_peak()
        if value is None:
            return {}
        self.peaks[phase] = max(self.peaks.get(phase, 0.0), value)
        return {f"perf/rss_peak_{phase}_gib": value}

    def line(self) -> str:
        """One line for the end of a run, or "" when nothing was measured."""
        if not self.peaks:
            return ""
        shown = ", ".join(f"{phase} {gib:.2f}" for phase, gib in self.peaks.items())
        return f"peak memory (this process's RSS, GiB): {shown}"


def gpu_memory() -> dict[str, float]:
    """Peak GPU memory of this process since the last call (GiB, allocated by tensors and reserved by
    torch's caching allocator), then the peak is reset; nothing on a machine without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return {}
    values = {"perf/gpu_peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
              "perf/gpu_peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30}  # fmt: skip
    torch.cuda.reset_peak_memory_stats()
    return values
