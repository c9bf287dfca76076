import time, torch, sys, torch.nn as nn
torch.set_num_threads(2)
import torch._inductor.config as ic
import torch._dynamo.config as dc
dc.recompile_limit = 64; dc.cache_size_limit = 64
mode = sys.argv[1]; rowsl=[int(r) for r in sys.argv[2].split(",")]; L=int(sys.argv[3])
if mode != "eager":
    ic.max_autotune = True
    ic.max_autotune_gemm_backends = {"cpp":"CPP","aten":"ATEN","both":"CPP,ATEN"}[mode]
    ic.freezing = True
class Layer(nn.Module):
    def __init__(s):
        super().__init__()
        s.q=nn.Linear(576,576,bias=False); s.k=nn.Linear(576,192,bias=False); s.v=nn.Linear(576,192,bias=False)
        s.o=nn.Linear(576,576,bias=False); s.g=nn.Linear(576,1536,bias=False); s.u=nn.Linear(576,1536,bias=False); s.d=nn.Linear(1536,576,bias=False)
    def forward(s,a,b):
        return s.q(a),s.k(a),s.v(a),s.o(a),s.g(a),s.u(a),s.d(b)
layers=[Layer().eval() for _ in range(L)]
with torch.no_grad():
  fs = layers if mode=="eager" else [torch.compile(l, dynamic=False) for l in layers]
  for rows in rowsl:
    a=torch.randn(rows,576); b=torch.randn(rows,1536)
    t0=time.perf_counter()
    for f in fs: f(a,b)
    comp=time.perf_counter()-t0
    ts=[]
    for r in range(15):
        t=time.perf_counter()
        for f in fs: f(a,b)
        ts.append(time.perf_counter()-t)
    ts.sort(); print(mode, rows, f"{ts[7]*1e3*30/L:.1f} ms per 30 layers (first call {comp:.1f}s)", flush=True)
