"""The HF generator's prefix cache over a lock-step multi-turn wave: prefill work, time and peak RSS.

A wave of R episodes, each turn one batched ``generate`` over every episode's prompt (as a held-out
eval or a training rollout runs them), each prompt the previous one + the sampled tokens + an
observation. Three prefix-cache budgets, each in a fresh process (peak RSS is per process): off,
65,536 tokens (the generator's default, and the trainer's until 2026-11-27) and every episode in
flight (R x the longest prompt + new tokens; the trainer and `agentrl eval` now resolve at least this when
memory allows). Reported per budget: prompt tokens prefilled (the rest reused from the cache),
rows that hit per turn, wall time, and the peak RSS (per turn and overall).

    python benchmarks/bench_prefix_cache.py            # SmolLM2-135M, 64 episodes (the quickstart's wave), 4 turns to 1,344 tokens
    python benchmarks/bench_prefix_cache.py --quick    # 4 episodes, 2 turns, first prompt 64 tokens (CI)
    python benchmarks/bench_prefix_cache.py --json out.json
    python benchmarks/bench_prefix_cache.py --malloc-mmap-threshold 131072 --reps 3

``--malloc-mmap-threshold BYTES`` instead runs the trainer's budget (every episode in flight) with
glibc's defaults and with ``MALLOC_MMAP_THRESHOLD_=BYTES``, alternating, ``--reps`` times each: glibc
raises its mmap threshold (up to 32 MiB) each time a large block is freed, so later K/V-sized
blocks come from the heap, and freed heap memory mostly stays with the process; a fixed threshold
maps and unmaps each block above it, at the price of system calls and page faults (what the wall
time column measures).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import Row, median, parser, print_table, write_json  # noqa: E402


def child(budget: int, rows: int, turns: int, first: int, obs: int, new: int, threads: int) -> dict:
    """One wave in this process; returns its counts, times and peak RSS."""
    import torch

    from agentrl.rollout.generators.base import SamplingParams
    from agentrl.rollout.generators.hf import HFGenerator
    from agentrl.rollout.model import load_model
    from agentrl.train.memory import peak_rss_gib, reset_peak

    torch.set_num_threads(threads)
    model, tokenizer = load_model("smollm2-135m")
    gen = HFGenerator(model, tokenizer, max_batch_size=rows, prefix_cache_tokens=budget)
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 49_000) for _ in range(first)] for _ in range(rows)]
    sampling = SamplingParams(max_new_tokens=new, temperature=1.0, seed=1, stop_ids=())
    base_rss, prefilled, hits, wall, peaks = peak_rss_gib(), 0, [], 0.0, []
    for _turn in range(turns):
        reset_peak()
        cache = gen.prefix_cache
        h0, r0 = (cache.hits, cache.reused_tokens) if cache else (0, 0)
        t0 = time.perf_counter()
        outs = gen.generate(prompts, sampling)
        wall += time.perf_counter() - t0
        reused = cache.reused_tokens - r0 if cache else 0
        prefilled += sum(len(p) for p in prompts) - reused
        hits.append(cache.hits - h0 if cache else 0)
        peaks.append(peak_rss_gib())
        prompts = [p + o.ids + [rng.randrange(100, 49_000) for _ in range(obs)] for p, o in zip(prompts, outs, strict=True)]
    return {"prefilled": prefilled, "hits": hits, "wall_s": wall, "peaks_gb": peaks, "model_rss_gb": base_rss}


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--malloc-mmap-threshold", type=int, default=None, metavar="BYTES",
                   help="compare glibc's defaults with MALLOC_MMAP_THRESHOLD_=BYTES (every-episode budget)")
    p.add_argument("--reps", type=int, default=2, help="runs per variant with --malloc-mmap-threshold")
    p.add_argument("--rows", type=int, default=None, help="episodes in the wave (default 64; --quick 4)")
    args = p.parse_args()
    rows, turns, first, obs, new = (4, 2, 64, 24, 4) if args.quick else (64, 4, 300, 300, 48)
    rows = args.rows or rows
    if args.child is not None:
        print(json.dumps(child(args.child, rows, turns, first, obs, new, args.threads)))
        return 0
    longest = first + (turns - 1) * (new + obs) + new
    shape = (f"SmolLM2-135M, {rows} episodes in lock step, {turns} turns, prompts {first} -> {longest - new} "
             f"tokens, {new} new tokens/turn, {args.threads} torch thread(s)")  # fmt: skip
    if args.malloc_mmap_threshold is not None:
        return compare_malloc(args, rows * longest, shape)
    budgets = [("off", 0), ("65,536 tokens", 65_536), (f"every episode ({rows} x {longest})", rows * longest)]
    results = {}
    for label, budget in budgets:
        results[label] = r = run_child(args, budget)
        print(f"done {label}: {r['wall_s']:.1f}s, hits per turn {r['hits']}", flush=True)
    off = results["off"]
    out: list[Row] = []
    for label, _ in budgets:
        r = results[label]
        base = None if label == "off" else "off"
        out += [
            Row(f"{label}: prompt tokens prefilled", r["prefilled"], "tok", base, off["prefilled"] if base else None),
            Row(f"{label}: rows that hit, per turn", sum(r["hits"]), "rows", note=" / ".join(map(str, r["hits"]))),
            Row(f"{label}: generate wall time, all turns", r["wall_s"], "s", base, off["wall_s"] if base else None),
            Row(f"{label}: peak RSS", max(r["peaks_gb"]), "GiB", base, max(off["peaks_gb"]) if base else None,
                note=f"per turn {' / '.join(f'{x:.2f}' for x in r['peaks_gb'])}; model loaded {r['model_rss_gb']:.2f}"),
        ]  # fmt: skip
    print_table(out, f"prefix cache: {shape}")
    write_json(args.json_path, "prefix_cache", out, args.quick)
    return 0


def run_child(args: argparse.Namespace, budget: int, env: dict[str, str] | None = None) -> dict:
    """One wave in a fresh process (peak RSS is per process), with extra environment ``env``."""
    cmd = [sys.executable, __file__, "--child", str(budget), "--threads", str(args.threads)]
    cmd += ["--rows", str(args.rows)] if args.rows else []
    done = subprocess.run(cmd + (["--quick"] if args.quick else []), capture_output=True, text=True,
                          env={**os.environ, **(env or {})})  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare_malloc(args: argparse.Namespace, budget: int, shape: str) -> int:
    """glibc defaults vs a fixed mmap threshold, alternating (a busy machine slows both alike)."""
    variants = {"glibc defaults": {}, f"MALLOC_MMAP_THRESHOLD_={args.malloc_mmap_threshold}":
                {"MALLOC_MMAP_THRESHOLD_": str(args.malloc_mmap_threshold)}}  # fmt: skip
    runs: dict[str, list[dict]] = {label: [] for label in variants}
    for rep in range(args.reps):
        for label, env in variants.items():
            r = run_child(args, budget, env)
            runs[label].append(r)
            print(f"rep {rep + 1}/{args.reps} {label}: {r['wall_s']:.1f}s, peak {max(r['peaks_gb']):.2f} GiB "
                  f"(model {r['model_rss_gb']:.2f})", flush=True)  # fmt: skip
    base = "glibc defaults"
    walls = {k: median([r["wall_s"] for r in v]) for k, v in runs.items()}
    peaks = {k: max(max(r["peaks_gb"]) for r in v) for k, v in runs.items()}
    above = {k: max(max(r["peaks_gb"]) - r["model_rss_gb"] for r in v) for k, v in runs.items()}
    out: list[Row] = []
    for label, rs in runs.items():
        ref = None if label == base else base
        out += [
            Row(f"{label}: generate wall, median of {len(rs)}", walls[label], "s", ref, walls[base] if ref else None,
                note=" / ".join(f"{r['wall_s']:.1f}" for r in rs)),
            Row(f"{label}: peak RSS, max of {len(rs)}", peaks[label], "GiB", ref, peaks[base] if ref else None,
                note=" / ".join(f"{max(r['peaks_gb']):.2f}" for r in rs)),
            Row(f"{label}: peak RSS above the loaded model", above[label], "GiB", ref, above[base] if ref else None),
        ]  # fmt: skip
    print_table(out, f"glibc mmap threshold, prefix cache {budget} tokens (every episode): {shape}")
    write_json(args.json_path, "prefix_cache_malloc", out, args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
