"""The Env contract, over a scripted toy env and over EVERY registered id.

For every registered id: ``check_env``, same seed + same scripted actions => same episode,
``close()`` twice, and the info fields DESIGN.md promises.
"""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
import toy_envs  # noqa: F401  (registers test/Counter-v0)
from gymnasium.utils.env_checker import check_env

import agentrl
from agentrl import TextEnv
from agentrl.errors import EnvError
from agentrl.outcome import OUTCOME


def _play(env, seed, actions):
    trace = [env.reset(seed=seed)]
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        # the calls carry wall-clock seconds (flat in tool_calls, typed in the step's outcome): the
        # rest of each typed call is compared
        calls = [(c.name, c.arguments, c.ok, c.error_kind, c.text, c.done) for c in info[OUTCOME].calls]
        info = {k: v for k, v in info.items() if k not in ("tool_calls", OUTCOME)} | {"calls": calls}
        trace.append((obs, reward, terminated, truncated, json.dumps(info, sort_keys=True, default=str)))
        if terminated or truncated:
            break
    return trace


def test_scripted_episode_rewards_and_info():
    env = agentrl.make("test/Counter-v0")
    obs, info = env.reset(seed=0, options={"task_id": "train-3"})
    assert obs == "Reach 30." and info["turn"] == 0 and info["task_id"] == "train-3"
    expected = [
        ('<tool_call>{"name": "add", "arguments": {"n": 20}}</tool_call>', "counter = 20", 0.0, False),
        ("add[10]", "counter = 30", 0.0, False),
        ("<answer>30</answer>", "", 1.0, True),
    ]
    for turn, (action, want_obs, want_reward, want_done) in enumerate(expected, start=1):
        obs, reward, terminated, truncated, info = env.step(action)
        assert (obs, reward, terminated, truncated, info["turn"]) == (want_obs, want_reward, want_done, False, turn)
    assert info["answer"] == "30" and info["ground_truth"] == "30"
    assert info["metrics"]["em"] == 1.0 and info["metrics"]["tool_calls"] == 2.0 and info["metrics"]["turns"] == 3.0
    with pytest.raises(EnvError):
        env.step("<answer>30</answer>")


def test_step_info_carries_the_typed_outcome_the_flat_keys_come_from():
    """info["outcome"] is the step typed end to end: ToolOutcome per call, the malformed-action kinds,
    and on the last step the episode's EpisodeMetrics; the gymnasium keys are derived from it."""
    from agentrl.outcome import EpisodeMetrics, StepOutcome
    from agentrl.tools.base import ToolOutcome

    env = agentrl.make("test/Counter-v0", max_turns=3)
    env.reset(seed=0, options={"task_id": "train-3"})
    _, _, _, _, info = env.step(
        '<tool_call>{"name": "add", "arguments": {"n": 20}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"n": "twenty"}}</tool_call>'
    )
    step = info[OUTCOME]
    assert isinstance(step, StepOutcome) and all(isinstance(c, ToolOutcome) for c in step.calls)
    assert [(c.name, c.ok, c.error_kind) for c in step.calls] == [
        ("add", True, None),
        ("add", False, "bad_arguments"),
    ]
    assert info["tool_calls"] == step.tool_call_records() and info["void_turn"] is step.void is False
    assert step.error() == "tool call failed: add (bad_arguments)" and step.metrics is None
    _, _, _, _, info = env.step('<tool_call>{"name": "nope", "arguments": {}}</tool_call>')
    assert info[OUTCOME].problems == tuple(info["action_problems"]) == ("unknown_tool",)
    assert info[OUTCOME].error() == "malformed action: unknown_tool"
    _, reward, _, truncated, info = env.step("add[10]")  # the turn budget ends it: the wrapper adds the final
    final = info[OUTCOME]
    assert truncated and final.ended and final.answer is None and final.ground_truth == "30"
    assert isinstance(final.metrics, EpisodeMetrics) and final.metrics.flat() == info["metrics"]
    assert (final.metrics.tool_calls, final.metrics.tool_errors, final.metrics.format_errors) == (
        3.0,
        1.0,
        1.0,
    )
    assert final.metrics.truncated == 1.0 and final.metrics.score["em"] == 0.0 == reward
    assert EpisodeMetrics.from_flat(info["metrics"]) == final.metrics  # a saved Episode.metrics, typed again


def test_turn_budget_truncates_and_scores_unanswered():
    env = agentrl.make("test/Counter-v0", max_turns=2)
    env.reset(seed=0)
    assert env.step("add[1]")[3] is False
    obs, reward, terminated, truncated, info = env.step("add[1]")
    assert (terminated, truncated, reward) == (False, True, 0.0)
    assert info["answer"] is None and info["metrics"]["truncated"] == 1.0


def test_observation_budget_cuts_with_a_note():
    env = agentrl.make("test/Counter-v0", max_obs_chars=40)
    env.reset(seed=0)
    calls = "".join(f'<tool_call>{{"name": "add", "arguments": {{"n": {i}}}}}</tool_call>' for i in range(4))
    obs, *_, info = env.step(calls)
    assert "characters cut" in obs and info["observation_cut"] is True


def test_malformed_actions_are_observations_and_counted():
    env = agentrl.make("test/Counter-v0")
    env.reset(seed=0)
    obs, *_ = env.step('<tool_call>{"name": "add", "arguments": {"n": "ten"}}</tool_call>')
    assert "argument 'n' must be integer" in obs
    obs, *_ = env.step('<tool_call>{"name": "mul"}</tool_call>')
    assert "Unknown tool 'mul'" in obs
    *_, info = env.step("<answer>0</answer>")
    assert info["metrics"]["tool_errors"] == 1.0 and info["metrics"]["format_errors"] == 1.0


def test_options_split_task_and_errors():
    env = agentrl.make("test/Counter-v0")
    assert env.reset(seed=1, options={"split": "test"})[1]["split"] == "test"
    assert env.reset(options={"task": {"id": "x", "question": "Reach 7.", "answer": "7"}})[0] == "Reach 7."
    with pytest.raises(EnvError, match="no task with id"):
        env.reset(options={"task_id": "nope"})
    with pytest.raises(EnvError, match="unknown env id"):
        agentrl.make("agentrl/DoesNotExist-v0")


def test_gymnasium_make_works_too():
    env = gym.make("test/Counter-v0")
    assert env.unwrapped.tools[0]["function"]["name"] == "add"
    env.close()


ALL_IDS = agentrl.registered_ids()
#: envs that need their data named explicitly (no silent fallback): their bundled fixtures
MAKE_KWARGS = {"agentrl/GAIA-Real-v0": {"data_dir": "fixture"}}


def _make(env_id: str):
    """Make the env and reset it (data loads lazily on the first reset): every id's data ships."""
    env = agentrl.make(env_id, **MAKE_KWARGS.get(env_id, {}))
    env.reset(seed=0)
    return env


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_registered_env_contract(env_id):
    env = _make(env_id)
    try:
        check_env(env.unwrapped, skip_render_check=True)
        unwrapped = env.unwrapped
        assert isinstance(unwrapped, TextEnv) and isinstance(unwrapped.system_prompt, str)
        assert agentrl.env.ENV_DESCRIPTIONS[env_id]
        obs, info = env.reset(seed=3)
        assert isinstance(obs, str) and obs and {"turn", "tool_calls"} <= set(info)
        for schema in unwrapped.tools:
            assert schema["type"] == "function" and schema["function"]["name"] and schema["function"]["description"]
    finally:
        env.close()
        env.close()


def _scripted_actions(env) -> list[str]:
    actions = ["hello", "<tool_call>{broken json</tool_call>"]
    for schema in env.unwrapped.tools[:2]:
        params = schema["function"]["parameters"]
        args = {name: ("1" if prop.get("type") == "string" else 1) for name, prop in params["properties"].items()
                if name in params.get("required", [])}
        actions.append(json.dumps({"name": schema["function"]["name"], "arguments": args}).join(
            ["<tool_call>", "</tool_call>"]))
    return actions + ["<answer>42</answer>"]


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_same_seed_same_episode(env_id):
    runs = []
    for _ in range(2):
        env = _make(env_id)
        env.reset(seed=11)
        runs.append(_play(env, 11, _scripted_actions(env)))
        env.close()
    assert runs[0] == runs[1]


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_each_env_declares_the_success_metric_its_final_info_reports(env_id):
    """Training's ``eval/success`` and ``agentrl eval``'s success both read this one metric."""
    env = _make(env_id)
    try:
        metric = agentrl.env.success_metric(env_id)
        assert metric == env.unwrapped.success_metric
        env.reset(seed=5)
        _, _, _, _, info = env.step("<answer>42</answer>")
        assert metric in info["metrics"], (metric, sorted(info["metrics"]))
        assert agentrl.env.solved(info["metrics"], 0.0, metric) in (0.0, 1.0)
    finally:
        env.close()


def test_solved_reads_the_named_metric_and_falls_back_to_the_outcome():
    assert agentrl.env.solved({"em": 1.0, "f1": 0.5}, 0.5, "em") == 1.0
    assert agentrl.env.solved({"em": 0.0, "f1": 1.0}, 1.0, "em") == 0.0
    assert agentrl.env.solved({}, 1.0, "correct") == 1.0 and agentrl.env.solved({}, 0.99, "correct") == 0.0
