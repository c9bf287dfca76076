"""Code and SQL env throughput with a warm sandbox pool: env steps/s and the share of step time that
is sandbox time: host-side wall time of the sandbox calls (interpreter cells, put_file, queries), and
separately the per-episode pool overhead (lease with health check, reset when the sandbox goes back).

Episodes are played by the scripted oracles (real tool calls through the real sandbox), so the mix of
actions is the one a solving agent produces: Code = 2 python cells + an answer; SQL = list_tables,
describe, query + an answer (half of them a SQL answer that is run again for scoring). The pool is
warmed first; every backend that works here is measured (Docker, bubblewrap). The Code env gets a
reset sandbox (fresh interpreter) per episode; the SQL env keeps its sandbox (``keep_sandbox=True``:
the database copies and the read-only connections stay warm, no model code runs there).

    python benchmarks/bench_code_sql.py              # 200 episodes per env and backend
    python benchmarks/bench_code_sql.py --quick      # 30
    python benchmarks/bench_code_sql.py --json out.json
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from common import Row, parser, percentile, print_table, write_json  # noqa: E402

import agentrl
from agentrl.envs.code.oracle import CodeOracle
from agentrl.envs.sql.oracle import SQLOracle
from agentrl.errors import SandboxError

ENVS = {
    "agentrl/Code-v0": (CodeOracle, {"kinds": ("dates", "tables")}),  # light cells: measure the env, not math
    "agentrl/SQL-v0": (SQLOracle, {}),
}


def backends() -> list[str]:
    from agentrl.sandboxes.bwrap_backend import bwrap_available
    from agentrl.sandboxes.docker_backend import engine_available

    found = []
    if engine_available():
        found.append("docker")
    if bwrap_available():
        found.append("bwrap")
    return found


def play(env_id: str, backend: str, episodes: int) -> dict[str, Any]:
    oracle_cls, kwargs = ENVS[env_id]
    env = agentrl.make(env_id, sandbox_backend=backend, **kwargs)
    unwrapped = env.unwrapped
    tasks = list(unwrapped.tasks("test"))
    oracle = oracle_cls()

    first_calls: list[float] = []  # first sandbox-using call of an episode (interpreter start, DB copy)
    later_calls: list[float] = []

    def episode(task) -> tuple[list[float], tuple[float, float, float], float]:
        obs, _ = env.reset(options={"task": task})
        oracle.reset(task)
        step_times, done, reward, calls = [], False, 0.0, []
        while not done:
            action = oracle.act(obs)
            start = time.perf_counter()
            obs, reward, terminated, truncated, info = env.step(action)
            step_times.append(time.perf_counter() - start)
            calls += [c["seconds"] for c in info["tool_calls"] if c["name"] in ("python", "query")]
            done = terminated or truncated
        first_calls.extend(calls[:1])
        later_calls.extend(calls[1:])
        slot = unwrapped.slot
        return step_times, (slot.sandbox_seconds, slot.lease_seconds, slot.release_seconds), reward

    for task in tasks[:5]:  # warm the pool and the interpreter
        episode(task)
    steps: list[float] = []
    sandbox_s = lease_s = release_s = solved = 0.0
    start = time.perf_counter()
    for i in range(episodes):
        step_times, (sandbox, lease, release), reward = episode(tasks[i % len(tasks)])
        steps += step_times
        sandbox_s += sandbox
        lease_s += lease
        release_s += release
        solved += reward
    wall = time.perf_counter() - start
    env.close()
    return {
        "steps": len(steps),
        "step_s": sum(steps),
        "wall_s": wall,
        "sandbox_s": sandbox_s,
        "lease_s": lease_s,
        "release_s": release_s,
        "p50_ms": percentile(steps, 50) * 1000,
        "p95_ms": percentile(steps, 95) * 1000,
        "solved": solved / episodes,
        "first_call_ms": percentile(first_calls, 50) * 1000,
        "later_call_ms": percentile(later_calls, 50) * 1000,
    }


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    episodes = 30 if args.quick else 200
    rows: list[Row] = []
    found = backends()
    if not found:
        raise SandboxError(
            "no sandbox backend works here (no Docker engine, no bubblewrap): nothing to measure"
        )
    for backend in found:
        for env_id in ENVS:
            result = play(env_id, backend, episodes)
            name = f"{env_id.split('/')[1]} [{backend}]"
            steps_per_s = result["steps"] / result["step_s"]
            later = result["later_call_ms"]
            share = result["sandbox_s"] / result["step_s"]
            pool_share = (result["lease_s"] + result["release_s"]) / result["step_s"]
            note = f"{result['steps']} steps, oracle solved {result['solved']:.0%}"
            rows.append(Row(f"{name} steps/s", steps_per_s, "steps/s", note=note))
            rows.append(Row(f"{name} step p50", result["p50_ms"], "ms"))
            rows.append(Row(f"{name} step p95", result["p95_ms"], "ms"))
            rows.append(
                Row(
                    f"{name} first sandbox call p50",
                    result["first_call_ms"],
                    "ms",
                    note="Code: fresh interpreter per episode",
                )
            )
            if later == later:  # not NaN: the SQL oracle makes one query per episode
                rows.append(Row(f"{name} later sandbox calls p50", later, "ms"))
            rows.append(
                Row(
                    f"{name} sandbox calls, share of step time",
                    share * 100,
                    "%",
                    note="cells/queries/put_file",
                )
            )
            rows.append(
                Row(
                    f"{name} pool lease+reset, share of step time",
                    pool_share * 100,
                    "%",
                    note="once per episode",
                )
            )
            rows.append(
                Row(f"{name} env+tool logic, share of step time", (1 - share - pool_share) * 100, "%")
            )
    print_table(rows, "Code / SQL envs with a warm sandbox pool (scripted oracle episodes)")
    write_json(args.json_path, "bench_code_sql", rows, args.quick)


if __name__ == "__main__":
    main()
