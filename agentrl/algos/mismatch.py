"""Sampler-learner mismatch: how far the sampler's log-probs are from the learner's, and corrections.

Any sampler that is not the learner itself (vLLM, a remote server, another precision or kernel)
reports per-token log-probs ``sampler_logp`` that differ from what the learner computes for the
same tokens before its update (``learner_logp``, the behaviour pass). With
``delta = learner_logp - sampler_logp`` and ``rho = exp(delta)`` (the learner/sampler ratio):

- metrics (:func:`mismatch_metrics`): mean and max ``|delta|`` over generated tokens, the share of
  tokens with ``rho`` outside ``[1/cap, cap]``, the signed mean of ``delta`` and the k3 estimate
  ``mean(rho - 1 - delta)`` of KL(sampler || learner) (the tokens were drawn from the sampler);
- corrections (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
  training"; Liu et al. 2025, masked importance sampling):

  - ``tis``: truncated importance sampling, each token's policy-gradient term times
    ``min(rho, cap)`` (no gradient through the weight);
  - ``token_mask``: tokens with ``rho`` outside ``[1/cap, cap]`` leave the loss (and its
    denominators), as if they had not been generated for training;
  - ``seq_mask``: a row whose geometric-mean ratio ``exp(mean_t delta)`` is outside
    ``[1/cap, cap]`` leaves the loss whole (length-normalised, so a long row is not dropped for
    accumulating many tiny differences).

All functions are pure, take ``[B, L]`` tensors with a ``mask`` of generated tokens and never
read masked-out positions (padding may hold anything, even NaN).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

CORRECTIONS = ("none", "tis", "token_mask", "seq_mask")


def _check_cap(cap: float) -> float:
    if not cap > 1.0:
        raise ValueError(f"the mismatch cap must be > 1 (a ratio bound; 2 is common), got {cap}")
    return math.log(cap)


def log_ratio(learner_logp: Tensor, sampler_logp: Tensor, mask: Tensor) -> Tensor:
    """``learner_logp - sampler_logp`` on ``mask``, 0 elsewhere; ``[B, L]``, no gradient."""
    m = mask.bool()
    delta = learner_logp.detach().float() - sampler_logp.detach().float()
    return torch.where(m, delta, torch.zeros_like(delta))


@torch.no_grad()
def mismatch_metrics(
    learner_logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, cap: float = 2.0
) -> dict[str, float]:
    """Per-step mismatch figures over the tokens of ``mask`` (all 0 when it is empty).

    Returns ``mismatch/abs_mean``, ``mismatch/abs_max``, ``mismatch/over_cap`` (share of tokens
    with ``|delta| > log cap``), ``mismatch/seq_over_cap`` (share of rows whose geometric-mean
    ratio is out of bounds, what ``seq_mask`` drops), ``mismatch/mean`` (signed) and ``mismatch/kl_k3``.
    """
    log_cap = _check_cap(cap)
    m = mask.bool()
    n = int(m.sum())
    if n == 0:
        return {
            f"mismatch/{k}": 0.0 for k in ("abs_mean", "abs_max", "over_cap", "seq_over_cap", "mean", "kl_k3")
        }
    delta = log_ratio(learner_logp, sampler_logp, m)  # [B, L]
    values = delta[m]  # [N]
    rows = m.any(dim=1)
    seq_out = ~sequence_keep(learner_logp, sampler_logp, m, cap=cap)
    stats = {
        "abs_mean": float(values.abs().mean()),
        "abs_max": float(values.abs().max()),
        "over_cap": float((values.abs() > log_cap).float().mean()),
        "seq_over_cap": float(seq_out[rows].float().mean()),
        "mean": float(values.mean()),
        "kl_k3": float((values.clamp(max=20.0).exp() - 1 - values).mean()),
    }
    return {f"mismatch/{k}": v for k, v in stats.items()}


@torch.no_grad()
def tis_weight(learner_logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, cap: float = 2.0) -> Tensor:
    """Truncated importance weight ``min(exp(delta), cap)`` on ``mask``, 1 elsewhere; ``[B, L]``."""
    _check_cap(cap)
    delta = log_ratio(learner_logp, sampler_logp, mask)
    weight = delta.clamp(max=math.log(cap)).exp()
    return torch.where(mask.bool(), weight, torch.ones_like(weight))


@torch.no_grad()
def token_keep(learner_logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, cap: float = 2.0) -> Tensor:
    """``[B, L]`` bool: tokens of ``mask`` whose ratio is within ``[1/cap, cap]``."""
    log_cap = _check_cap(cap)
    delta = log_ratio(learner_logp, sampler_logp, mask)
    return mask.bool() & (delta.abs() <= log_cap)


@torch.no_grad()
def sequence_keep(learner_logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, cap: float = 2.0) -> Tensor:
    """``[B]`` bool: rows whose geometric-mean ratio ``exp(mean delta)`` is within ``[1/cap, cap]``
    (a row with no token of ``mask`` is kept: it has nothing to drop)."""
    log_cap = _check_cap(cap)
    m = mask.bool()
    delta = log_ratio(learner_logp, sampler_logp, m)
    mean = delta.sum(dim=1) / m.sum(dim=1).clamp_min(1)  # [B]
    return mean.abs() <= log_cap


def correction_keep(kind: str, learner_logp: Tensor, sampler_logp: Tensor, mask: Tensor, *,
                    cap: float = 2.0) -> Tensor | None:  # fmt: skip
    """``[B, L]`` bool tokens the masking correction ``kind`` keeps (within ``mask``); None when
    ``kind`` masks nothing (``none``, ``tis``)."""
    if kind not in CORRECTIONS:
        raise ValueError(f"mismatch correction must be one of {CORRECTIONS}, got {kind!r}")
    if kind == "token_mask":
        return token_keep(learner_logp, sampler_logp, mask, cap=cap)
    if kind == "seq_mask":
        return mask.bool() & sequence_keep(learner_logp, sampler_logp, mask, cap=cap)[:, None]
    return None


__all__ = [
    "CORRECTIONS", "correction_keep", "log_ratio", "mismatch_metrics", "sequence_keep", "tis_weight",
    "token_keep",
]  # fmt: skip
