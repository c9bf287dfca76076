"""Log every _generate_batch call: batch, prompt lengths, new tokens, prefill/total seconds."""
import json, time, os
from agentrl.rollout.generators import hf
_orig = hf.HFGenerator._generate_batch
LOG = open(os.environ["TRACE_OUT"], "a")
def traced(self, prompts, sampling, rngs, on_token=None):
    t = time.perf_counter()
    outs = _orig(self, prompts, sampling, rngs, on_token)
    LOG.write(json.dumps({"t": time.time(), "batch": len(prompts), "plen": [len(p) for p in prompts],
        "new": [len(o.ids) for o in outs], "prefill_s": outs[0].timings["prefill_s"], "total_s": time.perf_counter() - t,
        "shared": outs[0].timings.get("shared_prompts")}) + "\n"); LOG.flush()
    return outs
hf.HFGenerator._generate_batch = traced
from agentrl.cli import main
main()
