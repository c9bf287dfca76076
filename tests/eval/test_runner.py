"""Eval runner, suites, agents and report on real envs (oracle and random agents)."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest

from agentrl.errors import ConfigError
from agentrl.eval.agents import AgentSpec, RandomAgent, parse_agent
from agentrl.eval.report import failure_bucket, pass_at_k
from agentrl.eval.runner import evaluate, run_eval
from agentrl.eval.suites import parse_suite


def test_parse_agent() -> None:
    assert parse_agent("oracle") == AgentSpec("oracle")
    assert parse_agent("smollm2-135m") == AgentSpec("model", model="smollm2-135m")
    assert parse_agent("smollm2-135m+runs/x/adapter") == AgentSpec(
        "model", model="smollm2-135m", adapter="runs/x/adapter"
    )
    spec = parse_agent("openai:http://127.0.0.1:8000/v1#smollm2")
    assert (spec.kind, spec.url, spec.model) == ("openai", "http://127.0.0.1:8000/v1", "smollm2")
    assert parse_agent("openai:http://h:1/v1").model == ""
    with pytest.raises(ConfigError, match="URL"):
        parse_agent("openai:localhost:8000")
    with pytest.raises(ConfigError):
        parse_agent("  ")
    # a server without its kind, or a misspelt kind, is said as such (not a hub lookup of 'chta:...')
    with pytest.raises(ConfigError, match="URL without an agent kind.*openai:URL"):
        parse_agent("http://127.0.0.1:8000/v1")
    with pytest.raises(ConfigError, match="'chta:' is not an agent kind.*chat:URL#model"):
        parse_agent("chta:http://127.0.0.1:8000/v1#m")


def test_a_model_folder_with_a_colon_is_still_a_model(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run:1").mkdir()
    assert parse_agent("run:1+adapter") == AgentSpec("model", model="run:1", adapter="adapter")


def test_parse_suite_options() -> None:
    suite = parse_suite("local-gaia:k=3,split=dev,python=false,python_timeout_s=2.5")
    assert suite.k == 3 and suite.split == "dev"
    assert suite.parts[0].kwargs == {"python": False, "python_timeout_s": 2.5}
    with pytest.raises(ConfigError, match="unknown eval suite"):
        parse_suite("nope")
    with pytest.raises(ConfigError, match="key=value"):
        parse_suite("local-gaia:k")
    with pytest.raises(ConfigError, match="k must be"):
        parse_suite("local-gaia:k=0")


def test_pass_at_k_by_hand() -> None:
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(2, 1, 2) == 1.0


def _record(**kw):
    base = {
        "error": None,
        "success": 0.0,
        "turns": 3,
        "void_turns": 0,
        "answered": True,
        "truncated": False,
        "tool_errors": 0,
    }
    return {**base, **kw}


def test_failure_buckets() -> None:
    assert failure_bucket(_record(success=1.0)) == "solved"
    assert failure_bucket(_record(error="boom")) == "episode error"
    assert failure_bucket(_record(void_turns=3, answered=False, truncated=True)) == "format error"
    assert failure_bucket(_record(void_turns=1, answered=False, truncated=True)) == "budget hit"
    assert failure_bucket(_record(answered=False)) == "no answer"
    assert failure_bucket(_record(tool_errors=2)) == "tool error"
    assert failure_bucket(_record()) == "wrong answer"


def test_oracle_and_random_on_local_gaia(tmp_path: Path) -> None:
    oracle = evaluate("local-gaia:python=false", "oracle", limit=12, concurrency=2, seed=1)
    assert oracle.metrics["overall"]["success_rate"] == 1.0
    assert len(oracle.records) == 12 and {r["bucket"] for r in oracle.records} == {"solved"}
    assert set(oracle.metrics["subsets"]) <= {"level 1", "level 2", "level 3"}
    first = evaluate("local-gaia:python=false", "random", limit=8, concurrency=2, seed=5)
    again = evaluate("local-gaia:python=false", "random", limit=8, concurrency=1, seed=5)
    strip = lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs]  # noqa: E731
    assert strip(first.records) == strip(again.records)
    assert first.metrics["overall"]["success_rate"] < 0.5
    assert all(r["tool_calls"] + r["answered"] > 0 for r in first.records)


def test_run_eval_writes_outputs_and_pass_at_k(tmp_path: Path, capsys) -> None:
    code = run_eval(
        suite="local-gaia:k=2,python=false", agent="random", limit=4, concurrency=2, seed=0, out=tmp_path
    )
    assert code == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["k"] == 2 and "pass@2" in metrics["overall"]
    assert metrics["overall"]["episodes"] == 8 and metrics["overall"]["tasks"] == 4
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert len(records) == 8 and {r["sample"] for r in records} == {0, 1}
    assert len((tmp_path / "episodes.jsonl").read_text().splitlines()) == 8
    report = (tmp_path / "report.md").read_text()
    assert "## Failure buckets" in report and "pass@2" in report and "agentrl eval --suite" in report
    for png in ("success_by_subset.png", "failure_buckets.png", "turns.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
    assert "| **all** |" in capsys.readouterr().out
    assert run_eval(suite="nope", agent="oracle", out=tmp_path / "x") == 2


class BrokenOracle:
    def reset(self, task) -> None:
        self.task = task

    def act(self, observation: str) -> str:
        if self.task.level == 2:
            raise RuntimeError("oracle bug")
        return "FINAL ANSWER: 0"


def test_crashed_episode_is_recorded_and_the_run_goes_on(monkeypatch) -> None:
    module = types.ModuleType("_eval_broken_oracle")
    module.BrokenOracle = BrokenOracle
    monkeypatch.setitem(sys.modules, "_eval_broken_oracle", module)
    suite = replace(parse_suite("local-gaia:python=false"), oracle="_eval_broken_oracle:BrokenOracle")
    result = evaluate(suite, "oracle", limit=10, concurrency=2)
    crashed = [r for r in result.records if r["error"]]
    assert crashed and all("oracle bug" in r["error"] and r["bucket"] == "episode error" for r in crashed)
    assert len(crashed) < len(result.records)


def test_real_gaia_suite_on_the_fixture() -> None:
    result = evaluate("gaia-fixture", "random", concurrency=1)
    assert result.metrics["overall"]["tasks"] == 6
    with pytest.raises(ConfigError, match="hidden"):
        evaluate("gaia-fixture:split=test", "random")
    with pytest.raises(ConfigError, match="no scripted oracle"):
        evaluate("gaia-fixture", "oracle")


def test_random_agent_actions_are_well_formed() -> None:
    import agentrl

    env = agentrl.make("agentrl/GAIA-v0", python=False)
    obs, _ = env.reset(seed=0)
    agent = RandomAgent(env.unwrapped.tools, seed=0, answer_prob=0.0)
    agent.reset(env.unwrapped.task)
    for _ in range(5):
        obs, _, terminated, truncated, info = env.step(agent.act(obs))
        assert "action_problems" not in info and len(info["tool_calls"]) == 1
        if terminated or truncated:
            break
    env.close()


def test_cli_eval_prints_json_metrics(tmp_path: Path) -> None:
    import subprocess

    agentrl_bin = Path(sys.executable).parent / "agentrl"
    argv = [
        str(agentrl_bin),
        "eval",
        "--suite",
        "local-gaia:python=false",
        "--agent",
        "oracle",
        "--limit",
        "3",
    ]
    done = subprocess.run(
        [*argv, "--concurrency", "1", "--out", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    metrics = json.loads(done.stdout)
    assert metrics["overall"]["success_rate"] == 1.0 and metrics["overall"]["tasks"] == 3
    assert (tmp_path / "report.md").is_file()
    bad = subprocess.run(
        [str(agentrl_bin), "eval", "--suite", "nope"], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2 and "unknown eval suite 'nope'" in bad.stderr
    typo = subprocess.run(
        [*argv, "--agent", "opneai:http://127.0.0.1:9/v1"], capture_output=True, text=True, timeout=120
    )
    assert typo.returncode == 2 and "'opneai:' is not an agent kind" in typo.stderr, typo.stderr


def test_stratified_sample_covers_subsets() -> None:
    from agentrl.env import Task
    from agentrl.eval.runner import stratified_sample

    tasks = [Task(str(i), "q", level=1 if i < 90 else (2 if i < 98 else 3)) for i in range(100)]
    picked = stratified_sample(tasks, 6, lambda t: str(t.level), "0")
    assert sorted(t.level for t in picked) == [1, 1, 2, 2, 3, 3]
    assert picked == sorted(picked, key=lambda t: int(t.id))
    assert stratified_sample(tasks, 6, lambda t: str(t.level), "0") == picked
    assert len(stratified_sample(tasks, 99, lambda t: str(t.level), "1")) == 99


@pytest.mark.docker
def test_an_eval_gives_its_sandboxes_back_when_it_returns():
    """The eval's envs are closed when it returns (not left to the garbage collector): a second eval
    in the same process must find the pool's boxes free, and no slot is still leased."""
    from agentrl.tools import python as python_tool

    first = evaluate("local-gaia", "oracle", limit=1, concurrency=1)
    assert not [slot for slot in python_tool._LIVE_SLOTS if slot.leased]
    second = evaluate("local-gaia", "oracle", limit=1, concurrency=1)
    assert first.metrics["overall"]["success_rate"] == second.metrics["overall"]["success_rate"] == 1.0
