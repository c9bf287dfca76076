import sys, torch
sys.path.insert(0, "benchmarks")
from bench_decode import interleaved
from agentrl.rollout.model import load_model
from agentrl.rollout.generators.head import packed_head_for
import agentrl.kernels.rows_linear as rl
model, tok = load_model("smollm2-135m")
rk, _ = rl.rows_linears_for(model)
ph = packed_head_for(model)
orig = rl.call_rows
class One:
    def __init__(s, rk): s.rk = rk
    def active(s):
        import contextlib
        @contextlib.contextmanager
        def cm():
            def one(lib, x, w, b):
                rows, k = x.shape; n = w.shape[0]; y = torch.empty((rows, n))
                lib.rows_linear(x.data_ptr(), w.data_ptr(), b.data_ptr() if b is not None else None, y.data_ptr(), rows, n, k, x.stride(0), n, 1)
                return y
            rl.call_rows = one
            try:
                with s.rk.active(): yield
            finally: rl.call_rows = orig
        return cm()
for B in (3, 4, 6, 8, 10, 12):
    t = interleaved(model, B, 200, 40, [(ph, None), (ph, rk)])
    print(B, "plain", round(t[0]*1000,1), "kernel 2 threads", round(t[1]*1000,1))
