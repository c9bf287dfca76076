"""Eval throughput: episodes per minute per suite with the scripted oracle, the random agent and
SmolLM2-135M (zero-shot, HF generator on this CPU), through the same code as ``agentrl eval``.

Episodes/min = episodes / wall time of the run, which includes building one env per worker;
process-wide caches (corpora, shop server, sandbox pool) are warmed up by a one-task run first, and
model loading is left out (``setup_s`` in the metrics). Suites whose env or oracle is not available here are listed as skipped.

    python benchmarks/bench_eval.py            # oracle/random: 40 tasks per suite; SmolLM2: 2 episodes, 4 turns
    python benchmarks/bench_eval.py --quick    # oracle/random: 6 tasks per suite; no SmolLM2
    python benchmarks/bench_eval.py --json out.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import Row, parser, print_table, write_json  # noqa: E402

from agentrl.errors import AgentRLError  # noqa: E402
from agentrl.eval.runner import evaluate  # noqa: E402

SUITES = ("local-gaia", "search-qa", "sql", "webshop", "math500", "gaia-fixture")


def measure(suite: str, agent: str, limit: int, concurrency: int) -> Row:
    try:
        if agent in ("oracle", "random"):  # warm-up: corpora, shop server, sandbox pool
            evaluate(suite, agent, limit=1, concurrency=1)
        result = evaluate(suite, agent, limit=limit, concurrency=concurrency, seed=1)
    except AgentRLError as exc:
        return Row(f"{suite} / {agent}", float("nan"), "ep/min", note=f"skipped: {str(exc)[:90]}")
    overall = result.metrics["overall"]
    note = (
        f"{overall['episodes']} episodes, success {100 * overall['success_rate']:.0f}%, "
        f"{overall['mean_turns']:.1f} turns/ep, concurrency {concurrency}"
    )
    return Row(f"{suite} / {agent}", result.metrics["episodes_per_minute"], "ep/min", note=note)


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    limit = 6 if args.quick else 40
    rows = []
    for suite in SUITES:
        for agent in ("oracle", "random"):
            if agent == "oracle" and suite == "gaia-fixture":
                continue  # real GAIA has no scripted oracle
            rows.append(measure(suite, agent, limit, concurrency=4))
    if not args.quick:
        for suite in ("local-gaia", "search-qa", "sql"):
            # zero-shot SmolLM2 rarely answers, so cap the env turns to keep a CPU run short
            rows.append(measure(f"{suite}:max_turns=4", "smollm2-135m", 2, concurrency=2))
    print_table(rows, "eval throughput (episodes per minute)")
    write_json(args.json_path, "bench_eval", rows, args.quick)


if __name__ == "__main__":
    main()
