import os, time
if os.environ.get("STEP_TRACE"):
    import threading
    from agentrl.rollout.generators import hf
    orig = hf.HFGenerator._logits
    out = open(os.environ["STEP_TRACE"], "a", buffering=1)
    def _logits(self, **inputs):
        w, c = time.perf_counter(), time.thread_time()
        r = orig(self, **inputs)
        ids = inputs["input_ids"]
        out.write(f"{os.getpid()} {ids.shape[0]} {ids.shape[1]} {time.perf_counter()-w:.5f} {time.thread_time()-c:.5f}\n")
        return r
    hf.HFGenerator._logits = _logits
