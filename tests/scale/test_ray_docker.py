"""The Docker sandbox inside Ray env actors, on a real two-node local cluster.

The code-interpreter env runs its ``python`` tool in hardened Docker containers leased from a pool;
with ``env.placement: ray`` the env (and its pool) lives in actors on either node. The episodes must
be the ones local placement gives, and a box handed to the next episode on the same actor must be as
clean as a new one (the pool's verified scrub still runs there).
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from agentrl.envs.code.oracle import CodeOracle, call
from agentrl.rollout.settings import RolloutConfig
from tests.scale.test_ray_envs import _canonical

pytestmark = [pytest.mark.slow, pytest.mark.docker]

ENV_ID = "agentrl/Code-v0"
ENV_KWARGS = {"sandbox_backend": "docker", "pool_size": 2, "n_tasks": 8}


def _config(concurrency: int = 4) -> RolloutConfig:
    # the oracle's first cell carries a whole solution program: room for it in one turn
    return RolloutConfig(max_new_tokens=2048, max_context_tokens=8192, concurrency=concurrency, group_size=1)


def _tasks(n: int) -> list:
    import agentrl

    env = agentrl.make(ENV_ID, **ENV_KWARGS)
    tasks = list(env.unwrapped.load_tasks("train"))[:n]
    env.close()
    return tasks


def _without_usage(episode, every_call_in_box: bool = True) -> dict:
    """:func:`_canonical` less the sandbox's measured usage (wall/CPU time, peak memory vary by run),
    which each tool-call turn must still carry when ``every_call_in_box`` (the cells did run in a box;
    SQL's list_tables/describe are answered without one)."""
    record = _canonical(episode)
    for segment in record["segments"]:
        for turn in segment["turns"]:
            usage = turn.pop("sandbox_usage")
            if every_call_in_box:
                assert (usage["wall_s"] > 0) if turn["tool_calls"] else usage is None, usage
            for tool_call in turn["tool_calls"]:
                measured = tool_call.pop("usage") if every_call_in_box else tool_call.pop("usage", None)
                assert measured is None or measured["wall_s"] > 0
    return record


def _ray_envs(env_kwargs: dict, **settings):
    from agentrl.cluster.remote_env import RayEnvs, RaySettings

    return RayEnvs(ENV_ID, env_kwargs, RaySettings(num_cpus_per_env=0.25, call_timeout_s=90, **settings))


@pytest.mark.parametrize("services", ["node", "actor"])
def test_docker_sandbox_in_ray_actors_gives_the_local_episodes(ray_cluster, tokenizer, services):
    import agentrl
    from agentrl.rollout.runner import RunStats, run_oracle_episodes

    tasks = _tasks(4)
    local = run_oracle_episodes(
        lambda: agentrl.make(ENV_ID, **ENV_KWARGS), tasks, CodeOracle, tokenizer, _config(), seed=5
    )
    envs = _ray_envs(ENV_KWARGS, envs_per_actor=2, services=services)
    try:
        stats = RunStats()
        remote = run_oracle_episodes(envs, tasks, CodeOracle, tokenizer, _config(), seed=5, stats=stats)
        nodes = {envs.ray.get(a.where.remote())["node_id"] for a in envs.actors}
        actor_pids = {envs.ray.get(a.where.remote())["pid"] for a in envs.actors}
        backends = [envs.ray.get(a.sandbox_pools.remote()) for a in envs.actors]
    finally:
        envs.shutdown()
    assert stats.failed == 0 and [e.outcome for e in local] == [1.0] * 4, [e.error for e in local]
    assert [_without_usage(e) for e in remote] == [_without_usage(e) for e in local]
    assert len(nodes) == 2, f"env actors should spread over both nodes, got {nodes}"
    # every actor ran its cells in Docker containers, leased from its node's pool or its own
    pools = {pool["host"]["pid"]: pool for host in backends for pool in host}
    assert pools and all(p["backend"] == "docker" and p["leases"] >= 1 for p in pools.values()), pools
    assert sum(p["leases"] for p in pools.values()) == 4
    assert (set(pools) == actor_pids) if services == "actor" else not set(pools) & actor_pids, (
        pools,
        actor_pids,
    )


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


def test_actors_on_one_node_lease_from_that_nodes_pool(ray_cluster, tokenizer):
    from agentrl.rollout.runner import RunStats, run_oracle_episodes

    tasks = _tasks(8)
    # 4 concurrent one-env actors on 2 nodes: some node hosts two of them
    envs = _ray_envs(ENV_KWARGS, envs_per_actor=1)
    try:
        stats = RunStats()
        episodes = run_oracle_episodes(envs, tasks, CodeOracle, tokenizer, _config(), seed=1, stats=stats)
        placed = [
            (envs.ray.get(a.where.remote()), envs.ray.get(a.sandbox_pools.remote())) for a in envs.actors
        ]
    finally:
        envs.shutdown()
    assert stats.failed == 0 and [e.outcome for e in episodes] == [1.0] * 8
    assert len(placed) == 4
    by_node: dict[str, set[int]] = {}
    for where, (pool,) in placed:
        assert pool["host"]["node_id"] == where["node_id"] and pool["host"]["pid"] != where["pid"]
        assert pool["backend"] == "docker" and pool["size"] == 2  # env.kwargs.pool_size, per node
        by_node.setdefault(where["node_id"], set()).add(pool["host"]["pid"])
    assert len(by_node) == 2 and all(len(hosts) == 1 for hosts in by_node.values()), by_node
    (pid_a,), (pid_b,) = by_node.values()
    assert pid_a != pid_b  # a pool per node
    assert max(sum(w["node_id"] == node for w, _ in placed) for node in by_node) >= 2  # shared by 2 actors
    pools = {pool["host"]["pid"]: pool for _, (pool,) in placed}
    assert sum(p["leases"] for p in pools.values()) == 8 and all(p["held"] == 0 for p in pools.values())
    assert all(p["created"] <= 2 for p in pools.values()), pools  # within the node pool's size


class KillWhileLeased(CodeOracle):
    """The oracle, except that on its second action in the first episode it SIGKILLs its env actor,
    which holds a box of its node's size-1 pool at that point."""

    envs = None
    kills_left = 0

    def act(self, observation: str, info: dict | None = None) -> str:
        if self.turn == 1 and KillWhileLeased.kills_left > 0:
            KillWhileLeased.kills_left -= 1
            (remote_env,) = self.envs.open_envs.values()
            pid = self.envs.ray.get(remote_env.handle.where.remote())["pid"]
            os.kill(pid, signal.SIGKILL)
        return super().act(observation, info)


def test_a_box_held_by_a_dead_actor_goes_back_to_the_node_pool(ray_cluster, tokenizer):
    from agentrl.rollout.runner import RunStats, run_oracle_episodes

    tasks = _tasks(2)
    # one actor at a time, on the envnode node, whose pool has one box
    envs = _ray_envs({**ENV_KWARGS, "pool_size": 1}, envs_per_actor=1, resources={"envnode": 1})
    KillWhileLeased.envs, KillWhileLeased.kills_left = envs, 1
    try:
        stats = RunStats()
        episodes = run_oracle_episodes(
            envs, tasks, KillWhileLeased, tokenizer, _config(concurrency=1), seed=0, stats=stats
        )
        (actor,) = envs.actors
        (pool,) = envs.ray.get(actor.sandbox_pools.remote())
    finally:
        envs.shutdown()
    assert KillWhileLeased.kills_left == 0
    assert [e.failed for e in episodes] == [True, False] and "EnvActorLost" in episodes[0].error
    # the next episode (a new actor) got the dead actor's box back from the pool, scrubbed
    assert episodes[1].outcome == 1.0, episodes[1].error
    assert pool["created"] == 1 and pool["leases"] == 2 and pool["held"] == 0, pool


def test_sql_env_through_the_node_pool_gives_the_local_episodes(ray_cluster, tokenizer):
    """The SQL tool copies its database into the leased box (put_file) and queries it in the box's
    interpreter: both go through the node's pool host and give the local episodes."""
    import agentrl
    from agentrl.envs.sql.oracle import SQLOracle
    from agentrl.cluster.remote_env import RayEnvs, RaySettings
    from agentrl.rollout.runner import RunStats, run_oracle_episodes

    env_id, kwargs = "agentrl/SQLChinook-v0", {"sandbox_backend": "docker", "pool_size": 2}
    probe = agentrl.make(env_id, **kwargs)
    tasks = list(probe.unwrapped.load_tasks("train"))[:4]
    probe.close()
    local = run_oracle_episodes(
        lambda: agentrl.make(env_id, **kwargs), tasks, SQLOracle, tokenizer, _config(), seed=0
    )
    envs = RayEnvs(env_id, kwargs, RaySettings(num_cpus_per_env=0.25, call_timeout_s=90))
    try:
        stats = RunStats()
        remote = run_oracle_episodes(envs, tasks, SQLOracle, tokenizer, _config(), seed=0, stats=stats)
        pools = {p["host"]["pid"]: p for a in envs.actors for p in envs.ray.get(a.sandbox_pools.remote())}
        actor_pids = {envs.ray.get(a.where.remote())["pid"] for a in envs.actors}
    finally:
        envs.shutdown()
    assert stats.failed == 0 and [e.outcome for e in local] == [1.0] * 4, [e.error for e in local]
    assert [_without_usage(e, False) for e in remote] == [_without_usage(e, False) for e in local]
    assert pools and not set(pools) & actor_pids  # the boxes were leased from node pool hosts
    assert sum(p["leases"] for p in pools.values()) == 4
