"""The quickstart's RL levers side by side: one table row per run.

    python benchmarks/quickstart_levers.py --run chains "rollout.group_size=8 rollout.tasks_per_step=4 \
        rollout.branches=0 train.lr=3e-5 train.steps=6 rollout.concurrency=64" --run trees ""
    python benchmarks/quickstart_levers.py --from runs/a runs/b   # runs that already ran

``--run NAME "OVERRIDES"`` runs ``agentrl train configs/quickstart.yaml OVERRIDES`` (seed
``--seed``) into ``--out/NAME`` and times it; ``--from`` reads finished run directories. Each row:
groups trained per RL step (after dynamic sampling), sampled reward per step, groups per 1,000
generated tokens, held-out success before -> after with tasks gained / lost and the sign test,
rollout and learner seconds per step, wall time (the run's own phases, from ``train.log``) and the
peak RSS of each phase (``summary.json``'s ``peak_rss_gib``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(name: str, overrides: str, out: Path, seed: int) -> Path:
    run_dir = out / name
    cmd = [sys.executable, "-m", "agentrl.cli", "train", str(REPO / "configs" / "quickstart.yaml"),
           *shlex.split(overrides), f"train.seed={seed}", f"train.out_dir={run_dir}", "train.resume=false"]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=REPO)
    (run_dir / "wall_s.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")
    return run_dir


def _range(values: list[float | None], fmt: str = "{:.2f}") -> str:
    """``min-max`` of the steps that logged the value ("-" for runs from before it was logged)."""
    values = [v for v in values if v is not None]
    return f"{fmt.format(min(values))}-{fmt.format(max(values))}" if values else "-"


def row(run_dir: Path) -> dict[str, str]:
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in steps if r.get("step", 0) > 0 and "perf/rollout_s" in r]
    wall_file = run_dir / "wall_s.txt"  # written by --run (or by whoever timed the run)
    wall = wall_file.read_text().strip() if wall_file.exists() else "-"
    peaks = summary.get("peak_rss_gib", {})
    mean = lambda key: sum(r.get(key, 0.0) for r in rl) / max(len(rl), 1)  # noqa: E731
    return {
        "run": run_dir.name,
        "groups/step": _range([r.get("rollout/groups_trained") for r in rl], "{:.0f}"),
        "sampled reward": _range([r.get("env/reward") for r in rl]),
        "groups/1k tokens": _range([r.get("rollout/groups_per_1k_tokens") for r in rl]),
        "held-out": f"{summary['success_before']:.3f} -> {summary['success_after']:.3f}",
        "gained/lost": f"{summary['gained']} / {summary['lost']}",
        "p": f"{summary['p_value']:.3g}",
        "rollout s/step": f"{mean('perf/rollout_s'):.0f}",
        "learner s/step": f"{mean('perf/learner_s'):.0f}",
        "wall s": str(wall),
        "peak RSS GiB": f"{max(peaks.values()):.2f} ({max(peaks, key=peaks.get)})" if peaks else "-",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", nargs=2, action="append", default=[], metavar=("NAME", "OVERRIDES"))
    parser.add_argument("--from", dest="dirs", nargs="*", default=[], type=Path)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "levers")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dirs = list(args.dirs) + [run(name, overrides, args.out, args.seed) for name, overrides in args.run]
    if not dirs:
        parser.error("give --run NAME OVERRIDES or --from DIR ...")
    rows = [row(d) for d in dirs]
    print("| " + " | ".join(rows[0]) + " |")
    print("|" + "---|" * len(rows[0]))
    for r in rows:
        print("| " + " | ".join(r.values()) + " |")


if __name__ == "__main__":
    main()
