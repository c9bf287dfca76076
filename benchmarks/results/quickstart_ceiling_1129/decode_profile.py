import time, torch, sys
from agentrl.rollout.model import load_model
from agentrl.rollout.generators.kv_cache import roomy_cache
a = torch.ones(256*1024*1024)  # 1 GiB
b = torch.empty_like(a)
for _ in range(2):
    t=time.perf_counter(); b.copy_(a); dt=time.perf_counter()-t
print("copy GB/s", 2*a.numel()*4/dt/1e9)
for _ in range(2):
    t=time.perf_counter(); s=a.sum(); dt=time.perf_counter()-t
print("read GB/s", a.numel()*4/dt/1e9)
del a,b
model, tok = load_model("smollm2-135m")
B=int(sys.argv[1]); C=400
ids = torch.randint(100, 20000, (B, C))
att = torch.ones(B, C, dtype=torch.long)
with torch.no_grad():
    cache = roomy_cache(64)
    model(input_ids=ids, attention_mask=att, past_key_values=cache, use_cache=True, logits_to_keep=1)
    pos = torch.full((B,1), C-1)
    def step():
        global att, pos
        att = torch.cat([att, torch.ones(B,1,dtype=torch.long)],-1); pos = pos+1
        return model(input_ids=ids[:, :1], attention_mask=att, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
    for _ in range(3): step()
    t=time.perf_counter()
    for _ in range(10): step()
    print("step ms", (time.perf_counter()-t)/10*1000)
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(5): step()
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
