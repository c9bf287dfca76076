import asyncio, time, sys, warnings, torch
warnings.filterwarnings("ignore")
from agentrl.rollout.model import load_model
from agentrl.rollout.generators.hf import HFGenerator
from agentrl.rollout.generators.base import SamplingParams
from agentrl.serve.continuous import ContinuousBatcher
model, tok = load_model("smollm2-135m")
gen = HFGenerator(model, tok, prefix_cache_tokens=int(sys.argv[1]))
eng = ContinuousBatcher(gen, max_batch_size=32)
def prompt(i):
    p = tok.apply_chat_template([{"role":"user","content":f"Count from 1 to 200, separated by commas. (request {i})"}], add_generation_prompt=True, tokenize=False)
    return tok(p, add_special_tokens=False)["input_ids"] if False else tok.encode(p, add_special_tokens=False)
sp = SamplingParams(max_new_tokens=64, temperature=0.0, ignore_eos=True)
async def wave(n, base):
    t = time.perf_counter()
    await asyncio.gather(*[eng.submit(prompt(base+i), sp) for i in range(n)])
    return time.perf_counter() - t
async def main():
    await wave(1, 1000)
    for n in (1, 8, 1, 8):
        s0 = eng.steps
        w = await wave(n, n*100 + int(time.time()) % 97 * 1000)
        print(n, "wall %.2f steps %d" % (w, eng.steps - s0))
asyncio.run(main())
import collections
T = collections.defaultdict(list)
orig = gen._logits
def timed(**kw):
    t = time.perf_counter(); out = orig(**kw); T[kw["input_ids"].shape].append(time.perf_counter() - t); return out
gen._logits = timed
async def main2():
    for n in (1, 8, 1, 8):
        T.clear()
        w = await wave(n, n*100 + 7000 + int(time.time()) % 97 * 1000)
        dec = [v for k, vs in T.items() if k[1] == 1 for v in vs]
        print(n, "wall %.2f" % w, "decode steps %d mean %.1f ms" % (len(dec), 1000 * sum(dec) / len(dec)), {k: len(v) for k, v in T.items() if k[1] != 1})
asyncio.run(main2())
