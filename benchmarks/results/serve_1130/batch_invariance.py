"""python benchmarks/results/serve_1130/batch_invariance.py float32 bfloat16

Greedy chat completions (64 tokens, SmolLM2-135M, prefix cache off) of 24 prompts, each alone and in batches of 8
(left-padded rows of unequal lengths), then the first 8 alone again: how many completions differ."""
import sys, time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository
from agentrl.rollout.model import load_model
from agentrl.rollout.generators.hf import HFGenerator
from agentrl.rollout.generators.base import SamplingParams
torch.set_num_threads(2)
topics = ["the moon", "bread", "rivers", "a cat", "chess", "rain", "volcanoes", "coffee", "trains", "the ocean",
          "bees", "a library", "winter", "music", "gardens", "robots", "maps", "clocks", "birds", "mountains",
          "paper", "bridges", "stars", "tea"]
lm, tok = load_model("smollm2-135m", dtype="float32")
prompts = [tok.apply_chat_template([{"role": "user", "content": f"Write three sentences about {t}."}], add_generation_prompt=True) for t in topics]
prompts = [p if isinstance(p, list) else p["input_ids"] for p in prompts]
sp = SamplingParams(temperature=0.0, max_new_tokens=64)
for dtype in sys.argv[1:]:
    m = lm if dtype == "float32" else lm.to(torch.bfloat16)
    gen = HFGenerator(m, tok, prefix_cache_tokens=0)
    t = time.time()
    alone = [gen.generate([p], sp)[0].ids for p in prompts]
    batched = []
    for s in range(0, len(prompts), 8):
        batched += [o.ids for o in gen.generate(prompts[s:s+8], sp)]
    again = [gen.generate([p], sp)[0].ids for p in prompts[:8]]
    diff = [i for i in range(len(prompts)) if alone[i] != batched[i]]
    first = [next(j for j,(a,b) in enumerate(zip(alone[i],batched[i])) if a!=b) if alone[i][:len(batched[i])]!=batched[i][:len(alone[i])] else min(len(alone[i]),len(batched[i])) for i in diff]
    print(dtype, f"alone vs batch-8 differ: {len(diff)}/{len(prompts)} (first differing token {first}); alone twice differ: {sum(a!=b for a,b in zip(alone, again))}/8; {time.time()-t:.0f}s", flush=True)
