"""Run every ``benchmarks/bench_*.py`` and merge their results into one table and one JSON file.

Each script runs in its own subprocess with ``--json`` (and ``--quick`` when asked), so one crash,
hang or missing script becomes a row saying so, never a crash of the runner. Every figure is
printed with its ratio to the baseline its script measured in the same run: absolute times on a
shared machine drift, ratios much less. ``agentrl bench [--quick]`` runs this file. Exit code 1
when a script failed, timed out or wrote malformed JSON (a missing script is only reported).

    python benchmarks/run_all.py [--quick] [--out benchmarks/results/latest.json] [--only sandbox,peers]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# The scripts issue 10 expects (owners: sandbox, search, web, code/SQL, objectives, rollout, serve,
# learner, eval, and the peers comparison). One that is absent gets a "missing" row.
EXPECTED = (
    "sandbox",
    "search",
    "web",
    "code_sql",
    "objectives",
    "rollout",
    "learner",
    "eval",
    "peers",
    "serve",
)


def machine() -> str:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        pass
    mem = ""
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        mem = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB RAM"
    gpu = "no GPU"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs ({cpu or 'unknown CPU'}){mem}, "
        f"{gpu}, Python {platform.python_version()}"
    )


def load_average() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def discover(bench_dir: Path, expected: tuple[str, ...]) -> list[str]:
    """Bench names: the expected ones first (present or not), then any other ``bench_*.py``."""
    found = sorted(p.stem.removeprefix("bench_") for p in bench_dir.glob("bench_*.py"))
    return list(expected) + [name for name in found if name not in expected]


def run_one(bench_dir: Path, name: str, quick: bool, timeout: float, log_dir: Path) -> dict[str, Any]:
    """Run one script; a record ``{"bench", "status", "seconds", "rows", "error", ...}``, never raises."""
    script = bench_dir / f"bench_{name}.py"
    record: dict[str, Any] = {
        "bench": name,
        "script": str(script),
        "status": "ok",
        "seconds": 0.0,
        "rows": [],
        "error": "",
    }
    if not script.exists():
        return {**record, "status": "missing", "error": f"{script.name} does not exist yet"}
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        json_path = Path(tmp) / f"{name}.json"
        cmd = [sys.executable, str(script), "--json", str(json_path)] + (["--quick"] if quick else [])
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=bench_dir.parent,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            output, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            output = _text(exc.stdout) + _text(exc.stderr)
            rc = None
        record["seconds"] = time.perf_counter() - start
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / f"{name}.log").write_text(output)
        record["log"] = str(log_dir / f"{name}.log")
        if rc is None:
            return {**record, "status": "timeout", "error": f"ran over {timeout:.0f} s"}
        if rc != 0:
            return {**record, "status": "failed", "error": f"exit code {rc}: {last_line(output)}"}
        try:
            data = json.loads(json_path.read_text())
        except (OSError, ValueError) as exc:
            return {
                **record,
                "status": "failed",
                "error": f"no valid JSON written ({type(exc).__name__}: {exc})",
            }
    problems = check_rows(data)
    record.update(machine=data.get("machine", ""), quick=data.get("quick", quick), rows=data.get("rows", []))
    if problems:
        record.update(status="bad-json", error="; ".join(problems))
    return record


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][-300:] if lines else "no output"


def is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def check_rows(data: Any) -> list[str]:
    """What is wrong with a bench's JSON (empty list when it follows the shared format)."""
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) or not data["rows"]:
        return ["JSON has no 'rows' list (or it is empty)"]
    problems = []
    for i, row in enumerate(data["rows"]):
        if not isinstance(row, dict) or not isinstance(row.get("name"), str):
            problems.append(f"row {i} has no name")
            continue
        value = row.get("value")
        if value is not None and not is_number(value):
            problems.append(f"row {row['name']!r}: value {value!r} is not a finite number")
        if value is None and not row.get("note"):
            problems.append(f"row {row['name']!r}: no value and no note saying why")
    if not any(is_number(r.get("value")) for r in data["rows"] if isinstance(r, dict)):
        problems.append("no row has a finite value")
    return problems


def ratio_of(row: dict[str, Any]) -> float | None:
    """The row's ratio to its same-run baseline (recomputed when the script left it out)."""
    if is_number(row.get("ratio")):
        return float(row["ratio"])
    value, base = row.get("value"), row.get("baseline_value")
    if is_number(value) and is_number(base) and base != 0:
        return value / base
    return None


def fmt(x: Any) -> str:
    if not is_number(x):
        return "-"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(records: list[dict[str, Any]]) -> str:
    """One Markdown table: every row of every bench, or one row saying why a bench has none."""
    lines = [
        "| bench | measurement | value | unit | baseline (same run) | ratio | note |",
        "|---|---|---:|---|---|---:|---|",
    ]
    for rec in records:
        if rec["status"] != "ok" and not rec["rows"]:
            lines.append(f"| {rec['bench']} | **{rec['status']}** | - | | | | {cell(rec['error'])} |")
            continue
        if rec["status"] != "ok":
            lines.append(f"| {rec['bench']} | **{rec['status']}** | - | | | | {cell(rec['error'])} |")
        for row in rec["rows"]:
            base = ""
            if row.get("baseline"):
                base = f"{row['baseline']} ({fmt(row.get('baseline_value'))})"
            ratio = ratio_of(row)
            value = fmt(row.get("value"))
            lines.append(
                f"| {rec['bench']} | {cell(row.get('name', '?'))} | {value} | {cell(row.get('unit', ''))} "
                f"| {cell(base)} | {'' if ratio is None else f'{ratio:.3g}'} | {cell(row.get('note', ''))} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes (CI); each script gets --quick")
    p.add_argument("--out", default=str(HERE / "results" / "latest.json"), help="merged JSON file")
    p.add_argument("--only", default=None, help="comma-separated bench names (e.g. sandbox,peers)")
    p.add_argument(
        "--timeout", type=float, default=None, help="seconds per script (default 300 quick, 3600 full)"
    )
    p.add_argument("--dir", default=str(HERE), help="directory holding bench_*.py")
    p.add_argument(
        "--expected", default=None, help="comma-separated names that must exist (default: issue 10's)"
    )
    args = p.parse_args(argv)

    bench_dir = Path(args.dir).resolve()
    expected = tuple(args.expected.split(",")) if args.expected is not None else EXPECTED
    names = discover(bench_dir, tuple(n for n in expected if n))
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        names = [n for n in names if n in wanted] + [n for n in wanted if n not in names]
    timeout = args.timeout or (300.0 if args.quick else 3600.0)
    out = Path(args.out)
    log_dir = out.parent / "logs"

    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load_start = load_average()
    records = []
    for name in names:
        print(f"[run_all] {name} ...", file=sys.stderr, flush=True)
        rec = run_one(bench_dir, name, args.quick, timeout, log_dir)
        print(
            f"[run_all] {name}: {rec['status']} in {rec['seconds']:.0f} s {rec['error']}",
            file=sys.stderr,
            flush=True,
        )
        records.append(rec)
    load_end = load_average()

    command = "python benchmarks/run_all.py" + (" --quick" if args.quick else "")
    header = [
        f"Machine: {machine()}",
        f"Started {started}; load average (1/5/15 min) {load_start} at start, {load_end} at end",
        f"Command: `{command}`" + ("  (quick mode: small sizes)" if args.quick else ""),
    ]
    table = markdown(records)
    print("\n".join(header) + "\n\n" + table)

    merged = {
        "machine": machine(),
        "quick": args.quick,
        "started": started,
        "command": command,
        "load_average": {"start": load_start, "end": load_end},
        "benches": {r["bench"]: {k: v for k, v in r.items() if k != "rows"} for r in records},
        "rows": [{"bench": r["bench"], **row} for r in records for row in r["rows"]],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged, indent=2))
    out.with_suffix(".md").write_text("\n".join(header) + "\n\n" + table + "\n")
    print(f"\nwrote {out} and {out.with_suffix('.md')}", file=sys.stderr)
    # Every bench still got its row; the exit code tells CI whether one broke (missing ones do not count).
    return 1 if any(r["status"] in ("failed", "timeout", "bad-json") for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
