import time, sys, torch
torch.set_num_threads(2)
import torch._inductor.config as ic, torch._dynamo.config as dc
dc.recompile_limit = 64; dc.cache_size_limit = 64
from agentrl.rollout.model import load_model
from transformers import StaticCache
mode=sys.argv[1]; rowsl=[int(x) for x in sys.argv[2].split(",")]
model,tok=load_model("smollm2-135m")
model.eval()
if mode!="eager":
    ic.max_autotune=True; ic.max_autotune_gemm_backends="CPP,ATEN"; ic.freezing=True
def step(ids, pos, cache):
    return model(input_ids=ids, cache_position=pos, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
f = step if mode=="eager" else torch.compile(step, dynamic=False)
ctx=60; L=160
with torch.no_grad():
  for rows in rowsl:
    cache=StaticCache(config=model.config, max_cache_len=L)
    ids=torch.randint(100,20000,(rows,ctx))
    model(input_ids=ids, cache_position=torch.arange(ctx), past_key_values=cache, use_cache=True, logits_to_keep=1)
    nxt=torch.randint(100,20000,(rows,1))
    t0=time.perf_counter(); f(nxt, torch.tensor([ctx]), cache); comp=time.perf_counter()-t0
    ts=[]
    for i in range(1,60):
        t=time.perf_counter(); lg=f(nxt, torch.tensor([ctx+i]), cache); ts.append(time.perf_counter()-t)
    ts.sort(); print(mode, rows, f"step p50 {ts[len(ts)//2]*1e3:.1f} ms (first {comp:.1f}s)", flush=True)
