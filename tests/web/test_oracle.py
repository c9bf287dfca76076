"""The scripted oracle reaches success >= 95% on test goals through real actions."""

from __future__ import annotations

import pytest

import agentrl
from agentrl.envs.web.oracle import WebShopOracle


def _run(count: int) -> tuple[float, float]:
    env = agentrl.make("agentrl/WebShop-v0", split="test")
    oracle = WebShopOracle()
    successes, scores = 0.0, 0.0
    try:
        for task in env.unwrapped.tasks("test")[:count]:
            obs, _ = env.reset(options={"task": task})
            oracle.reset(task)
            done = False
            while not done:
                obs, reward, terminated, truncated, info = env.step(oracle.act(obs))
                done = terminated or truncated
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
