"""Envs in Ray actors on a real two-node local cluster: same episodes as local placement; faults."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys

import pytest

from agentrl.envs.search.oracle import SearchOracle
from agentrl.rollout.runner import RunStats, run_oracle_episodes
from agentrl.rollout.settings import RolloutConfig

pytestmark = pytest.mark.slow  # a two-node cluster starts in 10-35 s on the shared 2-core machine

ENV_ID = "agentrl/Search-v0"
ENV_KWARGS = {"split": "train", "hops": "single", "max_turns": 4}


def _tasks(n: int) -> list:
    import agentrl

    env = agentrl.make(ENV_ID, **ENV_KWARGS)
    tasks = list(env.unwrapped.load_tasks("train"))[:n]
    env.close()
    return tasks


def _config(**kw) -> RolloutConfig:
    return RolloutConfig(max_new_tokens=512, concurrency=4, group_size=1, **kw)


def _canonical(episode) -> dict:
    """Everything an episode records except wall-clock times, its random id and the env's label."""
    record = episode.to_dict()
    for key in ("episode_id", "timings", "env_id"):  # env_id: the local factory is a lambda
        record.pop(key)
    for segment in record["segments"]:
        for turn in segment["turns"]:
            turn.pop("timings")
            for call in turn["tool_calls"]:
                call.pop("seconds")
    return record


def _ray_envs(**settings):
    from agentrl.cluster.remote_env import RayEnvs, RaySettings

    return RayEnvs(ENV_ID, ENV_KWARGS, RaySettings(**settings))


def test_ray_placement_gives_the_same_episodes_as_local(ray_cluster, tokenizer):
    import agentrl

    tasks = _tasks(6)
    local = run_oracle_episodes(
        lambda: agentrl.make(ENV_ID, **ENV_KWARGS), tasks, SearchOracle, tokenizer, _config(), seed=3
    )
    envs = _ray_envs(num_cpus_per_env=0.25, envs_per_actor=2, call_timeout_s=60)
    try:
        stats = RunStats()
        remote = run_oracle_episodes(envs, tasks, SearchOracle, tokenizer, _config(), seed=3, stats=stats)
        nodes = {envs.ray.get(a.where.remote())["node_id"] for a in envs.actors}
    finally:
        envs.shutdown()
    assert stats.failed == 0 and all(not e.failed for e in local)
    assert [e.outcome for e in local] == [1.0] * 6  # the oracle solves single-hop tasks
    assert [_canonical(e) for e in remote] == [_canonical(e) for e in local]
    assert remote[0].env_id == ENV_ID
    assert len(nodes) == 2, f"env actors should spread over both nodes, got {nodes}"


class KillOnSecondTurn(SearchOracle):
    """The oracle, except that before its second action on ``victim`` it SIGKILLs that episode's actor
    (once: a rerun of the episode is left alone)."""

    victim = ""
    envs = None
    kills_left = 0

    def reset(self, task) -> None:
        super().reset(task)
        self.task_id, self.turn = task.id, 0

    def act(self, observation: str, info: dict | None = None) -> str:
        self.turn += 1
        if self.task_id == self.victim and self.turn == 2 and KillOnSecondTurn.kills_left > 0:
            KillOnSecondTurn.kills_left -= 1
            (remote_env,) = [
                e for e in self.envs.open_envs.values() if e.task is not None and e.task.id == self.victim
            ]
            pid = self.envs.ray.get(remote_env.handle.where.remote())["pid"]
            os.kill(pid, signal.SIGKILL)
        return super().act(observation, info)


def test_an_env_actor_killed_mid_episode_costs_only_its_episode(ray_cluster, tokenizer):
    tasks = _tasks(4)
    envs = _ray_envs(num_cpus_per_env=0.25, envs_per_actor=1, call_timeout_s=60)
    KillOnSecondTurn.victim, KillOnSecondTurn.envs, KillOnSecondTurn.kills_left = tasks[1].id, envs, 1
    try:
        stats = RunStats()
        episodes = run_oracle_episodes(
            envs, tasks, KillOnSecondTurn, tokenizer, _config(), seed=0, stats=stats
        )
        # the pool replaced the dead actor: a later run still works
        (again,) = run_oracle_episodes(envs, [tasks[1]], SearchOracle, tokenizer, _config(), seed=1)
    finally:
        envs.shutdown()
    assert [e.failed for e in episodes] == [False, True, False, False]
    killed = episodes[1]
    assert "EnvActorLost: env actor" in killed.error and "died during step" in killed.error, killed.error
    assert killed.task_id == tasks[1].id and len(killed.turns) == 1  # the turn before the kill is kept
    assert [e.outcome for e in episodes if not e.failed] == [1.0, 1.0, 1.0]
    assert stats.failed == 1 and stats.episodes == 4
    assert not again.failed and again.outcome == 1.0


def test_an_episode_lost_with_its_actor_is_rerun_when_configured(ray_cluster, tokenizer):
    import agentrl

    tasks = _tasks(3)
    envs = _ray_envs(num_cpus_per_env=0.25, envs_per_actor=1, call_timeout_s=60, lost_retries=1)
    KillOnSecondTurn.victim, KillOnSecondTurn.envs, KillOnSecondTurn.kills_left = tasks[1].id, envs, 1
    try:
        stats = RunStats()
        episodes = run_oracle_episodes(
            envs, tasks, KillOnSecondTurn, tokenizer, _config(), seed=0, stats=stats
        )
    finally:
        envs.shutdown()
    local = run_oracle_episodes(
        lambda: agentrl.make(ENV_ID, **ENV_KWARGS), tasks, SearchOracle, tokenizer, _config(), seed=0
    )
    assert KillOnSecondTurn.kills_left == 0, "the actor was killed"
    assert stats.retried == 1 and stats.failed == 0
    assert [_canonical(e) for e in episodes] == [
        _canonical(e) for e in local
    ]  # the rerun is the same episode


def _hanging_lookup_env(hang_s: float = 60):
    """The toy lookup env whose tool sleeps ``hang_s`` on task k2, once per actor process (a hung
    call at 60 s, a slow node at 120 s)."""
    from tests.rollout.toy import LookupEnv, make_lookup_env

    LookupEnv.faults = {"hang_on": "k2", "hang_s": hang_s}
    LookupEnv.hangs_left["count"] = 1
    return make_lookup_env()


@contextlib.contextmanager
def _test_code_shipped_by_value():
    """The actors run in other processes: ship the test's env code by value, not by module name."""
    import ray.cloudpickle

    import tests.rollout.toy

    modules = (tests.rollout.toy, sys.modules[__name__])
    for module in modules:
        ray.cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        for module in modules:
            ray.cloudpickle.unregister_pickle_by_value(module)


def _slow_building_lookup_env(build_s: float):
    """The toy lookup env whose constructor takes ``build_s`` (data, clients, a sandbox pool ...)."""
    import time

    from tests.rollout.toy import make_lookup_env

    time.sleep(build_s)
    return make_lookup_env()


def test_a_slow_env_start_is_cut_by_the_start_limit_not_the_watchdog(ray_cluster, tokenizer):
    """Starting a remote env (a new actor, the env built on it) is the "starting" phase: a 5 s
    watchdog does not cut an env that takes 12 s to build, env.ray_start_timeout_s does. (With a 2 s
    watchdog, a loaded 2-core machine once took longer than that for the first remote call after the
    start, which is the watchdog's to cut: the margins are wide.)"""
    from agentrl.rollout.generators.scripted import ScriptedGenerator
    from agentrl.cluster.remote_env import RayEnvs, RaySettings
    from agentrl.rollout.runner import run_episodes
    from tests.rollout.test_agent import lookup_script

    gen = ScriptedGenerator(tokenizer, lookup_script)
    slow_build = functools.partial(_slow_building_lookup_env, 12.0)
    results = {}
    with _test_code_shipped_by_value():
        for limit in (120.0, 3.0):
            envs = RayEnvs(slow_build, None, RaySettings(num_cpus_per_env=0.25, start_timeout_s=limit))
            stats = RunStats()
            try:
                episodes = run_episodes(
                    envs, ["k1", "k2"], gen, tokenizer, _config(watchdog_s=5.0), stats=stats
                )
            finally:
                envs.shutdown()
            results[limit] = (episodes, stats)
    started, stats = results[120.0]
    assert [e.outcome for e in started] == [1.0, 1.0] and stats.watchdog_fired == 0
    cut, stats = results[3.0]
    assert all(e.failed and "env.ray_start_timeout_s" in e.error for e in cut), [e.error for e in cut]
    assert stats.watchdog_fired == 0


def test_a_hung_remote_call_times_out_and_fails_only_its_episode(ray_cluster, tokenizer):
    from agentrl.rollout.generators.scripted import ScriptedGenerator
    from agentrl.cluster.remote_env import RayEnvs, RaySettings
    from agentrl.rollout.runner import run_episodes
    from tests.rollout.test_agent import lookup_script

    with _test_code_shipped_by_value():
        envs = RayEnvs(_hanging_lookup_env, None, RaySettings(num_cpus_per_env=0.25, call_timeout_s=10))
        try:
            gen = ScriptedGenerator(tokenizer, lookup_script)
            episodes = run_episodes(envs, ["k1", "k2", "k3"], gen, tokenizer, _config())
        finally:
            envs.shutdown()
    assert [e.failed for e in episodes] == [False, True, False]
    hung = episodes[1]
    assert "remote env step took over 10s" in hung.error and "env.ray_call_timeout_s" in hung.error, (
        hung.error
    )
    assert [e.outcome for e in episodes if not e.failed] == [1.0, 1.0]


def test_a_slow_remote_step_does_not_hold_the_run_past_the_watchdog(ray_cluster, tokenizer):
    import time

    from agentrl.rollout.generators.scripted import ScriptedGenerator
    from agentrl.cluster.remote_env import RayEnvs, RaySettings
    from agentrl.rollout.runner import run_episodes
    from tests.rollout.test_agent import lookup_script

    slow_node = functools.partial(_hanging_lookup_env, 120)
    with _test_code_shipped_by_value():
        # the per-call timeout is far away: only the runner's watchdog can stop the slow step
        envs = RayEnvs(slow_node, None, RaySettings(num_cpus_per_env=0.25, call_timeout_s=600))
        try:
            gen = ScriptedGenerator(tokenizer, lookup_script)
            run_episodes(envs, ["k1", "k3", "k1"], gen, tokenizer, _config())  # three warm actors
            stats = RunStats()
            start = time.monotonic()
            config = _config(watchdog_s=10.0)
            episodes = run_episodes(envs, ["k1", "k2", "k3"], gen, tokenizer, config, stats=stats)
            returned_after = time.monotonic() - start
            alive = len(envs.actors)
        finally:
            envs.shutdown()
    assert [e.failed for e in episodes] == [False, True, False]
    assert "watchdog: no progress" in episodes[1].error and "rollout.watchdog_s" in episodes[1].error
    assert stats.watchdog_fired == 1
    assert returned_after < 120, "the run waited for the slow step instead of cancelling it"
    assert [e.outcome for e in episodes if not e.failed] == [1.0, 1.0]
    assert alive == 2  # of 3 one-episode actors, the slow episode's was killed and dropped from the pool
