"""Attention of many rows over one shared prefix, without copying the prefix's keys and values.

Rows of a tree (or of a batch with one system prompt) start with the same tokens. The learner runs
that prefix once at batch 1 (:meth:`agentrl.train.learner.Policy.hidden_states`); before this
module it then repeated the prefix's key/value cache for every row, and each attention layer
copied it twice more (appending the rows' own keys, and repeating the key/value heads for grouped
queries). For a tree of 16 rows over a 570-token prefix that is most of the learner's memory.

Here each layer attends to two key sets: the prefix's, held once at batch 1 and shared by every
row, and the row's own tail, causally and with its padding. Both score blocks go through one
softmax, so the result is exact attention over ``prefix + tail`` (gradients reach the prefix's
keys and values through autograd). With gradients the scores are recomputed in the backward pass
(activation checkpointing of the attention alone), so no layer keeps its ``[B, Hq, T, P + T]``
scores. Queries are grouped by key/value head (``[Hkv, rows x groups x
T, d]``), so the prefix's scores are one batched matmul against its ``[Hkv, P, d]`` keys: the prefix
is never expanded to the rows.

Used through :func:`shared_prefix_attention`, a context in which the model's attention layers call
:func:`attend` (a ``transformers`` attention function) with the prefixes (:class:`Prefixes`). The HF
generator decodes the same way (:mod:`agentrl.rollout.generators.hf`): the branches of a tree share
their prompt, whose K/V each decode step then reads once instead of once per branch. Models whose
attention layers do not follow the ``transformers`` attention-function interface (a ``layer_idx``
on the layer, keys/values passed as ``[B, Hkv, T, d]``) are not supported: :func:`supported`
says so and the caller keeps the copying path.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

NAME = "agentrl_shared_prefix"


class Prefixes:
    """Groups of rows, each group attending to one prefix held once.

    ``kv[g][layer] = (keys, values)``, each ``[1, Hkv, P_g, d]``; ``rows[g]`` the batch rows of
    group ``g`` (a ``[n_g]`` long tensor). The learner has one group (every row of a tree); the
    generator one per distinct prompt of a decode batch (a tree's branches share their prompt).
    """

    def __init__(self, kv: list[list[tuple[Tensor, Tensor]]], rows: list[Tensor], batch: int):
        if len(kv) != len(rows):
            raise ValueError(f"{len(kv)} prefixes for {len(rows)} row groups")
        self.kv, self.rows, self.batch = kv, rows, batch
        #: with gradients, recompute the scores in the backward pass (False where the caller already
        #: recomputes whole layers)
        self.recompute_scores = True
        # a group whose rows are consecutive is sliced (a view), not gathered and scattered back
        self.spans = [_span(r) for r in rows]

    @classmethod
    def of_cache(cls, cache: Any, batch: int, first: int = 0) -> Prefixes:
        """Every one of ``batch`` rows attends to one prefix, a ``transformers`` cache at batch 1
        (``first``: its slot 0 holds block ``first``'s K/V; the blocks below are not run)."""
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        kv: list[list[Any]] = [[None] * first + layers]
        return cls(kv, [torch.arange(batch, device=layers[0][0].device)], batch)

    def select(self, keep: Tensor) -> Prefixes:
        """The groups of rows ``keep`` (old row indices, in their new order); groups left empty go."""
        new_of_old = torch.full((self.batch,), -1, dtype=torch.long, device=keep.device)
        new_of_old[keep] = torch.arange(len(keep), device=keep.device)
        kv, rows = [], []
        for group_kv, group_rows in zip(self.kv, self.rows, strict=True):
            moved = new_of_old[group_rows]
            moved = moved[moved >= 0]
            if len(moved):
                kv.append(group_kv)
                rows.append(moved)
        return Prefixes(kv, rows, len(keep))


def attend(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, scaling: float,
    dropout: float = 0.0, shared_prefix: Prefixes | None = None, **_: Any,
) -> tuple[Tensor, None]:  # fmt: skip
    """Attention of ``query`` over its group's shared prefix and then its own ``key``/``value``.

    Args:
        query: ``[B, Hq, T, d]``, rotary applied at the tail's positions.
        key, value: ``[B, Hkv, K, d]`` of the tail tokens (``K >= T``: a cache of earlier tail tokens
            comes first).
        attention_mask: ``[B, 1, T, K]`` over the tail (causal and padding): boolean (True = may
            attend) or additive float.
        shared_prefix: the row groups and their prefixes (:class:`Prefixes`).

    Returns:
        ``([B, T, Hq, d], None)``, as ``transformers`` attention functions return.
    """
    if dropout:
        raise ValueError("shared-prefix attention has no dropout: the learner runs the model without it")
    if shared_prefix is None:
        raise ValueError("shared-prefix attention needs shared_prefix= (agentrl.kernels.prefix_attention)")
    layer = module.layer_idx
    group = _attend_group
    if shared_prefix.recompute_scores and torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        # the scores are [B, Hq, T, P + K]: recomputed in the backward pass instead of kept for every
        # layer (a tree with 170-token tails over a 640-token prefix kept ~2 GiB of them otherwise)
        group = functools.partial(checkpoint, _attend_group, use_reentrant=False)
    if len(shared_prefix.rows) == 1:  # every row shares one prefix: no gather
        keys, values = shared_prefix.kv[0][layer]
        return group(query, key, value, attention_mask, keys[0], values[0], scaling), None
    out = query.new_empty(query.shape[0], query.shape[2], query.shape[1], query.shape[3])  # [B, T, Hq, d]
    for group_kv, rows, span in zip(shared_prefix.kv, shared_prefix.rows, shared_prefix.spans, strict=True):
        keys, values = group_kv[layer]
        pick = rows if span is None else span
        mask = attention_mask[pick] if attention_mask is not None and attention_mask.shape[0] > 1 else attention_mask
        out[pick] = group(query[pick], key[pick], value[pick], mask, keys[0], values[0], scaling)
    return out, None


def _span(rows: Tensor) -> slice | None:
    """``rows`` as a slice when they are consecutive and increasing, else None."""
    if len(rows) == 0:
        return None
    start = int(rows[0])
    if int(rows[-1]) - start + 1 != len(rows) or not bool((rows.diff() == 1).all()):
        return None
    return slice(start, start + len(rows))


def _attend_group(
    query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, prefix_k: Tensor, prefix_v: Tensor,
    scaling: float,
) -> Tensor:  # fmt: skip
    """:func:`attend` for rows that share one prefix (``prefix_k``/``prefix_v`` ``[Hkv, P, d]``)."""
    rows, q_heads, length, dim = query.shape
    kv_heads, width, keys = key.shape[1], prefix_k.shape[1], key.shape[2]
    groups = q_heads // kv_heads
    q = query.reshape(rows, kv_heads, groups * length, dim)  # heads of one group are adjacent: [B, Hkv, g*T, d]
    by_head = q.transpose(0, 1).reshape(kv_heads, rows * groups * length, dim)  # [Hkv, B*g*T, d]
    scores_prefix = torch.matmul(by_head, prefix_k.transpose(1, 2).to(q.dtype))  # [Hkv, B*g*T, P]
    scores_prefix = scores_prefix.view(kv_heads, rows, groups * length, width).transpose(0, 1)
    scores_tail = torch.matmul(q, key.transpose(2, 3))  # [B, Hkv, g*T, K]
    if attention_mask is not None:
        mask = attention_mask.expand(rows, 1, length, keys).repeat(1, 1, groups, 1)  # [B, 1, g*T, K]
        if mask.dtype == torch.bool:
            scores_tail = scores_tail.masked_fill(~mask, float("-inf"))
        else:  # additive, as transformers' eager masks are
            scores_tail = scores_tail + mask.to(scores_tail.dtype) / scaling
    scores = torch.cat([scores_prefix, scores_tail], dim=-1) * scaling  # [B, Hkv, g*T, P+K]
    probs = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    probs_prefix = probs[..., :width].transpose(0, 1).reshape(kv_heads, rows * groups * length, width)
    out_prefix = torch.matmul(probs_prefix, prefix_v.to(q.dtype))  # [Hkv, B*g*T, d]
    out_prefix = out_prefix.view(kv_heads, rows, groups * length, dim).transpose(0, 1)
    out = out_prefix + torch.matmul(probs[..., width:], value)  # [B, Hkv, g*T, d]
    return out.reshape(rows, q_heads, length, dim).transpose(1, 2)  # [B, T, Hq, d]


def tail_mask(attention_mask: Tensor, prefix: int) -> Tensor:
    """``[B, 1, T, T]`` boolean mask of the tail after a ``prefix``-token shared prefix.

    Position ``i`` attends to tail positions ``j <= i`` that are real tokens (``attention_mask``
    is the rows' full ``[B, P + T]`` padding mask); the prefix is always visible.
    """
    tail = attention_mask[:, prefix:].bool()  # [B, T]
    length = tail.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=tail.device).tril()
    return (causal[None] & tail[:, None, :])[:, None]  # [B, 1, T, T]


_registered = False


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(NAME, attend)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, eager_mask)  # only reached without a prepared 4D mask
    _registered = True


#: Model families whose attention layers call a ``transformers`` attention function with
#: ``[B, H, T, d]`` queries/keys/values and nothing this module would have to honour besides the mask
#: (no sliding window in use, no attention sinks, no soft-capping).
FAMILIES = ("llama", "qwen2", "qwen3")


def supported(model: nn.Module) -> bool:
    """True when ``model``'s (a decoder's) attention can be :func:`attend`: a family of
    :data:`FAMILIES`, full attention in every layer, no attention dropout."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        return False
    if getattr(config, "model_type", None) not in FAMILIES or getattr(config, "use_sliding_window", False):
        return False
    if getattr(config, "attention_dropout", 0.0):  # attend() has no dropout
        return False
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return False
    layers = getattr(model, "layers", None)
    if layers is None or len(layers) == 0:
        return False
    attention = getattr(layers[0], "self_attn", None)
    return attention is not None and hasattr(attention, "layer_idx")


@contextlib.contextmanager
def shared_prefix_attention(decoder: nn.Module) -> Iterator[None]:
    """Within the context ``decoder``'s layers use :func:`attend` (pass ``shared_prefix=`` to its forward)."""
    _register()
    config = decoder.config
    before = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = before


__all__ = ["Prefixes", "attend", "shared_prefix_attention", "supported", "tail_mask"]
