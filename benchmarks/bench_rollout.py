"""Rollout throughput with the built-in SmolLM2 on this CPU: 1 / 8 / 32 concurrent episodes.

Each configuration runs real episodes of ``agentrl/Search-v0`` (BM25 over the generated wiki)
through the runner: envs step in a thread pool while the HF generator serves batched requests.
Reported per configuration: episodes/s, generated tokens/s, mean generation batch, and the
share of wall time the generator sat idle (waiting for envs or for the event loop; target
< 10% with 32 episodes).

    python benchmarks/bench_rollout.py            # 1/8/32 episodes at once, 48 new tokens, 3 env turns
    python benchmarks/bench_rollout.py --quick    # 1/4 episodes, 12 new tokens, 2 env turns
    python benchmarks/bench_rollout.py --json out.json
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from common import Row, parser, print_table, write_json  # noqa: E402

from agentrl.rollout.generators.hf import HFGenerator  # noqa: E402
from agentrl.rollout.model import load_model  # noqa: E402
from agentrl.rollout.runner import RunStats, run_episodes  # noqa: E402
from agentrl.rollout.settings import RolloutConfig  # noqa: E402


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 avoids oversubscription on shared cores)"
    )
    p.add_argument("--env", default="agentrl/Search-v0")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    levels = [1, 4] if args.quick else [1, 8, 32]
    new_tokens = 12 if args.quick else 48
    env_turns = 2 if args.quick else 3

    t0 = time.perf_counter()
    model, tokenizer = load_model("smollm2-135m")
    load_s = time.perf_counter() - t0
    generator = HFGenerator(model, tokenizer, max_batch_size=32)
    rows = [Row("load smollm2-135m (cached safetensors)", load_s, "s")]
    # warm-up: imports, env construction, first forward
    run_episodes(
        args.env,
        [None],
        generator,
        tokenizer,
        RolloutConfig(max_new_tokens=4, max_turns=1, group_size=1),
        progress=False,
        env_kwargs={"max_turns": 1},
    )
    base_eps = None
    for concurrency in levels:
        episodes_n = max(2, concurrency) if concurrency == 1 else concurrency
        config = RolloutConfig(
            max_new_tokens=new_tokens, max_turns=env_turns, temperature=1.0, max_context_tokens=4096,
            concurrency=concurrency, group_size=1, watchdog_s=600, episode_timeout_s=3600,
        )  # fmt: skip
        stats = RunStats()
        episodes = run_episodes(
            args.env,
            [None] * episodes_n,
            generator,
            tokenizer,
            config,
            seed=100,
            stats=stats,
            progress=False,
            env_kwargs={"max_turns": env_turns},
        )
        failed = sum(e.failed for e in episodes)
        eps = stats.episodes / stats.wall_s
        base_eps = base_eps or eps
        tag = f"{concurrency} concurrent"
        rows += [
            Row(
                f"{tag}: episodes/s ({episodes_n} episodes, {failed} failed)",
                eps,
                "ep/s",
                "1 concurrent" if concurrency != levels[0] else None,
                base_eps if concurrency != levels[0] else None,
            ),
            Row(f"{tag}: generated tokens/s", stats.generated_tokens / stats.wall_s, "tok/s"),
            Row(f"{tag}: turns/s", stats.turns / stats.wall_s, "turn/s"),
            Row(
                f"{tag}: mean generation batch",
                stats.generated_tokens and (stats.turns / max(stats.generate_calls, 1)),
                "req",
            ),
            Row(
                f"{tag}: generator idle share of wall time",
                100 * stats.generator_idle_share,
                "%",
                note="target < 10% at 32" if concurrency == 32 else "",
            ),
            Row(f"{tag}: env time (sum over episodes)", stats.env_s, "s"),
            Row(f"{tag}: wall time", stats.wall_s, "s"),
        ]
        print(f"done {tag}: {stats.wall_s:.1f}s", flush=True)
    print_table(
        rows,
        f"rollout: SmolLM2-135M on {args.env}, {new_tokens} new tokens/turn, {env_turns} env turns, {args.threads} torch thread(s)",
    )
    write_json(args.json_path, "rollout", rows, args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
