"""Tree rollouts with rollout.fork=env (branches get fork()s of one trunk env) and branch_at=entropy."""

from __future__ import annotations

import threading

import pytest
from tests.rollout.toy import LookupEnv

from agentrl.env import ObservationBudget, TurnBudget
from agentrl.errors import ConfigError
from agentrl.rollout.generators.hf import HFGenerator
from agentrl.rollout.runner import Runner, RunStats, run_episodes
from agentrl.rollout.settings import RolloutConfig
from agentrl.rollout.tree import entropy_branch_turn
from agentrl.trajectory import Episode, Segment, Turn


class CountingLookupEnv(LookupEnv):
    """LookupEnv that forks (its tool is stateless: a copy is a fork) and counts what runs."""

    fork_method = "copy"
    lock = threading.Lock()
    counts = {"made": 0, "closed": 0, "forks": 0, "lookups": 0, "steps": 0}

    def __init__(self):
        super().__init__()
        self._count("made")

    @classmethod
    def _count(cls, key):
        with cls.lock:
            cls.counts[key] += 1

    def make_tools(self):
        (lookup,) = super().make_tools()
        inner = lookup.call

        def call(arguments):
            self._count("lookups")
            return inner(arguments)

        lookup.call = call
        return [lookup]

    def step(self, action):
        self._count("steps")
        obs, reward, terminated, truncated, info = super().step(action)
        # an observation that depends on the episode's state, so a fork with a wrong state shows
        return f"{obs} [turn {self._turn}, void {int(self._metrics['void_turns'])}]", reward, terminated, truncated, info

    def fork_attach(self, parent):
        self._count("forks")
        self._count("made")

    def on_close(self):
        if not getattr(self, "_counted_close", False):
            self._counted_close = True
            self._count("closed")


def make_counting_env():
    return TurnBudget(ObservationBudget(CountingLookupEnv(), 2000), 3)


make_counting_env.env_class = CountingLookupEnv  # how a factory says what it builds (rollout.fork)


def _settings(**changes) -> RolloutConfig:
    base = dict(max_new_tokens=12, max_context_tokens=1024, temperature=1.0, concurrency=16, group_size=2,
                branches=3, max_turns=3)  # fmt: skip
    return RolloutConfig(**{**base, **changes})


def _run(tiny, tokenizer, stats=None, **changes):
    CountingLookupEnv.counts = dict.fromkeys(CountingLookupEnv.counts, 0)
    gen = HFGenerator(tiny, tokenizer, max_batch_size=16)
    return run_episodes(make_counting_env, ["k1", "k2"], gen, tokenizer, _settings(**changes), seed=7, stats=stats)


def _essence(episode):
    return (episode.episode_id, episode.group_id, episode.parent_id, episode.branch_turn, episode.outcome,
            episode.error, [(t.output_ids, t.output_logprobs, t.obs_ids, t.shared, t.reward) for t in episode.turns])  # fmt: skip


@pytest.mark.parametrize("branch_at", ["uniform", "last"])
def test_fork_env_gives_the_trees_replay_gives_with_the_prefix_run_once(tiny, tokenizer, branch_at):
    replayed = _run(tiny, tokenizer, branch_at=branch_at, fork="replay")
    replay_counts = dict(CountingLookupEnv.counts)
    forked = _run(tiny, tokenizer, branch_at=branch_at, fork="env")
    counts = dict(CountingLookupEnv.counts)
    assert [_essence(e) for e in forked] == [_essence(e) for e in replayed]
    assert not any(e.failed for e in forked)
    assert replay_counts["forks"] == 0 and counts["forks"] > 0
    assert counts["made"] == counts["closed"]  # every env and fork is closed, the trunks included
    # the prefix's env steps (and tool calls) run once per tree (the trunk), not once per branch
    roots = [e for e in forked if e.parent_id is None]
    prefix_steps = sum(r.branch_turn for r in roots)
    prefix_calls = sum(len(t.tool_calls) for r in roots for t in r.turns[: r.branch_turn])
    assert prefix_steps > 0
    assert replay_counts["steps"] - counts["steps"] == 2 * prefix_steps  # 3 branches: 3 replays -> 1 trunk
    assert replay_counts["lookups"] - counts["lookups"] == 2 * prefix_calls


def test_fork_env_on_an_env_that_cannot_fork_is_refused_and_auto_replays(tiny, tokenizer):
    from tests.rollout.toy import make_lookup_env  # LookupEnv declares no fork

    with pytest.raises(ConfigError, match=r"rollout\.fork"):
        Runner(make_lookup_env, tokenizer, generator=HFGenerator(tiny, tokenizer), config=_settings(fork="env"))
    runner = Runner(make_lookup_env, tokenizer, generator=HFGenerator(tiny, tokenizer), config=_settings(fork="auto"))
    assert runner.fork_envs is False
    runner = Runner("agentrl/Search-v0", tokenizer, generator=HFGenerator(tiny, tokenizer), config=_settings(fork="auto"))
    assert runner.fork_envs is True
    with pytest.raises(ConfigError, match=r"rollout\.fork"):
        RolloutConfig(branches=2, fork="snapshot").validate()


def _turn(index, entropy, tool=True):
    return Turn(index=index, output_ids=[1, 2], output_logprobs=[0.0, 0.0], output_entropy=entropy,
                tool_calls=[{"name": "lookup"}] if tool else [])  # fmt: skip


def _episode(turns):
    return Episode(episode_id="e", env_id="x", task_id="t", segments=[Segment(prompt_ids=[0], turns=turns)])


def test_entropy_branch_point_is_after_the_tool_result_with_the_most_uncertain_next_token():
    # turn k's first-token entropy counts only when turn k-1 called a tool; turn 0 follows the task
    turns = [_turn(0, [9.0, 0.1]), _turn(1, [0.5, 3.0]), _turn(2, [1.5, 0.0], tool=False), _turn(3, [4.0])]
    assert entropy_branch_turn(_episode(turns)) == 2  # turn 3 follows a turn without a tool call
    turns[2] = _turn(2, [1.5, 0.0])
    assert entropy_branch_turn(_episode(turns)) == 3
    turns[3] = _turn(3, [1.5])
    assert entropy_branch_turn(_episode(turns)) == 2  # a tie: the earliest
    no_entropy = [_turn(0, None), _turn(1, None), _turn(2, None)]
    assert entropy_branch_turn(_episode(no_entropy)) == 2  # the last rule
    assert entropy_branch_turn(_episode([_turn(0, [1.0])])) == 0


def test_branch_at_entropy_runs_and_forks_where_the_rule_says(tiny, tokenizer):
    stats = RunStats()
    episodes = _run(tiny, tokenizer, stats=stats, branch_at="entropy", fork="auto")
    roots = [e for e in episodes if e.parent_id is None]
    assert roots and all(r.branch_turn == entropy_branch_turn(r) for r in roots)
    assert all(not e.failed for e in episodes)
    assert all(e.branch_turn == roots[i // 4].branch_turn for i, e in enumerate(episodes))
