import time, torch, copy
from agentrl.rollout.model import load_model
from agentrl.rollout.generators.kv_cache import roomy_cache
model, tok = load_model("smollm2-135m")
try:
    from torch.ao.quantization import quantize_dynamic
    q = quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
except Exception as e:
    print("quantize_dynamic failed:", e); raise
def run(m, B, C=400, steps=8):
    ids = torch.randint(100, 20000, (B, C)); att = torch.ones(B, C, dtype=torch.long)
    with torch.no_grad():
        cache = roomy_cache(steps+4)
        t=time.perf_counter()
        out = m(input_ids=ids, attention_mask=att, past_key_values=cache, use_cache=True, logits_to_keep=1)
        pf=time.perf_counter()-t
        pos = torch.full((B,1), C-1)
        t=time.perf_counter()
        for _ in range(steps):
            att = torch.cat([att, torch.ones(B,1,dtype=torch.long)],-1); pos=pos+1
            m(input_ids=ids[:, :1], attention_mask=att, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return pf, (time.perf_counter()-t)/steps
for B in [1,16]:
    for name, m in [("fp32", model), ("int8dyn", q)]:
        run(m, B, 64, 2)
        pf, st = run(m, B)
        print(f"B={B} {name}: prefill {B*400/pf:.0f} tok/s, decode step {st*1000:.0f} ms")
ids = torch.tensor([tok.encode("The capital of France is Paris. The capital of Germany is")])
with torch.no_grad():
    a = torch.log_softmax(model(ids).logits[0,-1],-1); b = torch.log_softmax(q(ids).logits[0,-1],-1)
print("max |dlogp| top:", (a-b).abs()[a.topk(10).indices].max().item(), "KL", torch.sum(a.exp()*(a-b)).item())
