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

import argparse
import json
import platform
import time
from collections import defaultdict
from typing import Any

from agentrl.envs.search.env import wiki_retriever
from agentrl.envs.search.oracle import SearchOracle
from agentrl.envs.search.questions import generate_questions
from agentrl.envs.search.wiki import generate_wiki
from agentrl.tools.search import Doc, Hit, Retriever

import agentrl


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
        ms_per_step={kind: 1000 * sum(v) / len(v) for kind, v in sorted(by_kind.items())},
        ms_per_retrieval=1000 * timed.seconds / max(1, timed.calls),
        python=platform.python_version(),
    )
    return results


def print_table(results: dict[str, Any]) -> None:
    ms = results["ms_per_step"]
    rows = [
        ("passages (BM25 corpus)", f"{results['n_passages']:,}"),
        ("wiki generation", f"{results['wiki_generation_s']:.2f} s"),
        ("question generation (3000)", f"{results['question_generation_s']:.2f} s"),
        ("BM25 index build", f"{results['bm25_index_s']:.2f} s"),
        ("episodes / steps", f"{results['episodes']} / {results['steps']}"),
        ("oracle solve rate", f"{results['oracle_solve_rate']:.3f}"),
        ("env steps/s (all actions)", f"{results['steps_per_s']:.1f}"),
        ("env steps/s (search only)", f"{results['search_steps_per_s']:.1f}"),
        (
            "ms per step: search/open/answer",
            " / ".join(f"{ms.get(k, 0):.2f}" for k in ("search", "open", "answer")),
        ),
        ("ms per retrieval call", f"{results['ms_per_retrieval']:.2f}"),
        ("share of step time outside retrieval", f"{100 * results['share_outside_retrieval']:.1f} %"),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"| {'metric'.ljust(width)} | value |")
    print(f"|{'-' * (width + 2)}|-------|")
    for name, value in rows:
        print(f"| {name.ljust(width)} | {value} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Search env steps/s with BM25 over a generated corpus")
    parser.add_argument("--quick", action="store_true", help="20k passages, 300 steps")
    parser.add_argument("--n-passages", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--json", dest="json_path", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    n_passages = args.n_passages or (20_000 if args.quick else 100_000)
    steps = args.steps or (300 if args.quick else 2000)
    results = run(n_passages, steps)
    print_table(results)
    if args.json_path:
        with open(args.json_path, "w") as handle:
            json.dump({"benchmark": "search", **results}, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
