"""Reward shaping and sample filters around the estimators (DAPO, SUPO, SimpleTIR).

Pure tensor functions; they return rewards to add or boolean keep-masks for the trainer to apply.
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentrl.algos._ops import group_index, group_moments


def overlong_penalty(length: Tensor, *, max_len: int = 20480, cache_len: int = 4096) -> Tensor:
    """DAPO soft overlong punishment, added to the outcome reward.

    ``0`` if ``|y| <= max_len - cache_len``; ``(max_len - cache_len - |y|) / cache_len`` in the soft
    band (from 0 down to -1); ``-1`` beyond ``max_len``.

    Args:
        length: ``[N]`` generated length per rollout.

    Returns:
        ``[N]`` penalty in ``[-1, 0]``.
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    soft_start = max_len - cache_len
    length = length.to(torch.get_default_dtype())
    band = (soft_start - length) / cache_len
    penalty = torch.where(length <= soft_start, torch.zeros_like(length), band)
    return torch.where(length > max_len, torch.full_like(length, -1.0), penalty)


def dynamic_sampling_keep(outcome: Tensor, group_id: Tensor) -> Tensor:
    """DAPO dynamic sampling: keep groups whose outcomes are not all equal (0 < #correct < G).

    A group whose rollouts all score the same has zero GRPO advantage everywhere and only dilutes
    the batch.

    Args:
        outcome: ``[N]``. group_id: ``[N]``.

    Returns:
        ``[N]`` bool, True for rollouts of informative groups.
    """
    inverse, n_groups = group_index(group_id)
    _, var, _ = group_moments(outcome.to(torch.float64), inverse, n_groups, unbiased=False)
    return (var > 0)[inverse]


def rollout_row_mask(keep: Tensor, row_rollout: Tensor, loss_mask: Tensor) -> Tensor:
    """Drop the rows of rollouts with ``keep == False`` from the loss mask.

    Used for SUPO's overlong masking (``keep = finished``), DAPO's overlong filtering and
    SimpleTIR's void-turn filter (``keep = ~has_void_turn``): those rollouts then contribute exactly
    zero to every loss term, KL and entropy included.

    Args:
        keep: ``[R]`` bool per rollout. row_rollout: ``[B]`` rollout of each row. loss_mask: ``[B, L]``.

    Returns:
        ``[B, L]`` bool mask.
    """
    return loss_mask.bool() & keep.bool()[row_rollout][:, None]
