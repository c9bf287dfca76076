"""The web env end to end over real HTTP: scripted episodes, bad actions, a killed server, concurrency."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

import agentrl
from agentrl.env import Task
from agentrl.envs.web import manager
from agentrl.envs.web.browser import RESTART_NOTICE
from agentrl.envs.web.catalog import Goal
from agentrl.envs.web.oracle import WebShopOracle
from agentrl.errors import EnvError


@pytest.fixture(scope="module")
def env():
    env = agentrl.make("agentrl/WebShop-v0", split="test")
    yield env
    env.close()


def _goal(env, index: int) -> tuple[Task, Goal]:
    task = env.unwrapped.tasks("test")[index]
    return task, Goal.from_dict(task.payload)


def _open_target(env, task: Task, goal: Goal) -> str:
    obs, _ = env.reset(options={"task": task})
    assert obs.startswith(f"Instruction: {goal.instruction}") and "[Search]" in obs
    target = env.unwrapped.catalog.by_asin[goal.asin]
    obs, reward, terminated, truncated, _ = env.step(f"search[{target.title}]")
    assert f"[{goal.asin}]" in obs and (reward, terminated, truncated) == (0.0, False, False)
    obs, *_ = env.step(f"click[{goal.asin}]")
    assert target.title in obs and f"Price: ${target.price:.2f}" in obs
    return obs


def test_scripted_episode_buys_the_target_with_options(env):
    task, goal = _goal(env, 0)
    _open_target(env, task, goal)
    for value in goal.options.values():
        obs, reward, terminated, _, _ = env.step(f"click[{value}]")
        assert f"[{value}] (selected)" in obs and (reward, terminated) == (0.0, False)
    obs, reward, terminated, truncated, info = env.step(
        '<tool_call>{"name": "click", "arguments": {"element": "Buy Now"}}</tool_call>'
    )
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert "Thank you for shopping" in obs and "Your score (min 0.0, max 1.0): 1.00" in obs
    metrics = info["metrics"]
    assert (metrics["score"], metrics["success"], metrics["purchased"], metrics["invalid_actions"]) == (
        100,
        1,
        1,
        0,
    )
    assert (
        json.loads(info["answer"])["asin"] == goal.asin
        and json.loads(info["answer"])["options"] == goal.options
    )


def test_buying_without_options_and_over_the_price_cap(env):
    task, goal = _goal(env, 1)
    _open_target(env, task, goal)
    *_, reward, terminated, _, info = env.step("click[buy now]")  # labels match case-insensitively
    n_att, n_opt = len(goal.attributes), len(goal.options)
    assert terminated and reward == pytest.approx((n_att + 0 + 1) / (n_att + n_opt + 1))
    assert info["metrics"]["r_opt"] == 0.0 and info["metrics"]["success"] == 0.0

    price = env.unwrapped.catalog.by_asin[goal.asin].price
    cheap = replace(goal, price_upper=float(int(price) - 1) if price > 2 else 0.5)
    cheap_task = Task(id="cheap", question=cheap.instruction, split="test", payload=cheap.to_dict())
    _open_target(env, cheap_task, cheap)
    for value in cheap.options.values():
        env.step(f"click[{value}]")
    *_, reward, _, _, info = env.step("click[Buy Now]")
    assert (
        reward == pytest.approx((n_att + n_opt) / (n_att + n_opt + 1)) and info["metrics"]["r_price"] == 0.0
    )


def test_invalid_and_adversarial_actions_are_no_op_observations(env):
    task, _ = _goal(env, 2)
    env.reset(options={"task": task})
    obs, reward, terminated, _, _ = env.step("click[Not On This Page]")
    assert obs.startswith("Invalid action: 'Not On This Page' is not a clickable element") and not terminated
    obs, *_ = env.step("click[Search]")
    assert "write search[your keywords]" in obs
    obs, *_ = env.step("search[" + "shoes " * 400 + "]")
    assert "the limit is 500" in obs
    obs, *_ = env.step('search[<script>alert("x")</script> <b>bold</b> & "quotes"]')
    assert 'Results for: <script>alert("x")</script> <b>bold</b> & "quotes"' in obs  # shown as text
    obs, *_ = env.step("click[Back to Search]")
    obs, *_ = env.step('search[<a href="/evil">evil</a>]')
    assert 'Results for: <a href="/evil">evil</a>' in obs and "[evil]" not in obs  # never a clickable
    obs, *_ = env.step("click[evil]")
    assert "'evil' is not a clickable element" in obs
    obs, *_ = env.step("click[Back to Search]")
    obs, *_ = env.step("search[café ☕ 日本語 sandals]")
    assert "Total results:" in obs
    assert "Results for: café ☕ 日本語 sandals" in obs
    obs, *_ = env.step(f"click[{obs.splitlines()[5][1:-1]}]")  # first result's ASIN
    obs, *_ = env.step("search[shoes]")
    assert "there is no search box on this page" in obs
    obs, *_ = env.step("completely unrelated text")
    assert "No tool call or answer found" in obs
    *_, info = env.step("<answer>I bought it</answer>")  # typing an answer is not buying
    metrics = info["metrics"]
    assert (
        metrics["invalid_actions"] == 5.0 and metrics["purchased"] == 0.0 and info["metrics"]["reward"] == 0.0
    )


def test_markup_in_search_terms_is_rendered_as_text():
    from agentrl.envs.web.browser import parse_page

    page = parse_page('<p>You searched: &lt;script&gt;alert(1)&lt;/script&gt;</p><a href="/x">A &amp; B</a>')
    assert page.text == "You searched: <script>alert(1)</script>\n[A & B]" and page.labels() == ["A & B"]


def test_step_budget_truncates(env):
    task, _ = _goal(env, 3)
    env.reset(options={"task": task})
    for turn in range(1, 16):
        obs, reward, terminated, truncated, info = env.step("click[nothing here]")
        assert not terminated and truncated == (turn == 15)
    assert (
        reward == 0.0 and info["metrics"]["invalid_actions"] == 15.0 and info["metrics"]["truncated"] == 1.0
    )


def test_server_killed_mid_episode_is_restarted_and_the_episode_told(env):
    task, goal = _goal(env, 4)
    env.reset(options={"task": task})
    env.step(f"search[{goal.noun}]")
    server = env.unwrapped._server
    old_pid = server.pid
    os.kill(old_pid, signal.SIGKILL)
    time.sleep(0.2)
    obs, reward, terminated, truncated, _ = env.step("click[Next >]")
    assert obs.startswith(RESTART_NOTICE) and "[Search]" in obs and not (terminated or truncated)
    assert server.pid != old_pid and server.restarts >= 1
    oracle = WebShopOracle()
    oracle.reset(task)
    done = False
    while not done:
        obs, reward, terminated, truncated, info = env.step(oracle.act(obs))
        done = terminated or truncated
    assert info["metrics"]["server_restarts"] == 1.0 and reward == 1.0


def test_concurrent_sessions_stay_isolated():
    envs = [agentrl.make("agentrl/WebShop-v0", split="test") for _ in range(12)]
    results: dict[int, dict] = {}

    def play(index: int) -> None:
        env = envs[index]
        task = env.unwrapped.tasks("test")[20 + index]
        oracle = WebShopOracle()
        obs, _ = env.reset(options={"task": task})
        oracle.reset(task)
        done = False
        while not done:
            obs, reward, terminated, truncated, info = env.step(oracle.act(obs))
            done = terminated or truncated
        results[index] = {"goal": task.payload, "answer": info["answer"], "reward": reward, "obs": obs}

    try:
        for index in range(len(envs)):  # sequential run first: the expected outcomes
            play(index)
        expected = {i: (r["answer"], r["reward"]) for i, r in results.items()}
        results.clear()
        threads = [threading.Thread(target=play, args=(i,)) for i in range(len(envs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert len({id(env.unwrapped._server) for env in envs}) == 1  # one shared server
    finally:
        for env in envs:
            env.close()
    assert len(results) == len(envs)
    for result in results.values():
        assert result["obs"].startswith(
            f"Instruction: {result['goal']['instruction']}"
        )  # its own instruction
    assert {i: (r["answer"], r["reward"]) for i, r in results.items()} == expected
    assert sum(reward for _, reward in expected.values()) >= 10  # the oracle mostly succeeds


def test_sessions_are_independent_over_http():
    server = manager.acquire(seed=0, n_products=1500)
    try:
        client = httpx.Client(base_url=server.url)
        a = client.post("/api/sessions", json={"instruction": "session A"}).json()["session_id"]
        b = client.post("/api/sessions", json={"instruction": "session B"}).json()["session_id"]
        asin = next(iter(client.app.state.shop.catalog.by_asin)) if hasattr(client, "app") else None
        asin = asin or _first_asin(client, a)
        done = client.post(f"/s/{a}/buy/{asin}", data={})
        assert done.headers["x-shop-done"] == "1"
        page_b = client.get(f"/s/{b}/search", params={"q": "shoes"})
        assert "session B" in page_b.text and "x-shop-done" not in page_b.headers
        assert "Thank you" in client.get(f"/s/{a}").text  # A stays finished
        gone = client.get("/s/not-a-session")
        assert gone.status_code == 404 and gone.headers["x-shop-error"] == "unknown-session"
        assert client.post("/api/sessions", content=b"not json").status_code == 400
    finally:
        manager.release(server)


def _first_asin(client: httpx.Client, sid: str) -> str:
    text = client.get(f"/s/{sid}/search", params={"q": "shoes"}).text
    return text.split(f"/s/{sid}/item/")[1].split("?")[0]


def test_close_twice_stops_the_server():
    env = agentrl.make("agentrl/Web-v0", n_products=300)
    env.reset(seed=0)
    server = env.unwrapped._server
    pid = server.pid
    assert Path(f"/proc/{pid}").exists()
    env.close()
    env.close()
    assert not Path(f"/proc/{pid}").exists()
    assert server not in manager.running_servers()


def test_external_server_url_is_used_and_checked():
    server = manager.acquire(seed=0, n_products=1500)
    try:
        env = agentrl.make("agentrl/WebShop-v0", split="test", server_url=server.url)
        obs, _ = env.reset(seed=0)
        assert "[Search]" in obs and env.unwrapped._server is None  # nothing started by this env
        env.close()
        wrong = agentrl.make("agentrl/WebShop-v0", split="test", n_products=200, server_url=server.url)
        with pytest.raises(EnvError, match="catalogue"):
            wrong.reset(seed=0)
        wrong.close()
    finally:
        manager.release(server)
