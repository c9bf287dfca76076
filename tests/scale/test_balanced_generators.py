"""Several generation engines behind one generator: sticky per episode, least outstanding, same episodes."""

from __future__ import annotations

import pytest

from agentrl.errors import ConfigError
from agentrl.rollout.generators.balanced import BalancedGenerator
from agentrl.rollout.generators.base import SamplingParams, make_generator
from agentrl.rollout.generators.scripted import ScriptedGenerator
from agentrl.rollout.runner import run_episodes
from agentrl.rollout.settings import RolloutConfig
from tests.rollout.test_agent import lookup_script
from tests.rollout.toy import make_lookup_env

KEYS = [f"k{i}" for i in range(1, 7)]


def _config() -> RolloutConfig:
    return RolloutConfig(max_new_tokens=64, concurrency=4, group_size=1)


def _canonical(episode) -> dict:
    record = episode.to_dict()
    for key in ("episode_id", "timings"):
        record.pop(key)
    for segment in record["segments"]:
        for turn in segment["turns"]:
            turn.pop("timings")
            for call in turn["tool_calls"]:
                call.pop("seconds", None)
    return record


def test_episodes_stick_to_one_engine_and_both_engines_serve(tokenizer):
    engines = [ScriptedGenerator(tokenizer, lookup_script), ScriptedGenerator(tokenizer, lookup_script)]
    balanced = run_episodes(make_lookup_env, KEYS, BalancedGenerator(engines), tokenizer, _config())
    single = run_episodes(
        make_lookup_env, KEYS, ScriptedGenerator(tokenizer, lookup_script), tokenizer, _config()
    )
    assert [_canonical(e) for e in balanced] == [_canonical(e) for e in single]
    first = [e.segments[0].prompt_ids for e in balanced]
    owners = []
    for prompt in first:  # the engines whose calls extend this episode's first prompt
        owners.append({i for i, g in enumerate(engines) for p, _ in g.calls if p[: len(prompt)] == prompt})
    assert all(len(o) == 1 for o in owners), owners  # sticky: one engine per episode
    assert {next(iter(o)) for o in owners} == {0, 1}  # balanced: both engines got episodes
    assert sum(len(g.calls) for g in engines) == sum(len(e.turns) for e in balanced)


def test_new_episodes_go_to_the_least_busy_engine_and_turns_follow_their_episode(tokenizer):
    engines = [ScriptedGenerator(tokenizer, lambda p, i: "a"), ScriptedGenerator(tokenizer, lambda p, i: "b")]
    gen = BalancedGenerator(engines)
    sampling = SamplingParams(max_new_tokens=4)
    starts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
    gen.generate(starts, sampling)
    assert gen.served == [2, 2] and gen.outstanding == [0, 0]
    owner = {tuple(p): i for i, g in enumerate(engines) for p, _ in g.calls}
    later = [[1, 2, 3, 50, 51], [10, 60], [4, 5, 70]]
    outputs = gen.generate(later, sampling)
    for prompt, out in zip(later, outputs, strict=True):
        expected = owner[tuple(p for p in prompt if p < 50)]
        assert tokenizer.decode(out.ids[:-1]) == "ab"[expected]
    gen.reset_cache()  # a new run: routing starts over
    assert gen.served == [0, 0]


def test_comma_separated_base_urls_build_one_client_per_server():
    gen = make_generator(
        "openai", base_url="http://10.0.0.1:8000/v1, http://10.0.0.2:8000/v1/", model_name="m"
    )
    assert isinstance(gen, BalancedGenerator)
    assert [b.base_url for b in gen.backends] == ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"]
    with pytest.raises(ConfigError) as err:
        make_generator("openai", base_url="http://10.0.0.1:8000/v1,", model_name="m")
    assert err.value.field == "rollout.base_url"


def test_new_weights_reach_every_engine(tokenizer):
    import torch

    from agentrl.rollout.model import tiny_model

    engines = [make_generator("hf", model=tiny_model(tokenizer, layers=1, hidden=32, seed=s), tokenizer=tokenizer)
               for s in (1, 2)]  # fmt: skip
    source = tiny_model(tokenizer, layers=1, hidden=32, seed=3)
    BalancedGenerator(engines).update_weights(
        (n, p.detach()) for n, p in source.named_parameters()
    )  # an iterator
    for engine in engines:
        for (name, got), (_, want) in zip(
            engine.model.named_parameters(), source.named_parameters(), strict=True
        ):
            assert torch.equal(got, want), name
