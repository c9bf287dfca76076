"""The Docker sandbox inside Ray env actors, on a real two-node local cluster.

The code-interpreter env runs its ``python`` tool in hardened Docker containers leased from a pool;
with ``env.placement: ray`` the env (and its pool) lives in actors on either node. The episodes must
be the ones local placement gives, and a box handed to the next episode on the same actor must be as
clean as a new one (the pool's verified scrub still runs there).
"""

from __future__ import annotations

import json

import pytest

from agentrl.envs.code.oracle import CodeOracle, call
from agentrl.rollout.agent import AgentConfig
from agentrl.rollout.runner import RunnerConfig
from tests.scale.test_ray_envs import _canonical

pytestmark = [pytest.mark.slow, pytest.mark.docker]

ENV_ID = "agentrl/Code-v0"
ENV_KWARGS = {"sandbox_backend": "docker", "pool_size": 2, "n_tasks": 8}


def _config(concurrency: int = 4) -> RunnerConfig:
    # the oracle's first cell carries a whole solution program: room for it in one turn
    return RunnerConfig(
        agent=AgentConfig(max_new_tokens=2048, max_context_tokens=8192),
        concurrency=concurrency,
        progress=False,
    )


def _tasks(n: int) -> list:
    import agentrl

    env = agentrl.make(ENV_ID, **ENV_KWARGS)
    tasks = list(env.unwrapped.load_tasks("train"))[:n]
    env.close()
    return tasks


def _without_usage(episode) -> dict:
    """:func:`_canonical` less the sandbox's measured usage (wall/CPU time, peak memory vary by run),
    which each turn must still carry: the cells did run in a box."""
    record = _canonical(episode)
    for segment in record["segments"]:
        for turn in segment["turns"]:
            usage = turn.pop("sandbox_usage")
            assert (usage["wall_s"] > 0) if turn["tool_calls"] else usage is None, usage
            for tool_call in turn["tool_calls"]:
                assert tool_call.pop("usage")["wall_s"] > 0
    return record


def _ray_envs(env_kwargs: dict, **settings):
    from agentrl.rollout.remote_env import RayEnvs, RaySettings

    return RayEnvs(ENV_ID, env_kwargs, RaySettings(num_cpus_per_env=0.25, call_timeout_s=90, **settings))


def test_docker_sandbox_in_ray_actors_gives_the_local_episodes(ray_cluster, tokenizer):
    import agentrl
    from agentrl.rollout.runner import RunStats, run_oracle_episodes

    tasks = _tasks(4)
    local = run_oracle_episodes(
        lambda: agentrl.make(ENV_ID, **ENV_KWARGS), tasks, CodeOracle, tokenizer, _config(), seed=5
    )
    envs = _ray_envs(ENV_KWARGS, envs_per_actor=2)
    try:
        stats = RunStats()
        remote = run_oracle_episodes(envs, tasks, CodeOracle, tokenizer, _config(), seed=5, stats=stats)
        nodes = {envs.ray.get(a.where.remote())["node_id"] for a in envs.actors}
        backends = [envs.ray.get(a.sandbox_pools.remote()) for a in envs.actors]
    finally:
        envs.shutdown()
    assert stats.failed == 0 and [e.outcome for e in local] == [1.0] * 4, [e.error for e in local]
    assert [_without_usage(e) for e in remote] == [_without_usage(e) for e in local]
    assert len(nodes) == 2, f"env actors should spread over both nodes, got {nodes}"
    # every actor ran its cells in Docker containers, from a pool it leased from
    pools = [pool for host in backends for pool in host]
    assert pools and all(p["backend"] == "docker" and p["leases"] >= 1 for p in pools), pools
    assert sum(p["leases"] for p in pools) == 4


PROBE_AND_PLANT = (
    "import os\n"
    "print(json.dumps([sorted(os.listdir('/work')), sorted(os.listdir('/tmp')), 'secret' in globals()]))\n"
    "open('/work/planted.py', 'w').write('x = 1')\n"
    "open('/tmp/planted', 'w').write('secret')\n"
    "secret = 'episode data'\n"
)


class PlantingAgent(CodeOracle):
    """Turn 1: print what the box holds from earlier episodes, then leave a file and a variable behind."""

    seen: list[list] = []

    def act(self, observation: str, info: dict | None = None) -> str:
        self.turn += 1
        if self.turn == 1:
            code = "import json\n" + PROBE_AND_PLANT
            return call(code)
        PlantingAgent.seen.append(json.loads(observation.strip().splitlines()[-1]))
        return "<answer>0</answer>"


def test_each_episode_on_an_actor_leases_a_pristine_box(ray_cluster, tokenizer):
    from agentrl.rollout.runner import RunStats, run_oracle_episodes

    tasks = _tasks(3)
    # one actor, one box: every episode leases the box the previous one planted in
    envs = _ray_envs({**ENV_KWARGS, "pool_size": 1}, envs_per_actor=1)
    PlantingAgent.seen = []
    config = _config(concurrency=1)
    try:
        stats = RunStats()
        episodes = run_oracle_episodes(envs, tasks, PlantingAgent, tokenizer, config, seed=0, stats=stats)
        (actor,) = envs.actors
        (pool,) = envs.ray.get(actor.sandbox_pools.remote())
    finally:
        envs.shutdown()
    assert stats.failed == 0 and all(not e.failed for e in episodes), [e.error for e in episodes]
    assert PlantingAgent.seen == [[[], [], False]] * 3  # nothing of an earlier episode is visible
    # the same box served all three episodes, scrubbed and verified in between (not replaced)
    assert pool["created"] == 1 and pool["leases"] == 3, pool
    assert pool["resets"] >= 2 and pool["reset_failures"] == 0, pool
