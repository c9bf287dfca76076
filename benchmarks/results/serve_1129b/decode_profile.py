import time, torch, warnings, collections
warnings.filterwarnings("ignore")
from agentrl.rollout.model import load_model
from agentrl.rollout.generators.hf import HFGenerator
from agentrl.rollout.generators.kv_cache import roomy_cache
m, tok = load_model("smollm2-135m"); m.eval()
gen = HFGenerator(m, tok, prefix_cache_tokens=0)
def run(B, ctx=60, steps=20, prof=False):
    ids = torch.randint(0, 49000, (B, ctx)); att = torch.ones(B, ctx, dtype=torch.long)
    cache = roomy_cache(64)
    with torch.no_grad():
        lg = gen._logits(input_ids=ids, attention_mask=att, past_key_values=cache)
        nxt = lg.argmax(-1)
        ts=[]
        p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) if prof else None
        if p: p.__enter__()
        for i in range(steps):
            att = torch.cat([att, torch.ones(B,1,dtype=torch.long)], -1)
            s=time.perf_counter()
            lg = gen._logits(input_ids=nxt[:,None], attention_mask=att, position_ids=torch.full((B,1), ctx+i), past_key_values=cache)
            ts.append(time.perf_counter()-s)
            nxt = lg.argmax(-1)
        if p:
            p.__exit__(None,None,None)
            agg = collections.Counter()
            for e in p.key_averages(group_by_input_shape=True):
                if e.key in ("aten::mm", "aten::mkldnn_linear", "aten::_scaled_dot_product_flash_attention_for_cpu"):
                    agg[(e.key, str(e.input_shapes)[:60])] += e.self_cpu_time_total/steps/1000
            for k,v in agg.most_common(5): print(f"  {v:6.2f} ms/step  {k}")
            ka = sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)
            print("  total self %.1f ms/step" % (sum(e.self_cpu_time_total for e in ka)/steps/1000))
            for e in ka[:12]: print(f"    {e.self_cpu_time_total/steps/1000:6.2f} ms/step {e.count//steps:5d}/step {e.key}")
    ts.sort(); return ts[len(ts)//2]
for B in (1, 8, 1, 8):
    print(B, f"{run(B)*1000:.1f} ms", flush=True)
for B in (1,8,1,8): print("B",B); run(B, prof=True)
