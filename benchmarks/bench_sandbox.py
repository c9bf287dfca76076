"""Sandbox latency and throughput, each beside plain ``subprocess`` measured in the same run.

Rows: cold start (a fresh hardened container running ``print(1)``; a fresh agent sandbox), warm
``exec`` p50/p95 of ``print(1)``, the stateful interpreter's round trip, the engine's own
``exec_run`` for comparison, execs/s with a pool of N sandboxes driven by N threads, and a pool's
**lease + first exec** p50/p99 with 1 and 32 concurrent episodes (each episode: lease, ``print(1)``,
plant files, hold the box ``--episode-s``, give it back; the pool makes the next lease clean).
Targets (issue 3): warm p50 within 3x of subprocess and at least 10x faster than a cold container.

    python benchmarks/bench_sandbox.py [--quick] [--json PATH] [--backends docker,bwrap]
        [--only lease|churn] [--concurrency 1,32] [--episodes 8] [--episode-s 0.5]
        [--seconds 10] [--package DIR]

``--only channels`` measures covert channels between two leases of one box (issue 42): lease 1 sets
a counter to a random value, lease 2 reads it. ``--only churn`` is the issue-42 measurement: N threads loop lease, ``print(1)``, release for
``--seconds``; it prints the cycle's p50/p99 and leases/s. ``--package DIR`` measures another copy
of the ``sandboxes`` package (e.g. ``git archive HEAD sandboxes | tar -x -C /tmp/before``) in place
of this checkout's, for before/after tables run back to back.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Row, median, parser, percentile, print_table, write_json  # noqa: E402


def _use_package(directory: str) -> None:
    """Import ``agentrl.sandboxes`` from ``directory`` (an older copy) instead of this checkout."""
    import importlib.util

    import agentrl

    init = Path(directory) / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        "agentrl.sandboxes", init, submodule_search_locations=[str(Path(directory))]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["agentrl.sandboxes"] = module
    agentrl.sandboxes = module
    spec.loader.exec_module(module)


if "--package" in sys.argv:  # before anything imports the checkout's package
    _use_package(sys.argv[sys.argv.index("--package") + 1])
from agentrl.sandboxes import SandboxPool, make_sandbox  # noqa: E402

PRINT1 = ["python3", "-c", "print(1)"]
# The baseline runs the same interpreter build as the sandboxes (Debian's), never a shim: a pyenv
# shim alone costs ~400 ms here and would flatter every ratio.
HOST_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
HOST_PRINT1 = [HOST_PYTHON, "-c", "print(1)"]


def timed(fn, repeat: int) -> list[float]:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def subprocess_print1() -> None:
    subprocess.run(HOST_PRINT1, capture_output=True, check=True)


def throughput(fn_per_worker, workers: int, seconds: float) -> float:
    """Calls per second when ``workers`` threads each call their own function for ``seconds``."""
    counts = [0] * workers
    stop = time.monotonic() + seconds

    def loop(index: int) -> None:
        fn = fn_per_worker(index)
        while time.monotonic() < stop:
            fn()
            counts[index] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(workers)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.monotonic() - start)


def bench_backend(backend: str, quick: bool, sub_p50: float, sub_rate: dict[int, float]) -> list[Row]:
    repeat = 10 if quick else 40
    rows: list[Row] = []
    base = ("subprocess print(1) p50", sub_p50)

    def cold() -> None:
        with make_sandbox(backend) as box:
            box.exec(PRINT1, timeout=30)

    cold_times = timed(cold, 3 if quick else 8)
    rows.append(Row(f"{backend}: cold sandbox (start+exec+close) p50", median(cold_times) * 1e3, "ms", *base))
    if backend == "docker":
        from agentrl.sandboxes.docker_backend import one_shot_container

        one_shot = timed(lambda: one_shot_container(PRINT1), 3 if quick else 8)
        rows.append(Row("docker: cold container run --rm print(1) p50", median(one_shot) * 1e3, "ms", *base))
    cold_ref = median(one_shot) if backend == "docker" else median(cold_times)

    with make_sandbox(backend) as box:
        warm = timed(lambda: box.exec(PRINT1, timeout=30), repeat)
        p50 = median(warm)
        note = f"cold/warm = {cold_ref / p50:.1f}x"
        rows.append(Row(f"{backend}: warm exec print(1) p50", p50 * 1e3, "ms", *base, note=note))
        rows.append(Row(f"{backend}: warm exec print(1) p95", percentile(warm, 95) * 1e3, "ms", *base))
        session = box.python_session()
        session.run("x = 0")
        cells = timed(lambda: session.run("x += 1\nx"), repeat * 3)
        rows.append(Row(f"{backend}: interpreter round trip p50", median(cells) * 1e3, "ms", *base))
        rows.append(Row(f"{backend}: interpreter round trip p95", percentile(cells, 95) * 1e3, "ms", *base))
        if backend == "docker":
            from agentrl.sandboxes.docker_backend import engine_exec

            raw = timed(lambda: engine_exec(box, PRINT1), repeat // 2)
            rows.append(
                Row("docker: engine exec_run print(1) p50 (no agent)", median(raw) * 1e3, "ms", *base)
            )

    for size, rate in sub_rate.items():
        with SandboxPool(backend, size=size) as pool:
            leases = [pool.lease() for _ in range(size)]
            boxes = [lease.__enter__() for lease in leases]
            calls = [functools.partial(box.exec, PRINT1, timeout=30) for box in boxes]
            execs = throughput(lambda i, calls=calls: calls[i], size, 2.0 if quick else 5.0)
            for lease in leases:
                lease.__exit__(None, None, None)
        rows.append(
            Row(f"{backend}: execs/s, pool of {size}", execs, "exec/s", f"subprocess x{size} threads", rate)
        )
    return rows


PLANT = [
    "sh",
    "-c",
    "mkdir -p d/e && echo x > d/e/f && chmod 500 d && echo y > /tmp/t && echo z > /dev/shm/s",
]


def lease_latency(
    backend: str, concurrency: int, episodes: int, episode_s: float, reset: str = "auto"
) -> list[Row]:
    """Lease + first exec latency of a pool of ``concurrency`` boxes under as many episode threads."""
    latencies: list[float] = []  # lease + first exec
    waits: list[float] = []  # the lease alone: waiting for a clean, health-checked box
    errors: list[BaseException] = []
    kwargs = {} if reset == "main" else {"reset": reset}  # "main": before issue 22 (no reset= yet)
    with SandboxPool(backend, size=concurrency, **kwargs) as pool:

        def worker() -> None:
            try:
                for _ in range(episodes):
                    start = time.perf_counter()
                    with pool.lease(timeout=600) as box:
                        waits.append(time.perf_counter() - start)
                        box.exec(PRINT1, timeout=30)
                        latencies.append(time.perf_counter() - start)
                        box.exec(PLANT, timeout=30)
                        time.sleep(episode_s)
            except BaseException as exc:  # reported below, never swallowed
                errors.append(exc)

        started = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(concurrency)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
        stats = pool.stats
    if errors:
        raise RuntimeError(f"{len(errors)} episode thread(s) failed: {errors[0]!r}") from errors[0]
    mode = getattr(pool, "reset", reset)
    note = f"{len(latencies)} leases in {wall:.1f} s; pool stats {stats}"
    label = f"{backend} ({mode}): lease + first exec, {concurrency} concurrent"
    return [
        Row(f"{label} p50", median(latencies) * 1e3, "ms", note=note),
        Row(f"{label} p99", percentile(latencies, 99) * 1e3, "ms"),
        Row(f"{backend} ({mode}): lease alone, {concurrency} concurrent p50", median(waits) * 1e3, "ms"),
        Row(
            f"{backend} ({mode}): lease alone, {concurrency} concurrent p99",
            percentile(waits, 99) * 1e3,
            "ms",
        ),
    ]


def lease_churn(backend: str, concurrency: int, seconds: float) -> list[Row]:
    """``concurrency`` threads loop lease, ``print(1)``, release for ``seconds``: the cycle's
    latency and the pool's leases/s (the clean-up of each released box included, since the next
    lease waits for it when no clean box is idle)."""
    cycles: list[float] = []
    errors: list[BaseException] = []
    with SandboxPool(backend, size=concurrency) as pool:
        pool.wait_ready()
        stop = time.monotonic() + seconds

        def worker() -> None:
            try:
                while time.monotonic() < stop:
                    start = time.perf_counter()
                    with pool.lease(timeout=600) as box:
                        result = box.exec(PRINT1, timeout=30)
                    assert result.stdout == "1\n", result
                    cycles.append(time.perf_counter() - start)
            except BaseException as exc:  # reported below, never swallowed
                errors.append(exc)

        started = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(concurrency)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
        stats = pool.stats
        mode = getattr(pool, "reset", "?")
    if errors:
        raise RuntimeError(f"{len(errors)} episode thread(s) failed: {errors[0]!r}") from errors[0]
    label = f"{backend} ({mode}): lease + print(1) + release, {concurrency} concurrent"
    note = f"{len(cycles)} leases in {wall:.1f} s; pool stats {stats}"
    return [
        Row(f"{label} p50", median(cycles) * 1e3, "ms", note=note),
        Row(f"{label} p99", percentile(cycles, 99) * 1e3, "ms"),
        Row(f"{backend} ({mode}): leases/s, {concurrency} concurrent", len(cycles) / wall, "lease/s"),
    ]


# Covert channels between leases (issue 42): lease 1 sets a counter to a value mod M, lease 2 of the
# same size-1 pool reads it. Each sender prints how many operations it needed (the loopback one: bytes).
CHANNEL_SEND = {
    "pid counter": """
import os, sys
M, v = int(sys.argv[1]), int(sys.argv[2])
n = 0
while True:
    p = os.fork()
    if p == 0:
        os._exit(0)
    os.waitpid(p, 0)
    n += 1
    if (p + 1) % M == v:
        break
print(n)
""",
    "/work inode counter": """
import os, sys
M, v = int(sys.argv[1]), int(sys.argv[2])
n = 0
while True:
    fd = os.open("/work/c", os.O_CREAT | os.O_WRONLY)
    ino = os.fstat(fd).st_ino
    os.close(fd)
    os.unlink("/work/c")
    n += 1
    if (ino + 1) % M == v:
        break
print(n)
""",
    "SysV id sequence": """
import ctypes, sys
libc = ctypes.CDLL(None)
M, v = int(sys.argv[1]), int(sys.argv[2])
n = 0
while True:
    i = libc.shmget(0, 4096, 0o1600)
    libc.shmctl(i, 0, None)
    n += 1
    if ((i >> 15) * 64 + (i & 0x7FFF) + 1) % M == v:  # the index cycles over 64, then the sequence
        break
print(n)
""",
    "loopback byte counter": """
import socket, sys
M, v = int(sys.argv[1]), int(sys.argv[2])
def rx():
    for line in open("/proc/net/dev"):
        if line.strip().startswith("lo:"):
            return int(line.split(":")[1].split()[0])
sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sink.bind(("127.0.0.1", 0))  # a listener, so no ICMP error adds its own bytes
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
n = 0
while True:
    need = (v - rx()) % M
    if need == 0:
        break
    n += s.sendto(b"x" * max(1, min(need - 28, 60000)), sink.getsockname()) + 28  # bytes counted
print(n)
""",
}
CHANNEL_RECV = {
    "pid counter": "import os; print(os.getpid())",
    "/work inode counter": "import os; fd = os.open('/work/r', os.O_CREAT); print(os.fstat(fd).st_ino)",
    "SysV id sequence": "import ctypes; i = ctypes.CDLL(None).shmget(0, 4096, 0o1600); print((i >> 15) * 64 + (i & 0x7FFF))",
    "loopback byte counter": "print([int(l.split(':')[1].split()[0]) for l in open('/proc/net/dev') if l.strip().startswith('lo:')][0])",
}
CHANNEL_RANGE = {
    "pid counter": 256,
    "/work inode counter": 1024,
    "SysV id sequence": 1024,
    "loopback byte counter": 1 << 20,
}


def _channel_trial(pool, name: str, value: int) -> tuple[int, float, int]:
    """Lease 1 sends ``value``; lease 2 reads. Returns (read mod range, sender seconds, sender ops)."""
    modulus = CHANNEL_RANGE[name]
    with pool.lease(timeout=60) as box:
        started = time.perf_counter()
        sent = box.exec(["python3", "-c", CHANNEL_SEND[name], str(modulus), str(value)], timeout=120)
        spent = time.perf_counter() - started
        assert sent.ok, sent
    pool.wait_ready()
    with pool.lease(timeout=60) as box:
        got = box.exec(["python3", "-c", CHANNEL_RECV[name]], timeout=30)
        assert got.ok, got
    return int(got.stdout) % modulus, spent, int(sent.stdout)


def covert_channels(backend: str, trials: int) -> list[Row]:
    """Bits one lease passes to the next through counters a scrub cannot reset (see issue 42)."""
    import math
    import random

    rows = []
    rng = random.Random(0)
    with SandboxPool(backend, size=1) as pool:
        for name in CHANNEL_SEND:
            modulus = CHANNEL_RANGE[name]

            offset = (_channel_trial(pool, name, 0)[0]) % modulus  # what the receiver reads when 0 was sent
            hits, spent_all, ops_all = 0, 0.0, 0
            for _ in range(trials):
                value = rng.randrange(modulus)
                read, spent, ops = _channel_trial(pool, name, value)
                hits += (read - offset) % modulus == value
                spent_all, ops_all = spent_all + spent, ops_all + ops
            rate = ops_all / spent_all if spent_all else 0.0
            note = (
                f"{hits}/{trials} random values of {math.log2(modulus):.0f} bits read back; sender "
                f"{rate:,.0f} ops/s, so ~{math.log2(max(rate * 10, 2)):.0f} bits in a 10 s episode"
            )
            rows.append(
                Row(
                    f"{backend}: {name}, bits per lease read back",
                    math.log2(modulus) * hits / trials,
                    "bits",
                    note=note,
                )
            )
    return rows


def main() -> None:
    args_parser = parser(__doc__.splitlines()[0])
    args_parser.add_argument("--backends", default="docker,bwrap", help="comma-separated backends to measure")
    args_parser.add_argument(
        "--only",
        choices=["all", "lease", "churn", "channels"],
        default="all",
        help="lease/churn: only those pool rows",
    )
    args_parser.add_argument("--seconds", type=float, default=10.0, help="churn: seconds per level")
    args_parser.add_argument("--package", default=None, help="measure the sandboxes package in DIR")
    args_parser.add_argument(
        "--concurrency", default=None, help="concurrent episodes (default 1,32; quick 1,4)"
    )
    args_parser.add_argument(
        "--episodes", type=int, default=None, help="episodes per thread (default 8; quick 2)"
    )
    args_parser.add_argument(
        "--episode-s", type=float, default=0.5, help="seconds each episode holds its box"
    )
    args_parser.add_argument(
        "--resets", default="auto", help="pool reset modes to compare, e.g. scrub,recycle (main: old pool)"
    )
    args = args_parser.parse_args()
    levels = [int(n) for n in (args.concurrency or ("1,4" if args.quick else "1,32")).split(",")]
    episodes = args.episodes or (2 if args.quick else 8)
    if args.only == "channels":
        rows = [
            row
            for backend in args.backends.split(",")
            for row in covert_channels(backend.strip(), 2 if args.quick else 5)
        ]
        print_table(rows, f"covert channels between leases ({os.getloadavg()[0]:.1f} load)")
        write_json(args.json_path, "sandbox", rows, args.quick)
        return
    if args.only == "churn":
        rows = []
        for backend in args.backends.split(","):
            for level in levels:
                rows += lease_churn(backend.strip(), level, 2.0 if args.quick else args.seconds)
        where = args.package or "this checkout"
        print_table(rows, f"sandbox lease churn ({where}; {os.getloadavg()[0]:.1f} load)")
        write_json(args.json_path, "sandbox", rows, args.quick)
        return
    if args.only == "lease":
        rows = []
        for backend in args.backends.split(","):
            for reset in args.resets.split(","):
                if reset == "scrub" and backend.strip() != "docker":
                    continue
                for level in levels:
                    rows += lease_latency(backend.strip(), level, episodes, args.episode_s, reset)
        print_table(
            rows, f"sandbox pool lease latency ({episodes} episodes per thread, {args.episode_s} s each)"
        )
        write_json(args.json_path, "sandbox", rows, args.quick)
        return
    sizes = (1, 2) if args.quick else (1, 2, 4)
    sub = timed(subprocess_print1, 10 if args.quick else 40)
    rows = [
        Row("subprocess print(1) p50", median(sub) * 1e3, "ms"),
        Row("subprocess print(1) p95", percentile(sub, 95) * 1e3, "ms"),
    ]
    sub_rate = {n: throughput(lambda i: subprocess_print1, n, 2.0 if args.quick else 5.0) for n in sizes}
    for n, rate in sub_rate.items():
        rows.append(Row(f"subprocess execs/s, {n} threads", rate, "exec/s"))
    for backend in args.backends.split(","):
        rows += bench_backend(backend.strip(), args.quick, median(sub), sub_rate)
        for level in levels:
            rows += lease_latency(backend.strip(), level, episodes, args.episode_s)
    for row in rows:  # baselines are in ms; keep the ratio meaningful
        if row.unit == "ms" and row.baseline_value is not None:
            row.baseline_value *= 1e3
    print_table(rows, "sandbox latency and throughput")
    write_json(args.json_path, "sandbox", rows, args.quick)


if __name__ == "__main__":
    main()
