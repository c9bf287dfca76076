"""Tile sizes of the fused Triton log-prob + entropy kernel.

    python benchmarks/bench_triton_blocks.py [--quick] [--json PATH]

For each candidate ``Blocks`` (rows x vocabulary x hidden-slice tiles, warps, stages):

1. correctness: the largest absolute difference from ``chunked`` over log-prob, entropy and both
   gradients, in float32 (IEEE dots), and on a GPU also in bfloat16 (where cuBLAS rounds its
   logits to bf16, so ~1e-2 is expected there). On a CPU this runs through the Triton interpreter
   (``TRITON_INTERPRET=1``, set here before Triton is imported) on a small ragged case;
2. on a GPU only: forward + backward seconds at V = 49,152, H = 576 (SmolLM2) and V = 151,936,
   H = 896 (Qwen2.5), T = 4,096 rows (``--quick``: 1,024), bfloat16, median of 5 after 2 warm-ups
   (CUDA events), against ``chunked`` (cuBLAS) on the same inputs. On a CPU these rows say
   "needs CUDA".

The fastest correct tiles are what ``agentrl.kernels.triton_logprobs.GPU_BLOCKS`` holds; the H200
run that chose them is in ``benchmarks/results/gpu_h200/``.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any import of triton

sys.path.insert(0, str(Path(__file__).parent))

from common import Row, parser, print_table, write_json  # noqa: E402

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


def _inputs(n: int, dim: int, vocab: int, dtype: torch.dtype, device: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, dim, generator=gen).to(device, dtype)
    weight = (torch.randn(vocab, dim, generator=gen) / dim**0.5).to(device, dtype)
    targets = torch.randint(0, vocab, (n,), generator=gen).to(device)
    return hidden, weight, targets


def _run(fn, hidden, weight, targets):
    h = hidden.detach().requires_grad_(True)
    w = weight.detach().requires_grad_(True)
    logp, ent = fn(h, w, targets)
    (logp.sum() + 0.5 * ent.sum()).backward()
    return logp.detach().float(), ent.detach().float(), h.grad.float(), w.grad.float()


def _max_diff(fn, ref, inputs) -> float:
    got, want = _run(fn, *inputs), _run(ref, *inputs)
    return max((a - b).abs().max().item() for a, b in zip(got, want, strict=True))


def _seconds(fn, inputs) -> float:
    for _ in range(2):
        _run(fn, *inputs)
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        _run(fn, *inputs)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return statistics.median(times)


def main() -> int:
    args = parser(__doc__).parse_args()
    from agentrl.kernels import chunked_logprobs_entropy
    from agentrl.kernels.triton_logprobs import GPU_BLOCKS, Blocks, triton_logprobs_entropy

    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    rows_t = 1024 if args.quick else 4096
    small = (300, 576, 5000) if gpu else (37, 80, 300)  # the interpreter is slow: a small ragged case
    where = torch.cuda.get_device_name() if gpu else "CPU, Triton interpreter"
    chunked: dict[int, float] = {}
    if gpu:
        for vocab, dim in SIZES:
            chunked[vocab] = _seconds(
                chunked_logprobs_entropy, _inputs(rows_t, dim, vocab, torch.bfloat16, device)
            )
    rows: list[Row] = []
    for n, v, d, warps, stages in CANDIDATES:
        blocks = Blocks(n, v, d, warps, stages)
        tag = f"{n}x{v}x{d} w{warps} s{stages}" + (" (GPU_BLOCKS)" if blocks == GPU_BLOCKS else "")

        def fn(hh, ww, tt, _b=blocks):
            return triton_logprobs_entropy(hh, ww, tt, blocks=_b)

        dtypes = (torch.float32, torch.bfloat16) if gpu else (torch.float32,)
        try:
            for dtype in dtypes:
                err = _max_diff(fn, chunked_logprobs_entropy, _inputs(*small, dtype, device))
                rows.append(Row(f"max |diff| vs chunked, {str(dtype)[6:]}, tiles {tag}", err, "abs",
                                note=f"{small[0]}x{small[1]}, V={small[2]}; {where}"))  # fmt: skip
            for vocab, dim in SIZES:
                name = f"fwd+bwd T={rows_t} V={vocab} H={dim} bf16, tiles {tag}"
                if not gpu:
                    rows.append(Row(name, None, "s", note="needs CUDA (speed is a GPU matter)"))  # type: ignore[arg-type]
                    continue
                seconds = _seconds(fn, _inputs(rows_t, dim, vocab, torch.bfloat16, device))
                rows.append(Row(name, seconds, "s", "chunked (cuBLAS)", chunked[vocab]))
        except Exception as exc:  # a tile that does not compile or fit is a row, not the end
            rows.append(Row(f"tiles {tag}", None, "", note=f"{type(exc).__name__}: {str(exc)[:120]}"))  # type: ignore[arg-type]
        print(f"tiles {tag}: done", flush=True)
    print_table(rows, f"fused log-prob + entropy tiles ({where})")
    write_json(args.json_path, "triton_blocks", rows, args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
