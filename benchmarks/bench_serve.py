"""`agentrl serve` with the built-in SmolLM2 on this CPU: tokens/s and time to first token at 1 / 8 / 32 concurrent.

A real server (uvicorn on a free port, the HF generator) and the official ``openai`` async client
streaming chat completions (greedy, a prompt that keeps the model counting, ``max_tokens`` new
tokens each). Per level: generated tokens per second over the wave's wall time (usage from
``stream_options.include_usage``), time to the first content chunk (p50 / p99 over the wave's
requests), and the wave's wall time against one request's. Continuous batching (the default) and
static batching (``--batching static``: one batched call at a time) run in the same process, one
after the other, so their figures compare on the same load; the load average is printed (the
machine is shared).

    python benchmarks/bench_serve.py                  # 64 new tokens, levels 1 8 32
    python benchmarks/bench_serve.py --quick          # 8 new tokens, levels 1 8
    python benchmarks/bench_serve.py --levels 8 --stagger 2   # requests arriving while others decode
    python benchmarks/bench_serve.py --equal-lengths  # every request decodes max_tokens (vLLM's ignore_eos)

Equal lengths (``--equal-lengths``: ``ignore_eos`` sent, or ``--min-tokens N``: ``min_tokens``) make
the wall-time ratio of an N-concurrent wave to the lone request a fair one: without them a request
that meets EOS early ends early, and the lone request may decode far fewer tokens than the wave.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import Row, parser, percentile, print_table, write_json  # noqa: E402

from agentrl.rollout.generators.hf import HFGenerator  # noqa: E402
from agentrl.rollout.model import load_model  # noqa: E402
from agentrl.serve.server import BackgroundServer, build_app  # noqa: E402

ASK = "Count from 1 to 200, separated by commas."


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
    p.add_argument(
        "--prefix-cache",
        action="store_true",
        help="keep the prefix cache on, as `agentrl serve` does (default off: every request prefills)",
    )
    args = p.parse_args()
    extra = {**({"ignore_eos": True} if args.equal_lengths else {}),
             **({"min_tokens": args.min_tokens} if args.min_tokens else {})}  # fmt: skip
    max_tokens = args.max_tokens or (8 if args.quick else 64)
    levels = args.levels or ([1, 8] if args.quick else [1, 8, 32])
    print(f"load average before: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")
    model, tokenizer = load_model("smollm2-135m")
    rows: list[Row] = []
    measured: dict[tuple[str, int], tuple[float, float, float, float]] = {}
    for mode in args.modes:
        # off by default: every request prefills (a wave's prompts share their chat template's prefix)
        generator = HFGenerator(model, tokenizer, **({} if args.prefix_cache else {"prefix_cache_tokens": 0}))
        with BackgroundServer(build_app(generator, tokenizer, "smollm2-135m", batching=mode)) as server:
            asyncio.run(wave(server.url, 1, 4))  # warm-up
            for level in levels:
                firsts, tokens, wall = asyncio.run(wave(server.url, level, max_tokens, args.stagger, extra))
                measured[mode, level] = (
                    tokens / wall,
                    percentile(firsts, 50),
                    percentile(firsts, 99),
                    wall,
                )
                print(f"  {mode} x{level}: {tokens / wall:.2f} tok/s, TTFT p50 {percentile(firsts, 50):.2f} s "
                      f"p99 {percentile(firsts, 99):.2f} s, wall {wall:.1f} s, {tokens / level:.1f} tokens "
                      f"per request" + (f", wall {wall / measured[mode, levels[0]][3]:.2f}x the "
                      f"{levels[0]}-request wave's" if level != levels[0] else ""), flush=True)  # fmt: skip
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
    arrival += ", prefix cache on" if args.prefix_cache else ""
    print_table(
        rows,
        f"agentrl serve (built-in SmolLM2, greedy, {max_tokens} new tokens, {arrival}; load average after "
        f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f})",
    )
    write_json(args.json_path, "bench_serve", rows, args.quick)


if __name__ == "__main__":
    main()
