"""What capping the CPU kernel caches (``train.kernel_cache``) costs and saves, bfloat16 autocast.

A bfloat16 matmul on CPU goes through oneDNN, and both oneDNN's primitive cache and PyTorch's own
(ideep) cache keep a packed copy of the weight per input shape (1024 entries each by default). A
training run meets hundreds of sequence lengths (prompts, trees, warm-up batches), so its resident
memory grows with them. Each configuration runs in its own process (the caches read their sizes on
first use): the RSS a run of distinct shapes leaves behind (forward and backward through the
SmolLM2-135M MLP shapes), and the time of a decode-like step (every linear of 30 blocks at 1..16
rows, the shapes a lock-step decode repeats), with the libraries' defaults and capped.

    python benchmarks/bench_kernel_cache.py            # 200 shapes, caps 64 and 16
    python benchmarks/bench_kernel_cache.py --quick
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import Row, parser, print_table, write_json  # noqa: E402

CHILD = r"""
import ctypes, gc, json, sys, time
import torch

def rss_mb():
    with open("/proc/self/status") as fh:
        return next(int(x.split()[1]) for x in fh if x.startswith("VmRSS")) / 1024

shapes, repeats = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
torch.set_num_threads(1)
mlp = [torch.nn.Linear(576, 1536, bias=False), torch.nn.Linear(1536, 576, bias=False)]
trim = ctypes.CDLL("libc.so.6").malloc_trim
start = rss_mb()
for n in range(1, shapes + 1):  # a distinct number of rows each time, as a run's sequence lengths
    x = torch.randn(3 * n, 576, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = mlp[1](mlp[0](x)).float().sum()
    y.backward()
gc.collect(); trim(0)
grown = rss_mb() - start
dims = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576)]
blocks = [[torch.nn.Linear(i, o, bias=False) for i, o in dims] for _ in range(30)]
inputs = {(rows, i): torch.randn(rows, i) for rows in range(1, 17) for i in (576, 1536)}

def step(rows):
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for block in blocks:
            for lin in block:
                lin(inputs[rows, lin.in_features])

for rows in range(1, 17):
    step(rows)
t0 = time.perf_counter()
for _ in range(repeats):
    for rows in range(1, 17):
        step(rows)
print(json.dumps({"grown_mb": grown, "step_ms": (time.perf_counter() - t0) / (16 * repeats) * 1000}))
"""


def measure(cap: int, shapes: int, repeats: int) -> dict[str, float]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
    }
    if cap:
        env |= {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(cap), "LRU_CACHE_CAPACITY": str(cap)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(shapes), str(repeats)], env=env,
                         capture_output=True, text=True, check=True, timeout=1800)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--shapes", type=int, default=200, help="distinct input shapes run forward and backward")
    p.add_argument(
        "--caps", type=int, nargs="+", default=[64, 16], help="cache entries to compare with the default"
    )
    args = p.parse_args()
    shapes, repeats = (10, 1) if args.quick else (args.shapes, 3)
    base = measure(0, shapes, repeats)
    rows = [Row(f"RSS grown by {shapes} shapes, libraries' default", base["grown_mb"], "MB"),
            Row("decode-like step (30 blocks, 1..16 rows), default", base["step_ms"], "ms")]  # fmt: skip
    for cap in args.caps:
        got = measure(cap, shapes, repeats)
        rows += [Row(f"RSS grown by {shapes} shapes, {cap} entries each", got["grown_mb"], "MB",
                     "the default", base["grown_mb"]),
                 Row(f"decode-like step, {cap} entries each", got["step_ms"], "ms", "the default", base["step_ms"])]  # fmt: skip
    print_table(rows, "CPU kernel caches under bfloat16 autocast (train.kernel_cache)")
    write_json(args.json_path, "kernel_cache", rows, args.quick)


if __name__ == "__main__":
    main()
