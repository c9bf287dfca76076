"""Search env throughput: env steps/s with BM25 over a generated corpus (100k passages by default),
and the share of step time spent outside the retrieval call.

Episodes are played by the scripted oracle (real search/open/answer action strings), so the
action mix is the one a solving agent produces. Only ``env.step`` is timed; the retriever is
wrapped to time its ``search`` calls.

    python benchmarks/bench_search.py            # 100k passages, 2000 steps
    python benchmarks/bench_search.py --quick    # 20k passages, 300 steps
    python benchmarks/bench_search.py --json out.json
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from common import Row, parser, print_table, write_json  # noqa: E402

import agentrl
from agentrl.envs.search.env import wiki_retriever
from agentrl.envs.search.oracle import SearchOracle
from agentrl.envs.search.questions import generate_questions
from agentrl.envs.search.wiki import generate_wiki
from agentrl.tools.search import Doc, Hit, Retriever


class TimedRetriever:
    """Wraps a retriever and adds up the seconds spent in ``search``."""

    def __init__(self, inner: Retriever):
        self.inner = inner
        self.seconds = 0.0
        self.calls = 0

    def search(self, query: str, k: int) -> list[Hit]:
        start = time.perf_counter()
        hits = self.inner.search(query, k)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return hits

    def get(self, doc_id: str) -> Doc | None:
        return self.inner.get(doc_id)


def run(n_entities: int, steps: int, wiki_seed: int = 1) -> dict[str, Any]:
    results: dict[str, Any] = {"n_passages": n_entities, "wiki_seed": wiki_seed}
    start = time.perf_counter()
    generate_wiki(wiki_seed, n_entities)
    results["wiki_generation_s"] = time.perf_counter() - start
    start = time.perf_counter()
    generate_questions(wiki_seed, n_entities, 3000, "mix")
    results["question_generation_s"] = time.perf_counter() - start
    start = time.perf_counter()
    retriever = wiki_retriever(wiki_seed, n_entities, "bm25")
    results["bm25_index_s"] = time.perf_counter() - start

    env = agentrl.make("agentrl/Search-v0", wiki_seed=wiki_seed, n_entities=n_entities)
    timed = TimedRetriever(retriever)
    env.unwrapped.retriever = timed  # tools are bound at reset, so every episode uses the wrapper
    tasks = env.unwrapped.tasks("train")
    oracle = SearchOracle()
    step_seconds = 0.0
    by_kind: dict[str, list[float]] = defaultdict(list)
    n_steps = episodes = solved = 0
    while n_steps < steps:
        task = tasks[episodes % len(tasks)]
        obs, info = env.reset(options={"task": task})
        oracle.reset(task)
        episodes += 1
        while True:
            action = oracle.act(obs, info)
            kind = "answer" if action.startswith("<answer>") else "search" if '"search"' in action else "open"
            start = time.perf_counter()
            obs, reward, terminated, truncated, info = env.step(action)
            elapsed = time.perf_counter() - start
            step_seconds += elapsed
            by_kind[kind].append(elapsed)
            n_steps += 1
            if terminated or truncated:
                solved += reward
                break
    env.close()
    results.update(
        steps=n_steps,
        episodes=episodes,
        oracle_solve_rate=solved / episodes,
        steps_per_s=n_steps / step_seconds,
        search_steps_per_s=len(by_kind["search"]) / sum(by_kind["search"]),
        retrieval_s=timed.seconds,
        step_s=step_seconds,
        share_outside_retrieval=1 - timed.seconds / step_seconds,
        share_outside_retrieval_search_steps=1 - timed.seconds / sum(by_kind["search"]),
        ms_per_step={kind: 1000 * sum(v) / len(v) for kind, v in sorted(by_kind.items())},
        ms_per_retrieval=1000 * timed.seconds / max(1, timed.calls),
    )
    return results


def rows_of(results: dict[str, Any]) -> list[Row]:
    n = f"{results['n_passages']:,} passages"
    ms = results["ms_per_step"]
    retrieval_ms = results["ms_per_retrieval"]
    return [
        Row(f"wiki generation ({n})", results["wiki_generation_s"], "s"),
        Row("question generation (3000 questions)", results["question_generation_s"], "s"),
        Row(f"BM25 index build ({n})", results["bm25_index_s"], "s"),
        Row(
            "env steps/s, oracle action mix",
            results["steps_per_s"],
            "steps/s",
            note=f"{results['episodes']} episodes, {results['steps']} steps",
        ),
        Row("env steps/s, search steps only", results["search_steps_per_s"], "steps/s"),
        Row("ms per search step", ms.get("search", float("nan")), "ms", "retrieval call", retrieval_ms),
        Row("ms per open step", ms.get("open", float("nan")), "ms"),
        Row("ms per answer step", ms.get("answer", float("nan")), "ms"),
        Row(
            "share of step time outside retrieval (all steps)", 100 * results["share_outside_retrieval"], "%"
        ),
        Row(
            "share of step time outside retrieval (search steps)",
            100 * results["share_outside_retrieval_search_steps"],
            "%",
        ),
        Row("oracle solve rate", results["oracle_solve_rate"], "fraction"),
    ]


def main(argv: list[str] | None = None) -> int:
    cli = parser("Search env steps/s with BM25 over a generated corpus")
    cli.add_argument("--n-passages", type=int, default=None, help="default 100k (20k with --quick)")
    cli.add_argument("--steps", type=int, default=None, help="default 2000 (300 with --quick)")
    args = cli.parse_args(argv)
    n_passages = args.n_passages or (20_000 if args.quick else 100_000)
    steps = args.steps or (300 if args.quick else 2000)
    rows = rows_of(run(n_passages, steps))
    print_table(rows, title="Search env (BM25, oracle-driven episodes)")
    write_json(args.json_path, "search", rows, args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
