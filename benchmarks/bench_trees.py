"""Tree vs chain rollouts on multi-hop search: informative groups per 1,000 generated tokens and
tool calls per solved episode, on one stochastic policy and the same tasks.

The policy is a seeded noisy solver (not a model: a CPU-sized measurement of the rollout shapes,
not of learning): it knows each task's chain of pages; each turn it opens the next page of the
chain with probability 1 - ``noise`` (else it opens a wrong page or searches for something else),
and once the chain is read it answers the gold answer with probability 1 - ``noise`` (else a wrong
one). Its progress is read from the prompt, so it is a function of (prompt, seed) like a model and
a branch can replay its root's turns. Every episode goes through the real runner and the real
``agentrl/SearchMultiHop-v0`` env (BM25 over the generated wiki).

Arms, all with 8 episodes per task: chain GRPO (``group_size=8``), and trees of 2 roots x
(1 + 3 branches) with ``branch_at`` = last, uniform and entropy (``rollout.fork=env``: the prefix's
tool calls run once per tree). Reported per arm:

- informative groups per 1,000 generated tokens: groups (a chain group, or a tree) whose outcomes
  are not all equal, i.e. that give a non-zero GRPO advantage; trees are also counted by task
  (Tree-GRPO's inter-tree group);
- tool calls per solved episode: the tool calls the policy sampled (replayed prefixes are not
  sampled again), and the tool executions the env ran, over the episodes that solved their task;
- generated tokens and wall time of the whole arm.

    python benchmarks/bench_trees.py            # 48 tasks
    python benchmarks/bench_trees.py --quick    # 6 tasks
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import Row, parser, print_table, write_json  # noqa: E402

import agentrl  # noqa: E402
from agentrl.rollout.generators.base import GenerationOutput, Generator, SamplingParams  # noqa: E402
from agentrl.rollout.runner import RunStats, run_episodes  # noqa: E402
from agentrl.rollout.settings import RolloutConfig  # noqa: E402

ENV_ID = "agentrl/SearchMultiHop-v0"


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class NoisySolver(Generator):
    """The seeded noisy policy of the module docstring, as a generator (token ids in and out)."""

    name = "noisy-solver"
    supports_entropy = True
    supports_row_seeds = True
    shared_batches = True
    max_batch_size = 64

    def __init__(self, tokenizer, tasks, noise: float):
        self.tokenizer, self.noise = tokenizer, noise
        self.tasks = list(tasks)
        self.doc_ids = [d for t in self.tasks for d in t.payload["doc_ids"]]

    def _act(self, prompt: str, rng: random.Random) -> tuple[str, float]:
        task = next(t for t in self.tasks if t.question in prompt)
        chain = task.payload["doc_ids"]
        progress = 0
        while progress < len(chain) and json.dumps(chain[progress]) in prompt:
            progress += 1
        slip = rng.random() < self.noise
        if progress < len(chain):
            if not slip:
                return call("open", doc_id=chain[progress]), 0.3
            if rng.random() < 0.5:
                return call("open", doc_id=rng.choice(self.doc_ids)), 1.5
            return call("search", query=rng.choice(["harbour", "river", "founder", "museum"])), 1.5
        return f"<answer>{task.answer[0] if not slip else 'unknown'}</answer>", 2.0 if slip else 0.5

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams,
                 seeds: Sequence[int | None] | None = None) -> list[GenerationOutput]:  # fmt: skip
        outputs = []
        for i, prompt in enumerate(prompts):
            seed = seeds[i] if seeds is not None and seeds[i] is not None else sampling.seed
            rng = random.Random(f"{seed}:{len(prompt)}")
            text, entropy = self._act(self.tokenizer.decode(list(prompt)), rng)
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])[: sampling.max_new_tokens - 1]
            ids.append(self.tokenizer.eos_token_id)
            outputs.append(GenerationOutput(ids=ids, logprobs=[-0.1] * len(ids),
                                            entropy=[entropy + rng.random() * 0.1] + [0.1] * (len(ids) - 1),
                                            finish_reason="stop"))  # fmt: skip
        return outputs


def measure(name: str, episodes, stats: RunStats, wall_s: float, fork_env: bool) -> dict[str, float]:
    groups, tasks = defaultdict(list), defaultdict(list)
    sampled_calls = executed_calls = solved = 0
    for e in episodes:
        groups[e.group_id].append(e.outcome)
        tasks[e.group_id.split("/tree")[0]].append(e.outcome)
        solved += int(e.outcome >= 1.0)
        for t in e.turns:
            replayed = e.parent_id is not None and t.shared
            sampled_calls += 0 if replayed else len(t.tool_calls)
            executed_calls += 0 if (replayed and fork_env) else len(t.tool_calls)
            if fork_env and e.parent_id is None and t.shared:
                executed_calls += len(t.tool_calls)  # the trunk replays the root's prefix once per tree
    informative = sum(len(set(v)) > 1 for v in groups.values())
    informative_tasks = sum(len(set(v)) > 1 for v in tasks.values())
    k = stats.generated_tokens / 1000
    return {
        "episodes": len(episodes), "failed": sum(e.failed for e in episodes), "solved": solved,
        "generated_tokens": stats.generated_tokens, "groups": len(groups), "informative_groups": informative,
        "informative_per_1k": informative / k, "informative_tasks_per_1k": informative_tasks / k,
        "sampled_calls_per_solved": sampled_calls / max(solved, 1),
        "executed_calls_per_solved": executed_calls / max(solved, 1), "wall_s": wall_s,
    }  # fmt: skip


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=None)
    p.add_argument("--noise", type=float, default=0.3)
    args = p.parse_args()
    n_tasks = args.tasks or (6 if args.quick else 48)
    from agentrl.rollout.model import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m")
    env = agentrl.make(ENV_ID)
    tasks = list(env.unwrapped.tasks("train"))[:n_tasks]
    env.close()
    base = dict(max_new_tokens=64, max_context_tokens=8192, concurrency=4, tasks_per_step=n_tasks,
                episode_timeout_s=600.0)  # fmt: skip
    arms = {
        "chain (G=8)": RolloutConfig(group_size=8, **base),
        "tree last (2x4)": RolloutConfig(group_size=2, branches=3, branch_at="last", fork="env", **base),
        "tree uniform (2x4)": RolloutConfig(group_size=2, branches=3, branch_at="uniform", fork="env", **base),
        "tree entropy (2x4)": RolloutConfig(group_size=2, branches=3, branch_at="entropy", fork="env", **base),
    }
    results = {}
    for name, settings in arms.items():
        generator = NoisySolver(tokenizer, tasks, args.noise)
        stats = RunStats()
        start = time.perf_counter()
        episodes = run_episodes(ENV_ID, tasks, generator, tokenizer, settings, seed=0, stats=stats, progress=False)
        results[name] = measure(name, episodes, stats, time.perf_counter() - start, settings.fork == "env" and settings.branches > 0)

    chain = results["chain (G=8)"]
    print(f"\n| arm | episodes | failed | solved | generated tokens | informative groups / 1k tokens | "
          f"informative tasks / 1k tokens | sampled tool calls / solved | executed tool calls / solved | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['episodes']} | {r['failed']} | {r['solved']} | {r['generated_tokens']} | "
              f"{r['informative_per_1k']:.2f} ({r['informative_groups']}/{r['groups']}) | {r['informative_tasks_per_1k']:.2f} | "
              f"{r['sampled_calls_per_solved']:.2f} | {r['executed_calls_per_solved']:.2f} | {r['wall_s']:.1f} |")  # fmt: skip
    rows = []
    for name, r in results.items():
        baseline = None if name.startswith("chain") else "chain (G=8)"
        rows += [
            Row(f"{name}: informative groups / 1k generated tokens", r["informative_per_1k"], "groups",
                baseline, chain["informative_per_1k"] if baseline else None),
            Row(f"{name}: sampled tool calls / solved episode", r["sampled_calls_per_solved"], "calls",
                baseline, chain["sampled_calls_per_solved"] if baseline else None),
            Row(f"{name}: executed tool calls / solved episode", r["executed_calls_per_solved"], "calls",
                baseline, chain["executed_calls_per_solved"] if baseline else None),
            Row(f"{name}: generated tokens", float(r["generated_tokens"]), "tokens",
                baseline, float(chain["generated_tokens"]) if baseline else None),
        ]  # fmt: skip
    print_table(rows, f"tree vs chain rollouts, {ENV_ID}, {n_tasks} tasks, noise {args.noise}")
    write_json(args.json_path, "trees", rows, args.quick)


if __name__ == "__main__":
    main()
