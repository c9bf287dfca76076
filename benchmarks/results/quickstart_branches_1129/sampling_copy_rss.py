import copy, sys, resource, torch, warnings, gc, psutil
warnings.filterwarnings("ignore")
from agentrl.rollout.model import load_model
from agentrl.rollout.generators.hf import sampling_copy
m, tok = load_model("smollm2-135m")
for p in m.parameters(): p.data = p.data.clone()  # resident, as a trained model
gc.collect(); proc = psutil.Process(); r0 = proc.memory_info().rss; p0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024
if sys.argv[1] == "old":
    c = copy.deepcopy(m).to(torch.bfloat16)
else:
    c = sampling_copy(m, torch.bfloat16)
gc.collect()
print(sys.argv[1], "rss +%.0f MB" % ((proc.memory_info().rss - r0)/2**20), "peak +%.0f MB" % (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024 - max(p0, r0/2**20)))
