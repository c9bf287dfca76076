"""local-gaia (agentrl/GAIA-v0): task shape, determinism, attachments, oracle at 100%."""

from __future__ import annotations

import collections

import pytest

import agentrl
from agentrl.envs.gaia.oracle import LocalGaiaOracle, parse_table
from agentrl.envs.gaia.tasks import DEFAULT_COUNTS
from agentrl.envs.search.wiki import generate_wiki
from agentrl.scorers.gaia import scoring_mode
from agentrl.tools.files import render_file


def run_oracle(env, oracle: LocalGaiaOracle, task_ids: list[str]) -> list[tuple[float, dict]]:
    results = []
    for task_id in task_ids:
        obs, info = env.reset(options={"task_id": task_id})
        oracle.reset(env.unwrapped.task)
        while True:
            obs, reward, terminated, truncated, info = env.step(oracle.act(obs, info))
            if terminated or truncated:
                break
        results.append((reward, info))
    return results


def test_suite_shape_and_determinism() -> None:
    env = agentrl.make("agentrl/GAIA-v0", python=False)
    tasks = env.unwrapped.tasks("test")
    levels = collections.Counter(t.level for t in tasks)
    assert levels == collections.Counter(DEFAULT_COUNTS["test"]) == {1: 50, 2: 70, 3: 30}
    assert len({t.id for t in tasks}) == 150
    again = agentrl.make("agentrl/GAIA-v0", python=False).unwrapped.load_tasks("test")
    assert [(t.question, t.answer) for t in again] == [(t.question, t.answer) for t in tasks]
    modes = collections.Counter(scoring_mode(t.answer) for t in tasks)
    assert modes["number"] > 30 and modes["string"] > 30 and modes["list"] > 10
    assert all("," not in t.answer for t in tasks if scoring_mode(t.answer) != "list")
    with_file = [t for t in tasks if t.payload["file_name"]]
    assert {t.payload["file_format"] for t in with_file} == {"csv", "xlsx", "json", "sqlite", "pdf", "docx"}
    assert all(t.level >= 2 for t in with_file)
    train = env.unwrapped.tasks("train")
    assert not {t.question for t in train if not t.payload["file_name"]} & {t.question for t in tasks}
    env.close()


def test_attachments_hold_the_table_and_distractors() -> None:
    env = agentrl.make("agentrl/GAIA-v0", python=False)
    wiki = generate_wiki(0, 2000)
    tasks = [t for t in env.unwrapped.tasks("test") if t.payload["template"] == "investment_gap"]
    for task in tasks[:6]:
        obs, _ = env.reset(options={"task_id": task.id})
        assert task.payload["file_name"] in obs
        path = env.unwrapped.attachment_path(task)
        rows = parse_table(render_file(path))
        names = [r["company"] for r in rows]
        assert names == [r[0] for r in task.payload["document"]["rows"]]
        entities = [wiki.by_name(n) for n in names]
        twins = [e for e in entities if e.distractor_of and wiki.entity(e.distractor_of).name in names]
        assert len(names) >= 4 and len(twins) == 1  # the near-duplicate name sits beside its original
    env.close()


def test_wrong_and_missing_answers_score_zero() -> None:
    env = agentrl.make("agentrl/GAIA-v0", python=False, max_turns=2)
    task = env.unwrapped.tasks("test")[0]
    env.reset(options={"task_id": task.id})
    _, reward, terminated, _, info = env.step(f"FINAL ANSWER: {task.answer}")
    assert terminated and reward == 1.0
    env.reset(options={"task_id": task.id})
    _, reward, terminated, _, _ = env.step("FINAL ANSWER: definitely not it")
    assert terminated and reward == 0.0
    env.reset(options={"task_id": task.id})
    env.step("thinking...")
    _, reward, terminated, truncated, info = env.step("still thinking")
    assert truncated and not terminated and reward == 0.0 and info["metrics"]["answered"] == 0.0
    env.close()


def test_oracle_scores_100_percent_on_local_gaia() -> None:
    env = agentrl.make("agentrl/GAIA-v0", python=False)
    oracle = LocalGaiaOracle(python=False)
    tasks = env.unwrapped.tasks("test")
    results = run_oracle(env, oracle, [t.id for t in tasks])
    failed = [
        (t.id, info["answer"], t.answer) for t, (r, info) in zip(tasks, results, strict=True) if r != 1.0
    ]
    assert not failed
    assert all(info["metrics"]["tool_errors"] == 0 for _, info in results)
    env.close()


@pytest.mark.slow
def test_oracle_with_the_sandboxed_python_tool() -> None:
    env = agentrl.make("agentrl/GAIA-v0", python=True)
    oracle = LocalGaiaOracle(python=True)
    tasks = [
        t for t in env.unwrapped.tasks("test") if t.payload["template"] in ("fact_arith", "headcount_check")
    ]
    results = run_oracle(env, oracle, [t.id for t in tasks[:8]])
    errors = [c for _, info in results for c in info["tool_calls"] if not c["ok"]]
    if oracle.python_fallbacks and any(c["error_kind"] == "sandbox_error" for c in errors):
        pytest.skip("no sandbox backend here (Docker or bubblewrap)")
    assert oracle.python_fallbacks == 0
    assert all(r == 1.0 for r, _ in results)
    env.close()
