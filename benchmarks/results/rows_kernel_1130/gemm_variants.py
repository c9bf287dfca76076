import ctypes, time, torch, torch.nn.functional as F, sys, glob
torch.manual_seed(0)
th = int(sys.argv[1]); torch.set_num_threads(th)
libs = {}
for p in sorted(glob.glob("/tmp/sg/v_*.so")):  # built from variants.c: gcc -O3 -mavx2 -mfma -fopenmp -shared -fPIC -DNRMAX=2 -DMRMAX=4 -DPF=64 ... (linked to torch/lib/libgomp.so.1)
    lib = ctypes.CDLL(p); lib.rows_linear.argtypes = [ctypes.c_void_p]*4 + [ctypes.c_long]*5 + [ctypes.c_int]
    libs[p.split("/")[-1][2:-3]] = lib
def mk(lib):
    def mine(x, w):
        M, K = x.shape; N = w.shape[0]; y = torch.empty(M, N)
        lib.rows_linear(x.data_ptr(), w.data_ptr(), None, y.data_ptr(), M, N, K, K, N, th); return y
    return mine
fns = {"F": F.linear, **{k: mk(v) for k, v in libs.items()}}
shapes = [(576,576),(192,576),(192,576),(576,576),(1536,576),(1536,576),(576,1536)]
Ws = [[torch.randn(n,k)*0.05 for n,k in shapes] for _ in range(30)]
for M in (1,8,16):
    xs = {k: torch.randn(M,k) for k in (576,1536)}
    for name, fn in fns.items():
        assert (fn(xs[1536], Ws[0][6]) - F.linear(xs[1536], Ws[0][6])).abs().max() < 1e-4
    res={}
    for rep in range(3):
        for name,fn in fns.items():
            t=time.perf_counter()
            for L in Ws:
                for w in L: fn(xs[w.shape[1]], w)
            res.setdefault(name,[]).append((time.perf_counter()-t)*1000)
    print("threads", th, "M",M, " ".join(f"{k}={min(v):.1f}" for k,v in res.items()))
