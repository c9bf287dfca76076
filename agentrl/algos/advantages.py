"""Advantage estimators: pure functions of tensors (see ``/work/shared/ALGORITHMS.md``).

Shapes: ``N`` rows (= rollouts unless said otherwise), ``R`` rollouts, ``M`` training rows of
folded/summarised rollouts, ``K`` turns per row, ``L`` tokens per row. Estimators are targets: call
them on detached tensors (the uniform entry points in :mod:`agentrl.algos.spec` run under
``torch.no_grad``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentrl.algos._ops import (
    check_turn_ids,
    group_index,
    group_moments,
    masked_discounted_returns,
    pack,
    pack_slots,
    reverse_discounted_cumsum,
    turn_reduce,
    unpack,
)


def _scale(dev: Tensor, std: Tensor, eps: float) -> Tensor:
    """``dev / (std + eps)``, and exactly 0 where the group has no spread (also when eps = 0)."""
    return torch.where(std > 0, dev / (std + eps), torch.zeros_like(dev))


def grpo(
    outcome: Tensor, group_id: Tensor, *, std_normalize: bool = True, eps: float = 1e-6, unbiased: bool = True
) -> Tensor:
    """Group-relative advantage ``(R_i - mean_g R) / (std_g R + eps)``; Dr. GRPO drops the std.

    A group of one gets advantage 0 (it has no peer to compare with; verl instead passes the raw
    reward through with mean 0, std 1).

    Args:
        outcome: ``[N]`` outcome reward per rollout.
        group_id: ``[N]`` prompt-group id.
        std_normalize: divide by the group std (GRPO) or not (Dr. GRPO).
        eps: added to the std.
        unbiased: sample std (``torch.std``, verl's choice) or population std (IGPO's z-score).

    Returns:
        ``[N]`` advantages.
    """
    inverse, n_groups = group_index(group_id)
    mean, var, _ = group_moments(outcome, inverse, n_groups, unbiased=unbiased)
    adv = outcome - mean[inverse]  # [N]
    if std_normalize:
        adv = _scale(adv, var.sqrt()[inverse], eps)
    return adv


def tree_grpo(
    outcome: Tensor,
    group_id: Tensor,
    task_group: Tensor,
    *,
    intra: float = 1.0,
    inter: float = 1.0,
    std_normalize: bool = True,
    eps: float = 1e-6,
    unbiased: bool = True,
) -> Tensor:
    """Tree-GRPO (arXiv 2509.21240): ``A = intra * A_intra + inter * A_inter`` per rollout (leaf).

    ``A_intra`` is the group-relative advantage within a tree (``group_id``: a root and its
    branches), ``A_inter`` the same over every leaf of every tree of the task (``task_group``); the
    paper adds the two (``intra = inter = 1``). ``inter=0`` is intra-tree GRPO alone (= ``grpo``
    over trees), ``intra=0`` inter-tree alone (= ``grpo`` over tasks). A tree (or task) of one leaf
    contributes 0 (as :func:`grpo`).

    Args:
        outcome: ``[R]`` outcome reward per rollout. group_id: ``[R]`` tree. task_group: ``[R]``
            task (every tree of the same prompt shares it).
        intra, inter: weights of the two terms.
        std_normalize, eps, unbiased: as :func:`grpo`, for both terms.

    Returns:
        ``[R]`` advantages.
    """
    options = {"std_normalize": std_normalize, "eps": eps, "unbiased": unbiased}
    adv = torch.zeros_like(outcome, dtype=torch.float32 if not outcome.is_floating_point() else outcome.dtype)
    if intra:
        adv = adv + intra * grpo(outcome, group_id, **options)
    if inter:
        adv = adv + inter * grpo(outcome, task_group, **options)
    return adv


def gae(
    rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float = 1.0, lam: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over generated tokens, skipping masked (observation) ones.

    Masked positions are not time steps: they cost no discount and their value is never
    bootstrapped from. A reward placed on a masked position (IGPO puts turn rewards on the last
    observation token) is credited to the last generated token before it; rewards before the first
    generated token are dropped. The value after a row's last generated token is 0.

    Args:
        rewards: ``[B, L]`` per-token rewards.
        values: ``[B, L]`` critic values ``V(s_t)``.
        mask: ``[B, L]`` 1 on generated tokens.
        gamma: discount, in ``[0, 1]``.
        lam: GAE lambda, in ``[0, 1]``.

    Returns:
        ``(advantages [B, L], returns [B, L])``, both 0 on masked positions; ``returns = adv + V``.
    """
    m = mask.bool()
    seen = m.long().cumsum(dim=1)  # [B, L] valid tokens so far
    slot = seen - 1
    credited = seen > 0  # rewards before the first generated token have nobody to credit
    packed_r = pack(rewards, credited, slot)  # [B, L] sum of rewards from each valid token to the next
    packed_v = pack(values, m, slot)  # [B, L] values packed left, 0 after the last valid token
    next_v = torch.nn.functional.pad(packed_v[:, 1:], (0, 1))  # [B, L]
    n_valid = seen[:, -1:] if seen.shape[1] else seen
    in_row = torch.arange(m.shape[1], device=m.device)[None, :] < n_valid  # [B, L]
    delta = torch.where(in_row, packed_r + gamma * next_v - packed_v, torch.zeros_like(packed_v))
    adv = unpack(reverse_discounted_cumsum(delta, gamma * lam), m, slot)  # [B, L]
    returns = torch.where(m, adv + values, torch.zeros_like(adv))
    return adv, returns


def info_gain(gt_logprob: Tensor, turn_mask: Tensor, *, kind: str = "log_prob_diff") -> Tensor:
    """IGPO's turn reward from the teacher-forced confidence in the gold answer.

    ``gt_logprob[:, 0]`` is the mean log-prob of the gold answer given the prompt alone and
    ``gt_logprob[:, k + 1]`` the one after turn ``k``. ``log_prob_diff`` (ICLR paper, released
    ``train.sh``): ``s[k+1] - s[k]``; ``prob_diff`` (v1 paper, code default): ``exp(s[k+1]) - exp(s[k])``.

    The column after a row's last turn is never needed (:func:`igpo` gives that turn the outcome),
    so it may hold anything, NaN included; values off ``turn_mask`` are 0.

    Args:
        gt_logprob: ``[N, K + 1]``.
        turn_mask: ``[N, K]`` bool, which turns exist.
        kind: ``"log_prob_diff"`` or ``"prob_diff"``.

    Returns:
        ``[N, K]`` IG reward per turn.
    """
    if kind == "log_prob_diff":
        conf = gt_logprob
    elif kind == "prob_diff":
        conf = gt_logprob.exp()
    else:
        raise ValueError(f"info_gain kind must be 'log_prob_diff' or 'prob_diff', got {kind!r}")
    if conf.shape[1] != turn_mask.shape[1] + 1:
        raise ValueError(f"gt_logprob needs K + 1 = {turn_mask.shape[1] + 1} columns, got {conf.shape[1]}")
    gain = conf[:, 1:] - conf[:, :-1]  # [N, K]
    return torch.where(turn_mask.bool(), gain, torch.zeros_like(gain))


def _igpo_zscore(
    x: Tensor, inverse: Tensor, n_groups: int, member: Tensor, eps: float, var_eps: float
) -> Tensor:
    """IGPO's z-score: population sigma = sqrt(var + var_eps), sigma = 1 for pools under 2."""
    mean, var, count = group_moments(x, inverse, n_groups, member, unbiased=False)
    sigma = torch.where(count < 2, torch.ones_like(var), (var + var_eps).sqrt())
    z = (x - mean[inverse]) / (sigma[inverse] + eps)
    return torch.where(member, z, torch.zeros_like(z))


def igpo(
    outcome: Tensor,
    info_gain: Tensor,
    turn_mask: Tensor,
    group_id: Tensor,
    *,
    gamma: float = 1.0,
    pool: str = "separate",
    eps: float = 1e-6,
    var_eps: float = 1e-8,
) -> Tensor:
    """IGPO turn advantages: z-scored IG rewards on turns ``1..T-1``, outcome on turn ``T``, reward-to-go.

    Pools (per prompt group): ``separate`` (paper, ``train.sh``) z-scores all IG rewards of all
    turns of all rollouts together and the outcomes separately; ``joint`` (code default) z-scores
    IG rewards and outcomes as one pool; ``none`` keeps raw rewards (tests, ablations). Then
    ``A[i, k] = sum_{m >= k} gamma^(m-k) * r[i, m]`` over the row's valid turns.

    Args:
        outcome: ``[N]`` outcome reward (F1, or the format penalty).
        info_gain: ``[N, K]`` IG reward per turn (from :func:`info_gain`); the last valid turn's
            entry is ignored (may be NaN).
        turn_mask: ``[N, K]`` bool, which turns exist (invalid turns are skipped, not discounted).
        group_id: ``[N]`` prompt-group id.
        gamma: turn discount.
        pool: ``"separate"``, ``"joint"`` or ``"none"``.
        eps: added to sigma.
        var_eps: added to the variance inside the sqrt (IGPO code uses 1e-8).

    Returns:
        ``[N, K]`` advantage per turn, 0 on invalid turns.
    """
    tm = turn_mask.bool()
    n_turns = tm.long().sum(dim=1, keepdim=True)  # [N, 1]
    rank = tm.long().cumsum(dim=1) - 1  # [N, K]
    is_last = tm & (rank == n_turns - 1)
    is_ig = tm & ~is_last
    zeros = torch.zeros_like(info_gain)
    outcome_k = outcome[:, None].expand_as(info_gain)  # [N, K]
    inverse, n_groups = group_index(group_id)
    if pool == "none":
        rewards = torch.where(is_ig, info_gain, torch.where(is_last, outcome_k, zeros))
    elif pool == "separate":
        inv_k = inverse[:, None].expand_as(tm).reshape(-1)  # [N*K]
        z_ig = _igpo_zscore(info_gain.reshape(-1), inv_k, n_groups, is_ig.reshape(-1), eps, var_eps)
        all_rows = torch.ones_like(outcome, dtype=torch.bool)
        z_out = _igpo_zscore(outcome, inverse, n_groups, all_rows, eps, var_eps)  # [N]
        rewards = torch.where(is_last, z_out[:, None].expand_as(info_gain), z_ig.reshape(tm.shape))
    elif pool == "joint":
        inv_k = inverse[:, None].expand_as(tm).reshape(-1)
        raw = torch.where(is_last, outcome_k, info_gain).reshape(-1)
        rewards = _igpo_zscore(raw, inv_k, n_groups, tm.reshape(-1), eps, var_eps).reshape(tm.shape)
    else:
        raise ValueError(f"igpo pool must be 'separate', 'joint' or 'none', got {pool!r}")
    return masked_discounted_returns(rewards, tm, gamma)


def turn_mean(
    x: Tensor, turn_id: Tensor, mask: Tensor, num_turns: int | None = None
) -> tuple[Tensor, Tensor]:
    """Mean of a token quantity over each turn (e.g. EMPG's step entropy from token entropies).

    Args:
        x: ``[B, L]`` token values.
        turn_id: ``[B, L]`` turn index (-1 off turns).
        mask: ``[B, L]`` tokens that count (generated tokens).
        num_turns: K (default ``max(turn_id) + 1``).

    Returns:
        ``(mean [B, K], turn_mask [B, K])``; turns without counted tokens have mean 0, mask False.
    """
    valid = mask.bool() & (turn_id >= 0)
    k = check_turn_ids(turn_id, valid, num_turns)
    sums, counts = turn_reduce(x, turn_id, valid, k)
    return sums / counts.clamp_min(1), counts > 0


def empg_scale(
    step_entropy: Tensor, turn_mask: Tensor, *, k: float = 1.0, eps: float = 1e-8
) -> tuple[Tensor, Tensor]:
    """EMPG's self-calibrated scaling ``g(H)`` and the min-max normalised entropy ``Ht``.

    ``Ht = (H - min H) / (max H - min H + eps)`` over the batch's valid steps and
    ``g = exp(-k Ht) / mean(exp(-k Ht))`` (mean 1 over valid steps); both 0 off ``turn_mask``.

    Args:
        step_entropy: ``[N, K]``. turn_mask: ``[N, K]`` bool (at least one True). k, eps: as :func:`empg`.

    Returns:
        ``(g [N, K], h_norm [N, K])``.
    """
    tm = turn_mask.bool()
    zeros = torch.zeros_like(step_entropy)
    big = torch.finfo(step_entropy.dtype).max
    h_min = torch.where(tm, step_entropy, torch.full_like(step_entropy, big)).min()
    h_max = torch.where(tm, step_entropy, torch.full_like(step_entropy, -big)).max()
    h_norm = torch.where(tm, (step_entropy - h_min) / (h_max - h_min + eps), zeros)  # [N, K] in [0, 1]
    scale = torch.where(tm, torch.exp(-k * h_norm), zeros)
    return scale / (scale.sum() / tm.sum()), h_norm


def empg(
    base: Tensor,
    step_entropy: Tensor,
    turn_mask: Tensor,
    *,
    k: float = 1.0,
    k_future: float = 1.0,
    zeta: float = 0.1,
    center: bool = True,
    eps: float = 1e-8,
) -> Tensor:
    """EMPG: entropy-modulated step advantage ``g(H_t) * A + zeta * f(H_{t+1})``, then batch centring.

    ``Ht = (H - min H) / (max H - min H + eps)`` over all valid steps of the batch;
    ``g = exp(-k Ht) / mean(exp(-k Ht))`` (mean 1 over steps); ``f = exp(-k_future Ht)`` of the
    row's next valid step (0 on its last step). ``center`` subtracts the mean over steps without
    dividing by the std: the project-page pseudocode only says "e.g. zero-mean"; the no-std choice
    follows a third-party copy [S], so it is a parameter.

    Args:
        base: ``[N]`` trajectory advantage (e.g. :func:`grpo`).
        step_entropy: ``[N, K]`` mean rollout-policy token entropy per step (:func:`turn_mean`).
        turn_mask: ``[N, K]`` bool, which steps exist.
        k: scaling sharpness. k_future: bonus sharpness. zeta: bonus weight.
        center: subtract the batch mean over steps.
        eps: in the min-max normalisation.

    Returns:
        ``[N, K]`` modulated advantage, 0 on invalid steps.
    """
    tm = turn_mask.bool()
    zeros = torch.zeros_like(step_entropy)
    if not bool(tm.any()):
        return zeros
    g, h_norm = empg_scale(step_entropy, tm, k=k, eps=eps)  # [N, K] each
    n_steps = tm.sum()
    f = torch.where(tm, torch.exp(-k_future * h_norm), zeros)
    # f of the next valid step in the same row: pack valid steps left, shift by one, unpack.
    slot = pack_slots(tm)
    f_packed = pack(f, tm, slot)
    f_next = unpack(torch.nn.functional.pad(f_packed[:, 1:], (0, 1)), tm, slot)  # 0 after the last step
    adv = torch.where(tm, g * base[:, None] + zeta * f_next, zeros)
    if center:
        adv = torch.where(tm, adv - adv.sum() / n_steps, zeros)
    return adv


def empg_grpo(
    outcome: Tensor,
    group_id: Tensor,
    entropy: Tensor,
    turn_id: Tensor,
    loss_mask: Tensor,
    *,
    std_normalize: bool = True,
    **empg_options: float | bool,
) -> Tensor:
    """EMPG on a GRPO base, straight from token entropies: the trainer's one-call form.

    Args:
        outcome: ``[N]``. group_id: ``[N]``.
        entropy: ``[N, L]`` rollout-policy token entropy. turn_id: ``[N, L]``. loss_mask: ``[N, L]``.
        std_normalize: for the GRPO base. empg_options: passed to :func:`empg`.

    Returns:
        ``[N, K]`` turn advantages.
    """
    base = grpo(outcome, group_id, std_normalize=std_normalize)
    step_entropy, turn_mask = turn_mean(entropy, turn_id, loss_mask)
    return empg(base, step_entropy, turn_mask, **empg_options)


def gigpo(
    outcome: Tensor,
    group_id: Tensor,
    step_reward: Tensor,
    anchor_id: Tensor,
    turn_mask: Tensor,
    *,
    gamma: float = 0.95,
    omega: float = 1.0,
    std_normalize: bool = True,
    eps: float = 1e-6,
    singleton: str = "zero",
) -> Tensor:
    """GiGPO (verl-agent): episode advantage plus anchor-state step advantage, per step.

    ``A^E = grpo(outcome)`` (``std_normalize=False`` is verl-agent's ``mean_norm``); step return
    ``R_t = sum_{k >= t} gamma^(k-t) r_k`` over the row's valid steps; steps of the same prompt
    group with the same ``anchor_id`` (the caller hashes the observation) form a step group and
    ``A^S = (R_t - mean) / (std + eps)`` inside it; ``A = A^E + omega * A^S``.

    A step group of one: ``singleton="zero"`` (the default) gives ``A^S = 0``, which is what
    verl-agent does (a one-member step group gets step advantage 0); ``"raw"`` is an alternative
    that keeps the raw return, ``A^S = R_t`` (mean 0 / std 1 for a group of one).

    Args:
        outcome: ``[N]`` episode reward. group_id: ``[N]`` prompt group.
        step_reward: ``[N, K]`` environment reward per step. anchor_id: ``[N, K]`` int64 state id.
        turn_mask: ``[N, K]`` bool, which steps exist.

    Returns:
        ``[N, K]`` step advantages, 0 on invalid steps.
    """
    if singleton not in ("zero", "raw"):
        raise ValueError(f"gigpo singleton must be 'zero' or 'raw', got {singleton!r}")
    tm = turn_mask.bool()
    episode = grpo(outcome, group_id, std_normalize=std_normalize, eps=eps)  # [N]
    returns = masked_discounted_returns(step_reward, tm, gamma)  # [N, K]
    inverse, _ = group_index(group_id)
    keys = torch.stack([inverse[:, None].expand_as(anchor_id), anchor_id.long()], dim=-1)  # [N, K, 2]
    # Invalid steps share one key of their own so they never join a real step group.
    keys = torch.where(tm[..., None], keys, torch.full_like(keys, -1))
    _, step_group = torch.unique(keys.reshape(-1, 2), dim=0, return_inverse=True)
    n_step_groups = int(step_group.max()) + 1
    flat_member = tm.reshape(-1)
    mean, var, count = group_moments(
        returns.reshape(-1), step_group, n_step_groups, flat_member, unbiased=True
    )
    step_adv = returns.reshape(-1) - mean[step_group]
    if std_normalize:
        step_adv = _scale(step_adv, var.sqrt()[step_group], eps)
    if singleton == "raw":
        step_adv = torch.where(count[step_group] == 1, returns.reshape(-1), step_adv)
    step_adv = step_adv.reshape(tm.shape)
    adv = episode[:, None] + omega * step_adv
    return torch.where(tm, adv, torch.zeros_like(adv))


def foldgrpo(
    outcome: Tensor,
    row_rollout: Tensor,
    process_reward: Tensor,
    rollout_group: Tensor,
    *,
    eps: float = 1e-6,
    unbiased: bool = True,
    reward_min: float = 0.0,
    reward_max: float = 1.0,
) -> Tensor:
    """FoldGRPO token advantage ``(clip(R + Q, 0, 1) - mean R) / (std R + eps)``.

    Mean and std are over the group's *rollouts*, not over its rows (a rollout has a main row and
    one row per branch). Consequence: a failed rollout (R = 0) ignores any Q <= 0. A group whose
    outcomes are all equal gets 0 (the formula would otherwise divide a nonzero Q by eps).

    Args:
        outcome: ``[R]`` outcome per rollout (0/1 in the paper).
        row_rollout: ``[M]`` rollout index of each training row.
        process_reward: ``[M, L]`` per-token process reward Q (0, -0.2, -1 in the paper).
        rollout_group: ``[R]`` prompt-group id per rollout.
        eps: added to the std. unbiased: sample std (verl) or population std.
        reward_min, reward_max: the clip range of ``R + Q``.

    Returns:
        ``[M, L]`` advantages at every position (the loss mask selects the trained ones).
    """
    inverse, n_groups = group_index(rollout_group)
    mean, var, _ = group_moments(outcome, inverse, n_groups, unbiased=unbiased)
    row_group = inverse[row_rollout]  # [M]
    mu = mean[row_group][:, None]  # [M, 1]
    sd = var.sqrt()[row_group][:, None]
    shaped = (outcome[row_rollout][:, None] + process_reward).clamp(reward_min, reward_max)  # [M, L]
    return _scale(shaped - mu, sd.expand_as(shaped), eps)


def supo(
    outcome: Tensor,
    rollout_group: Tensor,
    finished: Tensor,
    *,
    std_normalize: bool = True,
    eps: float = 1e-6,
    mask_unfinished: bool = True,
    baseline_includes_unfinished: bool = True,
) -> Tensor:
    """SUPO: GRPO advantage of the whole rollout, broadcast to all of its summary segments.

    Overlong masking: a rollout that hit the summary, step or context limit without finishing
    (``finished == False``) gets advantage 0; to make its gradient exactly 0 when other terms
    (KL, entropy) are on, also drop its rows from the loss mask
    (:func:`agentrl.algos.shaping.rollout_row_mask`). Whether unfinished rollouts still count in
    the group baseline is not confirmed [U]: ``baseline_includes_unfinished``. The loss normaliser
    is also [U]: ``agg="token-mean"`` counts tokens over all segments; ``agg="seq-mean-token-mean"``
    with ``seq_id=row_rollout`` averages segments per rollout (see :func:`~agentrl.algos.losses.ppo_clip`).

    Args:
        outcome: ``[R]`` final outcome per rollout. rollout_group: ``[R]``. finished: ``[R]`` bool.

    Returns:
        ``[R]`` advantage per rollout; index with ``row_rollout`` for segment rows.
    """
    done = finished.bool()
    if baseline_includes_unfinished:
        adv = grpo(outcome, rollout_group, std_normalize=std_normalize, eps=eps)
    else:
        inverse, n_groups = group_index(rollout_group)
        mean, var, _ = group_moments(outcome, inverse, n_groups, done, unbiased=True)
        adv = outcome - mean[inverse]
        if std_normalize:
            adv = _scale(adv, var.sqrt()[inverse], eps)
    if mask_unfinished:
        adv = torch.where(done, adv, torch.zeros_like(adv))
    return adv


def to_tokens(turn_adv: Tensor, turn_id: Tensor) -> Tensor:
    """Broadcast per-turn values to tokens: ``out[b, t] = turn_adv[b, turn_id[b, t]]``, 0 where ``turn_id < 0``.

    Args:
        turn_adv: ``[N, K]``.
        turn_id: ``[N, L]`` long.

    Returns:
        ``[N, L]``.
    """
    on_turn = turn_id >= 0
    check_turn_ids(turn_id, on_turn, turn_adv.shape[1])
    out = turn_adv.gather(1, turn_id.clamp_min(0))  # [N, L]
    return torch.where(on_turn, out, torch.zeros_like(out))
