import time, torch
import torch.nn.functional as F
torch.manual_seed(0)
Ws=[]
for l in range(30):
    for s in [(576,576),(192,576),(192,576),(576,576),(1536,576),(1536,576),(576,1536)]:
        Ws.append(torch.randn(*s))
nbytes=sum(w.numel()*4 for w in Ws)
P=[w.to_mkldnn() for w in Ws]
def bench(name, fn, M):
    for rep in range(3):
        t=time.perf_counter(); fn(); dt=time.perf_counter()-t
    print(f"M={M:3d} {name:22s} {dt*1000:6.1f} ms  {nbytes/dt/1e9:5.1f} GB/s")
for M in [1,8,16,32,64,128]:
    xs={576:torch.randn(M,576),1536:torch.randn(M,1536)}
    bench("F.linear (MKL)", lambda: [F.linear(xs[w.shape[1]], w) for w in Ws], M)
    bench("oneDNN packed", lambda: [torch._C._nn.mkldnn_linear(xs[w.shape[1]].to_mkldnn(), p, None).to_dense() for w,p in zip(Ws,P)], M)
    try:
        MP=[torch.ops.mkl._mkl_reorder_linear_weight(w, M) for w in Ws]
        bench("MKL packed", lambda: [torch.ops.mkl._mkl_linear(xs[w.shape[1]], mp, w, None, M) for w,mp in zip(Ws,MP)], M)
        del MP
    except Exception as e: print("mkl packed failed", e)
