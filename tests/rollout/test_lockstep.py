"""Decode batches that do not depend on timing (lock-step), the default with an in-process generator:
a row's log-probs depend on which prompts share its batch, so timing-dependent batches make the same
seed give different runs."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentrl.rollout.batcher import Batcher
from agentrl.rollout.generators.base import SamplingParams
from agentrl.rollout.generators.hf import HFGenerator
from agentrl.rollout.generators.openai import OpenAIGenerator
from agentrl.rollout.runner import LOCKSTEP_WAIT_S, lockstep_mode

from .toy import LookupEnv

SAMPLING = SamplingParams(max_new_tokens=6, temperature=1.0)


def _prompts(tokenizer) -> list[list[int]]:
    texts = ("short", "a somewhat longer prompt than the first one", "the longest prompt of the three, by a few words")
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def _staggered(gen, prompts, delays, **batcher_options):
    """Three episodes (entered at once) that ask after ``delays`` seconds, as env steps of
    different lengths would; returns (outputs, decode calls, batches cut)."""

    async def main():
        batcher = Batcher(gen, max_batch_size=8, **batcher_options)
        for _ in prompts:
            batcher.enter()

        async def episode(i):
            await asyncio.sleep(delays[i])
            try:
                return await batcher.submit(prompts[i], SamplingParams(6, 1.0, seed=100 + i))
            finally:
                batcher.leave()

        outs = await asyncio.gather(*(episode(i) for i in range(len(prompts))))
        await batcher.stop()
        return outs, batcher.calls, batcher.cut

    return asyncio.run(main())


def test_lockstep_batches_do_not_depend_on_when_episodes_ask(tiny, tokenizer):
    gen = HFGenerator(tiny, tokenizer, max_batch_size=8)
    prompts = _prompts(tokenizer)
    together = gen.generate(prompts, SAMPLING, seeds=[100, 101, 102])  # the wave as one batch
    for delays in ((0.0, 0.0, 0.0), (0.0, 0.05, 0.2), (0.2, 0.0, 0.1)):
        outs, calls, cut = _staggered(gen, prompts, delays, lockstep=True)
        assert calls == 1 and cut == 0, delays
        assert [o.ids for o in outs] == [o.ids for o in together]
        assert [o.logprobs for o in outs] == [o.logprobs for o in together]  # bit for bit
    # without lockstep the late askers get batches of their own: other shapes, other floats
    _, calls, _ = _staggered(gen, prompts, (0.0, 0.05, 0.2), lockstep=False)
    assert calls == 3


def test_a_capped_lockstep_wait_goes_ahead_without_a_slow_episode_and_counts_it(tiny, tokenizer):
    gen = HFGenerator(tiny, tokenizer, max_batch_size=8)
    prompts = _prompts(tokenizer)
    # the third episode's env call takes 0.5 s, the cap is 0.1 s: the first two go ahead together
    outs, calls, cut = _staggered(gen, prompts, (0.0, 0.0, 0.5), lockstep=True, lockstep_wait_s=0.1)
    assert (calls, cut) == (2, 1)
    pair = gen.generate(prompts[:2], SAMPLING, seeds=[100, 101])
    assert [o.logprobs for o in outs[:2]] == [o.logprobs for o in pair]


def test_lockstep_is_the_default_for_in_process_generators_only(tiny, tokenizer):
    assert lockstep_mode(None, HFGenerator(tiny, tokenizer)) == (True, LOCKSTEP_WAIT_S)
    remote = OpenAIGenerator("http://127.0.0.1:9/v1", model="tiny")
    assert lockstep_mode(None, remote) == (False, LOCKSTEP_WAIT_S)  # each request its own
    assert lockstep_mode(True, remote) == (True, None)  # train.deterministic: no cap
    assert lockstep_mode(False, HFGenerator(tiny, tokenizer)) == (False, None)


@pytest.mark.parametrize(("lockstep", "resolved"), [(None, (True, LOCKSTEP_WAIT_S)), (False, (False, None))])
def test_the_runner_resolves_lockstep_from_its_generator_and_runs_the_wave(tiny, tokenizer, lockstep, resolved):
    from agentrl.rollout.runner import Runner, RunStats, run_episodes
    from agentrl.rollout.settings import RolloutConfig

    gen = HFGenerator(tiny, tokenizer)
    config = RolloutConfig(max_new_tokens=4, max_turns=2, group_size=2, concurrency=4, temperature=1.0)
    runner = Runner("agentrl/Search-v0", tokenizer, generator=gen, config=config, lockstep=lockstep)
    assert (runner.lockstep, runner.lockstep_wait_s) == resolved
    stats = RunStats()
    episodes = run_episodes("agentrl/Search-v0", [None, None], gen, tokenizer, config, seed=3, stats=stats,
                            progress=False, env_kwargs={"max_turns": 2}, lockstep=lockstep)  # fmt: skip
    assert len(episodes) == 4 and not any(ep.failed for ep in episodes)
    assert stats.as_metrics()["rollout/lockstep_cut"] == 0.0  # the search env answers in milliseconds


class _PacedEnv(LookupEnv):
    """The lookup env whose episode of task ``k<i>`` lasts ``turns[i]`` turns (then ends, whatever
    the action) and whose step at turn ``t`` takes ``delays[(i, t)]`` seconds more."""

    def __init__(self, turns: dict[int, int], delays: dict[tuple[int, int], float]):
        super().__init__()
        self.turns, self.delays = turns, delays

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        index = int(self.task.id[1:])
        time.sleep(self.delays.get((index, self._turn), 0.0))
        if self._turn >= self.turns.get(index, 99):
            self._done = True
            return obs, reward, terminated, True, info
        return obs, reward, terminated, truncated, info


def _paced_run(tiny, tokenizer, slow: int, lockstep: bool | None):
    """Two slots, three episodes (k0 one turn, k1 and k2 two), the first step of ``k<slow>`` 0.4 s
    long; returns (rows of each decode call, every turn's sampler log-probs, the run's metrics)."""
    from agentrl.rollout.runner import RunStats, run_episodes
    from agentrl.rollout.settings import RolloutConfig

    gen = HFGenerator(tiny, tokenizer, prefix_cache_tokens=0)
    config = RolloutConfig(max_new_tokens=4, max_turns=3, group_size=1, concurrency=2, temperature=1.0)
    calls = []
    generate = gen.generate

    def recording(prompts, sampling, on_token=None, *, seeds=None):
        calls.append(len(prompts))
        return generate(prompts, sampling, on_token, seeds=seeds)

    gen.generate = recording
    stats = RunStats()
    env = lambda: _PacedEnv({0: 1, 1: 2, 2: 2}, {(slow, 1): 0.4})  # noqa: E731
    episodes = run_episodes(env, ["k0", "k1", "k2"], gen, tokenizer, config, seed=5, stats=stats, progress=False,
                            lockstep=lockstep)
    assert not any(ep.failed for ep in episodes)
    assert [len(ep.segments[0].turns) for ep in episodes] == [1, 2, 2]
    return calls, [[t.output_logprobs for t in ep.segments[0].turns] for ep in episodes], stats.as_metrics()


@pytest.mark.parametrize("lockstep", [None, True])  # the default (60 s wait cap) and train.deterministic
def test_a_freed_slot_holds_the_next_lockstep_batch_for_the_episode_that_takes_it(tiny, tokenizer, lockstep):
    """When k0's last step is the slow one, k1 has asked its second turn before k0 ends; the batch
    must still wait for k2, which takes k0's slot, so the batches are those of a run where k1's step
    is the slow one: [k0, k1], [k1, k2], [k2]. Before the handover, with the uncapped wait of
    ``train.deterministic`` [k1] went alone there (4 decode calls against 3, other floats: the same
    seed gave another run depending on how long env steps took); with the capped wait it held only
    because asyncio's ``wait_for`` (Python 3.11) woke the batcher one event-loop pass later."""
    slow_end = _paced_run(tiny, tokenizer, 0, lockstep)
    slow_step = _paced_run(tiny, tokenizer, 1, lockstep)
    for calls, _, metrics in (slow_end, slow_step):
        assert calls == [2, 2, 1]
        assert metrics["rollout/decode_batches"] == 3.0 and metrics["rollout/lockstep_cut"] == 0.0
    assert slow_end[1] == slow_step[1]  # every turn's log-probs, bit for bit
