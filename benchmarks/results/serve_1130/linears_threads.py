"""python benchmarks/results/serve_1130/linears_threads.py

SmolLM2-135M's 210 decoder linear shapes (random float32 weights, streamed from memory): one pass at M rows with torch
at 1 and 2 threads (F.linear: MKL), and each weight split in halves over two Python threads at 1 torch thread each."""
import torch, time, threading
import torch.nn.functional as F
torch.manual_seed(0)
shapes=[(576,576),(192,576),(192,576),(576,576),(1536,576),(1536,576),(576,1536)]
Ws=[torch.randn(n,k)/30 for _ in range(30) for (n,k) in shapes]
def run(fn, M, reps=15):
    xs={k: torch.randn(M,k) for k in (576,1536)}
    ts=[]
    for r in range(reps):
        t=time.perf_counter(); fn(xs); ts.append(time.perf_counter()-t)
    ts.sort(); return ts[len(ts)//2]*1e3
def serial(xs):
    for W in Ws: F.linear(xs[W.shape[1]], W)
halves=[(W[:W.shape[0]//2], W[W.shape[0]//2:]) for W in Ws]
for th in (1,2):
    torch.set_num_threads(th)
    print("threads", th, " ".join(f"M={M}:{run(serial,M):.1f}" for M in (1,2,4,8)), flush=True)
# two python threads, each one torch thread, each half of every weight, barrier per layer op
torch.set_num_threads(1)
import concurrent.futures as cf
ex=cf.ThreadPoolExecutor(2)
def split(xs):
    for a,b in halves:
        x=xs[a.shape[1]]
        f=ex.submit(F.linear, x, b); ya=F.linear(x,a); yb=f.result()
        torch.cat([ya,yb],-1)
print("2 py threads", " ".join(f"M={M}:{run(split,M):.1f}" for M in (1,8)), flush=True)
