"""Policy and value losses: pure functions of tensors, each returning ``(loss, metrics)``.

Masking rule for every function here: positions with ``mask == 0`` are replaced by constants
*before* any nonlinearity, so garbage there (NaN, -inf log-probs of padding) never reaches the
loss or the gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentrl.algos._ops import check_turn_ids, group_index, turn_ids_from_mask, turn_reduce
from agentrl.trajectory import Source

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "constant")
RATIO_MODES = ("token", "turn", "sequence")
# Bound on log-ratios before exp (as verl does): keeps exp finite so a zero upstream gradient
# never meets an infinite local derivative (0 * inf = NaN).
MAX_LOG_RATIO = 20.0


def agg_loss(
    values: Tensor,
    mask: Tensor,
    agg: str = "token-mean",
    *,
    seq_id: Tensor | None = None,
    norm_constant: float | None = None,
) -> Tensor:
    """Reduce a per-token loss ``[B, L]`` to a scalar.

    - ``token-mean``: ``sum(mask * v) / sum(mask)`` (DAPO, FoldGRPO).
    - ``seq-mean-token-mean``: mean over sequences of each sequence's token mean (GRPO paper).
    - ``seq-mean-token-sum``: mean over sequences of each sequence's token sum.
    - ``constant``: ``sum(mask * v) / (n_seq * norm_constant)`` (Dr. GRPO; ``norm_constant``
      defaults to ``L``, the padded length, which should be the max generation length).

    A "sequence" is a row, or the rows sharing a ``seq_id`` (e.g. the segments of a SUPO rollout,
    or the main and branch rows of a folded one). Sequences with no masked-in token are left out
    of the seq-means; ``constant`` counts every sequence.

    Args:
        values: ``[B, L]``. mask: ``[B, L]``. seq_id: ``[B]`` optional.

    Returns:
        Scalar tensor.
    """
    m = mask.bool()
    v = torch.where(m, values, torch.zeros_like(values))
    if agg == "token-mean":
        return v.sum() / m.sum().clamp_min(1)
    row_sum = v.sum(dim=1)  # [B]
    row_count = m.sum(dim=1).to(v.dtype)  # [B]
    if seq_id is None:
        seq_sum, seq_count, n_seq = row_sum, row_count, v.shape[0]
    else:
        inverse, n_seq = group_index(seq_id)
        seq_sum = torch.zeros(n_seq, dtype=v.dtype, device=v.device).index_add(0, inverse, row_sum)
        seq_count = torch.zeros(n_seq, dtype=v.dtype, device=v.device).index_add_(0, inverse, row_count)
    if agg == "constant":
        constant = float(v.shape[1] if norm_constant is None else norm_constant)
        return v.sum() / (max(n_seq, 1) * constant)
    if agg == "seq-mean-token-mean":
        per_seq = seq_sum / seq_count.clamp_min(1)
    elif agg == "seq-mean-token-sum":
        per_seq = seq_sum
    else:
        raise ValueError(f"agg must be one of {AGG_MODES}, got {agg!r}")
    present = seq_count > 0
    return torch.where(present, per_seq, torch.zeros_like(per_seq)).sum() / present.sum().clamp_min(1)


def _masked_stats(x: Tensor, m: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Masked mean, min and max of ``x`` (0, 0, 0 when nothing is masked in)."""
    count = m.sum()
    mean = torch.where(m, x, torch.zeros_like(x)).sum() / count.clamp_min(1)
    lo = torch.where(m, x, torch.full_like(x, float("inf"))).min() if x.numel() else mean
    hi = torch.where(m, x, torch.full_like(x, float("-inf"))).max() if x.numel() else mean
    empty = count == 0
    return mean, torch.where(empty, torch.zeros_like(lo), lo), torch.where(empty, torch.zeros_like(hi), hi)


def turn_log_ratio(log_ratio: Tensor, mask: Tensor, turn_id: Tensor | None) -> Tensor:
    """ST-PPO's per-turn mean log-ratio broadcast to the turn's tokens (0 off the mask).

    Args:
        log_ratio: ``[B, L]`` token log-ratios, already 0 off the mask.
        mask: ``[B, L]`` bool.
        turn_id: ``[B, L]`` turn of each token, or None to use the maximal runs of ``mask``.
    """
    tid = turn_ids_from_mask(mask) if turn_id is None else turn_id.long()
    n_turns = check_turn_ids(tid, mask)
    sums, counts = turn_reduce(log_ratio, tid, mask, n_turns)  # [B, K]
    means = sums / counts.clamp_min(1)
    out = means.gather(1, torch.where(mask, tid, torch.zeros_like(tid)))  # [B, L]
    return torch.where(mask, out, torch.zeros_like(out))


def turn_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, turn_id: Tensor | None) -> Tensor:
    """Turn-level importance ratio ``w_k = exp(mean_{t in k}(logp - old_logp))`` on each token.

    The geometric mean of the token ratios inside the turn (GSPO's length normalisation at turn
    granularity), so it does not change with turn length under constant per-token drift.

    Args:
        logp, old_logp: ``[B, L]``. mask: ``[B, L]``. turn_id: ``[B, L]`` or None (runs of mask).

    Returns:
        ``[B, L]`` ratio, 1 off the mask; differentiable in ``logp`` (every token of the turn).
    """
    m = mask.bool()
    log_ratio = torch.where(m, logp - old_logp, torch.zeros_like(logp))
    return turn_log_ratio(log_ratio, m, turn_id).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()


def policy_log_ratio(
    logp: Tensor, old_logp: Tensor, m: Tensor, ratio: str, turn_id: Tensor | None
) -> tuple[Tensor, Tensor]:
    """``(log of the ratio the loss uses, token log-ratio)``, both ``[B, L]`` and 0 off the mask."""
    token = torch.where(m, logp - old_logp, torch.zeros_like(logp))
    if ratio == "token":
        used = token
    elif ratio == "turn":
        used = turn_log_ratio(token, m, turn_id)
    elif ratio == "sequence":
        per_row = token.sum(dim=1, keepdim=True) / m.sum(dim=1, keepdim=True).clamp_min(1)  # [B, 1]
        used = torch.where(m, per_row.expand_as(token), torch.zeros_like(token))
    else:
        raise ValueError(f"ratio must be one of {RATIO_MODES}, got {ratio!r}")
    return used.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO), token


def ppo_clip(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    ratio: str = "token",
    turn_id: Tensor | None = None,
    agg: str = "token-mean",
    seq_id: Tensor | None = None,
    norm_constant: float | None = None,
    ratio_max: float | None = None,
    is_weight: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate ``-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)``, aggregated.

    ``ratio``: ``token`` (PPO/GRPO/DAPO), ``turn`` (ST-PPO's Turn-PPO: the turn's geometric-mean
    ratio on every token of the turn; ``turn_id=None`` takes turns as the runs of ``mask``) or
    ``sequence`` (GSPO: the row's geometric-mean ratio). DAPO's clip-higher is ``clip_high=0.28``.
    ``dual_clip=c`` caps the loss of ``A < 0`` tokens at ``-c A`` (verl; c > 1). ``ratio_max``
    clamps the ratio before the clip (FoldAct clamps to [0, 10]).

    Args:
        logp: ``[B, L]`` log-prob of the sampled tokens under the current policy (with grad).
        old_logp: ``[B, L]`` under the behaviour policy. adv: ``[B, L]``. mask: ``[B, L]``.
        turn_id: ``[B, L]`` for ``ratio="turn"``. agg, seq_id, norm_constant: see :func:`agg_loss`.
        is_weight: ``[B, L]`` per-token weight of the clipped term, no gradient (truncated
            importance sampling toward the sampler: :func:`agentrl.algos.mismatch.tis_weight`).

    Returns:
        ``(loss, metrics)``; metrics: ``pg_loss``, ``clipfrac`` (tokens where the clipped branch is
        active), ``clipfrac_dual``, ``approx_kl`` (mean of ``r - 1 - log r`` over token ratios),
        ``ratio_mean/min/max`` (of the ratio the loss used); with ``is_weight`` also
        ``is_weight_mean`` and ``is_weight_min``.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (verl uses 3), got {dual_clip}")
    m = mask.bool()
    log_r, token_log_r = policy_log_ratio(logp, old_logp, m, ratio, turn_id)
    r = log_r.exp()  # [B, L], 1 off the mask
    if ratio_max is not None:
        r = r.clamp(max=ratio_max)
    a = torch.where(m, adv, torch.zeros_like(adv))
    pg_unclipped = -a * r
    pg_clipped = -a * r.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg_max = torch.maximum(pg_unclipped, pg_clipped)  # [B, L]
    pg = pg_max
    if dual_clip is not None:
        cap = -a * dual_clip
        pg = torch.where(a < 0, torch.minimum(pg_max, cap), pg_max)
    if is_weight is not None:
        pg = pg * torch.where(m, is_weight.detach(), torch.ones_like(pg))
    loss = agg_loss(pg, m, agg, seq_id=seq_id, norm_constant=norm_constant)

    with torch.no_grad():
        n = m.sum().clamp_min(1)
        clipped = m & (pg_clipped > pg_unclipped)
        dual = m & (a < 0) & (pg_max > -a * dual_clip) if dual_clip is not None else torch.zeros_like(m)
        approx_kl = torch.where(m, token_log_r.exp() - 1 - token_log_r, torch.zeros_like(r)).sum() / n
        r_mean, r_min, r_max = _masked_stats(r, m)
        stats = torch.stack(
            [loss.detach(), clipped.sum() / n, dual.sum() / n, approx_kl, r_mean, r_min, r_max]
        ).tolist()
    names = ("pg_loss", "clipfrac", "clipfrac_dual", "approx_kl", "ratio_mean", "ratio_min", "ratio_max")
    metrics = dict(zip(names, stats, strict=True))
    if is_weight is not None:
        w_mean, w_min, _ = _masked_stats(is_weight.detach(), m)
        metrics |= {"is_weight_mean": float(w_mean), "is_weight_min": float(w_min)}
    return loss, metrics


def clip_bias_norm(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    ratio: str = "token",
    turn_id: Tensor | None = None,
    agg: str = "token-mean",
    seq_id: Tensor | None = None,
    norm_constant: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """S-PPO/ST-PPO clipping-bias surrogate: its gradient is the clipping-bias term C. [U]

    Reconstruction (ALGORITHMS.md 3.2, unconfirmed): the clipped set is
    ``((A > 0) & (w > 1 + clip_high)) | ((A < 0) & (w < 1 - clip_low))`` (plus, with
    ``dual_clip=c``, ``(A < 0) & (w > c)``), ``w`` the ratio the loss uses, and

        ``S_c = agg(clipped * sg(w * A) * logp)``,  so ``grad S_c = C``

    with the same aggregation as the PPO loss. For token ratios ``grad S_c`` is exactly
    ``grad L_clip - grad L_unclipped``: the part of the importance-weighted gradient the clip
    discarded. What the trainer does with it (the [U] choice of norm and floor are parameters of
    :func:`clip_bias_scale`): ``scale = clip_bias_scale(S_c, params)`` before ``loss.backward()``,
    then ``scale_grads_(params, scale)``: the update is ``grad L_PPO / max(1, ||C||_2)``. When no
    token is clipped, C = 0 and the scale is 1 ("clipping-triggered").

    Args: as :func:`ppo_clip`.

    Returns:
        ``(S_c scalar with graph through logp, metrics)``; metrics: ``clip_bias_frac`` (fraction
        of masked-in tokens in the clipped set).
    """
    m = mask.bool()
    with torch.no_grad():
        log_r, _ = policy_log_ratio(logp.detach(), old_logp, m, ratio, turn_id)
        w = log_r.exp()
        a = torch.where(m, adv, torch.zeros_like(adv))
        in_set = ((a > 0) & (w > 1.0 + clip_high)) | ((a < 0) & (w < 1.0 - clip_low))
        if dual_clip is not None:
            in_set = in_set | ((a < 0) & (w > dual_clip))
        in_set = in_set & m
        weight = torch.where(in_set, w * a, torch.zeros_like(w))
    safe_logp = torch.where(in_set, logp, torch.zeros_like(logp))
    surrogate = agg_loss(weight * safe_logp, m, agg, seq_id=seq_id, norm_constant=norm_constant)
    frac = float(in_set.sum()) / max(int(m.sum()), 1)
    return surrogate, {"clip_bias_frac": frac}


def clip_bias_scale(
    surrogate: Tensor, params: list[Tensor], *, floor: float = 1.0, norm_type: float = 2.0
) -> tuple[float, float]:
    """``(1 / max(floor, ||grad surrogate||), ||grad surrogate||)`` over ``params``. [U]

    Call before ``loss.backward()`` (the graph is retained). The scale is <= 1 whenever
    ``floor >= 1``, so the corrected update is never larger than the PPO one.
    """
    params = [p for p in params if p.requires_grad]
    grads = torch.autograd.grad(surrogate, params, retain_graph=True, allow_unused=True)
    norms = [g.detach().norm(norm_type) for g in grads if g is not None]
    total = float(torch.stack(norms).norm(norm_type)) if norms else 0.0
    return clip_bias_scale_from_norm(total, floor=floor)


def clip_bias_scale_from_norm(norm: float, *, floor: float = 1.0) -> tuple[float, float]:
    """``(1 / max(floor, norm), norm)``: the S-PPO scale once ``||C||`` is known (e.g. summed over a
    whole minibatch of micro-batches). [U]"""
    return 1.0 / max(floor, norm), norm


@torch.no_grad()
def scale_grads_(params: list[Tensor], scale: float) -> None:
    """Multiply every ``p.grad`` by ``scale`` in place."""
    for p in params:
        if p.grad is not None:
            p.grad.mul_(scale)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None = 0.5,
    agg: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    """Clipped value loss ``0.5 * max((V - G)^2, (V_old + clip(V - V_old, -c, c) - G)^2)``.

    ``clip=None`` gives the plain squared error. Values: ``[B, L]`` each; returns a scalar and
    ``vf_loss``, ``vf_clipfrac``, ``value_mean``, ``return_mean``.
    """
    m = mask.bool()
    zeros = torch.zeros_like(values)
    v = torch.where(m, values, zeros)
    target = torch.where(m, returns, zeros)
    err = (v - target) ** 2
    if clip is None:
        per_token = err
        clipped_err = err
    else:
        v_old = torch.where(m, old_values, zeros)
        v_clipped = v_old + (v - v_old).clamp(-clip, clip)
        clipped_err = (v_clipped - target) ** 2
        per_token = torch.maximum(err, clipped_err)
    loss = 0.5 * agg_loss(per_token, m, agg)
    with torch.no_grad():
        n = m.sum().clamp_min(1)
        stats = torch.stack(
            [loss.detach(), (m & (clipped_err > err)).sum() / n, v.sum() / n, target.sum() / n]
        ).tolist()
    return loss, dict(zip(("vf_loss", "vf_clipfrac", "value_mean", "return_mean"), stats, strict=True))


# Token kinds are agentrl.trajectory.Source codes everywhere (the one place they are defined).
# FoldAct's own code numbers think 0, search 1, answer 2, observation 3, info-summary 4,
# think-summary 5; its summaries are Source.SUMMARY here and its actions Source.MODEL.
FOLDACT_SUMMARY_KINDS = (int(Source.SUMMARY),)
FOLDACT_ACTION_KINDS = (int(Source.MODEL),)


def foldact(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    token_kind: Tensor,
    full_ctx_logp: Tensor,
    *,
    w_summary: float = 0.3,
    w_action: float = 0.7,
    w_consistency: float = 0.1,
    clip: float = 0.2,
    dual_clip: float | None = None,
    ratio_max: float = 10.0,
    summary_kinds: tuple[int, ...] = FOLDACT_SUMMARY_KINDS,
    action_kinds: tuple[int, ...] = FOLDACT_ACTION_KINDS,
    consistency_on: str = "all",
) -> tuple[Tensor, dict[str, float]]:
    """FoldAct: ``w_summary * L_sum + w_action * L_act + w_consistency * L_cons``.

    ``L_sum`` / ``L_act``: PPO clipped loss (ratio clamped to ``[0, ratio_max]`` first), each a
    token mean over its own token set, so summary tokens are not diluted by action tokens; an
    empty set contributes 0. ``L_cons = masked_mean(logp - sg(full_ctx_logp))``, a sampled-token
    estimate of KL(folded || full context); gradient flows only through ``logp``. Defaults
    0.3 / 0.7 / 0.1 are the code's (README: 1 / 1 / 1). Which tokens ``L_cons`` averages over is
    not confirmed [U]: ``consistency_on="all"`` (every masked-in token) or ``"summary"``.
    Positions where ``full_ctx_logp`` is NaN were not scored under the full context (turns left
    out by selective segment training) and are left out of ``L_cons``.
    Kinds are :class:`agentrl.trajectory.Source` codes (summary ``SUMMARY``, action ``MODEL``).

    Args:
        logp, old_logp, adv, mask: ``[B, L]`` as :func:`ppo_clip` (``old_logp`` recomputed per
            turn under that turn's folded context).
        token_kind: ``[B, L]`` int kind per token (``Source`` codes).
        full_ctx_logp: ``[B, L]`` log-prob under the full unfolded context (no grad; NaN = not scored).

    Returns:
        ``(loss, metrics)`` with ``loss_summary``, ``loss_action``, ``loss_consistency``,
        ``summary_tokens``, ``action_tokens`` and the action loss's PPO metrics.
    """
    m = mask.bool()
    is_summary = m & torch.isin(token_kind, torch.tensor(summary_kinds, device=token_kind.device))
    is_action = m & torch.isin(token_kind, torch.tensor(action_kinds, device=token_kind.device))
    options = {"clip_low": clip, "clip_high": clip, "dual_clip": dual_clip, "ratio_max": ratio_max}
    loss_sum, _ = ppo_clip(logp, old_logp, adv, is_summary, **options)
    loss_act, act_metrics = ppo_clip(logp, old_logp, adv, is_action, **options)
    if consistency_on == "all":
        cons_mask = m
    elif consistency_on == "summary":
        cons_mask = is_summary
    else:
        raise ValueError(f"consistency_on must be 'all' or 'summary', got {consistency_on!r}")
    full = full_ctx_logp.detach()
    cons_mask = cons_mask & ~torch.isnan(full)
    gap = torch.where(cons_mask, logp - torch.nan_to_num(full), torch.zeros_like(logp))
    loss_cons = agg_loss(gap, cons_mask, "token-mean")
    loss = w_summary * loss_sum + w_action * loss_act + w_consistency * loss_cons
    metrics = {f"action_{k}": v for k, v in act_metrics.items()}
    parts = torch.stack(
        [loss_sum.detach(), loss_act.detach(), loss_cons.detach(), is_summary.sum(), is_action.sum()]
    ).tolist()
    parts.append(float(cons_mask.sum()))
    names = ("loss_summary", "loss_action", "loss_consistency", "summary_tokens", "action_tokens",
             "consistency_tokens")  # fmt: skip
    metrics.update(zip(names, parts, strict=True))
    return loss, metrics
