"""Web env speed: env steps/s with 1, 8 and 64 concurrent sessions, step latency, server memory.

Each session is one env (all sharing one local shop server) driven by the scripted oracle in its
own thread, episode after episode, for a fixed time. A step is one ``env.step`` (parse, one HTTP
request, HTML -> text). Memory is the server process's RSS with the 64 sessions open.

    python benchmarks/bench_web.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

from agentrl.envs.web.oracle import WebShopOracle

import agentrl


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 s per setting instead of 10 s")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    seconds = 2.0 if args.quick else 10.0
    rows = []
    for concurrency in (1, 8, 64):
        row, envs = run(concurrency, seconds)
        rows.append(row)
        for env in envs:
            env.close()
    print(f"web env: oracle episodes, {seconds:.0f} s per setting, one shared local shop server")
    print(
        f"{'sessions':>8} {'steps':>7} {'episodes':>8} {'steps/s':>8} {'p50 ms':>7} {'p95 ms':>7} {'server RSS MB':>13}"
    )
    for row in rows:
        print(
            f"{row['sessions']:>8} {row['steps']:>7} {row['episodes']:>8} {row['steps_per_s']:>8.1f} "
            f"{row['p50_ms']:>7.1f} {row['p95_ms']:>7.1f} {row['server_rss_mb']:>13.1f}"
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"benchmark": "web", "seconds_per_setting": seconds, "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
