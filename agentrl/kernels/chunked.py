"""Chunked log-prob + entropy of the taken token from hidden states and the LM head, in plain torch.

Never holds more than ``chunk_rows x V`` logits at once: the forward pass keeps only the per-row
log-sum-exp, and the backward pass recomputes each chunk's logits, turns them into the logit
gradient and multiplies straight back into ``grad_hidden`` / ``grad_weight``. Works on CPU and GPU.

Gradient of the two outputs with respect to the logits ``z`` of one row (``p = softmax(z)``,
``log p = z - lse``, ``H = -sum p log p``)::

    d logp_target / dz = onehot(target) - p
    d H / dz           = -p * (log p + H)
"""

from __future__ import annotations

import torch
from torch import Tensor

# Logit elements per chunk (fp32): 2**25 elements = 128 MiB, small next to a model, big enough
# that the matmul stays efficient.
DEFAULT_CHUNK_ELEMENTS = 2**25


def chunk_rows_for(vocab: int, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> int:
    """Rows per chunk so that one chunk of logits holds about ``chunk_elements`` values."""
    return max(1, chunk_elements // max(1, vocab))


def _chunk_logits(hidden: Tensor, weight: Tensor, temperature: float) -> Tensor:
    # matmul in the model dtype (no fp32 copy of a large LM head), softmax maths in fp32
    logits = (hidden @ weight.t()).float()  # [n, V], a fresh buffer
    if temperature != 1.0:
        logits /= temperature
    return logits


class ChunkedLogprobEntropy(torch.autograd.Function):
    """autograd.Function: ``(hidden [N,H], weight [V,H], targets [N]) -> (logp [N], entropy [N])``."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float, chunk_rows: int):  # type: ignore[override]
        n_rows = hidden.shape[0]
        logp = torch.empty(n_rows, dtype=torch.float32, device=hidden.device)  # [N]
        entropy = torch.empty_like(logp)  # [N]
        lse = torch.empty_like(logp)  # [N]
        for start in range(0, n_rows, chunk_rows):
            stop = min(start + chunk_rows, n_rows)
            log_probs = _chunk_logits(hidden[start:stop], weight, temperature)  # [n, V], logits for now
            chunk_lse = torch.logsumexp(log_probs, dim=-1)  # [n]
            log_probs -= chunk_lse[:, None]  # in place: two [n, V] buffers at most
            lse[start:stop] = chunk_lse
            logp[start:stop] = log_probs.gather(1, targets[start:stop, None]).squeeze(1)
            probs = torch.exp(log_probs)  # [n, V]
            entropy[start:stop] = -probs.mul_(log_probs).sum(-1)
            del log_probs, probs
        ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        ctx.temperature = temperature
        ctx.chunk_rows = chunk_rows
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: Tensor | None, grad_entropy: Tensor | None):  # type: ignore[override]
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        temperature, chunk_rows = ctx.temperature, ctx.chunk_rows
        n_rows = hidden.shape[0]
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if need_h else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        for start in range(0, n_rows, chunk_rows):
            stop = min(start + chunk_rows, n_rows)
            # d/dz of (g_logp * logp_target + g_ent * H): g_logp * onehot - p * (g_logp + g_ent * (log p + H)),
            # built in place in the logits' buffer: two [n, V] buffers at most
            grad_z = _chunk_logits(hidden[start:stop], weight, temperature)  # [n, V], logits for now
            grad_z -= lse[start:stop, None]  # log p
            probs = torch.exp(grad_z)  # [n, V]
            g_logp = grad_logp[start:stop].float() if grad_logp is not None else None  # [n]
            if grad_entropy is not None:
                grad_z += entropy[start:stop, None]
                grad_z *= grad_entropy[start:stop].float()[:, None]
                if g_logp is not None:
                    grad_z += g_logp[:, None]
            elif g_logp is not None:
                grad_z.copy_(g_logp[:, None].expand_as(grad_z))
            else:
                grad_z.zero_()
            grad_z *= probs
            grad_z.neg_()
            del probs
            if g_logp is not None:
                grad_z.scatter_add_(1, targets[start:stop, None], g_logp[:, None])
            if temperature != 1.0:
                grad_z /= temperature
            grad_z = grad_z.to(weight.dtype)
            if need_h:
                grad_hidden[start:stop] = (grad_z @ weight).to(hidden.dtype)
            if need_w:
                grad_weight += (grad_z.t() @ hidden[start:stop]).float()
            del grad_z
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None


def chunked_logprobs_entropy(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Log-prob of ``targets`` and full-vocabulary entropy, chunk by chunk (see module docstring).

    Args:
        hidden: ``[N, H]`` final hidden states (already through the final norm).
        weight: ``[V, H]`` LM head.
        targets: ``[N]`` long, the token whose log-prob is wanted at each row.
        temperature: logits are divided by it (match the sampler's temperature).
        chunk_rows: rows per chunk; default keeps one chunk near 128 MiB of fp32 logits.

    Returns:
        ``(logp [N], entropy [N])`` in float32, differentiable in ``hidden`` and ``weight``.
    """
    rows = chunk_rows or chunk_rows_for(weight.shape[0])
    return ChunkedLogprobEntropy.apply(hidden, weight, targets, float(temperature), int(rows))
