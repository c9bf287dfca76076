"""fork() over EVERY registered env id, on real components (sandboxes, the HTTP shop server).

The differential test: a reference episode (the env's oracle where it has one, else scripted
actions) is played once without a fork. Then a prefix of it is played, the env is forked, and

- the original and the fork are driven with the same suffix, one after the other (the original to
  its end first: a purchase, a final answer, files it wrote), and both give the reference's steps;
- one of the two is driven differently first (other tool calls, a wrong answer, files and variables
  written, a session clicked elsewhere), then the other with the reference suffix: it still gives
  the reference's steps, both ways round, so neither sees the other's changes.
"""

from __future__ import annotations

import json

import pytest

import agentrl
from agentrl.env import TextEnv, fork_env, fork_support
from agentrl.errors import EnvError
from agentrl.outcome import OUTCOME

# the platform's own ids (in the full suite other tests register toy envs, test/..., in this process)
ALL_IDS = [env_id for env_id in agentrl.registered_ids() if env_id.startswith("agentrl/")]
MAKE_KWARGS = {"agentrl/GAIA-Real-v0": {"data_dir": "fixture"}}
SEED = 7


def _oracle(env_id: str):
    from agentrl.envs.code.oracle import CodeOracle
    from agentrl.envs.gaia.oracle import LocalGaiaOracle
    from agentrl.envs.search.oracle import GoldQAOracle, SearchOracle
    from agentrl.envs.sql.oracle import SQLOracle
    from agentrl.envs.web.oracle import WebShopOracle

    family = env_id.split("/")[1]
    if family.startswith("SearchQA"):
        return GoldQAOracle()
    if family.startswith("Search"):
        return SearchOracle()
    if family.startswith("SQL"):
        return SQLOracle()
    if family.startswith("Code"):
        return CodeOracle()
    if family == "GAIA-v0":
        return LocalGaiaOracle()
    if family.startswith("Web"):
        return WebShopOracle()
    return None  # GAIA-Real: scripted below


def _call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _step(env, action):
    obs, reward, terminated, truncated, info = env.step(action)
    # the calls carry wall-clock seconds: the rest of each typed call is compared (as test_env_contract)
    calls = [(c.name, c.arguments, c.ok, c.error_kind, c.text, c.done) for c in info[OUTCOME].calls]
    info = {k: v for k, v in info.items() if k not in ("tool_calls", OUTCOME)} | {"calls": calls}
    return (obs, reward, terminated, truncated, json.dumps(info, sort_keys=True, default=str))


def _play(env, actions):
    trace = []
    for action in actions:
        trace.append(_step(env, action))
        if trace[-1][2] or trace[-1][3]:
            break
    return trace


def _make(env_id):
    return agentrl.make(env_id, **MAKE_KWARGS.get(env_id, {}))


def _reference(env_id):
    """(task, actions, trace) of one whole episode played without a fork."""
    env = _make(env_id)
    try:
        obs, _ = env.reset(seed=SEED)
        task = env.unwrapped.task
        oracle = _oracle(env_id)
        actions, trace = [], []
        if oracle is None:  # GAIA-Real (fixture): the python interpreter's state, then an answer
            script = [_call("python", code="x = 41"), _call("read_file", file_name="missing.txt"),
                      _call("python", code="print(x + 1)"), "FINAL ANSWER: 42"]  # fmt: skip
        oracle and oracle.reset(task)
        while True:
            action = oracle.act(obs) if oracle is not None else script[len(actions)]
            actions.append(action)
            trace.append(_step(env, action))
            obs = trace[-1][0]
            if trace[-1][2] or trace[-1][3]:
                break
        return task, actions, trace
    finally:
        env.close()


def _disturb(env_id, env) -> list[str]:
    """Actions that change the env's state another way than the reference does."""
    tools = {schema["function"]["name"] for schema in env.unwrapped.tools}
    actions = []
    if "python" in tools:
        actions.append(_call("python", code="open('fork_probe.txt', 'w').write('x'); fork_probe = 1; x = -1"))
    if "search" in tools and "Web" not in env_id:
        actions.append(_call("search", query="zebra lighthouse"))
    if "query" in tools:
        actions.append(_call("query", sql="SELECT 1"))
    if "Web" in env_id:
        actions += ["click[Back to Search]", "search[blue cotton]", "click[< Prev]", "click[Buy Now]"]
    return actions + ["<answer>certainly wrong</answer>", "FINAL ANSWER: certainly wrong"]


@pytest.fixture(scope="module")
def references():
    return {}


def _prefix_env(env_id, task, actions, k):
    env = _make(env_id)
    env.reset(seed=SEED, options={"task": task})
    for action in actions[:k]:
        env.step(action)
    return env


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_every_env_declares_fork(env_id):
    method, reason = fork_support(env_id)
    assert method is not None or reason, env_id


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_fork_differential(env_id, references):
    task, actions, reference = _reference(env_id)
    k = len(actions) // 2  # 0 for a one-turn episode: the fork is taken right after reset
    suffix = actions[k:]

    # same suffix on both, the original to its end first
    env = _prefix_env(env_id, task, actions, k)
    try:
        fork = fork_env(env)
        try:
            assert _play(env, suffix) == reference[k:]
            assert _play(fork, suffix) == reference[k:]
        finally:
            fork.close()
    finally:
        env.close()

    # driven differently: neither sees the other's changes (both ways round)
    for disturbed_first in ("original", "fork"):
        env = _prefix_env(env_id, task, actions, k)
        try:
            fork = fork_env(env)
            try:
                other, clean = (env, fork) if disturbed_first == "original" else (fork, env)
                disturbed = _play(other, _disturb(env_id, other))
                assert disturbed and disturbed != reference[k : k + len(disturbed)]
                assert _play(clean, suffix) == reference[k:], disturbed_first
            finally:
                fork.close()
        finally:
            env.close()


@pytest.mark.parametrize("backend", ["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def test_fork_python_state_is_the_parents_and_stays_apart(backend):
    """Code env, both sandbox backends: the fork has the parent's variables and files (replayed
    into a lease of its own); what either writes later the other does not see."""
    env = agentrl.make("agentrl/Code-v0", sandbox_backend=backend)
    try:
        env.reset(seed=0)
        env.step(_call("python", code="import os\nv = 6 * 7\nopen('a.txt', 'w').write(str(v))"))
        fork = fork_env(env)
        try:
            probe = _call("python", code="import os\nprint(v, open('a.txt').read(), os.path.exists('b.txt'), 'w' in globals())")
            env.step(_call("python", code="v = 0\nopen('b.txt', 'w').write('1'); w = 1"))
            assert fork.step(probe)[0] == "42 42 False False"
            fork.step(_call("python", code="open('a.txt', 'w').write('fork')"))
            assert env.step(probe)[0] == "0 42 True True"
            assert env.unwrapped.slot.get() is not fork.unwrapped.slot.get()
        finally:
            fork.close()
    finally:
        env.close()


def test_fork_leases_count_against_the_pool_and_are_released_on_every_path(monkeypatch):
    from agentrl.tools.python import shared_pool

    env = agentrl.make("agentrl/Code-v0", sandbox_backend="bwrap", pool_size=2)
    try:
        env.reset(seed=0)
        env.step(_call("python", code="a = 1"))
        pool = shared_pool("bwrap", 2, memory_mb=512)
        leased = pool.stats.leases
        fork = fork_env(env)
        assert pool.stats.leases == leased + 1 and fork.unwrapped.slot.leased
        fork.close()
        assert not fork.unwrapped.slot.leased
        # a fork that fails half-way (the replay raises) gives its lease back before the error propagates
        monkeypatch.setattr(TextEnv, "_replay_stateful_calls", lambda self: (self.slot.get(), 1 / 0))
        slots = []
        real_attach = type(env.unwrapped).fork_detach

        def detach(self):
            real_attach(self)
            slots.append(self.slot)

        monkeypatch.setattr(type(env.unwrapped), "fork_detach", detach)
        with pytest.raises(ZeroDivisionError):
            fork_env(env)
        assert slots and not slots[0].leased
        assert env.unwrapped.slot.leased  # the parent's own lease is untouched
    finally:
        env.close()


def test_fork_is_refused_with_a_reason():
    class Undeclared(TextEnv):
        def load_tasks(self, split):
            from agentrl.env import Task

            return [Task("t", "q", "a", split)]

    env = Undeclared()
    with pytest.raises(NotImplementedError, match="does not declare how its state is forked"):
        env.fork()
    env = agentrl.make("agentrl/Search-v0")
    with pytest.raises(EnvError, match="reset"):
        env.unwrapped.fork()
    env.reset(seed=0)
    env.step("<answer>x</answer>")
    with pytest.raises(EnvError, match="over"):
        fork_env(env)
    env.close()


def test_fork_copies_the_wrappers_counters():
    env = agentrl.make("agentrl/Search-v0", max_turns=3)
    env.reset(seed=0)
    env.step(_call("search", query="a"))
    env.step(_call("search", query="b"))
    fork = fork_env(env)
    assert fork.step(_call("search", query="c"))[3] is True  # the third turn hits the budget in the fork too
    assert env.step(_call("search", query="c"))[3] is True
