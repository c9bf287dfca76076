"""KL estimators k1 / k2 / k3 on sampled tokens (Schulman's naming; RPG, arXiv 2505.17508).

With ``l = logp - ref_logp`` on tokens sampled from the current policy:

- ``k1 = l``: unbiased value of KL(pi || ref); as a loss its gradient is 0 in expectation.
- ``k2 = l^2 / 2``: biased value; its gradient is the reverse-KL gradient ``grad KL(pi || ref)``.
- ``k3 = exp(-l) - 1 + l`` (verl's ``low_var_kl``): unbiased, non-negative, low-variance value;
  its gradient is, in expectation, the forward-KL gradient ``grad KL(ref || pi)``.

Samples drawn from pi_old instead of pi would need the weight pi/pi_old (RPG's "importance
weighting mismatch"); GRPO-style trainers omit it, and so does this function.
"""

from __future__ import annotations

import torch
from torch import Tensor

KL_KINDS = ("k1", "k2", "k3")


def kl(
    logp: Tensor,
    ref_logp: Tensor,
    kind: str = "k1",
    *,
    mask: Tensor | None = None,
    clamp: float | None = None,
) -> Tensor:
    """Per-token KL estimate.

    Args:
        logp: ``[B, L]`` log-prob of the sampled tokens under the trained policy (with grad).
        ref_logp: ``[B, L]`` under the reference policy.
        kind: ``"k1"``, ``"k2"`` or ``"k3"``.
        mask: ``[B, L]`` optional; positions off the mask give exactly 0 and no gradient, even if
            the log-probs there are -inf or NaN (padding).
        clamp: optional bound on ``|logp - ref_logp|`` before the estimator (verl clamps k3).

    Returns:
        ``[B, L]`` estimate; aggregate with :func:`agentrl.algos.losses.agg_loss`.
    """
    log_ratio = logp - ref_logp
    if mask is not None:
        log_ratio = torch.where(mask.bool(), log_ratio, torch.zeros_like(log_ratio))
    if clamp is not None:
        log_ratio = log_ratio.clamp(-clamp, clamp)
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio * log_ratio
    if kind == "k3":
        return torch.exp(-log_ratio) - 1.0 + log_ratio
    raise ValueError(f"kl kind must be one of {KL_KINDS}, got {kind!r}")
