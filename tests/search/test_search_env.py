"""Search env: scripted multi-turn episodes, scoring, check_env, oracle, errors."""

from __future__ import annotations

import json

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import agentrl
from agentrl.env import Task
from agentrl.envs.search.oracle import SearchOracle, run_oracle, tool_call
from agentrl.errors import EnvError

SEARCH_IDS = ["agentrl/Search-v0", "agentrl/SearchMultiHop-v0"]


@pytest.fixture(scope="module")
def env():
    env = agentrl.make("agentrl/Search-v0")
    yield env
    env.close()


def _task(env, hops: int, last_relation: str | None = None) -> Task:
    return next(
        t
        for t in env.unwrapped.tasks("train")
        if t.level == hops and (last_relation is None or t.payload["relations"][-1] == last_relation)
    )


@pytest.mark.parametrize("env_id", SEARCH_IDS)
def test_check_env_on_unwrapped(env_id: str) -> None:
    env = agentrl.make(env_id)
    check_env(env.unwrapped, skip_render_check=True)
    env.close()
    env.close()


def test_gymnasium_make_works() -> None:
    env = gymnasium.make("agentrl/SearchMultiHop-v0")
    obs, info = env.reset(seed=3)
    assert info["level"] in (2, 3) and obs == env.unwrapped.task.question
    env.close()


def test_scripted_two_hop_episode_per_turn(env) -> None:
    """founder -> birth_city: search, open, search, open, answer; every observation checked."""
    u = env.unwrapped
    wiki = u.wiki
    task = next(t for t in u.tasks("train") if t.payload["relations"] == ["founder", "birth_city"])
    company = wiki.entity(task.payload["start_id"])
    founder = wiki.value(company, "founder")
    city = wiki.value(founder, "birth_city")
    company_page, founder_page = wiki.page_of(company), wiki.page_of(founder)

    obs, info = env.reset(seed=0, options={"task": task})
    assert obs == f"In which city was the founder of {company.name} born?"
    assert info["turn"] == 0 and info["task_id"] == task.id and info["level"] == 2

    obs, reward, terminated, truncated, info = env.step(tool_call("search", query=company.name, k=3))
    assert obs.startswith(f'Results for "{company.name}":\n[1] {company_page.doc_id} | {company.name}\n')
    assert obs.count("\n[") == 3 and obs.endswith("Use open(doc_id) to read a whole page.")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["turn"] == 1 and info["tool_calls"][0]["name"] == "search" and info["tool_calls"][0]["ok"]

    obs, reward, terminated, truncated, info = env.step(tool_call("open", doc_id=company_page.doc_id))
    assert obs == f"{company.name} ({company_page.doc_id})\n{company_page.text}"
    assert f"Founder: {founder.name}" in obs and reward == 0.0 and not terminated

    # ReAct style works too for a one-argument tool
    obs, reward, terminated, _, info = env.step(f"search[{founder.name}]")
    assert f"{founder_page.doc_id} | {founder.name}" in obs and not terminated

    obs, reward, terminated, _, _ = env.step(tool_call("open", doc_id=founder_page.doc_id))
    assert f"Birthplace: {city.name}" in obs

    obs, reward, terminated, truncated, info = env.step(f"I found it. <answer>{city.name}</answer>")
    assert (obs, reward, terminated, truncated) == ("", 1.0, True, False)
    assert info["answer"] == city.name and info["ground_truth"] == [city.name]
    metrics = info["metrics"]
    assert metrics["em"] == metrics["f1"] == metrics["reward"] == 1.0
    assert metrics["tool_calls"] == 4 and metrics["tool_errors"] == 0 and metrics["turns"] == 5


def test_scripted_episode_with_mistakes(env) -> None:
    task = _task(env, 1, "population")
    wiki = env.unwrapped.wiki
    page = wiki.page_of(task.payload["start_id"])
    env.reset(seed=0, options={"task": task})

    obs, reward, *_, info = env.step('<tool_call>{"name": "search", "arguments": {"query": </tool_call>')
    assert obs.startswith("Your <tool_call> is not valid JSON") and reward == 0.0
    assert info["action_problems"] == ["malformed_json"]

    obs, *_ = env.step(tool_call("open", doc_id="d999999"))
    assert obs == "Error: no page with doc id 'd999999'; use a doc id from the search results"

    obs, *_ = env.step(tool_call("search", query="x", k=50))
    assert obs == "Error: k must be between 1 and 10, got 50"

    obs, *_ = env.step(tool_call("search", query="   "))
    assert obs.startswith("Error: query is empty")

    obs, *_ = env.step(tool_call("lookup", query="x"))
    assert obs.startswith("Unknown tool 'lookup'")

    obs, *_ = env.step(tool_call("open", doc_id=page.doc_id))
    assert "Population: " in obs

    obs, reward, terminated, truncated, info = env.step("<answer>42</answer>")
    assert (reward, terminated, truncated) == (0.0, True, False)
    m = info["metrics"]
    assert (m["em"], m["f1"], m["tool_calls"], m["tool_errors"], m["format_errors"]) == (0, 0, 4, 3, 2)


def test_gold_scores_one_wrong_scores_zero(env) -> None:
    u = env.unwrapped
    for task in u.tasks("dev")[:50]:
        for alias in task.answer:
            assert u.score(alias, task).reward == 1.0
        assert u.score("Nobody Atall", task).reward == 0.0
        assert u.score(None, task).reward == 0.0


def test_number_alias_and_f1_reward() -> None:
    env = agentrl.make("agentrl/Search-v0", reward="f1")
    task = _task(env, 1, "population")
    shown, plain = task.answer
    u = env.unwrapped
    assert u.score(plain, task).metrics == {"em": 1.0, "f1": 1.0}
    date_task = _task(env, 1, "birth_date")
    day, month, year = date_task.answer[0].split()
    partial = u.score(f"{month} {year}", date_task)  # 2 of 3 tokens right: P=1, R=2/3 -> F1 0.8
    assert partial.reward == pytest.approx(0.8) and partial.metrics["em"] == 0.0
    env.close()


def test_truncation_scores_unanswered() -> None:
    env = agentrl.make("agentrl/Search-v0", max_turns=2)
    env.reset(seed=1)
    assert env.step(tool_call("search", query="a"))[2:4] == (False, False)
    obs, reward, terminated, truncated, info = env.step(tool_call("search", query="b"))
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert info["metrics"]["answered"] == 0.0 and info["answer"] is None


def test_oracle_solves_generated_tasks(env) -> None:
    u = env.unwrapped
    tasks = [*u.tasks("train")[:100], *u.tasks("dev")[:50], *u.tasks("test")[:50]]
    rewards = [run_oracle(env, task)[0] for task in tasks]
    assert len(tasks) == 200 and sum(rewards) / len(rewards) >= 0.99


def test_oracle_multi_hop_and_other_seed() -> None:
    env = agentrl.make("agentrl/SearchMultiHop-v0", wiki_seed=5, n_entities=3000)
    tasks = env.unwrapped.tasks("test")[:100]
    solved = 0
    for task in tasks:
        reward, info = run_oracle(env, task)
        solved += reward
        assert info["metrics"]["tool_calls"] >= 2 * task.level  # one search and one open per hop
    assert solved / len(tasks) >= 0.99
    env.close()


def test_oracle_only_uses_action_text(env) -> None:
    """The oracle's actions are plain model-style text that the env parses."""
    task = _task(env, 3)
    obs, info = env.reset(options={"task": task})
    oracle = SearchOracle()
    oracle.reset(task)
    action = oracle.act(obs, info)
    assert action.startswith("<tool_call>") and json.loads(action[11:-12])["name"] == "search"
    with pytest.raises(RuntimeError):
        SearchOracle().act("x")


def test_seed_determinism_and_task_options(env) -> None:
    first = env.reset(seed=11)
    again = env.reset(seed=11)
    assert first == again
    task = env.unwrapped.tasks("test")[0]
    obs, info = env.reset(options={"task_id": task.id, "split": "test"})
    assert obs == task.question and info["split"] == "test"
    obs, info = env.reset(seed=2, options={"split": "dev"})
    assert info["split"] == "dev"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hops": "four"}, "hops must be one of"),
        ({"reward": "bleu"}, "reward must be 'em'"),
        ({"retriever": "remote"}, "retriever_url="),
        ({"retriever": "tfidf"}, "unknown retriever"),
        ({"retriever": "none"}, "questions need the search tools"),
        ({"retriever_url": "localhost:8000"}, "not an http(s) URL"),
        ({"split": "validation"}, "no split 'validation'"),
        ({"default_k": 20}, "default_k"),
    ],
)
def test_bad_kwargs_fail_at_construction(kwargs: dict, message: str) -> None:
    with pytest.raises(EnvError, match=message.replace("(", r"\(").replace(")", r"\)")):
        agentrl.make("agentrl/Search-v0", **kwargs)


def test_system_prompt_and_tool_schemas(env) -> None:
    u = env.unwrapped
    names = [t["function"]["name"] for t in u.tools]
    assert names == ["search", "open"]
    search_schema = u.tools[0]["function"]["parameters"]
    assert search_schema["required"] == ["query"] and search_schema["properties"]["k"]["default"] == 3
    assert "<answer>" in u.system_prompt and "<tool_call>" in u.system_prompt


def test_retriever_url_with_a_local_retriever_is_a_conflict() -> None:
    with pytest.raises(EnvError, match="only used with retriever='remote'"):
        agentrl.make("agentrl/Search-v0", retriever="bm25", retriever_url="http://127.0.0.1:9/retrieve")
