import copy, sys, time, torch
sys.path.insert(0, "benchmarks")
from bench_decode import measure
from agentrl.rollout.model import load_model
from agentrl.rollout.generators.head import packed_head_for
torch.set_num_threads(2)
model = load_model("smollm2-135m")[0]
model.eval()
bf = copy.deepcopy(model).to(torch.bfloat16).eval()
for name, m in (("fp32", model), ("bf16 copy", bf), ("fp32", model), ("bf16 copy", bf)):
    head = packed_head_for(m)
    p, d = measure(m, 16, 640, 8, False, head)
    print(f"{name}: prefill 16x640 {p:.2f} s, decode step {d*1000:.0f} ms, head {'packed' if head else 'plain'}", flush=True)
