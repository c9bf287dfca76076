"""Golden episodes: the same seeds give the same episodes, whatever the refactoring underneath.

Each case runs scripted generators / scripted oracles through one user path (training rollouts
with every context strategy, evaluation with scripted, chat and completions agents, ``agentrl
play``, the env families' oracles) and records everything an episode decides: token ids, sources,
loss masks, sampler log-probs, rewards, per-token process rewards, metrics, answers, errors.
``tests/fixtures/golden_episodes.json`` holds the recording; the test regenerates each case and
compares it exactly. Only wall-clock timings (and the tmp folder's name) are left out.

Re-record (only when a change of behaviour is intended, and say so in the commit):
``AGENTRL_GOLDEN_RECORD=1 .venv/bin/python -m pytest tests/test_golden_episodes.py``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from rollout.test_agent import lookup_script
from rollout.test_folding import branch_script
from rollout.toy import LookupOracle, make_lookup_env

ROOT = Path(__file__).resolve().parent
FIXTURE = ROOT / "fixtures" / "golden_episodes.json"
RECORD = os.environ.get("AGENTRL_GOLDEN_RECORD") == "1"
TIMING_KEYS = {"seconds", "usage", "latency_s", "wall_s", "generate_s", "env_s", "act_s", "sandbox_usage"}


def _chat_servers() -> Any:
    spec = importlib.util.spec_from_file_location("chat_servers", ROOT / "eval" / "chat_servers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("chat_servers", module)
    spec.loader.exec_module(module)
    return module


def _clean(value: Any, root: str = "") -> Any:
    """JSON-ready, without wall-clock timings; ``root`` (a tmp folder) becomes ``<ROOT>``; long lists
    of numbers (token ids, sources, masks, log-probs) and long texts become their length and digest."""
    if isinstance(value, dict):
        from agentrl.outcome import StepOutcome

        # an env step's typed outcome (info["outcome"]) is compared through the flat keys derived from it
        return {
            str(k): _clean(v, root)
            for k, v in value.items()
            if k not in TIMING_KEYS and k != "timings" and not isinstance(v, StepOutcome)
        }
    if isinstance(value, list | tuple):
        if len(value) > 12 and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
            digest = hashlib.sha256(json.dumps(list(value)).encode()).hexdigest()[:16]
            return f"<{len(value)} numbers sha256:{digest}>"
        return [_clean(v, root) for v in value]
    if isinstance(value, str):
        value = value.replace(root, "<ROOT>") if root else value
        if len(value) > 400:
            return f"{value[:120]}...<{len(value)} chars sha256:{hashlib.sha256(value.encode()).hexdigest()[:16]}>"
    if isinstance(value, float) and value != value:
        return "nan"
    return value


def _episode(episode: Any, root: str = "") -> dict[str, Any]:
    """Everything the episode decided, plus its training rows (ids, sources, masks, process rewards)."""
    from agentrl.trajectory import segment_arrays

    record = _clean(episode.to_dict(), root)
    record["rows"] = _clean(
        [
            {k: v for k, v in segment_arrays(seg).items() if k in ("source", "mask", "turn_id", "process")}
            for seg in episode.segments
            if seg.turns
        ]
    )
    return record


# --------------------------------------------------------------------------- the cases
def _rollout(tokenizer: Any, script: Any, tasks: list[str], *, env_turns: int = 6, **agent: Any) -> list[Any]:
    from agentrl.rollout.generators.scripted import ScriptedGenerator
    from agentrl.rollout.runner import run_episodes
    from agentrl.rollout.settings import RolloutConfig

    gen = ScriptedGenerator(tokenizer, script, logprob=-0.25)
    config = RolloutConfig(**{"max_new_tokens": 96, **agent}, concurrency=2, group_size=2)
    return run_episodes(lambda: make_lookup_env(max_turns=env_turns), tasks, gen, tokenizer, config, seed=7)


def _never_answers(prompt: str, index: int) -> str:
    return '<tool_call>{"name": "lookup", "arguments": {"key": "k1"}}</tool_call>'


def _from_run_config(tokenizer: Any, script: Any, overrides: list[str]) -> list[Any]:
    """A RunConfig's rollout section through the trainer's Rollouts (real env registry, Search-v0)."""
    from agentrl.config import RunConfig, load_config
    from agentrl.rollout.generators.scripted import ScriptedGenerator
    from agentrl.train.rollouts import Rollouts

    config = load_config(None, ["env.max_turns=3", "rollout.concurrency=2", *overrides], cls=RunConfig)
    rollouts = Rollouts(config, ScriptedGenerator(tokenizer, script, logprob=-0.5), tokenizer)
    episodes, _ = rollouts.run(rollouts.train_tasks[:2], seed=3, version=1, group_size=2)
    return episodes


def _search_script(prompt: str, index: int) -> str:
    """Search twice, then answer with a word of the last observation (or branch first with folding)."""
    if "branch" in prompt and "You are now in a branch" not in prompt and "Branch result" not in prompt:
        return (
            '<tool_call>{"name": "branch", "arguments": {"description": "look", "prompt": "Search it."}}'
            "</tool_call>"
        )
    if "You are now in a branch" in prompt and prompt.count("<|im_start|>assistant") > 3:
        return '<tool_call>{"name": "return", "arguments": {"message": "found little"}}</tool_call>'
    if prompt.count("<|im_start|>assistant") >= 3:
        return "<answer>Unknown</answer>"
    return '<tool_call>{"name": "search", "arguments": {"query": "capital city"}}</tool_call>'


RETURN_IN_MAIN = '<tool_call>{"name": "return", "arguments": {"message": "done"}}</tool_call>'


def _oracles(tokenizer: Any, env_id: str, oracle: str, template_mode: str = "concat") -> list[Any]:
    import agentrl
    from agentrl.registry import load_entry_point
    from agentrl.rollout.runner import run_oracle_episodes
    from agentrl.rollout.settings import RolloutConfig

    probe = agentrl.make(env_id)
    tasks = list(probe.unwrapped.load_tasks("train"))[:3]
    probe.close()
    config = RolloutConfig(
        max_new_tokens=512, max_context_tokens=4096, template_mode=template_mode, concurrency=2, group_size=1
    )
    return run_oracle_episodes(
        env_id, tasks, load_entry_point(oracle), tokenizer, config, seed=5, env_kwargs={"max_turns": 6}
    )


def _eval(suite: str, agent: str, limit: int = 2) -> dict[str, Any]:
    from agentrl.eval.runner import evaluate

    result = evaluate(suite, agent, limit=limit, concurrency=2, seed=11)
    return {
        "records": _clean(result.records),
        "episodes": [_episode(e) for e in result.episodes],
        "overall": _clean(result.metrics["overall"]),
    }


def _gaia_server(tmp_path: Path, kind: str) -> dict[str, Any]:
    """``chat:`` (native tool calls) and ``openai:`` (token ids) agents over real HTTP on GAIA files."""
    from agentrl.eval.model_agent import ModelEvalConfig
    from agentrl.eval.runner import evaluate
    from agentrl.eval.suites import parse_suite
    from agentrl.rollout.model import load_tokenizer
    from agentrl.serve.server import BackgroundServer

    servers = _chat_servers()
    records = servers.write_gaia_download(tmp_path)
    if kind == "chat":
        server, agent = servers.ScriptedChat(records), "chat:{url}#scripted"
    else:
        server = servers.ScriptedCompletions(records, load_tokenizer("smollm2-135m"))
        agent = "openai:{url}#smollm2-135m"
    suite = parse_suite("gaia", [f"data_dir={tmp_path}", "python=false"])
    with BackgroundServer(server.app) as http:
        result = evaluate(
            suite, agent.format(url=http.url), concurrency=1, seed=2, settings=ModelEvalConfig.resolve()
        )
    root = str(tmp_path)
    return {
        "records": _clean(result.records, root),
        "episodes": [_episode(e, root) for e in result.episodes],
        "transcripts": _clean(result.transcripts, root),
    }


def _play(args: list[str], script: str, tmp_path: Path) -> Any:
    from typer.testing import CliRunner

    from agentrl.cli import app

    path = tmp_path / "actions.txt"
    path.write_text(script)
    result = CliRunner().invoke(app, ["play", *args, "--script", str(path), "--json"])
    assert result.exit_code == 0, result.output
    return _clean(json.loads(result.output))


SEARCH_SCRIPT = (
    '<tool_call>{"name": "search", "arguments": {"query": "founded"}}</tool_call>\n'
    "hello there\n"
    "<answer>nothing</answer>\n"
)
FOLD_SCRIPT = (
    '<tool_call>{"name": "branch", "arguments": {"description": "find", "prompt": "Look k2 up."}}</tool_call>\n'
    '<tool_call>{"name": "lookup", "arguments": {"key": "zz"}}</tool_call>\n'
    '<tool_call>{"name": "return", "arguments": {"message": "v2"}}</tool_call>\n'
    '<tool_call>{"name": "return", "arguments": {"message": "again"}}</tool_call>\n'
    "<answer>v2</answer>\n"
)


def _play_policy() -> list[Any]:
    """The env families' own oracle check (``agentrl.env.play_policy``), on Search and SQL."""
    import agentrl
    from agentrl.envs.search.oracle import run_oracle as search_oracle
    from agentrl.envs.sql.oracle import run_oracle as sql_oracle

    out = []
    for env_id, run in (("agentrl/Search-v0", search_oracle), ("agentrl/SQL-v0", sql_oracle)):
        env = agentrl.make(env_id)
        for task in list(env.unwrapped.load_tasks("train"))[:2]:
            reward, info = run(env, task, seed=1)
            out.append({"env": env_id, "task": task.id, "reward": reward, "info": _clean(info)})
        env.close()
    return out


CASES: dict[str, Any] = {
    "rollout/concat": lambda tok, tmp: _rollout(tok, lookup_script, ["k1", "k3"], template_mode="concat"),
    "rollout/per_turn": lambda tok, tmp: _rollout(tok, lookup_script, ["k2", "k5"], template_mode="per_turn"),
    "rollout/branch": lambda tok, tmp: _rollout(tok, branch_script, ["k4", "k6"], folding="branch"),
    "rollout/branch_policy_judge": lambda tok, tmp: _rollout(
        tok, branch_script, ["k0"], folding="branch", scope_judge="none", unfolded_threshold=0.05
    ),
    "rollout/summary": lambda tok, tmp: _rollout(
        tok, lookup_script, ["k3", "k7"], folding="summary", summary_threshold=300, max_summaries=2
    ),
    "rollout/env_turn_budget": lambda tok, tmp: _rollout(tok, _never_answers, ["k1"], env_turns=3),
    "rollout/agent_turn_budget": lambda tok, tmp: _rollout(tok, _never_answers, ["k2"], max_turns=2),
    "rollout/context_budget": lambda tok, tmp: _rollout(
        tok, _never_answers, ["k3"], max_context_tokens=420, max_new_tokens=40
    ),
    "train/none": lambda tok, tmp: _from_run_config(tok, _search_script, []),
    "train/branch": lambda tok, tmp: _from_run_config(tok, _search_script, ["rollout.folding=branch"]),
    "train/summary": lambda tok, tmp: _from_run_config(
        tok, _search_script, ["rollout.folding=summary", "rollout.summary_threshold=700"]
    ),
    "train/refused_fold_calls": lambda tok, tmp: _from_run_config(
        tok, lambda prompt, index: RETURN_IN_MAIN, ["rollout.folding=branch"]
    ),
    "oracle/search": lambda tok, tmp: _oracles(
        tok, "agentrl/Search-v0", "agentrl.envs.search.oracle:SearchOracle"
    ),
    "oracle/sql_per_turn": lambda tok, tmp: _oracles(
        tok, "agentrl/SQL-v0", "agentrl.envs.sql.oracle:SQLOracle", template_mode="per_turn"
    ),
    "oracle/lookup": lambda tok, tmp: _oracle_lookup(tok),
    "eval/search-qa/oracle": lambda tok, tmp: _eval("search-qa", "oracle"),
    "eval/search-qa/random": lambda tok, tmp: _eval("search-qa", "random", limit=3),
    "eval/sql/oracle": lambda tok, tmp: _eval("sql", "oracle"),
    "eval/gaia/chat": lambda tok, tmp: _gaia_server(tmp, "chat"),
    "eval/gaia/openai": lambda tok, tmp: _gaia_server(tmp, "openai"),
    "play/search": lambda tok, tmp: _play(["agentrl/Search-v0", "--seed", "4"], SEARCH_SCRIPT, tmp),
    "play/sql_task": lambda tok, tmp: _play(
        ["agentrl/SQL-v0", "--task-id", _first_task("agentrl/SQL-v0"), "--split", "train"], SEARCH_SCRIPT, tmp
    ),
    "play/search_branch": lambda tok, tmp: _play(
        [
            "agentrl/Search-v0",
            "--task-id",
            _first_task("agentrl/Search-v0"),
            "--folding",
            "branch",
            "--set",
            "unfolded_threshold=0.1",
        ],
        FOLD_SCRIPT.replace("lookup", "search").replace('"key"', '"query"'),
        tmp,
    ),  # fmt: skip
    "play_policy/oracles": lambda tok, tmp: _play_policy(),
}


def _first_task(env_id: str) -> str:
    import agentrl

    env = agentrl.make(env_id)
    task_id = env.unwrapped.load_tasks("train")[0].id
    env.close()
    return task_id


def _oracle_lookup(tokenizer: Any) -> list[Any]:
    from agentrl.rollout.runner import run_oracle_episodes
    from agentrl.rollout.settings import RolloutConfig

    config = RolloutConfig(max_new_tokens=64, concurrency=2, group_size=1)
    return run_oracle_episodes(make_lookup_env, ["k1", "k2"], LookupOracle, tokenizer, config)


def _run_case(name: str, tokenizer: Any, tmp_path: Path) -> Any:
    result = CASES[name](tokenizer, tmp_path)
    if isinstance(result, list) and result and hasattr(result[0], "segments"):
        return [_episode(e) for e in result]
    return result


@pytest.fixture(scope="module")
def tokenizer():
    from agentrl.rollout.model import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    if RECORD:
        data: dict[str, Any] = {}
        yield data
        FIXTURE.write_text(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")
        return
    yield json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("name", list(CASES))
def test_golden_episode(name: str, tokenizer: Any, golden: dict[str, Any], tmp_path: Path) -> None:
    got = json.loads(json.dumps(_run_case(name, tokenizer, tmp_path), sort_keys=True))
    if RECORD:
        golden[name] = got
        return
    assert name in golden, f"no recording of {name}: run with AGENTRL_GOLDEN_RECORD=1"
    want = golden[name]
    if got != want:  # name the first difference, then fail on the whole case
        pytest.fail(f"{name} differs from the recording: {_first_difference(want, got)}")


def _first_difference(want: Any, got: Any, path: str = "") -> str:
    if type(want) is not type(got):
        return f"{path}: recorded {want!r:.200}, got {got!r:.200}"
    if isinstance(want, dict):
        for key in sorted(set(want) | set(got)):
            if key not in want or key not in got:
                return f"{path}.{key}: only in {'recording' if key in want else 'new run'}"
            if want[key] != got[key]:
                return _first_difference(want[key], got[key], f"{path}.{key}")
    if isinstance(want, list):
        if len(want) != len(got):
            return f"{path}: recorded {len(want)} items, got {len(got)}"
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            if a != b:
                return _first_difference(a, b, f"{path}[{i}]")
    return f"{path}: recorded {want!r:.200}, got {got!r:.200}"


def test_cases_cover_every_context_strategy_and_caller() -> None:
    recorded = json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {}
    kinds = {
        seg["kind"]
        for name, value in recorded.items()
        if name.startswith(("rollout/", "train/", "oracle/"))
        for ep in value
        for seg in ep["segments"]
    }
    assert kinds == {"main", "turn", "branch", "summary"}, kinds
    assert {n.split("/")[0] for n in recorded} == {
        "rollout",
        "train",
        "oracle",
        "eval",
        "play",
        "play_policy",
    }
    assert re.search(r"agent_truncated", json.dumps(recorded["rollout/agent_turn_budget"]))
