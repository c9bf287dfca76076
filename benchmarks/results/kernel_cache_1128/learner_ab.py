import os, sys, time, torch
from agentrl.train.memory import cap_kernel_caches
print(cap_kernel_caches(int(sys.argv[1])))
from agentrl.rollout.model import load_model
model, tok = load_model("smollm2-135m", dtype="float32")
for p in model.parameters(): p.requires_grad_(False)
for block in model.model.layers[-10:]:
    for p in block.parameters(): p.requires_grad_(True)
torch.manual_seed(0)
lengths = [600, 640, 700, 660, 620, 680]
def step(L):
    ids = torch.randint(100, 20000, (4, L))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=ids).logits
    out[:, -50:].float().logsumexp(-1).mean().backward()
step(500)
t0 = time.perf_counter()
for rep in range(2):
    for L in lengths:
        step(L)
rss = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM")) / 2**20
print(f"cap {sys.argv[1]}: {(time.perf_counter()-t0)/12:.2f} s per fwd+bwd [4, ~650], peak {rss:.2f} GiB")
