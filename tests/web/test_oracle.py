"""The scripted oracle reaches success >= 95% on test goals through real actions."""

from __future__ import annotations

import pytest

import agentrl
from agentrl.envs.web.oracle import OptionsFirstWebShopOracle, WebShopOracle


def _run(count: int, oracle_cls: type = WebShopOracle, trace: list | None = None) -> tuple[float, float]:
    env = agentrl.make("agentrl/WebShop-v0", split="test")
    oracle = oracle_cls()
    successes, scores = 0.0, 0.0
    try:
        for task in env.unwrapped.tasks("test")[:count]:
            obs, _ = env.reset(options={"task": task})
            oracle.reset(task)
            done = False
            actions = []
            while not done:
                actions.append(oracle.act(obs))
                obs, reward, terminated, truncated, info = env.step(actions[-1])
                done = terminated or truncated
            if trace is not None:
                trace.append((task, actions))
            successes += info["metrics"]["success"]
            scores += info["metrics"]["score"]
    finally:
        env.close()
    return successes / count, scores / count


def test_oracle_on_the_first_60_test_goals():
    success, score = _run(60)
    assert success >= 0.95 and score >= 95.0


@pytest.mark.slow
def test_oracle_on_all_500_test_goals():
    success, score = _run(500)
    assert success >= 0.95 and score >= 95.0


def test_options_first_oracle_selects_options_before_the_features_check():
    trace: list = []
    success, score = _run(60, OptionsFirstWebShopOracle, trace)
    assert success >= 0.95 and score >= 95.0  # the selections survive the trip to Features and back
    checked = 0
    for task, actions in trace:
        options = set(task.payload["options"].values())
        if "click[Buy Now]" not in actions or not options or "click[Features]" not in actions:
            continue
        buy, features = actions.index("click[Buy Now]"), len(actions) - 1 - actions[::-1].index("click[Features]")
        clicks = [i for i, a in enumerate(actions) if a[6:-1] in options]
        # on the bought item: its options, then Features, back, buy
        assert clicks and max(clicks) < features < buy and actions[features + 1 : buy] == ["click[< Prev]"]
        checked += 1
    assert checked >= 10
