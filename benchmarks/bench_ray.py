"""Remote envs (``env.placement: ray``) vs local ones: per-step overhead, same run, same episodes.

Starts a two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``, 1 CPU per node),
then plays the same Search-v0 tasks with the scripted oracle through the rollout runner twice:
envs in this process (local) and envs in Ray actors spread over both nodes. The per-step time is
what the agent records around each ``env.step`` (``turn.timings["env_s"]``), so the remote figure
includes the actor round trip and (de)serialisation. Also: a no-op actor call (the floor of any
remote call) and whole-run episodes/s. The cluster is shut down by the processes it started.

Sandbox-bound part (``--part sandbox``, needs Docker): Code-v0 episodes whose python cells run in
Docker containers leased from each node's pool (``env.ray_services=node``), with one simulated node
and with two, at the same concurrency, plus local placement. The simulated nodes share this
machine's cores and its one Docker engine, so this measures the overhead of placement, per-node
pools and scheduling - not the throughput real extra machines would add.

    python benchmarks/bench_ray.py            # 48 episodes, concurrency 4; then 24 code episodes
    python benchmarks/bench_ray.py --quick    # 12 episodes; 8 code episodes
    python benchmarks/bench_ray.py --part sandbox --json out.json
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import Row, median, parser, percentile, print_table, write_json  # noqa: E402

import agentrl
from agentrl.envs.code.oracle import CodeOracle
from agentrl.envs.search.oracle import SearchOracle
from agentrl.rollout.model import load_tokenizer
from agentrl.rollout.runner import RunStats, run_oracle_episodes
from agentrl.rollout.settings import RolloutConfig

ENV_ID = "agentrl/Search-v0"
ENV_KWARGS = {"split": "train", "hops": "single", "max_turns": 4}
CODE_ID = "agentrl/Code-v0"
CODE_KWARGS = {"sandbox_backend": "docker", "pool_size": 4, "n_tasks": 64}


def step_times(episodes) -> list[float]:
    return [t.timings["env_s"] for e in episodes for t in e.turns if "env_s" in t.timings]


def run(envs, tasks, tokenizer, concurrency: int, oracle=SearchOracle) -> tuple[list, float]:
    # the code oracle's first cell is a whole program: room for it in one turn
    config = RolloutConfig(
        max_new_tokens=2048, max_context_tokens=8192, concurrency=concurrency, group_size=1
    )
    stats = RunStats()
    episodes = run_oracle_episodes(
        envs, tasks, oracle, tokenizer, config, seed=0, stats=stats, progress=False
    )
    failed = [e.error for e in episodes if e.failed]
    if failed:
        raise RuntimeError(f"{len(failed)} episodes failed, first: {failed[0]}")
    return episodes, stats.wall_s


def start_cluster(nodes: int):
    """A local Ray cluster of ``nodes`` simulated 1-CPU nodes, connected."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    return cluster


def stop_cluster(cluster) -> None:
    import ray

    ray.shutdown()
    cluster.shutdown()


def load_note(before: float) -> str:
    return f"load {before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def step_rows(tokenizer, quick: bool) -> list[Row]:
    """Per-step overhead of a remote Search-v0 env vs a local one, same run."""
    import ray

    from agentrl.cluster.remote_env import RayEnvs, RaySettings

    n = 12 if quick else 48
    probe = agentrl.make(ENV_ID, **ENV_KWARGS)
    tasks = list(probe.unwrapped.load_tasks("train"))[:n]
    probe.close()
    load_before = os.getloadavg()[0]
    cluster = start_cluster(2)
    try:
        envs = RayEnvs(ENV_ID, ENV_KWARGS, RaySettings(num_cpus_per_env=0.25, envs_per_actor=2))
        run(envs, tasks[:4], tokenizer, 4)  # warm-up: actors start, envs load their corpus
        local_eps, local_wall = run(lambda: agentrl.make(ENV_ID, **ENV_KWARGS), tasks, tokenizer, 4)
        remote_eps, remote_wall = run(envs, tasks, tokenizer, 4)
        handle = envs.actors[0]
        noop = []
        for _ in range(50 if quick else 200):
            t0 = time.perf_counter()
            ray.get(handle.where.remote())
            noop.append(time.perf_counter() - t0)
        actors = len(envs.actors)
        nodes = len({ray.get(a.where.remote())["node_id"] for a in envs.actors})
        envs.shutdown()
    finally:
        stop_cluster(cluster)
    local, remote = step_times(local_eps), step_times(remote_eps)
    note = f"{len(remote)} steps, {actors} actors on {nodes} nodes; {load_note(load_before)}"
    return [
        Row(
            "env step p50: ray actor vs local",
            median(remote) * 1e3,
            "ms",
            "local env",
            median(local) * 1e3,
            note,
        ),
        Row(
            "env step p90: ray actor vs local",
            percentile(remote, 90) * 1e3,
            "ms",
            "local env",
            percentile(local, 90) * 1e3,
        ),  # fmt: skip
        Row("added per step (p50 remote - p50 local)", (median(remote) - median(local)) * 1e3, "ms"),
        Row("no-op actor call p50 (round trip floor)", median(noop) * 1e3, "ms"),
        Row(
            "episodes/s, oracle, concurrency 4: ray vs local",
            len(remote_eps) / remote_wall,
            "ep/s",
            "local env",
            len(local_eps) / local_wall,
            f"{n} episodes",
        ),  # fmt: skip
    ]


def sandbox_rows(tokenizer, quick: bool) -> list[Row]:
    """Code-v0 with Docker sandboxes: episodes/s on 1 vs 2 simulated nodes (node pools) and local."""
    import ray

    from agentrl.cluster.remote_env import RayEnvs, RaySettings

    n, concurrency = (8, 4) if quick else (24, 4)
    probe = agentrl.make(CODE_ID, **CODE_KWARGS)
    tasks = list(probe.unwrapped.load_tasks("train"))
    probe.close()
    warm, timed = tasks[:concurrency], tasks[concurrency : concurrency + n]
    load_before = os.getloadavg()[0]
    local = lambda: agentrl.make(CODE_ID, **CODE_KWARGS)  # noqa: E731
    run(local, warm, tokenizer, concurrency, CodeOracle)  # warm boxes in this process's pool
    local_eps, local_wall = run(local, timed, tokenizer, concurrency, CodeOracle)
    rates, notes = {}, {}
    for nodes in (1, 2):
        cluster = start_cluster(nodes)
        try:
            settings = RaySettings(num_cpus_per_env=0.25, envs_per_actor=1, services="node")
            envs = RayEnvs(CODE_ID, CODE_KWARGS, settings)
            run(envs, warm, tokenizer, concurrency, CodeOracle)  # actors, pool hosts and boxes start
            eps, wall = run(envs, timed, tokenizer, concurrency, CodeOracle)
            placed = {ray.get(a.where.remote())["node_id"] for a in envs.actors}
            pools = {p["host"]["pid"] for a in envs.actors for p in ray.get(a.sandbox_pools.remote())}
            rates[nodes] = len(eps) / wall
            notes[nodes] = f"{len(envs.actors)} actors on {len(placed)} node(s), {len(pools)} node pool(s)"
            envs.shutdown()
        finally:
            stop_cluster(cluster)
    shared = f"{n} episodes, concurrency {concurrency}; nodes share 2 cores and 1 engine"
    return [
        Row("code+docker episodes/s: 2 nodes vs 1 node", rates[2], "ep/s", "1 node", rates[1], f"{notes[2]}; {shared}"),
        Row("code+docker episodes/s: 1 node vs local", rates[1], "ep/s", "local env", len(local_eps) / local_wall, f"{notes[1]}; {load_note(load_before)}"),
    ]  # fmt: skip


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--part", choices=("step", "sandbox", "all"), default="all")
    args = p.parse_args()
    try:
        import ray  # noqa: F401
    except ImportError:
        row = Row(
            "remote env step p50 (ray)", None, "ms", note="ray is not installed: pip install 'agentrl[ray]'"
        )  # type: ignore[arg-type]
        print_table([row], "Ray env placement")
        write_json(args.json_path, "ray", [row], args.quick)
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    tokenizer = load_tokenizer("smollm2-135m")
    rows: list[Row] = []
    if args.part in ("step", "all"):
        rows += step_rows(tokenizer, args.quick)
    if args.part in ("sandbox", "all"):
        from agentrl.sandboxes.docker_backend import engine_available

        if engine_available():
            rows += sandbox_rows(tokenizer, args.quick)
        else:
            why = "no Docker engine answers (start dockerd or set DOCKER_HOST)"
            rows.append(Row("code+docker episodes/s: 2 nodes vs 1 node", None, "ep/s", note=why))  # type: ignore[arg-type]
    print_table(rows, "Ray env placement (simulated nodes on one machine)")
    write_json(args.json_path, "ray", rows, args.quick)


if __name__ == "__main__":
    main()
