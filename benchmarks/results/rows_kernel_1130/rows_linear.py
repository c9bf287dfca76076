"""A decode step's linear layers on CPU: a few rows times every weight, reading each weight once.

A decode step multiplies a handful of rows (one per sequence in the batch) by every weight of the
model. On CPU, float32 ``F.linear`` at 8 rows costs about twice its 1-row time (MKL packs the weight
for a GEMM; at 1 row it streams it): SmolLM2's 210 decoder linears took 47 ms at 8 rows against 24 ms
at 1 (2 threads, 2026-11-30, ``benchmarks/bench_decode.py --rows``). ``rows_linear.c`` streams each
weight row once for all the input rows and prefetches the next ones: 34 ms at 8 rows, the same 24 ms
at 1. The LM head gains alike (11 ms packed by oneDNN, 7 ms here, at 8 rows).

Each output is the same sum in the same order whatever the batch, the thread count or the CPU (see
the C file), so a row's logits never depend on which rows it decodes beside: greedy serving gives the
same tokens alone or batched. It differs from ``F.linear`` in the last bits (~1e-6), as the oneDNN
head does; the learner measures the sampler's log-probs against its own where that matters.

The C file is compiled once per machine on first use (``cc -O3 -mavx2 -mfma -fopenmp``, ~0.5 s)
into ``~/.cache/agentrl/kernels/`` and linked against torch's own OpenMP runtime, so its threads are
torch's. Where it cannot run (not x86-64 with AVX2 and FMA, ``ATEN_CPU_CAPABILITY=default``, no C
compiler, a failed self-check) :func:`load` says why and the model's own layers run unchanged.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("rows_linear.c")
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC"]
#: rows up to which the kernel runs; more rows go to ``F.linear`` (MKL is faster from ~24 rows)
MAX_ROWS = 16
MODES = ("auto", "torch")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentrl" / "kernels"


def _cpu_reason() -> str | None:
    """Why this CPU cannot run the kernel, or None."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"{platform.machine()} is not x86-64"
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        return "torch runs without AVX2 here (ATEN_CPU_CAPABILITY or the CPU)"
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return "cannot read /proc/cpuinfo to check for AVX2 and FMA"
    missing = [f for f in ("avx2", "fma") if f not in flags]
    return f"the CPU lacks {', '.join(missing)}" if missing else None


def _openmp_args() -> list[str]:
    """Link torch's bundled OpenMP runtime where it ships one (one thread pool for both)."""
    lib = Path(torch.__file__).parent / "lib"
    if (lib / "libgomp.so.1").exists():
        return [f"-L{lib}", f"-Wl,-rpath,{lib}", "-l:libgomp.so.1"]
    return []


def _build(compiler: str) -> Path:
    """Compile the C file into the cache (once per source, flags and compiler) and return the library."""
    args = [*FLAGS, *_openmp_args()]
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256("\n".join([SOURCE.read_text(), *args, version]).encode()).hexdigest()[:16]
    target = cache_dir() / f"rows_linear-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        done = subprocess.run(
            [compiler, str(SOURCE), "-o", str(out), *args], capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {done.stderr.strip()[-400:]}")
        os.replace(out, target)  # atomic: processes building at once each install a whole file
    return target


@functools.lru_cache(maxsize=1)
def load() -> tuple[Any, str]:
    """``(library, what)`` where the kernel runs here, else ``(None, why not)``; built on first call."""
    why = _cpu_reason()
    if why:
        return None, why
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return None, "no C compiler (cc) to build it; apt-get install gcc"
    try:
        path = _build(compiler)
        lib = ctypes.CDLL(str(path))  # CDLL: the call releases the GIL
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return None, f"could not build it: {exc}"
    lib.rows_linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 5 + [ctypes.c_int]
    lib.rows_linear.restype = None
    error = _self_check(lib)
    if error > 1e-4:
        return None, f"its self-check was off by {error:.2e} against float64"
    return lib, f"rows kernel (AVX2+FMA, up to {MAX_ROWS} rows; {path.name})"


def call_rows(lib: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x [M, K]`` (rows ``x.stride(0)`` apart, unit stride within) times ``weight [N, K]`` (contiguous)."""
    rows, k = x.shape
    n = weight.shape[0]
    y = torch.empty((rows, n), dtype=torch.float32)
    lib.rows_linear(x.data_ptr(), weight.data_ptr(), bias.data_ptr() if bias is not None else None,
                    y.data_ptr(), rows, n, k, x.stride(0), n, torch.get_num_threads())  # fmt: skip
    return y


def _self_check(lib: Any) -> float:
    """Largest relative error against float64 on a seeded problem with every remainder path."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 37, generator=gen)
    w = torch.randn(5, 37, generator=gen)
    b = torch.randn(5, generator=gen)
    want = x.double() @ w.double().T + b.double()
    got = call_rows(lib, x, w, b).double()
    return float(((got - want).abs() / want.abs().clamp(min=1.0)).max())


def rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through the kernel (float32 CPU tensors; raises where it cannot run)."""
    lib, why = load()
    if lib is None:
        raise RuntimeError(f"the rows kernel cannot run here: {why}")
    flat = x.reshape(-1, x.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    out = call_rows(lib, flat, weight.contiguous(), None if bias is None else bias.contiguous())
    return out.reshape(*x.shape[:-1], weight.shape[0])


def usable(weight: torch.Tensor) -> bool:
    """A weight the kernel reads: float32, on CPU, contiguous."""
    return weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.is_contiguous()


class RowsLinears:
    """The kernel in place of a model's ``nn.Linear`` layers while :meth:`active`: a layer's input of
    at most :data:`MAX_ROWS` rows, without grad, goes through the kernel; anything else (a prefill, a
    training forward) through ``F.linear``. The layers' weights are read live, never copied."""

    def __init__(self, lib: Any, layers: list[nn.Linear]):
        self.lib = lib
        self.layers = layers
        self._depth = 0
        self._lock = threading.Lock()

    def _forward(self, layer: nn.Linear) -> Any:
        lib = self.lib

        def forward(x: torch.Tensor) -> torch.Tensor:
            weight, bias = layer.weight, layer.bias
            k = weight.shape[1]
            if (
                x.dtype == torch.float32
                and x.device.type == "cpu"
                and x.shape[-1] == k
                and x.numel() <= MAX_ROWS * k
                and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
                and usable(weight)
            ):
                flat = x.reshape(-1, k)
                if flat.stride(-1) != 1:
                    flat = flat.contiguous()
                return call_rows(lib, flat, weight, bias).reshape(*x.shape[:-1], weight.shape[0])
            return F.linear(x, weight, bias)

        return forward

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The kernel in place for the duration (re-entrant and thread-safe; restored on exit)."""
        with self._lock:
            if self._depth == 0:
                for layer in self.layers:
                    layer.forward = self._forward(layer)  # type: ignore[method-assign]
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    for layer in self.layers:
                        del layer.forward


def rows_linears_for(model: Any, mode: str = "auto") -> tuple[RowsLinears | None, str]:
    """The kernel for ``model``'s decoder linears (``mode`` auto), or ``(None, why not)``.

    Only plain ``nn.Linear`` layers with float32 CPU weights take part (a LoRA layer's base does, its
    adapter runs as before); the LM head is the generator's own (:mod:`agentrl.rollout.generators.head`)."""
    if mode not in MODES:
        raise ValueError(f"decode kernel {mode!r} is not one of {', '.join(MODES)}")
    if mode == "torch":
        return None, "torch (F.linear), as asked"
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    # (a layer whose forward is already replaced on the instance, e.g. by a hook library, keeps it)
    layers = [
        m for m in decoder.modules() if type(m) is nn.Linear and usable(m.weight) and "forward" not in vars(m)
    ]
    if not layers:
        return None, "torch (F.linear): no float32 CPU linear layers in the decoder"
    lib, what = load()
    if lib is None:
        return None, f"torch (F.linear): {what}"
    return RowsLinears(lib, layers), what
