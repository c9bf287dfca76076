"""`agentrl serve` with the built-in SmolLM2 on this CPU: time to first token and tokens/s, 1 / 8 concurrent.

A real server (uvicorn on a free port, the HF generator) and the official ``openai`` async client
streaming chat completions (greedy, a prompt that keeps the model counting). Reported: median time
to the first content chunk, and generated tokens per second over the wall time of the wave
(usage from ``stream_options.include_usage``). Baselines in the same run: the HF generator
called directly (no HTTP) for the tokens/s at 1 request, and the 1-request figures for 8.

    python benchmarks/bench_serve.py            # 64 new tokens, 3 waves each
    python benchmarks/bench_serve.py --quick    # 8 new tokens, 1 wave each
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import Row, parser, print_table, write_json  # noqa: E402

from agentrl.rollout.generators.base import GenerationOutput, SamplingParams  # noqa: E402
from agentrl.rollout.generators.hf import HFGenerator  # noqa: E402
from agentrl.rollout.model import load_model  # noqa: E402
from agentrl.rollout.server import BackgroundServer, build_app  # noqa: E402

ASK = "Count from 1 to 200, separated by commas."


async def wave(url: str, concurrency: int, max_tokens: int) -> tuple[list[float], int, float]:
    """``concurrency`` streamed chats at once: (time to first token per request, tokens, wall s)."""
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)

    async def one(i: int) -> tuple[float, int]:
        start = time.perf_counter()
        first, tokens = None, 0
        stream = await client.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "user", "content": f"{ASK} (request {i})"}],
            temperature=0,
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
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
    args = parser(__doc__.splitlines()[0]).parse_args()
    max_tokens, waves = (8, 1) if args.quick else (64, 3)
    model, tokenizer = load_model("smollm2-135m")
    generator = HFGenerator(model, tokenizer)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": ASK}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    sampling = SamplingParams(max_new_tokens=max_tokens, temperature=0.0, return_entropy=False)

    # In a worker thread, like the server's batcher: on this shared CPU torch runs several times
    # slower from the main thread than from a worker (measured 0.6-1.2 vs 3.0-4.9 tok/s).
    def call() -> GenerationOutput:
        return asyncio.run(generator.agenerate([prompt], sampling))[0]

    call()  # warm-up
    direct = []
    for _ in range(waves):
        start = time.perf_counter()
        out = call()
        direct.append(len(out.ids) / (time.perf_counter() - start))
    direct_tps = statistics.median(direct)
    rows = [Row("HF generator, direct call (worker thread), 1 request", direct_tps, "tok/s")]
    measured: dict[int, tuple[float, float]] = {}
    with BackgroundServer(build_app(generator, tokenizer, "smollm2-135m")) as server:
        asyncio.run(wave(server.url, 1, 4))  # warm-up
        for concurrency in (1, 8):
            ttfts, tps = [], []
            for _ in range(waves):
                firsts, tokens, wall = asyncio.run(wave(server.url, concurrency, max_tokens))
                ttfts += firsts
                tps.append(tokens / wall)
            measured[concurrency] = (statistics.median(ttfts) * 1000, statistics.median(tps))
    (ttft1, tps1), (ttft8, tps8) = measured[1], measured[8]
    rows += [
        Row("serve, stream, 1 request: tokens/s", tps1, "tok/s", "HF generator direct", direct_tps),
        Row("serve, stream, 8 concurrent: tokens/s (all)", tps8, "tok/s", "serve, 1 request", tps1),
        Row("serve, stream, 1 request: time to first token", ttft1, "ms"),
        Row("serve, stream, 8 concurrent: time to first token", ttft8, "ms", "serve, 1 request", ttft1),
    ]
    print_table(rows, f"agentrl serve (built-in SmolLM2, greedy, {max_tokens} new tokens, median of {waves})")
    write_json(args.json_path, "bench_serve", rows, args.quick)


if __name__ == "__main__":
    main()
