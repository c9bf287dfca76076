"""Remote envs (``env.placement: ray``) vs local ones: per-step overhead, same run, same episodes.

Starts a two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``, 1 CPU per node),
then plays the same Search-v0 tasks with the scripted oracle through the rollout runner twice:
envs in this process (local) and envs in Ray actors spread over both nodes. The per-step time is
what the agent records around each ``env.step`` (``turn.timings["env_s"]``), so the remote figure
includes the actor round trip and (de)serialisation. Also: a no-op actor call (the floor of any
remote call) and whole-run episodes/s. The cluster is shut down by the processes it started.

    python benchmarks/bench_ray.py            # 48 episodes, concurrency 4
    python benchmarks/bench_ray.py --quick    # 12 episodes
    python benchmarks/bench_ray.py --json out.json
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import Row, median, parser, percentile, print_table, write_json  # noqa: E402

import agentrl
from agentrl.envs.search.oracle import SearchOracle
from agentrl.rollout.agent import AgentConfig
from agentrl.rollout.model import load_tokenizer
from agentrl.rollout.runner import RunnerConfig, RunStats, run_oracle_episodes

ENV_ID = "agentrl/Search-v0"
ENV_KWARGS = {"split": "train", "hops": "single", "max_turns": 4}


def step_times(episodes) -> list[float]:
    return [t.timings["env_s"] for e in episodes for t in e.turns if "env_s" in t.timings]


def run(envs, tasks, tokenizer, concurrency: int) -> tuple[list, float]:
    config = RunnerConfig(agent=AgentConfig(max_new_tokens=512), concurrency=concurrency, progress=False)
    stats = RunStats()
    episodes = run_oracle_episodes(envs, tasks, SearchOracle, tokenizer, config, seed=0, stats=stats)
    failed = [e.error for e in episodes if e.failed]
    if failed:
        raise RuntimeError(f"{len(failed)} episodes failed, first: {failed[0]}")
    return episodes, stats.wall_s


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    n = 12 if args.quick else 48
    rows: list[Row] = []
    try:
        import ray
        from ray.cluster_utils import Cluster
    except ImportError:
        rows.append(
            Row(
                "remote env step p50 (ray)",
                None,
                "ms",
                note="ray is not installed: pip install 'agentrl[ray]'",
            )
        )  # type: ignore[arg-type]
        print_table(rows, "Ray env placement")
        write_json(args.json_path, "ray", rows, args.quick)
        return
    from agentrl.rollout.remote_env import RayEnvs, RaySettings

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    tokenizer = load_tokenizer("smollm2-135m")
    probe = agentrl.make(ENV_ID, **ENV_KWARGS)
    tasks = list(probe.unwrapped.load_tasks("train"))[:n]
    probe.close()
    load_before = os.getloadavg()[0]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        envs = RayEnvs(ENV_ID, ENV_KWARGS, RaySettings(num_cpus_per_env=0.25, envs_per_actor=2))
        run(envs, tasks[:4], tokenizer, 4)  # warm-up: actors start, envs load their corpus
        local_eps, local_wall = run(lambda: agentrl.make(ENV_ID, **ENV_KWARGS), tasks, tokenizer, 4)
        remote_eps, remote_wall = run(envs, tasks, tokenizer, 4)
        handle = envs.actors[0]
        noop = []
        for _ in range(50 if args.quick else 200):
            t0 = time.perf_counter()
            ray.get(handle.where.remote())
            noop.append(time.perf_counter() - t0)
        actors = len(envs.actors)
        nodes = len({ray.get(a.where.remote())["node_id"] for a in envs.actors})
        envs.shutdown()
    finally:
        ray.shutdown()
        cluster.shutdown()
    local, remote = step_times(local_eps), step_times(remote_eps)
    load = f"load {load_before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    note = f"{len(remote)} steps, {actors} actors on {nodes} nodes; {load}"
    rows += [
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
    print_table(rows, "Ray env placement (two simulated nodes on one machine)")
    write_json(args.json_path, "ray", rows, args.quick)


if __name__ == "__main__":
    main()
