"""Fused Triton kernel: hidden states x LM head -> log-prob of the taken token and entropy.

No logits ever reach global memory. Forward: each program owns ``BLOCK_N`` rows and walks the
vocabulary in ``BLOCK_V`` tiles; a tile's logits are built with ``tl.dot`` over ``BLOCK_D`` slices
of the hidden size and folded into an online (max, sum-exp, sum-exp*z, target logit) state.
Backward recomputes logit tiles from the saved log-sum-exp and entropy:

* ``_grad_hidden_kernel`` (one program per row block) accumulates ``grad_z @ W`` into its rows;
* ``_grad_weight_kernel`` (one program per vocabulary block) accumulates ``grad_z^T @ h``.

Each program writes only its own rows / vocabulary slice, so there are no atomics and the result
is deterministic. The backward costs about three forward matmuls (recompute twice, multiply once
each way). On CPU this module runs only under ``TRITON_INTERPRET=1`` (set before import), which is
how the tests check it; speed is a GPU matter.

Tile sizes (``Blocks``): the interpreter runs small tiles (its cost grows with the tile); on a GPU
``GPU_BLOCKS`` holds the tiles ``benchmarks/bench_triton_blocks.py`` measured fastest, and a caller
may pass its own ``blocks=``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor


@dataclass(frozen=True)
class Blocks:
    """Tile sizes (powers of two, each at least 16 for ``tl.dot``) and launch options."""

    n: int  # rows per tile
    v: int  # vocabulary entries per tile
    d: int  # hidden-size slice per tl.dot
    warps: int = 4
    stages: int = 2

    def __post_init__(self) -> None:
        for name in ("n", "v", "d"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"Blocks.{name}={value}: a tile side must be a power of two >= 16")

    def meta(self, ieee: bool) -> dict[str, int | bool]:
        return dict(BLOCK_N=self.n, BLOCK_V=self.v, BLOCK_D=self.d, IEEE=ieee,
                    num_warps=self.warps, num_stages=self.stages)  # fmt: skip


INTERPRETER_BLOCKS = Blocks(16, 64, 32)
GPU_BLOCKS = Blocks(64, 256, 64, warps=8, stages=3)


def blocks_for(device: torch.device) -> Blocks:
    """The tiles used on ``device`` when the caller names none."""
    if device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return GPU_BLOCKS
    return INTERPRETER_BLOCKS


@triton.jit
def _logit_tile(h_ptr, w_ptr, rows, row_ok, cols, col_ok, D, stride_h, stride_w, inv_temp,
                BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr):  # fmt: skip
    acc = tl.zeros([BLOCK_N, BLOCK_V], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        ds = d0 + tl.arange(0, BLOCK_D)
        d_ok = ds < D
        h = tl.load(
            h_ptr + rows[:, None] * stride_h + ds[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0
        )
        w = tl.load(
            w_ptr + cols[:, None] * stride_w + ds[None, :], mask=col_ok[:, None] & d_ok[None, :], other=0.0
        )
        if IEEE:
            acc = tl.dot(h, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(h, tl.trans(w), acc)
    return acc * inv_temp


@triton.jit
def _grad_logit_tile(z, cols, col_ok, tgt, lse, ent, g_logp, g_ent, inv_temp):
    # d logp/dz = onehot - p ; d H/dz = -p (log p + H); masked columns contribute nothing
    log_q = z - lse[:, None]
    p = tl.where(col_ok[None, :], tl.exp(log_q), 0.0)
    log_q = tl.where(col_ok[None, :], log_q, 0.0)
    onehot = tl.where(cols[None, :] == tgt[:, None], 1.0, 0.0)
    grad = g_logp[:, None] * (onehot - p) - g_ent[:, None] * p * (log_q + ent[:, None])
    return grad * inv_temp


@triton.jit
def _forward_kernel(h_ptr, w_ptr, tgt_ptr, logp_ptr, ent_ptr, lse_ptr, N, V, D, stride_h, stride_w, inv_temp,
                    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    tgt = tl.load(tgt_ptr + rows, mask=row_ok, other=0)
    run_max = tl.full([BLOCK_N], float("-inf"), dtype=tl.float32)
    sum_exp = tl.zeros([BLOCK_N], dtype=tl.float32)  # sum exp(z - run_max)
    sum_exp_z = tl.zeros([BLOCK_N], dtype=tl.float32)  # sum exp(z - run_max) * z
    z_target = tl.zeros([BLOCK_N], dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < V
        z = _logit_tile(h_ptr, w_ptr, rows, row_ok, cols, col_ok, D, stride_h, stride_w, inv_temp,
                        BLOCK_N, BLOCK_V, BLOCK_D, IEEE)  # fmt: skip
        z_safe = tl.where(col_ok[None, :], z, 0.0)  # avoids -inf * 0 below
        z = tl.where(col_ok[None, :], z, float("-inf"))
        new_max = tl.maximum(run_max, tl.max(z, axis=1))
        scale = tl.exp(run_max - new_max)
        e = tl.exp(z - new_max[:, None])
        sum_exp = sum_exp * scale + tl.sum(e, axis=1)
        sum_exp_z = sum_exp_z * scale + tl.sum(e * z_safe, axis=1)
        z_target += tl.sum(tl.where(cols[None, :] == tgt[:, None], z_safe, 0.0), axis=1)
        run_max = new_max
    lse = run_max + tl.log(sum_exp)
    tl.store(lse_ptr + rows, lse, mask=row_ok)
    tl.store(logp_ptr + rows, z_target - lse, mask=row_ok)
    tl.store(ent_ptr + rows, lse - sum_exp_z / sum_exp, mask=row_ok)


@triton.jit
def _grad_hidden_kernel(h_ptr, w_ptr, tgt_ptr, lse_ptr, ent_ptr, glogp_ptr, gent_ptr, gh_ptr,
                        N, V, D, stride_h, stride_w, inv_temp,
                        BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    tgt = tl.load(tgt_ptr + rows, mask=row_ok, other=0)
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    ent = tl.load(ent_ptr + rows, mask=row_ok, other=0.0)
    g_logp = tl.load(glogp_ptr + rows, mask=row_ok, other=0.0)
    g_ent = tl.load(gent_ptr + rows, mask=row_ok, other=0.0)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < V
        z = _logit_tile(h_ptr, w_ptr, rows, row_ok, cols, col_ok, D, stride_h, stride_w, inv_temp,
                        BLOCK_N, BLOCK_V, BLOCK_D, IEEE)  # fmt: skip
        grad_z = _grad_logit_tile(z, cols, col_ok, tgt, lse, ent, g_logp, g_ent, inv_temp)
        for d0 in range(0, D, BLOCK_D):
            ds = d0 + tl.arange(0, BLOCK_D)
            d_ok = ds < D
            w = tl.load(
                w_ptr + cols[:, None] * stride_w + ds[None, :],
                mask=col_ok[:, None] & d_ok[None, :],
                other=0.0,
            )
            out = gh_ptr + rows[:, None] * D + ds[None, :]
            out_ok = row_ok[:, None] & d_ok[None, :]
            if IEEE:
                part = tl.dot(grad_z.to(w.dtype), w, input_precision="ieee")
            else:
                part = tl.dot(grad_z.to(w.dtype), w)
            tl.store(out, tl.load(out, mask=out_ok, other=0.0) + part, mask=out_ok)


@triton.jit
def _grad_weight_kernel(h_ptr, w_ptr, tgt_ptr, lse_ptr, ent_ptr, glogp_ptr, gent_ptr, gw_ptr,
                        N, V, D, stride_h, stride_w, inv_temp,
                        BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr):  # fmt: skip
    cols = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    col_ok = cols < V
    for n0 in range(0, N, BLOCK_N):
        rows = n0 + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        tgt = tl.load(tgt_ptr + rows, mask=row_ok, other=0)
        lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
        ent = tl.load(ent_ptr + rows, mask=row_ok, other=0.0)
        g_logp = tl.load(glogp_ptr + rows, mask=row_ok, other=0.0)
        g_ent = tl.load(gent_ptr + rows, mask=row_ok, other=0.0)
        z = _logit_tile(h_ptr, w_ptr, rows, row_ok, cols, col_ok, D, stride_h, stride_w, inv_temp,
                        BLOCK_N, BLOCK_V, BLOCK_D, IEEE)  # fmt: skip
        grad_z = _grad_logit_tile(z, cols, col_ok, tgt, lse, ent, g_logp, g_ent, inv_temp)
        grad_z = tl.where(row_ok[:, None], grad_z, 0.0)
        for d0 in range(0, D, BLOCK_D):
            ds = d0 + tl.arange(0, BLOCK_D)
            d_ok = ds < D
            h = tl.load(
                h_ptr + rows[:, None] * stride_h + ds[None, :],
                mask=row_ok[:, None] & d_ok[None, :],
                other=0.0,
            )
            out = gw_ptr + cols[:, None] * D + ds[None, :]
            out_ok = col_ok[:, None] & d_ok[None, :]
            if IEEE:
                part = tl.dot(tl.trans(grad_z.to(h.dtype)), h, input_precision="ieee")
            else:
                part = tl.dot(tl.trans(grad_z.to(h.dtype)), h)
            tl.store(out, tl.load(out, mask=out_ok, other=0.0) + part, mask=out_ok)


class TritonLogprobEntropy(torch.autograd.Function):
    """autograd.Function over the fused kernels: ``(hidden [N,H], weight [V,H], targets [N])``."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float,  # type: ignore[override]
                blocks: Blocks):  # fmt: skip
        hidden, weight = hidden.contiguous(), weight.contiguous()
        targets = targets.contiguous().to(torch.int64)
        n_rows, dim = hidden.shape
        vocab = weight.shape[0]
        logp = torch.empty(n_rows, dtype=torch.float32, device=hidden.device)  # [N]
        entropy = torch.empty_like(logp)  # [N]
        lse = torch.empty_like(logp)  # [N]
        ieee = hidden.dtype == torch.float32
        if n_rows:
            _forward_kernel[(triton.cdiv(n_rows, blocks.n),)](
                hidden, weight, targets, logp, entropy, lse, n_rows, vocab, dim,
                hidden.stride(0), weight.stride(0), 1.0 / temperature, **blocks.meta(ieee),
            )  # fmt: skip
        ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        ctx.temperature = temperature
        ctx.blocks = blocks
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: Tensor | None, grad_entropy: Tensor | None):  # type: ignore[override]
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        n_rows, dim = hidden.shape
        vocab = weight.shape[0]
        zeros = torch.zeros(n_rows, dtype=torch.float32, device=hidden.device)
        g_logp = zeros if grad_logp is None else grad_logp.float().contiguous()
        g_ent = zeros if grad_entropy is None else grad_entropy.float().contiguous()
        args = (hidden, weight, targets, lse, entropy, g_logp, g_ent)
        blocks: Blocks = ctx.blocks
        meta = blocks.meta(hidden.dtype == torch.float32)
        scalars = (n_rows, vocab, dim, hidden.stride(0), weight.stride(0), 1.0 / ctx.temperature)
        grad_hidden = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_hidden = torch.zeros((n_rows, dim), dtype=torch.float32, device=hidden.device)
            if n_rows:
                _grad_hidden_kernel[(triton.cdiv(n_rows, blocks.n),)](*args, grad_hidden, *scalars, **meta)
            grad_hidden = grad_hidden.to(hidden.dtype)
        if ctx.needs_input_grad[1]:
            grad_weight = torch.zeros((vocab, dim), dtype=torch.float32, device=weight.device)
            if n_rows:
                _grad_weight_kernel[(triton.cdiv(vocab, blocks.v),)](*args, grad_weight, *scalars, **meta)
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None


def triton_logprobs_entropy(
    hidden: Tensor, weight: Tensor, targets: Tensor, *, temperature: float = 1.0, blocks: Blocks | None = None
) -> tuple[Tensor, Tensor]:
    """Fused log-prob of ``targets`` and entropy; same contract as ``chunked_logprobs_entropy``.

    ``blocks``: tile sizes; default ``blocks_for(hidden.device)``."""
    chosen = blocks or blocks_for(hidden.device)
    return TritonLogprobEntropy.apply(hidden, weight, targets, float(temperature), chosen)
