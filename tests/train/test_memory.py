"""Peak RSS per phase (agentrl.train.memory): the kernel's VmHWM, reset per phase."""

from __future__ import annotations

import sys

import pytest

from agentrl.train.memory import PhasePeaks, peak_rss_gib, reset_peak

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")


@linux
def test_a_phase_that_touches_memory_peaks_above_one_that_does_not():
    peaks = PhasePeaks()
    assert peaks.enabled
    peaks.start()
    quiet = peaks.end("quiet")["perf/rss_peak_quiet_gib"]
    peaks.start()
    block = bytearray(512 * 2**20)  # 512 MiB, every page written: resident
    block[:: 4096] = b"\x01" * (len(block) // 4096)
    del block  # freed before end(): the peak still saw it
    busy = peaks.end("busy")["perf/rss_peak_busy_gib"]
    assert busy - quiet > 0.45  # the 0.5 GiB block, less what the quiet phase already held
    # a later quiet phase starts from the current RSS, not the old peak
    peaks.start()
    again = peaks.end("quiet")["perf/rss_peak_quiet_gib"]
    assert again < busy - 0.45
    assert peaks.peaks["busy"] == busy and peaks.peaks["quiet"] == max(quiet, again)  # the run's maxima
    assert peaks.line().startswith("peak memory (this process's RSS, GiB): quiet ")


@linux
def test_reset_brings_the_peak_down_to_the_current_rss():
    block = bytearray(256 * 2**20)
    block[:: 4096] = b"\x01" * (len(block) // 4096)
    del block
    high = peak_rss_gib()
    assert reset_peak()
    assert peak_rss_gib() < high - 0.2


def test_nothing_is_logged_where_the_kernel_gives_no_peak(monkeypatch, tmp_path):
    import agentrl.train.memory as memory

    monkeypatch.setattr(memory, "STATUS", tmp_path / "absent")
    peaks = PhasePeaks()
    assert not peaks.enabled
    peaks.start()
    assert peaks.end("rollout") == {} and peaks.line() == "" and peaks.peaks == {}
