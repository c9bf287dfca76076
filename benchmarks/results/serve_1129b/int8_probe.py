import time, copy, sys, torch
from agentrl.rollout.model import load_model, load_tokenizer
torch.manual_seed(0)
m = load_model("smollm2-135m", dtype="float32")[0].eval().requires_grad_(False)
from torch.ao.quantization import per_channel_dynamic_qconfig
qc = copy.deepcopy(m)
spec = {n: per_channel_dynamic_qconfig for n, mod in qc.named_modules() if isinstance(mod, torch.nn.Linear) and "lm_head" not in n}
q = torch.ao.quantization.quantize_dynamic(qc, spec, dtype=torch.qint8)
print(q.model.layers[0].self_attn.q_proj, q.lm_head)
def timeit(model, ids, past=None, n=5):
    ts=[]
    for _ in range(n):
        t=time.perf_counter()
        with torch.inference_mode():
            out = model(ids, use_cache=True)
        ts.append(time.perf_counter()-t)
    return sorted(ts)[len(ts)//2], out
def decode(model, B, ctx=600, steps=8):
    ids = torch.randint(0, 49000, (B, ctx))
    with torch.inference_mode():
        out = model(ids, use_cache=True)
        pkv = out.past_key_values
        nxt = out.logits[:, -1:].argmax(-1)
        t=time.perf_counter()
        for _ in range(steps):
            out = model(nxt, past_key_values=pkv, use_cache=True)
            pkv = out.past_key_values; nxt = out.logits[:, -1:].argmax(-1)
        return (time.perf_counter()-t)/steps
for name, model in [("fp32", m), ("int8", q)]:
    ids = torch.randint(0, 49000, (4, 256))
    tp, _ = timeit(model, ids, n=3)
    print(name, f"prefill 4x256: {tp:.3f}s = {4*256/tp:.0f} tok/s", flush=True)
    for B in (1, 16):
        print(name, f"decode B={B} ctx600: {decode(model, B)*1000:.1f} ms/step", flush=True)
# logprob mismatch on real text
tok = load_tokenizer("smollm2-135m")
text = "The capital of France is Paris. Search results: 1. Zorvia (country) Currency: Zorvian mark. Population 3 million. The answer is the Zorvian mark." * 3
ids = torch.tensor([tok(text)["input_ids"]])
with torch.inference_mode():
    a = torch.log_softmax(m(ids).logits.float(), -1); b = torch.log_softmax(q(ids).logits.float(), -1)
tgt = ids[0,1:]
la = a[0,:-1].gather(-1, tgt[:,None])[:,0]; lb = b[0,:-1].gather(-1, tgt[:,None])[:,0]
kl = (a.exp()*(a-b)).sum(-1).mean()
print(f"token logp diff mean {float((la-lb).abs().mean()):.4f} max {float((la-lb).abs().max()):.4f}, KL {float(kl):.5f}, argmax agree {float((a.argmax(-1)==b.argmax(-1)).float().mean()):.3f}")
