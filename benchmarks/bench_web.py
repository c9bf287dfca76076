"""Web env speed: env steps/s with 1, 8 and 64 concurrent sessions, step latency, server memory.

Each session is one env (all sharing one local shop server) driven by the scripted oracle in its
own thread, episode after episode, for a fixed time. A step is one ``env.step`` (parse, one HTTP
request, HTML -> text). Memory is the server process's RSS with the 64 sessions open.

    python benchmarks/bench_web.py [--quick] [--json PATH]
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from pathlib import Path

import agentrl
from agentrl.envs.web.oracle import WebShopOracle

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Row, parser, print_table, write_json  # noqa: E402


def _drive(env, tasks, seconds: float, latencies: list[float], episodes: list[int], offset: int) -> None:
    oracle = WebShopOracle()
    deadline = time.perf_counter() + seconds
    index = offset
    while time.perf_counter() < deadline:
        task = tasks[index % len(tasks)]
        index += 1
        obs, _ = env.reset(options={"task": task})
        oracle.reset(task)
        done = False
        while not done:
            start = time.perf_counter()
            obs, _, terminated, truncated, _ = env.step(oracle.act(obs))
            latencies.append(time.perf_counter() - start)
            done = terminated or truncated
        episodes.append(1)


def run(concurrency: int, seconds: float) -> tuple[dict[str, float], list]:
    envs = [agentrl.make("agentrl/WebShop-v0", split="test") for _ in range(concurrency)]
    for env in envs:
        env.reset(seed=0)  # start the server and open the sessions before timing
    tasks = envs[0].unwrapped.tasks("test")
    per_thread: list[list[float]] = [[] for _ in envs]
    episodes: list[int] = []
    threads = [
        threading.Thread(target=_drive, args=(env, tasks, seconds, per_thread[i], episodes, i * 7))
        for i, env in enumerate(envs)
    ]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    latencies = sorted(x for chunk in per_thread for x in chunk)
    server = envs[0].unwrapped._server
    row = {
        "sessions": concurrency,
        "steps": len(latencies),
        "episodes": len(episodes),
        "steps_per_s": len(latencies) / wall,
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * latencies[int(0.95 * (len(latencies) - 1))],
        "server_rss_mb": server.rss_bytes() / 2**20,
        "server_sessions": len(envs),
    }
    return row, envs


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    seconds = 2.0 if args.quick else 10.0
    results = []
    for concurrency in (1, 8, 64):
        row, envs = run(concurrency, seconds)
        results.append(row)
        for env in envs:
            env.close()
    single = results[0]
    rows = []
    for r in results:
        n = r["sessions"]
        base = None if n == 1 else ("1 session", single)
        rows += [
            Row(f"web env steps/s, {n} sessions", r["steps_per_s"], "steps/s", base and base[0],
                base and base[1]["steps_per_s"], note=f"{r['steps']} steps, {r['episodes']} oracle episodes"),
            Row(f"web env step p50, {n} sessions", r["p50_ms"], "ms", base and base[0], base and base[1]["p50_ms"]),
            Row(f"web env step p95, {n} sessions", r["p95_ms"], "ms", base and base[0], base and base[1]["p95_ms"]),
            Row(f"shop server RSS, {n} sessions", r["server_rss_mb"], "MiB", base and base[0],
                base and base[1]["server_rss_mb"]),
        ]
    print_table(rows, f"web env: oracle episodes, {seconds:.0f} s per setting, one shared local shop server")
    write_json(args.json_path, "web", rows, args.quick)


if __name__ == "__main__":
    main()
