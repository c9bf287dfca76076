"""One policy update from a step's episodes: score, advantages, PPO epochs over minibatches.

Everything algorithm-specific is looked up by name (``agentrl.registry``) and every input an
objective reads comes from :mod:`agentrl.train.fields`; this module only moves tensors around.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch import Tensor

import agentrl.algos  # noqa: F401  (registers the objectives)
from agentrl.algos.losses import agg_loss, clip_bias_scale_from_norm
from agentrl.registry import KL_ESTIMATORS, LOSSES
from agentrl.train.fields import LazyBatch, StepData
from agentrl.train.plan import ObjectivePlan
from agentrl.trajectory import TokenBatch


def row_chunks(rows: Tensor, size: int, groups: Tensor | None = None) -> list[Tensor]:
    """Split a 1-D index tensor into consecutive pieces of at most ``size``.

    With ``groups`` (``[B]`` group of each row, rows of a group contiguous in ``rows``) a piece
    never splits a group: it closes before a group that would overflow it (a group larger than
    ``size`` is a piece of its own).
    """
    if groups is None:
        return [rows[i : i + size] for i in range(0, rows.numel(), size)]
    n = rows.numel()
    ids = groups[rows].tolist()
    ends = [i for i in range(1, n) if ids[i] != ids[i - 1]] + [n]  # exclusive end of each group
    pieces: list[Tensor] = []
    start = last = 0
    for end in ends:
        if end - start > size and last > start:  # this group would overflow: close before it
            pieces.append(rows[start:last])
            start = last
        last = end
    if start < n:
        pieces.append(rows[start:n])
    return pieces


def group_order(order: Tensor, groups: Tensor) -> Tensor:
    """``order`` with the rows of each group made contiguous (groups in order of first appearance)."""
    first: dict[int, int] = {}
    for pos, g in enumerate(groups[order].tolist()):
        first.setdefault(g, pos)
    rank = torch.tensor([first[g] for g in groups[order].tolist()], dtype=torch.long)
    return order[torch.sort(rank, stable=True).indices]


def _slice(tokens: TokenBatch, idx: Tensor) -> tuple[Tensor, Tensor, Tensor, int]:
    """Rows ``idx``, trimmed to their longest real length (saves compute on short rows)."""
    mask = tokens.attention_mask[idx]
    length = int(mask.sum(1).max()) if idx.numel() else 1
    return tokens.input_ids[idx, :length], mask[:, :length], tokens.loss_mask[idx, :length], length


@torch.no_grad()
def score_tokens(engine: Any, tokens: TokenBatch, micro_batch_size: int, *, reference: bool = False,
                 groups: Tensor | None = None) -> dict[str, Tensor | None]:  # fmt: skip
    """No-grad pass: ``logp``, ``entropy`` and ``values`` ``[B, L]`` (reference policy if asked).
    ``groups`` (``[B]``, e.g. :func:`tree_of_rows`): a group's rows share a micro-batch, as in the
    update, so a tree's shared prefix runs once here too."""
    batch, width = tokens.input_ids.shape
    out: dict[str, Tensor | None] = {"logp": torch.zeros(batch, width), "entropy": torch.zeros(batch, width)}
    out["values"] = (
        torch.zeros(batch, width) if engine.policy.value_head is not None and not reference else None
    )
    rows = torch.arange(batch) if groups is None else group_order(torch.arange(batch), groups)
    for idx in row_chunks(rows, micro_batch_size, groups):
        ids, mask, loss_mask, length = _slice(tokens, idx)
        device = engine.policy.lm.device
        ids, mask, loss_mask = ids.to(device), mask.to(device), loss_mask.to(device)
        result = engine.forward(ids, mask, loss_mask, reference=reference)
        out["logp"][idx, :length] = result.logp.float().cpu()
        out["entropy"][idx, :length] = result.entropy.float().cpu()
        if out["values"] is not None and result.values is not None:
            out["values"][idx, :length] = result.values.float().cpu()
    return out


def norm_units(agg: str, mask: Tensor, seq_id: Tensor | None = None) -> Tensor:
    """How much of an aggregation's normaliser ``mask`` holds: tokens, or sequences that count
    (rows, or distinct ``seq_id`` with ``agg_unit=rollout``)."""
    m = mask.bool()
    if agg == "token-mean":
        return m.sum().float()
    if agg == "constant":
        return torch.tensor(float(m.shape[0] if seq_id is None else seq_id.unique().numel()))
    if seq_id is None:
        return m.any(dim=1).sum().float()  # seq-mean-*: sequences with at least one token
    return torch.tensor(float(seq_id[m.any(dim=1)].unique().numel()))


def loss_options(plan: ObjectivePlan, width: int) -> dict[str, Any]:
    """The plan's resolved loss options; an unset Dr. GRPO ``norm_constant`` is the batch width."""
    options = dict(plan.loss_options)
    if "norm_constant" in options and options["norm_constant"] is None:
        options["norm_constant"] = float(width)  # micro-batches are trimmed; keep one constant
    return options


def compute_advantages(step: StepData) -> tuple[Tensor, Tensor | None, LazyBatch]:
    """Token advantages ``[B, L]`` (and GAE returns) from the registered estimator."""
    plan = step.plan
    batch = LazyBatch(step)
    adv, returns = plan.estimator.from_batch(batch, **plan.advantage_options)
    return adv, returns, batch


def _rows(value: Tensor, idx: Tensor, length: int) -> Tensor:
    """Rows ``idx`` of a per-row field (``[B]`` or ``[B, L]``, trimmed to ``length``)."""
    return value[idx, :length] if value.dim() == 2 else value[idx]


def sampler_rows(engine: Any, episodes: list[Any], tokens: TokenBatch) -> list[Any] | None:
    """Per row, the sampler's kept states it can start from (``train.reuse_sampler_hidden``;
    :mod:`agentrl.rollout.generators.hidden`), else None: its episode's last generate call covered
    the row's tokens up to its last trained one. None when the policy never starts from them."""
    if engine.policy.start_layer is None:
        return None
    rows: list[Any] = []
    for r, e in enumerate(tokens.row_episode.tolist()):
        kept = getattr(episodes[e], "sampler_hidden", None)
        if kept is not None:
            n = len(kept.ids)
            if not kept.covers(tokens.input_ids[r]) or bool(tokens.loss_mask[r, n + 1 :].any()):
                kept = None  # another segment of the episode, or a token trained past what was kept
        rows.append(kept)
    return rows


class _Micro:
    """One micro-batch: the forward pass and exactly the declared needs, sliced to its rows.
    ``kept`` (:func:`sampler_rows`): where every row has the sampler's states, the frozen blocks are
    not run."""

    def __init__(self, engine: Any, tokens: TokenBatch, fields: dict[str, Tensor], idx: Tensor,
                 adv: Tensor, *, module: bool = True, kept: list[Any] | None = None):  # fmt: skip
        device = engine.policy.lm.device
        mask = tokens.attention_mask[idx]
        self.length = length = int(mask.sum(1).max()) if idx.numel() else 1
        loss_mask = fields["loss_mask"][idx, :length].to(device)
        ids, attn = tokens.input_ids[idx, :length].to(device), mask[:, :length].to(device)
        forward = engine.forward if module else engine.policy
        rows = [kept[r] for r in idx.tolist()] if kept is not None else []
        self.from_sampler = bool(rows) and all(k is not None for k in rows)
        if self.from_sampler:
            start = torch.stack([k.rows(length) for k in rows]).to(device)  # [b, length, H]
            self.out = forward(ids, attn, loss_mask, start=start)
        else:
            self.out = forward(ids, attn, loss_mask)
        self.inputs = {k: _rows(v, idx, length).to(device) for k, v in fields.items()}
        self.inputs["logp"] = self.out.logp
        self.loss_mask = loss_mask
        self.adv = adv[idx, :length].to(device)


def ppo_update(engine: Any, step: StepData, batch: LazyBatch, adv: Tensor, returns: Tensor | None,
               ref_logp: Tensor | None, *, rng: torch.Generator) -> dict[str, float]:  # fmt: skip
    """``ppo_epochs`` passes over the step's rows in shuffled minibatches; returns mean metrics.

    Each micro-batch hands the loss exactly its declared needs. Rows with no trainable token left
    (SUPO's unfinished rollouts) are not forwarded: they add nothing to any term or denominator.
    With ``algo.clip_bias_correction`` the S-PPO scale ``1 / max(algo.clip_bias_floor, ||C||)`` is
    computed once per optimizer step over the whole minibatch (one extra forward per micro-batch, and
    a backward for the micro-batches with a token in the clipped set), with the loss's own ratio and
    clip options. With ``train.skip_zero_advantage`` rows whose advantage is 0 on every trained
    token are not forwarded (they still count in the denominators; see :func:`zero_advantage_rows`).
    """
    config = step.config
    algo, train = config.algo, config.train
    tokens = step.tokens
    width = tokens.input_ids.shape[1]
    plan = step.plan
    loss, options = plan.loss, loss_options(plan, width)
    agg = options.get("agg", "token-mean")
    value_loss = LOSSES.get("value") if engine.policy.value_head is not None else None
    clip_bias = LOSSES.get("clip_bias_norm") if algo.clip_bias_correction else None
    kl = KL_ESTIMATORS.get(algo.kl_kind, field="algo.kl_kind") if algo.kl_coef > 0 else None
    needs = set(plan.loss_needs) - {"logp"} | {"loss_mask"}
    if value_loss is not None:
        needs.add("old_values")
    if options.get("agg_unit") == "rollout":
        needs.add("seq_id")  # KL and entropy aggregate like the policy loss
    fields = {name: batch[name] for name in sorted(needs)}
    if clip_bias is not None:
        bias_options = {k: v for k, v in options.items() if k in clip_bias.option_defaults()}
    trainable = fields["loss_mask"].bool().any(dim=1)  # [B]
    seq = fields.get("seq_id")  # [B] rollout of each row, with agg_unit=rollout
    # tree rollouts: a tree's rows go through one micro-batch, which forwards their shared prefix once
    together = seq if seq is not None else tree_of_rows(step.config, step.episodes, step.tokens)
    kept = sampler_rows(engine, step.episodes, tokens)
    skip = config.train.skip_zero_advantage
    inert = zero_advantage_rows(adv, fields["loss_mask"], seq) if skip else torch.zeros_like(trainable)
    rows_seen = rows_skipped = 0
    forwarded = {"tokens": 0.0, "loss_tokens": 0.0, "from_sampler": 0.0, "micro_batches": 0.0}
    device = engine.policy.lm.device
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    peak = float("-inf")

    def agg_term(values: Tensor, micro: _Micro) -> Tensor:
        return agg_loss(
            values, micro.loss_mask, agg, seq_id=micro.inputs.get("seq_id"), norm_constant=float(width)
        )

    for _epoch in range(train.ppo_epochs):
        order = torch.randperm(tokens.input_ids.shape[0], generator=rng)
        order = order[trainable[order]]
        if together is not None:  # a rollout's rows stay in one micro-batch: its normaliser is whole
            order = group_order(order, together)
        for minibatch in row_chunks(order, train.minibatch_size, together):
            mb_mask = fields["loss_mask"][minibatch]
            mb_seq = seq[minibatch] if seq is not None else None
            total_units = engine.all_reduce_sum(norm_units(agg, mb_mask, mb_seq))
            total_tokens = engine.all_reduce_sum(norm_units("token-mean", mb_mask))
            live = minibatch[~inert[minibatch]]  # rows to forward (all, without the skip)
            rows_seen += len(minibatch)
            rows_skipped += len(minibatch) - len(live)
            micros = row_chunks(live, train.micro_batch_size, together)

            def weight_of(micro: _Micro, total_units: Tensor = total_units) -> float:
                return float(
                    norm_units(agg, micro.loss_mask, micro.inputs.get("seq_id")).cpu()
                    / total_units.clamp_min(1)
                    * engine.world_size
                )

            scale, extra = 1.0, {}
            if clip_bias is not None:
                scale, extra = _clip_bias_scale(
                    engine, tokens, fields, adv, micros, clip_bias, bias_options, weight_of, floor=algo.clip_bias_floor,
                    kept=kept,
                )
            for m_idx, idx in enumerate(micros):
                micro = _Micro(engine, tokens, fields, idx, adv, kept=kept)
                out, loss_mask = micro.out, micro.loss_mask
                weight = weight_of(micro)
                policy_loss, metrics = loss.from_batch(micro.inputs, micro.adv, **options)
                metrics |= extra
                total = policy_loss * scale * weight
                if kl is not None:
                    kl_tok = kl(out.logp, ref_logp[idx, : micro.length].to(device), mask=loss_mask)  # [b, l]
                    kl_term = agg_term(kl_tok, micro)
                    total = total + algo.kl_coef * kl_term * weight
                    metrics["kl"] = float(kl_term.detach())
                entropy_term = agg_term(out.entropy, micro)
                if algo.entropy_coef:
                    total = total - algo.entropy_coef * entropy_term * weight
                metrics["entropy"] = float(entropy_term.detach())
                if value_loss is not None:
                    v_inputs = {**micro.inputs, "values": out.values}
                    v_loss, v_metrics = value_loss.from_batch(
                        v_inputs, returns[idx, : micro.length].to(device), clip=algo.vf_clip or None
                    )
                    v_weight = float(norm_units("token-mean", loss_mask).cpu() / total_tokens.clamp_min(1))
                    total = total + algo.vf_coef * v_loss * v_weight * engine.world_size
                    metrics |= v_metrics
                engine.backward(total, last=m_idx == len(micros) - 1)
                forwarded["tokens"] += float(tokens.attention_mask[idx].sum())
                forwarded["loss_tokens"] += float(loss_mask.sum().cpu())
                forwarded["from_sampler"] += float(micro.from_sampler)
                forwarded["micro_batches"] += 1.0
                metrics["loss"] = float(policy_loss.detach())
                for key, value in metrics.items():
                    sums[key] += float(value)
                    counts[key] += 1
            if skip and not micros:  # every row skipped: the optimizer steps on zero gradients, as it would have
                engine.zero_missing_grads()
            for key, value in engine.step().items():
                sums[key] += value
                counts[key] += 1
                if key == "grad_norm":
                    peak = max(peak, float(value))
    out = {key: sums[key] / counts[key] for key in sums}
    out["skipped_rows"] = rows_skipped / max(rows_seen, 1)
    out["forwarded_tokens"], out["forwarded_loss_tokens"] = forwarded["tokens"], forwarded["loss_tokens"]
    if kept is not None:  # train.reuse_sampler_hidden: the share of micro-batches that started from the sampler's states
        out["from_sampler_share"] = forwarded["from_sampler"] / max(forwarded["micro_batches"], 1.0)
    if "grad_norm" in out:
        out["grad_norm_max"] = peak  # the largest optimizer step of this update (spikes hide in the mean)
    return out


def tree_of_rows(config: Any, episodes: list[Any], tokens: TokenBatch) -> Tensor | None:
    """``[B]`` the tree of each row under tree rollouts (``rollout.branches``), else None. A tree's
    rows share every token up to its branch point, so a micro-batch of one tree runs that prefix once
    (:meth:`agentrl.train.learner.Policy.hidden_states`): the learner's cost of a tree is about one
    row plus the branches' own tokens."""
    if not config.rollout.branches:
        return None
    trees: dict[str, int] = {}
    per_episode = torch.tensor([trees.setdefault(ep.group_id, len(trees)) for ep in episodes])
    return per_episode[tokens.row_episode]


def zero_advantage_rows(adv: Tensor, loss_mask: Tensor, seq_id: Tensor | None = None) -> Tensor:
    """``[B]`` bool: rows whose advantage is 0 on every trained token; with ``seq_id`` (a rollout's
    rows share one normaliser) a row counts only when every row of its rollout does."""
    zero = ~((adv != 0) & loss_mask.bool()).any(dim=1)
    if seq_id is not None:
        live = torch.zeros(int(seq_id.max()) + 1 if seq_id.numel() else 0, dtype=torch.long)
        live.scatter_add_(0, seq_id.long(), (~zero).long())
        zero = live[seq_id.long()] == 0
    return zero


def _clip_bias_scale(engine: Any, tokens: TokenBatch, fields: dict[str, Tensor], adv: Tensor,
                     micros: list[Tensor], clip_bias: Any, options: dict[str, Any],
                     weight_of: Any, *, floor: float = 1.0, kept: list[Any] | None = None) -> tuple[float, dict[str, float]]:  # fmt: skip
    """``(1 / max(floor, ||C||), metrics)`` with ``C = grad S_c`` over the whole minibatch (all ranks)."""
    params = engine.policy.trainable_parameters()
    total: list[Tensor | None] = [None] * len(params)
    in_set = 0.0
    # a micro-batch with nothing clipped may skip its backward where a zero tensor can stand in for
    # its gradient in the ranks' all-reduce: one process, DDP, ZeRO-1/2 (not where parameters are sharded)
    can_skip = engine.world_size == 1 or not engine.shards_parameters
    for idx in micros:
        micro = _Micro(engine, tokens, fields, idx, adv, module=False, kept=kept)  # no DDP hooks: autograd.grad only
        surrogate, metrics = clip_bias.from_batch(micro.inputs, micro.adv, **options)
        in_set += metrics["clip_bias_frac"] * float(micro.loss_mask.sum())
        if can_skip and metrics["clip_bias_frac"] == 0:
            continue  # no token in the clipped set: S_c is a sum of zeros, its gradient exactly 0
        # weight_of carries the DDP world-size factor (ranks' gradients are averaged); C is a sum
        grads = torch.autograd.grad(
            surrogate * weight_of(micro) / engine.world_size, params, allow_unused=True
        )
        for i, g in enumerate(grads):
            if g is not None:
                total[i] = g if total[i] is None else total[i] + g
    if can_skip and engine.world_size > 1:  # every rank all-reduces every tensor, whatever it skipped
        total = [torch.zeros_like(p) if g is None else g for g, p in zip(total, params, strict=True)]
    sq = torch.zeros(())
    for g in total:
        if g is not None:
            sq = sq + engine.all_reduce_sum(g.detach().clone()).float().pow(2).sum().cpu()
    c_norm = float(sq.sqrt())
    tokens_in = float(sum(fields["loss_mask"][idx].sum() for idx in micros))
    scale, _ = clip_bias_scale_from_norm(c_norm, floor=floor)
    return scale, {
        "clip_bias_norm": c_norm,
        "clip_bias_scale": scale,
        "clip_bias_frac": in_set / max(tokens_in, 1.0),
    }


__all__ = ["compute_advantages", "loss_options", "norm_units", "ppo_update", "row_chunks", "score_tokens",
           "zero_advantage_rows"]
