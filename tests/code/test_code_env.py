"""The code env through real sandboxes: scripted episodes, adversarial code, void turns, the oracle."""

from __future__ import annotations

import json

import pytest

import agentrl
from agentrl.env import Task
from agentrl.envs.code.oracle import run_oracle as play_one


def py(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


TASK = Task("t-1", "What is 6 * 7 + 1?", "43", "test", 1, {"compare": "int"})


@pytest.fixture
def env(backend):
    env = agentrl.make("agentrl/Code-v0", sandbox_backend=backend, timeout_s=3.0, max_turns=20)
    yield env
    env.close()


def test_scripted_episode_state_persists_and_rewards_per_turn(env):
    obs, info = env.reset(options={"task": TASK})
    assert obs == TASK.question and info["turn"] == 0
    script = [
        (py("x = 6 * 7"), "[no output: print() the values you want to see]", 0.0, False),
        (py("print(x + 1)"), "43", 0.0, False),
        ("python[x * 2]", "84", 0.0, False),  # ReAct form; a bare last expression is shown
        ("So the answer is <answer>43</answer>", "", 1.0, True),
    ]
    for turn, (action, want_obs, want_reward, want_done) in enumerate(script, start=1):
        obs, reward, terminated, truncated, info = env.step(action)
        assert (obs, reward, terminated, truncated, info["turn"]) == (
            want_obs,
            want_reward,
            want_done,
            False,
            turn,
        )
    metrics = info["metrics"]
    assert metrics["correct"] == 1.0 and metrics["tool_calls"] == 3.0 and metrics["void_trajectory"] == 0.0
    assert info["answer"] == "43" and info["ground_truth"] == "43"


def test_boxed_answer_and_fenced_code_block(env):
    env.reset(options={"task": TASK})
    obs, reward, terminated, *_ = env.step("Let me compute.\n```python\nprint(6 * 7 + 1)\n```")
    assert (obs, reward, terminated) == ("43", 0.0, False)
    obs, reward, terminated, truncated, info = env.step(r"Therefore the result is $\boxed{43}$.")
    assert (reward, terminated, info["answer"]) == (1.0, True, "43")


def test_wrong_answer_scores_zero(env):
    env.reset(options={"task": TASK})
    *_, reward, terminated, truncated, info = env.step("<answer>42</answer>")
    assert (reward, terminated, info["metrics"]["correct"]) == (0.0, True, 0.0)


def test_timeout_crash_and_tracebacks_are_observations(env):
    env.reset(options={"task": TASK})
    env.step(py("keep = 5"))
    obs, reward, terminated, truncated, info = env.step(py("while True:\n    pass"))
    assert "ran longer than the 3 s limit" in obs and not terminated and info["tool_calls"][0]["ok"] is False
    assert env.step(py("print(keep)"))[0] == "5"  # the KeyboardInterrupt left the variables alone
    obs, *_ = env.step(py("import os\nos._exit(3)"))
    assert "interpreter crashed" in obs and "variables from earlier calls are gone" in obs
    obs, *_ = env.step(py("print(keep)"))
    assert "NameError" in obs
    obs, *_ = env.step(py("1 / 0"))
    assert "ZeroDivisionError" in obs and obs.startswith("Traceback")
    *_, info = env.step("<answer>43</answer>")
    assert info["metrics"]["tool_errors"] == 2.0


def test_long_output_is_cut_with_a_note(backend):
    env = agentrl.make("agentrl/Code-v0", sandbox_backend=backend, max_output_chars=500)
    env.reset(options={"task": TASK})
    obs, *_ = env.step(py("print('a' * 3000 + 'END')"))
    assert "characters cut" in obs and obs.endswith("END") and len(obs) < 600
    env.close()


def test_network_and_fork_bombs_are_contained(env):
    env.reset(options={"task": TASK})
    obs, *_ = env.step(py("import socket\nprint([name for _, name in socket.if_nameindex()])"))
    assert obs == "['lo']"  # no interface but loopback: nothing leaves the sandbox
    obs, *_ = env.step(py("import socket\nsocket.create_connection(('10.255.255.1', 80), timeout=2)"))
    assert "Error" in obs and ("unreachable" in obs.lower() or "timed out" in obs.lower())
    bomb = (
        "import os\nstarted = 0\nfor _ in range(500):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        import time\n        time.sleep(60)\n"
        "        os._exit(0)\n    started += 1\nprint(started)"
    )
    obs, *_ = env.step(py(bomb))
    assert obs.isdigit() and int(obs) < 500  # the pids limit stopped it
    assert env.step(py("print('alive')"))[0] == "alive"


def test_void_turn_policies(backend):
    flag = agentrl.make("agentrl/Code-v0", sandbox_backend=backend, void_turn_policy="flag")
    flag.reset(options={"task": TASK})
    obs, reward, terminated, truncated, info = flag.step("I am thinking about it.")
    assert info["void_turn"] is True and not terminated and "No tool call or answer found" in obs
    *_, info = flag.step("<answer>43</answer>")
    assert info["metrics"]["void_trajectory"] == 1.0 and info["metrics"]["reward"] == 1.0

    end = agentrl.make("agentrl/Code-v0", sandbox_backend=backend, void_turn_policy="end")
    end.reset(options={"task": TASK})
    obs, reward, terminated, truncated, info = end.step("I am thinking about it.")
    assert (reward, terminated, truncated, info["answer"]) == (0.0, True, False, None)
    assert info["metrics"]["void_trajectory"] == 1.0

    off = agentrl.make("agentrl/Code-v0", sandbox_backend=backend, void_turn_policy="off")
    off.reset(options={"task": TASK})
    off.step("hmm")
    *_, info = off.step("<answer>43</answer>")
    assert "void_trajectory" not in info["metrics"] and info["metrics"]["void_turns"] == 1.0
    for env in (flag, end, off):
        env.close()


def test_bad_kwargs_name_the_field():
    with pytest.raises(agentrl.errors.ConfigError, match="void_turn_policy"):
        agentrl.make("agentrl/Code-v0", void_turn_policy="sometimes")
    with pytest.raises(agentrl.errors.ConfigError, match="env.source"):
        agentrl.make("agentrl/Code-v0", source="gsm8k")


def test_without_any_backend_the_tool_says_so(monkeypatch):
    # A Docker engine that does not answer: construction works, the tool call is a clear observation.
    import agentrl.sandboxes.docker_backend as docker_backend

    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:9")
    monkeypatch.setattr(docker_backend, "_client", None)  # forget the process-wide client
    env = agentrl.make("agentrl/Code-v0", sandbox_backend="docker", pool_size=3)  # a pool of its own
    env.reset(options={"task": TASK})
    obs, reward, terminated, truncated, info = env.step(py("print(1)"))
    assert obs.startswith("Error: sandbox failure in python") and not terminated, obs
    assert info["tool_calls"][0]["error_kind"] == "sandbox_error"
    *_, info = env.step("<answer>43</answer>")
    assert info["metrics"]["reward"] == 1.0
    env.close()


def run_oracle(env, tasks) -> float:
    """Mean oracle reward over ``tasks`` (one scripted episode each)."""
    return sum(play_one(env, task)[0] for task in tasks) / len(tasks)


def test_oracle_solves_generated_problems(backend):
    env = agentrl.make("agentrl/Code-v0", sandbox_backend=backend, n_tasks=100)
    assert run_oracle(env, list(env.unwrapped.tasks("test"))) >= 0.99
    reward, info = play_one(env, seed=3)  # the protocol helper, from a seeded reset
    assert reward == 1.0 and info["metrics"]["tool_calls"] == 2.0
    env.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    "env_id", ["agentrl/CodeAIME24-v0", "agentrl/CodeAIME25-v0", "agentrl/CodeMath500-v0"]
)
def test_oracle_on_real_sets(backend, env_id):
    env = agentrl.make(env_id, sandbox_backend=backend)
    tasks = list(env.unwrapped.tasks("test"))
    assert len(tasks) in (30, 500)
    assert run_oracle(env, tasks[:100]) >= 0.99
    env.close()


def test_real_set_without_data_is_a_clear_error(monkeypatch, tmp_path):
    (tmp_path / "math").mkdir()
    monkeypatch.setenv("AGENTRL_DATA", str(tmp_path))  # an override folder that lacks the file
    env = agentrl.make("agentrl/CodeAIME24-v0")  # construction needs no data
    with pytest.raises(agentrl.errors.EnvError, match=r"math/aime2024.jsonl is missing"):
        env.reset(seed=0)
    env.close()
