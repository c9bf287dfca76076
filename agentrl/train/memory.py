"""Peak memory of this process, phase by phase: ``perf/rss_peak_<phase>_gib`` in ``metrics.jsonl``
and the run's maxima in ``summary.json`` (``peak_rss_gib``).

On Linux the kernel keeps the process's peak resident set (``VmHWM`` in ``/proc/self/status``) and
resets it to the current RSS when ``5`` is written to ``/proc/self/clear_refs``; each phase resets
it at its start and reads it at its end. The peak of a phase includes what earlier phases left
resident (the heap keeps freed memory), which is what decides whether the phase fits the machine.
Elsewhere (no ``/proc``) nothing is logged. Child processes (sandboxes, Ray actors) are not counted.
"""

from __future__ import annotations

from pathlib import Path

STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


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
        if self.enabled:
            reset_peak()

    def end(self, phase: str) -> dict[str, float]:
        """``{perf/rss_peak_<phase>_gib: peak since start()}`` (empty where not measurable)."""
        if not self.enabled:
            return {}
        value = peak_rss_gib()
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
