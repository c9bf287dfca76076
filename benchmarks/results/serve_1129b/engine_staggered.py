import asyncio, collections, sys, time, warnings
from agentrl.rollout.generators.base import SamplingParams
from agentrl.rollout.generators.hf import HFGenerator
from agentrl.rollout.model import load_model
from agentrl.serve.continuous import ContinuousBatcher
warnings.filterwarnings("ignore")
model, tok = load_model("smollm2-135m")
gen = HFGenerator(model, tok, prefix_cache_tokens=int(sys.argv[1]))
eng = ContinuousBatcher(gen, max_batch_size=32)
sampling = SamplingParams(max_new_tokens=64, temperature=0.0, ignore_eos=True)
steps = collections.defaultdict(list)
forward = gen._logits
def timed(**inputs):
    s = time.perf_counter(); out = forward(**inputs)
    if inputs["input_ids"].shape[1] == 1: steps[inputs["input_ids"].shape[0]].append(time.perf_counter() - s)
    return out
gen._logits = timed
def prompt(i):
    ask = [{"role": "user", "content": f"Count from 1 to 200, separated by commas. (request {i})"}]
    return tok.encode(tok.apply_chat_template(ask, add_generation_prompt=True, tokenize=False), add_special_tokens=False)
async def wave(n, base, split):
    s = time.perf_counter()
    if split:
        a = [asyncio.ensure_future(eng.submit(prompt(base + i), sampling)) for i in range(split)]
        await asyncio.sleep(0.03)
        b = [asyncio.ensure_future(eng.submit(prompt(base + i), sampling)) for i in range(split, n)]
        await asyncio.gather(*a, *b)
    else:
        await asyncio.gather(*[eng.submit(prompt(base + i), sampling) for i in range(n)])
    return time.perf_counter() - s
async def main():
    await wave(1, 10_000, 0)
    for k, (n, split) in enumerate([(1,0),(8,0),(8,2),(1,0),(8,0),(8,2)]):
        steps.clear()
        wall = await wave(n, 1000 * (k + 1), split)
        st = sorted(steps.get(n) or [float('nan')])
        print(f"{n} split {split}: wall {wall:.2f} s, median decode step at batch {n} {1000*st[len(st)//2]:.1f} ms ({len(st)} steps)", flush=True)
asyncio.run(main())
