"""Per-token log-prob and entropy from hidden states and the LM head, without ``[B, T, V]`` logits.

``token_logprobs_entropy(hidden, weight, targets, impl="auto")`` picks:

* ``triton``: fused kernel (``triton_logprobs.py``), chosen by ``auto`` on CUDA tensors when Triton
  is installed;
* ``chunked``: plain torch over row chunks with a recomputing backward (``chunked.py``), chosen by
  ``auto`` everywhere else;
* ``naive``: materialises all logits; the reference the other two are tested against.

All three return float32 ``(logp, entropy)`` and are differentiable in ``hidden`` and ``weight``.
"""

from __future__ import annotations

import importlib.util
import os

import torch
from torch import Tensor

from agentrl.kernels.chunked import chunk_rows_for, chunked_logprobs_entropy

IMPLS = ("auto", "chunked", "triton", "naive")


def naive_logprobs_entropy(
    hidden: Tensor, weight: Tensor, targets: Tensor, *, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Reference: full logits, ``log_softmax``, gather, ``-(p * log p).sum``."""
    logits = (hidden @ weight.t()).float() / temperature  # [N, V]
    log_probs = torch.log_softmax(logits, dim=-1)  # [N, V]
    logp = log_probs.gather(-1, targets[..., None]).squeeze(-1)  # [N]
    entropy = -(log_probs.exp() * log_probs).sum(-1)  # [N]
    return logp, entropy


def triton_available() -> bool:
    """True when the Triton kernel can run here (CUDA device, or the Triton interpreter)."""
    if importlib.util.find_spec("triton") is None:
        return False
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def resolve_impl(impl: str, device: torch.device) -> str:
    """Turn ``auto`` into a concrete implementation for tensors on ``device``."""
    if impl not in IMPLS:
        raise ValueError(f"logprob impl {impl!r} is not one of {', '.join(IMPLS)}")
    if impl != "auto":
        return impl
    if device.type == "cuda" and importlib.util.find_spec("triton") is not None:
        # measured on an H200 (benchmarks/results/gpu_h200): 1.15x chunked's time at an eighth of its
        # memory (T=4096, V=49152), so the fused kernel; train.logprob_impl=chunked for the speed
        return "triton"
    return "chunked"


def token_logprobs_entropy(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    impl: str = "auto",
    temperature: float = 1.0,
    chunk_rows: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Log-prob of each target token and the full-vocabulary entropy at each row.

    Args:
        hidden: ``[N, H]`` final hidden states (after the model's final norm).
        weight: ``[V, H]`` LM head weight.
        targets: ``[N]`` long token ids.
        impl: ``auto | chunked | triton | naive``.
        temperature: logits are divided by it before the softmax.
        chunk_rows: rows per chunk for ``chunked`` (default: about 128 MiB of logits).

    Returns:
        ``(logp [N], entropy [N])`` float32.
    """
    which = resolve_impl(impl, hidden.device)
    if which == "naive":
        return naive_logprobs_entropy(hidden, weight, targets, temperature=temperature)
    if which == "triton":
        if not triton_available():
            raise RuntimeError(
                "logprob impl 'triton' needs a CUDA GPU (or TRITON_INTERPRET=1 set before import "
                "for CPU testing); use train.logprob_impl=chunked"
            )
        from agentrl.kernels.triton_logprobs import triton_logprobs_entropy

        return triton_logprobs_entropy(hidden, weight, targets, temperature=temperature)
    return chunked_logprobs_entropy(hidden, weight, targets, temperature=temperature, chunk_rows=chunk_rows)


__all__ = [
    "IMPLS",
    "chunk_rows_for",
    "chunked_logprobs_entropy",
    "naive_logprobs_entropy",
    "resolve_impl",
    "token_logprobs_entropy",
    "triton_available",
]
