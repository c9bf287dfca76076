"""Shared helpers for benchmark scripts: rows, timing, a printed table and the JSON file format.

Every ``bench_*.py`` accepts ``--quick`` (small sizes; CI runs it so scripts cannot rot) and
``--json PATH``. Timings are wall-clock on a shared machine: compare rows by their ``ratio`` to a
baseline measured in the same run, not by absolute values.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Row:
    name: str
    value: float
    unit: str
    baseline: str | None = None
    baseline_value: float | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.baseline_value in (None, 0):
            return None
        return self.value / self.baseline_value  # type: ignore[operator]


def machine() -> str:
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small sizes (CI)")
    p.add_argument("--json", dest="json_path", default=None, help="write rows as JSON here")
    return p


def timeit(fn: Callable[[], Any], repeat: int = 5, warmup: int = 1) -> list[float]:
    """Wall seconds of ``repeat`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median(values: list[float]) -> float:
    return statistics.median(values)


def print_table(rows: list[Row], title: str = "") -> None:
    if title:
        print(f"\n## {title}  ({machine()})")
    header = f"| {'measurement':<52} | {'value':>12} | {'unit':<8} | {'baseline':<34} | {'ratio':>7} |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for r in rows:
        ratio = f"{r.ratio:.3f}" if r.ratio is not None else ""
        base = "" if r.baseline is None else f"{r.baseline} ({r.baseline_value:.4g})"
        value = "—" if r.value is None else f"{r.value:.4g}"  # a row that could not be measured says why
        print(f"| {r.name:<52} | {value:>12} | {r.unit:<8} | {base:<34} | {ratio:>7} |" + (f" {r.note}" if r.note else ""))


def write_json(path: str | None, bench: str, rows: list[Row], quick: bool) -> None:
    if not path:
        return
    record = {"bench": bench, "machine": machine(), "quick": quick,
              "rows": [{**asdict(r), "ratio": r.ratio} for r in rows]}
    with open(path, "w") as fh:
        json.dump(record, fh, indent=2)
