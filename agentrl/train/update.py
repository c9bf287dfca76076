"""One policy update from a step's episodes: score, advantages, PPO epochs over minibatches.

Everything algorithm-specific is looked up by name (``agentrl.registry``) and every input an
objective reads comes from :mod:`agentrl.train.fields`; this module only moves tensors around.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections import defaultdict
from typing import Any

import torch
from torch import Tensor

import agentrl.algos  # noqa: F401  (registers the objectives)
from agentrl.algos.losses import agg_loss, clip_bias_scale
from agentrl.config import AlgoConfig
from agentrl.registry import ADVANTAGES, KL_ESTIMATORS, LOSSES
from agentrl.train.fields import LazyBatch, StepData
from agentrl.trajectory import TokenBatch

# AlgoConfig fields that are also keyword options of the PPO-style losses
_LOSS_KEYS = ("ratio", "agg", "clip_low", "clip_high")


def row_chunks(rows: Tensor, size: int) -> list[Tensor]:
    """Split a 1-D index tensor into consecutive pieces of at most ``size``."""
    return [rows[i : i + size] for i in range(0, rows.numel(), size)]


def _slice(tokens: TokenBatch, idx: Tensor) -> tuple[Tensor, Tensor, Tensor, int]:
    """Rows ``idx``, trimmed to their longest real length (saves compute on short rows)."""
    mask = tokens.attention_mask[idx]
    length = int(mask.sum(1).max()) if idx.numel() else 1
    return tokens.input_ids[idx, :length], mask[:, :length], tokens.loss_mask[idx, :length], length


@torch.no_grad()
def score_tokens(engine: Any, tokens: TokenBatch, micro_batch_size: int, *, reference: bool = False) -> dict[str, Tensor | None]:  # fmt: skip
    """No-grad pass: ``logp``, ``entropy`` and ``values`` ``[B, L]`` (reference policy if asked)."""
    batch, width = tokens.input_ids.shape
    out: dict[str, Tensor | None] = {"logp": torch.zeros(batch, width), "entropy": torch.zeros(batch, width)}
    out["values"] = (
        torch.zeros(batch, width) if engine.policy.value_head is not None and not reference else None
    )
    for idx in row_chunks(torch.arange(batch), micro_batch_size):
        ids, mask, loss_mask, length = _slice(tokens, idx)
        device = engine.policy.lm.device
        ids, mask, loss_mask = ids.to(device), mask.to(device), loss_mask.to(device)
        result = engine.forward(ids, mask, loss_mask, reference=reference)
        out["logp"][idx, :length] = result.logp.float().cpu()
        out["entropy"][idx, :length] = result.entropy.float().cpu()
        if out["values"] is not None and result.values is not None:
            out["values"][idx, :length] = result.values.float().cpu()
    return out


def loss_options(loss: Any, algo: AlgoConfig, width: int) -> dict[str, Any]:
    """Keyword options for ``loss``: AlgoConfig fields set away from their defaults, then ``loss_options``.

    A preset loss (``dapo``, ``gspo``...) keeps its presets unless the config changes that field.
    """
    accepted = inspect.signature(loss.fn).parameters
    defaults = {f.name: f.default for f in dataclasses.fields(AlgoConfig)}
    options = {k: getattr(algo, k) for k in _LOSS_KEYS if k in accepted and getattr(algo, k) != defaults[k]}
    if "norm_constant" in accepted:
        options["norm_constant"] = float(width)  # micro-batches are trimmed; keep Dr. GRPO's constant
    options.update(algo.loss_options)
    return options


def norm_units(agg: str, mask: Tensor) -> Tensor:
    """How much of an aggregation's normaliser ``mask`` holds: tokens, or rows that count."""
    m = mask.bool()
    if agg == "token-mean":
        return m.sum().float()
    if agg == "constant":
        return torch.tensor(float(m.shape[0]))
    return m.any(dim=1).sum().float()  # seq-mean-*: sequences with at least one token


def estimator_options(estimator: Any, algo: AlgoConfig) -> dict[str, Any]:
    """``gamma``/``lam`` from the config when the estimator takes them and they are set, then ``options``."""
    accepted = inspect.signature(estimator.fn).parameters
    defaults = {f.name: f.default for f in dataclasses.fields(AlgoConfig)}
    options = {
        k: getattr(algo, k) for k in ("gamma", "lam") if k in accepted and getattr(algo, k) != defaults[k]
    }
    options.update(algo.options)
    return options


def compute_advantages(step: StepData) -> tuple[Tensor, Tensor | None, LazyBatch]:
    """Token advantages ``[B, L]`` (and GAE returns) from the registered estimator."""
    algo = step.config.algo
    batch = LazyBatch(step)
    estimator = ADVANTAGES.get(algo.advantage, field="algo.advantage")
    adv, returns = estimator.from_batch(batch, **estimator_options(estimator, algo))
    return adv, returns, batch


def ppo_update(engine: Any, step: StepData, batch: LazyBatch, adv: Tensor, returns: Tensor | None,
               ref_logp: Tensor | None, *, rng: torch.Generator) -> dict[str, float]:  # fmt: skip
    """``ppo_epochs`` passes over the step's rows in shuffled minibatches; returns mean metrics."""
    config = step.config
    algo, train = config.algo, config.train
    tokens = step.tokens
    width = tokens.input_ids.shape[1]
    loss = LOSSES.get(algo.loss, field="algo.loss")
    options = loss_options(loss, algo, width)
    agg = options.get("agg", loss.defaults.get("agg", "token-mean"))
    value_loss = LOSSES.get("value") if engine.policy.value_head is not None else None
    clip_bias = LOSSES.get("clip_bias_norm") if algo.clip_bias_correction else None
    kl = KL_ESTIMATORS.get(algo.kl_kind, field="algo.kl_kind") if algo.kl_coef > 0 else None
    needs = (set(loss.head) | set(loss.inputs)) - {"logp", "loss_mask"}
    if value_loss is not None:
        needs.add("old_values")
    row_fields = {name: batch[name] for name in sorted(needs) if name in batch}
    device = engine.policy.lm.device
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)

    for _epoch in range(train.ppo_epochs):
        order = torch.randperm(tokens.input_ids.shape[0], generator=rng)
        for minibatch in row_chunks(order, train.minibatch_size):
            mb_mask = tokens.loss_mask[minibatch]
            total_units = engine.all_reduce_sum(norm_units(agg, mb_mask))
            total_tokens = engine.all_reduce_sum(norm_units("token-mean", mb_mask))
            micros = row_chunks(minibatch, train.micro_batch_size)
            for m_idx, idx in enumerate(micros):
                ids, mask, loss_mask, length = _slice(tokens, idx)
                ids, mask, loss_mask = ids.to(device), mask.to(device), loss_mask.to(device)
                out = engine.forward(ids, mask, loss_mask)
                micro = {k: v[idx, :length].to(device) for k, v in row_fields.items() if v.dim() == 2}
                micro |= {"logp": out.logp, "loss_mask": loss_mask}
                a = adv[idx, :length].to(device)
                weight = norm_units(agg, loss_mask).cpu() / total_units.clamp_min(1) * engine.world_size
                policy_loss, metrics = loss.from_batch(micro, a, **options)
                if clip_bias is not None:
                    surrogate, bias_metrics = clip_bias.from_batch(
                        micro, a, **loss_options(clip_bias, algo, width)
                    )
                    scale, c_norm = clip_bias_scale(surrogate, engine.policy.trainable_parameters())
                    policy_loss = policy_loss * scale
                    metrics |= bias_metrics | {"clip_bias_norm": c_norm, "clip_bias_scale": scale}
                total = policy_loss * float(weight)
                if kl is not None:
                    kl_tok = kl(out.logp, ref_logp[idx, :length].to(device), mask=loss_mask)  # [b, l]
                    kl_term = agg_loss(kl_tok, loss_mask, agg, norm_constant=float(width))
                    total = total + algo.kl_coef * kl_term * float(weight)
                    metrics["kl"] = float(kl_term.detach())
                entropy_term = agg_loss(out.entropy, loss_mask, agg, norm_constant=float(width))
                if algo.entropy_coef:
                    total = total - algo.entropy_coef * entropy_term * float(weight)
                metrics["entropy"] = float(entropy_term.detach())
                if value_loss is not None:
                    micro["values"] = out.values
                    v_loss, v_metrics = value_loss.from_batch(
                        micro, returns[idx, :length].to(device), clip=algo.vf_clip or None
                    )
                    v_weight = float(norm_units("token-mean", loss_mask).cpu() / total_tokens.clamp_min(1))
                    total = total + algo.vf_coef * v_loss * v_weight * engine.world_size
                    metrics |= v_metrics
                engine.backward(total, last=m_idx == len(micros) - 1)
                metrics["loss"] = float(policy_loss.detach())
                for key, value in metrics.items():
                    sums[key] += float(value)
                    counts[key] += 1
            for key, value in engine.step().items():
                sums[key] += value
                counts[key] += 1
    return {key: sums[key] / counts[key] for key in sums}


__all__ = ["compute_advantages", "loss_options", "norm_units", "ppo_update", "row_chunks", "score_tokens"]
