"""Peak RSS per phase (agentrl.train.memory): the kernel's VmHWM, reset per phase."""

from __future__ import annotations

import os
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
    block[::4096] = b"\x01" * (len(block) // 4096)
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
    block[::4096] = b"\x01" * (len(block) // 4096)
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


# --------------------------------------------------------------------------- train.kernel_cache
def test_the_kernel_cache_line_says_what_holds(monkeypatch):
    from agentrl.train.memory import KERNEL_CACHES, cap_kernel_caches

    for name in KERNEL_CACHES:
        monkeypatch.delenv(name, raising=False)
    assert cap_kernel_caches(0) == "kernel caches: the libraries' defaults (train.kernel_cache=0)"
    assert all(name not in os.environ for name in KERNEL_CACHES)  # 0 sets nothing
    assert (
        cap_kernel_caches(64)
        == "kernel caches: 64 entries each in oneDNN's and PyTorch's (train.kernel_cache)"
    )
    assert [os.environ[name] for name in KERNEL_CACHES] == ["64", "64"]
    # what the environment already says wins, and is said
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "512")
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY")
    assert cap_kernel_caches(16) == (
        "kernel caches: LRU_CACHE_CAPACITY=512 from the environment (above train.kernel_cache=16)"
    )
    assert os.environ["LRU_CACHE_CAPACITY"] == "512"
    assert cap_kernel_caches(0).endswith("(train.kernel_cache=0), ONEDNN_PRIMITIVE_CACHE_CAPACITY=16 from the "
                                         "environment, LRU_CACHE_CAPACITY=512 from the environment")  # fmt: skip


GROWTH = r"""
import ctypes, gc, os, sys, torch
from agentrl.train.memory import cap_kernel_caches
cap_kernel_caches(int(sys.argv[1]))  # after import torch, before the first matmul, as the trainer does
rss = lambda: next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmRSS")) / 1024
torch.set_num_threads(1)
layer = torch.nn.Linear(576, 1536, bias=False)
start = rss()
for n in range(1, 61):
    x = torch.randn(3 * n, 576, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer(x).float().sum().backward()
gc.collect(); ctypes.CDLL("libc.so.6").malloc_trim(0)
print(rss() - start)
"""


@linux
def test_a_capped_kernel_cache_bounds_what_sequence_lengths_leave_resident():
    import subprocess

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")
    }

    def grown(cap: int) -> float:
        out = subprocess.run([sys.executable, "-c", GROWTH, str(cap)], env=env, capture_output=True, text=True,
                             check=True, timeout=600)  # fmt: skip
        return float(out.stdout.strip().splitlines()[-1])

    capped, default = grown(4), grown(0)
    # 60 lengths through one 576 x 1536 layer: with the defaults each may keep a ~1.8 MB packed weight
    # (on a CPU whose bf16 matmuls take that path); 4 entries each hold a few of them at most
    assert capped < 40, (capped, default)
    assert capped <= default + 10, (capped, default)
