"""Rollout batching: timing-dependent windows vs lock-step waves, repeatability and speed.

The in-process HF generator decodes the requests that reach it together as one batch. A row's
floats depend on which other rows share its batch (padding length and GEMM shapes: ~1e-5 in a
log-prob), so a near-tie sample can flip. By default a batch takes what arrived within 2 ms
(``window``), so which rows share a batch depends on how fast each env step returned; with
``lockstep`` a batch waits until every active episode has asked (or ended) and is ordered by seed.
This script runs the same rollout (same model, tasks and seeds) several times in each mode,
alternating, in one process, and reports per mode: wall time, decode calls and mean batch, and
whether each run's episodes (every token id and log-prob) equal that mode's first run.

    python benchmarks/bench_lockstep.py             # 4 tasks x 8 samples, 3 turns, 32 new tokens, 3 runs per mode
    python benchmarks/bench_lockstep.py --quick     # 2 tasks x 2 samples, 2 turns, 8 new tokens, 2 runs per mode
    python benchmarks/bench_lockstep.py --tasks 2 --turns 2 --reps 2 --json out.json   # about 2 min a run on 2 busy cores
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from common import Row, median, parser, print_table, write_json  # noqa: E402

from agentrl.rollout.generators.hf import HFGenerator  # noqa: E402
from agentrl.rollout.model import load_model  # noqa: E402
from agentrl.rollout.runner import RunStats, run_episodes  # noqa: E402
from agentrl.rollout.settings import RolloutConfig  # noqa: E402


def fingerprint(episodes: list) -> list[tuple]:
    """Every episode's turns as (output token ids, output log-probs), in task order."""
    return [tuple((tuple(t.output_ids), tuple(t.output_logprobs)) for t in ep.turns) for ep in episodes]


def compare(first: list[tuple], other: list[tuple]) -> tuple[int, float]:
    """(episodes whose tokens or log-probs differ, largest |log-prob| difference where tokens agree)."""
    differ, worst = 0, 0.0
    for a, b in zip(first, other, strict=True):
        if a != b:
            differ += 1
        for (ids_a, lp_a), (ids_b, lp_b) in zip(a, b, strict=False):
            if ids_a == ids_b:
                worst = max([worst, *(abs(x - y) for x, y in zip(lp_a, lp_b, strict=True))])
    return differ, worst


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--env", default="agentrl/Search-v0")
    p.add_argument("--reps", type=int, default=None, help="runs per mode (default 3; --quick 2)")
    p.add_argument("--tasks", type=int, default=None, help="tasks per run (default 4; --quick 2)")
    p.add_argument("--turns", type=int, default=None, help="env turns per episode (default 3; --quick 2)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    tasks, group, turns, new = (2, 2, 2, 8) if args.quick else (4, 8, 3, 32)
    tasks, turns = args.tasks or tasks, args.turns or turns
    reps = args.reps or (2 if args.quick else 3)
    model, tokenizer = load_model("smollm2-135m")
    config = RolloutConfig(max_new_tokens=new, max_turns=turns, temperature=1.0, max_context_tokens=4096,
                           concurrency=tasks * group, group_size=group, watchdog_s=1800, episode_timeout_s=3600)  # fmt: skip
    modes = {"window": False, "lockstep": True}
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for rep in range(reps):
        for mode, lockstep in modes.items():
            # a fresh generator per run (no prefix cache carried between runs), the same weights
            generator = HFGenerator(model, tokenizer, max_batch_size=tasks * group)
            stats = RunStats()
            t0 = time.perf_counter()
            episodes = run_episodes(args.env, [None] * tasks, generator, tokenizer, config, seed=7, stats=stats,
                                    progress=False, env_kwargs={"max_turns": turns}, lockstep=lockstep)  # fmt: skip
            wall = time.perf_counter() - t0
            failed = sum(ep.failed for ep in episodes)
            runs[mode].append({"wall_s": wall, "calls": stats.generate_calls, "turns": stats.turns,
                               "failed": failed, "print": fingerprint(episodes)})  # fmt: skip
            print(f"rep {rep + 1}/{reps} {mode}: {wall:.1f}s, {stats.generate_calls} decode calls, "
                  f"{stats.turns} turns, {failed} failed", flush=True)  # fmt: skip
    rows: list[Row] = []
    base_wall = median([r["wall_s"] for r in runs["window"]])
    for mode, rs in runs.items():
        walls = [r["wall_s"] for r in rs]
        checks = [compare(rs[0]["print"], r["print"]) for r in rs[1:]]
        same = sum(1 for differ, _ in checks if differ == 0)
        ref = None if mode == "window" else "window"
        rows += [
            Row(f"{mode}: rollout wall, median of {len(rs)}", median(walls), "s", ref, base_wall if ref else None,
                note=" / ".join(f"{w:.1f}" for w in walls)),
            Row(f"{mode}: decode calls per run (mean batch)", median([r["calls"] for r in rs]), "calls",
                note=" / ".join(f"{r['calls']} ({r['turns'] / max(r['calls'], 1):.1f})" for r in rs)),
            Row(f"{mode}: runs identical to its first run", same, f"of {len(checks)}",
                note="episodes differing per run: " + " / ".join(str(d) for d, _ in checks)),
            Row(f"{mode}: largest |log-prob| change on agreeing tokens", max((w for _, w in checks), default=0.0), "nats"),
        ]  # fmt: skip
    print_table(rows, f"rollout batching: SmolLM2-135M float32 on {args.env}, {tasks} tasks x {group} samples, "
                      f"{turns} turns, {new} new tokens, temperature 1, {args.threads} torch thread(s)")  # fmt: skip
    write_json(args.json_path, "lockstep", rows, args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
