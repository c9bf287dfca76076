"""The continuous-batching engine of `agentrl serve` without HTTP: waves of 1 and 8 greedy requests of
64 tokens (ignore_eos), the same prompts as bench_serve.py, and the mean decode step per wave.

    python benchmarks/results/serve_1129/engine_only.py 8192   # the prefix cache's tokens (0: off)

Recorded 2026-11-29 (AMD EPYC, 2 cores, quiet), prefix cache 8192: 8 at once 4.91-5.49 s against
3.83-3.94 s for one; decode step 73-78 ms (batch 8) against 60 ms (batch 1).
"""

import asyncio
import collections
import sys
import time
import warnings

from agentrl.rollout.generators.base import SamplingParams
from agentrl.rollout.generators.hf import HFGenerator
from agentrl.rollout.model import load_model
from agentrl.serve.continuous import ContinuousBatcher

warnings.filterwarnings("ignore")
model, tok = load_model("smollm2-135m")
gen = HFGenerator(model, tok, prefix_cache_tokens=int(sys.argv[1]) if len(sys.argv) > 1 else 8192)
eng = ContinuousBatcher(gen, max_batch_size=32)
sampling = SamplingParams(max_new_tokens=64, temperature=0.0, ignore_eos=True)
steps: dict[int, list[float]] = collections.defaultdict(list)
forward = gen._logits


def timed(**inputs):
    start = time.perf_counter()
    out = forward(**inputs)
    if inputs["input_ids"].shape[1] == 1:  # a decode step, by batch size
        steps[inputs["input_ids"].shape[0]].append(time.perf_counter() - start)
    return out


gen._logits = timed


def prompt(i: int) -> list[int]:
    ask = [{"role": "user", "content": f"Count from 1 to 200, separated by commas. (request {i})"}]
    return tok.encode(tok.apply_chat_template(ask, add_generation_prompt=True, tokenize=False), add_special_tokens=False)


async def wave(n: int, base: int) -> float:
    start = time.perf_counter()
    await asyncio.gather(*[eng.submit(prompt(base + i), sampling) for i in range(n)])
    return time.perf_counter() - start


async def main() -> None:
    await wave(1, 10_000)  # warm-up
    for k, n in enumerate((1, 8, 1, 8)):
        steps.clear()
        wall = await wave(n, 1000 * (k + 1))
        step = steps.get(n) or [float("nan")]
        print(f"{n} at once: wall {wall:.2f} s, decode step at batch {n} {1000 * sum(step) / len(step):.1f} ms")


asyncio.run(main())
