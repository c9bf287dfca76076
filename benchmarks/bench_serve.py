"""`agentrl serve` with the built-in SmolLM2 on this CPU: tokens/s and time to first token at 1 / 8 / 32 concurrent.

The server is the real ``agentrl serve`` (``--server cli``, the default): its own process with its
defaults (the built-in SmolLM2, the hf engine, the prefix cache on), as a user runs it beside the
clients that call it. The official ``openai`` async client streams chat completions (greedy, a
prompt that keeps the model counting, ``max_tokens`` new tokens each). Per level: generated tokens
per second over the wave's wall time (usage from ``stream_options.include_usage``), time to the
first content chunk (p50 / p99 over the wave's requests), and the wave's wall time against one
request's. Continuous batching (the default) and static batching (``--modes static``: one batched
call at a time) each get a server of their own, one after the other, so their figures compare on
the same load; the load average is printed (the machine may be shared). ``--repeats N`` runs the
levels N times in turn and reports each level's median wave.

``--server thread`` runs the server in this process instead (uvicorn in a thread, as the tests do):
the client's per-chunk parsing then shares the engine's interpreter, which costs the engine a
batch-8 wave ~1.2 s at 64 tokens on a 2-core CPU (docs/results/2026-11-29-serving.md); only there
``--prefix-cache`` chooses the prefix cache (default off: every request prefills).

    python benchmarks/bench_serve.py                  # 64 new tokens, levels 1 8 32
    python benchmarks/bench_serve.py --quick          # 8 new tokens, levels 1 8
    python benchmarks/bench_serve.py --levels 8 --stagger 2   # requests arriving while others decode
    python benchmarks/bench_serve.py --equal-lengths  # every request decodes max_tokens (vLLM's ignore_eos)
    python benchmarks/bench_serve.py --levels 1 8 32 --modes continuous --equal-lengths --repeats 3

Equal lengths (``--equal-lengths``: ``ignore_eos`` sent, or ``--min-tokens N``: ``min_tokens``) make
the wall-time ratio of an N-concurrent wave to the lone request a fair one: without them a request
that meets EOS early ends early, and the lone request may decode far fewer tokens than the wave.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import Row, parser, percentile, print_table, write_json  # noqa: E402

ASK = "Count from 1 to 200, separated by commas."
SERVED: list[str] = []  # each CLI server's start line


async def wave(
    url: str, concurrency: int, max_tokens: int, stagger: float = 0.0, extra: dict | None = None
) -> tuple[list[float], int, float]:
    """``concurrency`` streamed chats, started together (``stagger`` 0) or ``stagger`` seconds
    apart: time to first token per request (from its own start), tokens in all, the wave's wall
    seconds."""
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=3600)

    async def one(i: int) -> tuple[float, int]:
        await asyncio.sleep(i * stagger)
        start = time.perf_counter()
        first, tokens = None, 0
        stream = await client.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "user", "content": f"{ASK} (request {i})"}],
            temperature=0,
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra or None,
        )
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - start
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return (first if first is not None else float("nan")), tokens

    try:
        start = time.perf_counter()
        results = await asyncio.gather(*(one(i) for i in range(concurrency)))
        wall = time.perf_counter() - start
    finally:
        await client.close()
    return [r[0] for r in results], sum(r[1] for r in results), wall


@contextlib.contextmanager
def cli_server(mode: str, dtype: str | None = None) -> Iterator[str]:
    """``agentrl serve --batching mode`` in a process of its own; yields its ``/v1`` URL once it
    answers ``/v1/models``, after printing its start line (the dtype it resolved, and why)."""
    import tempfile

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, "-c", "from agentrl.cli import main; main()", "serve", "--port", str(port),
           "--batching", mode, *(["--dtype", dtype] if dtype else [])]  # fmt: skip
    # the server's output in a file: a pipe nobody reads could fill and stall it
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise SystemExit(f"agentrl serve exited ({proc.returncode}):\n{log.read()[-3000:]}")
            try:
                urllib.request.urlopen(url + "/models", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("agentrl serve did not answer /v1/models within 300 s") from None
                time.sleep(0.5)
        log.seek(0)
        started = next((ln.strip() for ln in log if ln.startswith("agentrl serve:")), "(no start line)")
        print(f"  {started}", flush=True)
        SERVED.append(started)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@contextlib.contextmanager
def thread_server(mode: str, prefix_cache: bool) -> Iterator[str]:
    """The server in this process (uvicorn in a thread); yields its ``/v1`` URL."""
    from agentrl.rollout.generators.hf import HFGenerator
    from agentrl.rollout.model import load_model
    from agentrl.serve.server import BackgroundServer, build_app

    model, tokenizer = load_model("smollm2-135m")
    # off by default: every request prefills (a wave's prompts share their chat template's prefix)
    generator = HFGenerator(model, tokenizer, **({} if prefix_cache else {"prefix_cache_tokens": 0}))
    with BackgroundServer(build_app(generator, tokenizer, "smollm2-135m", batching=mode)) as server:
        yield server.url


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--levels", type=int, nargs="+", default=None, help="concurrent requests per wave")
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--modes", nargs="+", default=["continuous", "static"])
    p.add_argument(
        "--stagger",
        type=float,
        default=0.0,
        help="seconds between request starts within a wave (0: all at once; >0: requests arrive "
        "while others decode, which is what continuous batching changes)",
    )
    p.add_argument(
        "--equal-lengths", action="store_true", help="send ignore_eos: every request decodes max_tokens"
    )
    p.add_argument("--min-tokens", type=int, default=0, help="send min_tokens (no EOS before it)")
    p.add_argument("--repeats", type=int, default=1, help="run the levels this many times; report medians")
    p.add_argument(
        "--server",
        choices=["cli", "thread"],
        default="cli",
        help="cli: `agentrl serve` in its own process (default); thread: in this process",
    )
    p.add_argument(
        "--prefix-cache",
        action="store_true",
        help="--server thread: keep the prefix cache on, as `agentrl serve` does (default off: every "
        "request prefills)",
    )
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "auto"),
                   help="`agentrl serve --dtype`: the server's weights and K/V (default: serve's own; bfloat16 "
                   "pays off on CPUs with fast bf16 matmuls; the table says what the server chose)")  # fmt: skip
    args = p.parse_args()
    extra = {**({"ignore_eos": True} if args.equal_lengths else {}),
             **({"min_tokens": args.min_tokens} if args.min_tokens else {})}  # fmt: skip
    max_tokens = args.max_tokens or (8 if args.quick else 64)
    levels = args.levels or ([1, 8] if args.quick else [1, 8, 32])
    if args.prefix_cache and args.server != "thread":
        p.error("--prefix-cache chooses the in-process server's cache: add --server thread "
                "(`agentrl serve` keeps its prefix cache on)")  # fmt: skip
    cli = args.server == "cli"
    if args.dtype is not None and not cli:
        p.error("--dtype is `agentrl serve --dtype`: use it with --server cli (the default)")
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    print(f"load average before: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")
    rows: list[Row] = []
    measured: dict[tuple[str, int], tuple[float, float, float, float]] = {}
    for mode in args.modes:
        server = cli_server(mode, args.dtype) if cli else thread_server(mode, args.prefix_cache)
        waves: dict[int, list[tuple[list[float], int, float]]] = {level: [] for level in levels}
        with server as url:
            asyncio.run(wave(url, 1, 4))  # warm-up
            for repeat in range(args.repeats):
                for level in levels:
                    firsts, tokens, wall = asyncio.run(wave(url, level, max_tokens, args.stagger, extra))
                    waves[level].append((firsts, tokens, wall))
                    ratio = wall / waves[levels[0]][repeat][2] if level != levels[0] else None
                    print(f"  {mode} x{level} (run {repeat + 1}): {tokens / wall:.2f} tok/s, TTFT p50 "
                          f"{percentile(firsts, 50):.2f} s p99 {percentile(firsts, 99):.2f} s, wall {wall:.1f} s, "
                          f"{tokens / level:.1f} tokens per request"
                          + (f", wall {ratio:.2f}x this run's {levels[0]}-request wave" if ratio else ""),
                          flush=True)  # fmt: skip
        for level in levels:  # the median wave by wall time (the lower of the middle two), all its figures
            firsts, tokens, wall = sorted(waves[level], key=lambda w: w[2])[(args.repeats - 1) // 2]
            measured[mode, level] = (tokens / wall, percentile(firsts, 50), percentile(firsts, 99), wall)
    for mode in args.modes:
        one_wall = measured[mode, levels[0]][3]
        for level in levels:
            tps, p50, p99, wall = measured[mode, level]
            other = "static" if mode == "continuous" else None
            base = measured.get((other, level)) if other else None
            rows.append(Row(f"{mode}, {level} concurrent: tokens/s (all)", tps, "tok/s",
                            f"static, {level} concurrent" if base else None, base[0] if base else None))  # fmt: skip
            rows.append(Row(f"{mode}, {level} concurrent: TTFT p50", p50, "s",
                            f"static, {level} concurrent" if base else None, base[1] if base else None))  # fmt: skip
            rows.append(Row(f"{mode}, {level} concurrent: TTFT p99", p99, "s",
                            f"static, {level} concurrent" if base else None, base[2] if base else None))  # fmt: skip
            if level != levels[0]:  # the ratio column: this wave's wall time over the first level's
                rows.append(Row(f"{mode}, {level} concurrent: wave wall time", wall, "s",
                                f"{mode}, {levels[0]} concurrent wall", one_wall))  # fmt: skip
    load = os.getloadavg()
    arrival = f"requests {args.stagger:g} s apart" if args.stagger else "requests at once"
    if extra:
        arrival += ", " + ", ".join(f"{k}={v}" for k, v in extra.items())
    if cli:
        chosen = sorted({m.group(1) for m in (re.search(r" dtype=(\w+)", ln) for ln in SERVED) if m})
        asked = f" --dtype {args.dtype}" if args.dtype else ""
        arrival += f", `agentrl serve{asked}` in its own process (dtype {' / '.join(chosen) or 'not said'})"
    else:
        arrival += ", server in-process (float32)"
    arrival += ", prefix cache on" if args.prefix_cache or cli else ""
    arrival += f", median of {args.repeats} runs" if args.repeats > 1 else ""
    print_table(
        rows,
        f"agentrl serve (built-in SmolLM2, greedy, {max_tokens} new tokens, {arrival}; load average after "
        f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f})",
    )
    write_json(args.json_path, "bench_serve", rows, args.quick)


if __name__ == "__main__":
    main()
