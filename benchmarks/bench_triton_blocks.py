"""Tile sizes of the fused Triton log-prob + entropy kernel, measured on a GPU.

    python benchmarks/bench_triton_blocks.py [--quick] [--json PATH]

For each candidate ``Blocks`` (rows x vocabulary x hidden-slice tiles, warps, stages):

1. correctness against ``chunked`` on a small case in bfloat16 (log-prob, entropy and both
   gradients; the largest absolute difference is printed) and in float32 (IEEE dots);
2. forward + backward time at V = 49,152, H = 576 (SmolLM2) and V = 151,936, H = 896 (Qwen2.5),
   T = 4,096 rows (``--quick``: 1,024), bfloat16, median of 5 after 2 warm-ups (CUDA events).

``chunked`` (the cuBLAS fallback) is timed on the same inputs as the baseline. The fastest correct
tiles are what ``agentrl.kernels.triton_logprobs.GPU_BLOCKS`` should hold. Needs CUDA; on a CPU it
says so and exits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

CANDIDATES = (  # (n, v, d, warps, stages)
    (16, 64, 32, 4, 2),
    (32, 128, 64, 4, 3),
    (64, 128, 64, 4, 3),
    (64, 128, 64, 8, 3),
    (64, 256, 64, 8, 3),
    (128, 128, 64, 8, 3),
    (128, 256, 64, 8, 3),
    (32, 256, 64, 4, 3),
    (64, 64, 64, 4, 3),
)
SIZES = ((49_152, 576), (151_936, 896))


def _inputs(n: int, dim: int, vocab: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    hidden = torch.randn(n, dim, device="cuda", dtype=torch.float32, generator=gen).to(dtype)
    weight = (torch.randn(vocab, dim, device="cuda", dtype=torch.float32, generator=gen) / dim**0.5).to(dtype)
    targets = torch.randint(0, vocab, (n,), device="cuda", generator=gen)
    return hidden, weight, targets


def _run(fn, hidden, weight, targets):
    h = hidden.detach().requires_grad_(True)
    w = weight.detach().requires_grad_(True)
    logp, ent = fn(h, w, targets)
    (logp.sum() + 0.5 * ent.sum()).backward()
    return logp.detach().float(), ent.detach().float(), h.grad.float(), w.grad.float()


def _max_diff(fn, ref, hidden, weight, targets) -> float:
    got = _run(fn, hidden, weight, targets)
    want = _run(ref, hidden, weight, targets)
    return max((a - b).abs().max().item() for a, b in zip(got, want, strict=True))


def _time(fn, hidden, weight, targets) -> float:
    for _ in range(2):
        _run(fn, hidden, weight, targets)
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        _run(fn, hidden, weight, targets)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="T = 1,024 rows")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_triton_blocks: needs a CUDA GPU (the kernel's speed is a GPU matter); nothing measured")
        return 0
    from agentrl.kernels import chunked_logprobs_entropy
    from agentrl.kernels.triton_logprobs import GPU_BLOCKS, Blocks, triton_logprobs_entropy

    rows = 1024 if args.quick else 4096
    print(f"fused log-prob + entropy tiles on {torch.cuda.get_device_name()}, T={rows}, bfloat16 timing")
    print(f"current GPU_BLOCKS: {GPU_BLOCKS}")
    header = f"{'n':>4} {'v':>4} {'d':>3} {'warps':>5} {'stages':>6}  {'bf16 err':>9} {'fp32 err':>9}"
    header += "".join(f"  {f'V={v} s':>12}" for v, _ in SIZES)
    print(header)
    results = []
    chunked = {}
    for vocab, dim in SIZES:
        h, w, t = _inputs(rows, dim, vocab, torch.bfloat16)
        chunked[vocab] = _time(chunked_logprobs_entropy, h, w, t)
    line = f"{'chunked (cuBLAS)':>27}  {'-':>9} {'-':>9}" + "".join(
        f"  {chunked[v]:>12.4f}" for v, _ in SIZES
    )
    print(line)
    for n, v, d, warps, stages in CANDIDATES:
        blocks = Blocks(n, v, d, warps, stages)

        def fn(hh, ww, tt, _b=blocks):
            return triton_logprobs_entropy(hh, ww, tt, blocks=_b)

        row = {"blocks": [n, v, d, warps, stages]}
        try:
            row["bf16_err"] = _max_diff(
                fn, chunked_logprobs_entropy, *_inputs(300, 576, 5000, torch.bfloat16)
            )
            row["fp32_err"] = _max_diff(fn, chunked_logprobs_entropy, *_inputs(300, 576, 5000, torch.float32))
            for vocab, dim in SIZES:
                row[f"s_{vocab}"] = _time(fn, *_inputs(rows, dim, vocab, torch.bfloat16))
        except Exception as exc:  # a tile that does not compile or fit is reported, not fatal
            row["error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
        results.append(row)
        cells = "".join(f"  {row.get(f's_{vocab}', float('nan')):>12.4f}" for vocab, _ in SIZES)
        errs = f"{row.get('bf16_err', float('nan')):>9.2e} {row.get('fp32_err', float('nan')):>9.2e}"
        print(f"{n:>4} {v:>4} {d:>3} {warps:>5} {stages:>6}  {errs}{cells}  {row.get('error', '')}")
        sys.stdout.flush()
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows,
                                         "chunked": chunked, "tiles": results}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
