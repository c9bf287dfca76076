"""Small tensor helpers shared by the estimators and losses (group statistics, packing, scans).

Everything here is vectorised: no Python loop over rows or tokens, only over blocks of a scan.
"""

from __future__ import annotations

import torch
from torch import Tensor


def group_index(group_id: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary group ids to 0..G-1.

    Args:
        group_id: ``[N]`` integer ids (any values, any order).

    Returns:
        ``(inverse [N] long, G)`` with ``inverse[i]`` the dense index of ``group_id[i]``.
    """
    uniq, inverse = torch.unique(group_id, return_inverse=True)
    return inverse, int(uniq.numel())


def group_moments(
    x: Tensor, inverse: Tensor, n_groups: int, member: Tensor | None = None, *, unbiased: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-group mean, variance and member count of ``x`` (two-pass, so it stays accurate).

    Args:
        x: ``[M]`` values; entries with ``member == False`` are ignored (they may be NaN).
        inverse: ``[M]`` dense group index (from :func:`group_index`).
        n_groups: G.
        member: ``[M]`` bool, which entries belong to their group's pool (default: all).
        unbiased: divide the squared deviations by ``n - 1`` (``torch.std``) instead of ``n``.

    Returns:
        ``(mean [G], var [G], count [G])``. Groups with too few members get variance 0.
    """
    if member is None:
        member = torch.ones_like(x, dtype=torch.bool)
    xs = torch.where(member, x, torch.zeros_like(x))
    count = torch.zeros(n_groups, dtype=x.dtype, device=x.device).index_add_(0, inverse, member.to(x.dtype))
    total = torch.zeros(n_groups, dtype=x.dtype, device=x.device).index_add_(0, inverse, xs)
    mean = total / count.clamp_min(1)
    dev = torch.where(member, x - mean[inverse], torch.zeros_like(x))
    sq = torch.zeros(n_groups, dtype=x.dtype, device=x.device).index_add_(0, inverse, dev * dev)
    denom = count - 1 if unbiased else count
    var = torch.where(denom > 0, sq / denom.clamp_min(1), torch.zeros_like(sq))
    return mean, var, count


def reverse_discounted_cumsum(x: Tensor, discount: float, *, block: int = 128) -> Tensor:
    """``y[:, t] = x[:, t] + discount * y[:, t + 1]`` along the last dim.

    Blocked: inside a block the scan is one matmul with a ``[block, block]`` matrix of powers of
    ``discount`` (all <= 1, so nothing overflows), and a carry crosses blocks, so the Python loop
    runs ``L / block`` times instead of ``L``.

    Args:
        x: ``[B, L]``.
        discount: in ``[0, 1]``.

    Returns:
        ``[B, L]``, differentiable in ``x``.
    """
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must be in [0, 1], got {discount}")
    batch, length = x.shape
    if length == 0:
        return x.clone()
    block = min(block, length)
    n_blocks = -(-length // block)
    pad = n_blocks * block - length
    xp = torch.nn.functional.pad(x, (0, pad)) if pad else x
    xb = xp.reshape(batch, n_blocks, block)  # [B, nb, b]
    idx = torch.arange(block, device=x.device)
    gap = idx[None, :] - idx[:, None]  # [b, b]: gap[i, j] = j - i
    base = torch.tensor(discount, dtype=x.dtype, device=x.device)
    # pow(0, 0) = 1, so discount = 0 gives the identity; negative gaps are masked out.
    powers = torch.where(gap >= 0, base.pow(gap.clamp_min(0).to(x.dtype)), torch.zeros((), dtype=x.dtype))
    local = xb @ powers.T  # [B, nb, b]: local[..., i] = sum_{j >= i} d^(j-i) x[j]
    decay = base.pow((block - idx).to(x.dtype))  # [b]: discount to the next block's first token
    blocks: list[Tensor] = [None] * n_blocks  # type: ignore[list-item]
    carry = torch.zeros(batch, dtype=x.dtype, device=x.device)
    for k in range(n_blocks - 1, -1, -1):
        out = local[:, k, :] + decay[None, :] * carry[:, None]  # [B, b]
        blocks[k] = out
        carry = out[:, 0]
    return torch.cat(blocks, dim=1)[:, :length]


def pack_slots(mask: Tensor) -> Tensor:
    """Index of each position among its row's valid positions (``-1`` before the first one).

    ``slot[b, t] = (number of valid positions <= t) - 1``; on a valid position it is the column the
    value takes when the row's valid entries are packed to the left; on an invalid position it is
    the slot of the last valid position before it.
    """
    return mask.long().cumsum(dim=1) - 1  # [B, L]


def pack(x: Tensor, mask: Tensor, slot: Tensor) -> Tensor:
    """Pack the valid entries of each row to the left (zeros after them). ``[B, L] -> [B, L]``."""
    vals = torch.where(mask, x, torch.zeros_like(x))
    return torch.zeros_like(vals).scatter_add(1, slot.clamp_min(0), vals)


def unpack(packed: Tensor, mask: Tensor, slot: Tensor) -> Tensor:
    """Inverse of :func:`pack`: put packed values back at their positions, zero elsewhere."""
    out = packed.gather(1, slot.clamp_min(0))
    return torch.where(mask, out, torch.zeros_like(out))


def masked_discounted_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Discounted reward-to-go over the valid positions of each row, skipping invalid ones.

    Invalid positions hold no reward, cost no discount step and get 0.

    Args:
        rewards: ``[B, L]``.
        mask: ``[B, L]`` bool.
        gamma: discount per valid position, in ``[0, 1]``.

    Returns:
        ``[B, L]``.
    """
    slot = pack_slots(mask)
    packed = pack(rewards, mask, slot)  # [B, L]
    return unpack(reverse_discounted_cumsum(packed, gamma), mask, slot)


def turn_ids_from_mask(mask: Tensor) -> Tensor:
    """Turn index per token when turns are the maximal runs of ``mask == 1`` (-1 elsewhere).

    This is ST-PPO's definition of a turn: agent-generated blocks separated by tool output.
    """
    m = mask.bool()
    prev = torch.nn.functional.pad(m[:, :-1], (1, 0), value=False)
    starts = m & ~prev
    tid = starts.long().cumsum(dim=1) - 1
    return torch.where(m, tid, torch.full_like(tid, -1))


def turn_reduce(x: Tensor, turn_id: Tensor, valid: Tensor, num_turns: int) -> tuple[Tensor, Tensor]:
    """Per (row, turn) sums and counts of ``x`` over valid tokens.

    Args:
        x: ``[B, L]``.
        turn_id: ``[B, L]`` long, turn of each token (only read where ``valid``).
        valid: ``[B, L]`` bool.
        num_turns: K; every valid ``turn_id`` must be in ``[0, K)``.

    Returns:
        ``(sums [B, K], counts [B, K])``, differentiable in ``x``.
    """
    batch = x.shape[0]
    rows = torch.arange(batch, device=x.device)[:, None]
    dump = batch * num_turns  # one extra bucket collects invalid tokens
    key = torch.where(valid, rows * num_turns + turn_id, torch.full_like(turn_id, dump))
    vals = torch.where(valid, x, torch.zeros_like(x))
    sums = torch.zeros(dump + 1, dtype=x.dtype, device=x.device).index_add(
        0, key.reshape(-1), vals.reshape(-1)
    )
    counts = torch.zeros(dump + 1, dtype=x.dtype, device=x.device).index_add_(
        0, key.reshape(-1), valid.reshape(-1).to(x.dtype)
    )
    return sums[:dump].reshape(batch, num_turns), counts[:dump].reshape(batch, num_turns)


def check_turn_ids(turn_id: Tensor, valid: Tensor, num_turns: int | None = None) -> int:
    """Validate turn ids on valid tokens and return K (``num_turns`` or ``max + 1``)."""
    ids = torch.where(valid, turn_id, torch.zeros_like(turn_id))
    if bool((valid & (turn_id < 0)).any()):
        raise ValueError("turn_id is negative on a token inside the mask; every trainable token needs a turn")
    top = int(ids.max()) + 1 if ids.numel() else 0
    if num_turns is None:
        return max(top, 1)
    if top > num_turns:
        raise ValueError(f"turn_id reaches {top - 1} but only {num_turns} turns were given")
    return num_turns
