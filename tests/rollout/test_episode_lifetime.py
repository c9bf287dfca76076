"""A finished episode frees its env (and the sandboxes it leased) by reference counting alone.

The loop (EpisodeRun) owns its context strategy and the strategy refers back to the loop only
weakly, and a closed env drops its tools (which usually close over it), so nothing of an episode
waits for Python's cycle collector: these tests run with the collector off and check that the
loop, its context and its env are gone once the caller drops them.
"""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

import pytest

from agentrl.rollout.agent import EpisodeRun, ModelPolicy
from agentrl.rollout.generators.scripted import ScriptedGenerator
from agentrl.rollout.runner import run_episodes
from agentrl.rollout.settings import RolloutConfig

from .test_agent import lookup_script
from .test_folding import branch_script
from .toy import make_lookup_env


@pytest.fixture
def no_cycle_collector():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("folding", ["none", "branch", "summary"])
def test_a_finished_episode_run_is_freed_by_refcount(tokenizer, no_cycle_collector, folding):
    gen = ScriptedGenerator(tokenizer, branch_script if folding == "branch" else lookup_script)

    async def submit(ids, sampling):
        return gen.generate([ids], sampling)[0]

    env = make_lookup_env()
    settings = RolloutConfig(max_new_tokens=96, folding=folding, scope_judge="rule")
    run = EpisodeRun(
        env, ModelPolicy(submit), tokenizer, settings, env_id="lookup", options={"task_id": "k3"}
    )
    episode = asyncio.run(run.run())
    assert episode.error is None and episode.outcome == 1.0
    assert {seg.kind for seg in episode.segments} >= {"main"}
    refs = {"run": weakref.ref(run), "context": weakref.ref(run.context), "env": weakref.ref(env.unwrapped)}
    env.close()  # as the runner does (a closed env drops its tools, which close over it)
    del run, env
    assert {name: ref() is None for name, ref in refs.items()} == dict.fromkeys(refs, True)


def test_the_runner_leaves_no_env_alive_after_a_run(tokenizer, no_cycle_collector):
    made: list[weakref.ref] = []

    def factory():
        env = make_lookup_env()
        made.append(weakref.ref(env.unwrapped))
        return env

    gen = ScriptedGenerator(tokenizer, lookup_script)
    settings = RolloutConfig(max_new_tokens=64, concurrency=2, group_size=2)
    episodes = run_episodes(factory, ["k1", "k2"], gen, tokenizer, settings)
    assert [e.outcome for e in episodes] == [1.0] * 4 and len(made) == 4
    deadline = time.monotonic() + 30  # the runner closes envs in its pool threads, without waiting
    while any(ref() is not None for ref in made) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [ref() is None for ref in made] == [True] * 4
