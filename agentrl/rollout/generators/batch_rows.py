"""The rows of one HF decode batch: their K/V, positions and masks, in one of two layouts.

:class:`PaddedRows` (every batch): each row's prompt K/V copied into one left-padded batch cache,
attended by the model's own attention. :class:`SharedPromptRows` (a batch in which rows repeat a
prompt: a tree's branches, a group's samples of one prompt): each distinct prompt's K/V is held
once, and a decode step attends to it once for all its rows
(:mod:`agentrl.kernels.prefix_attention`); only the generated tokens have a per-row cache. On the
quickstart's trees (16 rows, 2 prompts of ~600 tokens) a decode step reads ~8x less K/V and the
batch holds ~8x less of it; ``benchmarks/bench_decode.py --shared`` measures both layouts.

Both give :class:`agentrl.rollout.generators.hf.HFGenerator` the same four operations: the first
logits, one decode step (:meth:`advance`), dropping rows that stopped (:meth:`keep`), and each
row's K/V for the prefix cache (:meth:`kv_rows`: with shared prompts, each prompt's K/V once as a
:class:`~agentrl.rollout.generators.kv_cache.SharedPrefix` and each row's own tokens past it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from agentrl.kernels import prefix_attention
from agentrl.rollout.generators.kv_cache import SharedPrefix, left_pad, roomy_cache

HFGenerator = Any  # agentrl.rollout.generators.hf.HFGenerator, which imports this module

KV = list[tuple[torch.Tensor, torch.Tensor]]  # (keys, values) [1, H, T, D] per layer
RowKV = tuple[KV, SharedPrefix | None]  # a row's K/V for the prefix cache: past the shared prefix, if any


def shares_prompts(prompts: Sequence[Sequence[int]]) -> bool:
    """True when the batch's rows repeat prompts enough (at most half as many distinct prompts as
    rows) for :class:`SharedPromptRows` to pay for its per-group attention."""
    return len({tuple(p) for p in prompts}) * 2 <= len(prompts)


class PaddedRows:
    """Every row's prompt K/V in one left-padded batch cache with ``room`` spare positions."""

    shared = False

    def __init__(self, gen: HFGenerator, prompts: list[Sequence[int]], room: int):
        self.gen = gen
        device = gen.device
        if gen.prefix_cache is not None:
            self.cache, self.logits, self.attention, self.pads = gen._prefill_with_prefix_cache(prompts, room)
        else:
            input_ids, self.attention = left_pad(prompts, gen.pad_id, device)  # [B, L]
            self.pads = [input_ids.shape[1] - len(p) for p in prompts]
            self.cache = roomy_cache(room)
            self.logits = gen._logits(
                input_ids=input_ids,
                attention_mask=self.attention,
                position_ids=(self.attention.cumsum(-1) - 1).clamp(min=0),
                past_key_values=self.cache,
            )
        self.last_pos = (self.attention.cumsum(-1) - 1).clamp(min=0)[:, -1:]  # [B, 1]
        self.lengths = [len(p) for p in prompts]

    def advance(self, feed: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (``[B]``); the next logits ``[B, V]``."""
        ones = torch.ones((len(feed), 1), dtype=self.attention.dtype, device=feed.device)
        self.attention = torch.cat([self.attention, ones], -1)
        self.last_pos = self.last_pos + 1
        return self.gen._logits(
            input_ids=feed[:, None], attention_mask=self.attention, position_ids=self.last_pos,
            past_key_values=self.cache,
        )  # fmt: skip

    def keep(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` (in that order)."""
        self.cache.batch_select_indices(index)
        self.attention, self.last_pos = self.attention[index], self.last_pos[index]

    def kv_rows(self, rows: list[tuple[int, int, int]], *, release: bool = False) -> list[RowKV]:
        """K/V of ``(cache row, prompt index, generated tokens fed)`` triples: the prompt and the
        fed tokens, without padding (no shared prefix). ``release``: the batch is done, so each
        layer's buffers are let go once copied (one batch copy plus one layer at a time, not two)."""
        kvs: list[KV] = [[] for _ in rows]
        for layer in self.cache.layers:
            for kv, (r, b, fed) in zip(kvs, rows, strict=True):
                span = slice(self.pads[b], self.pads[b] + self.lengths[b] + fed)
                kv.append((layer.keys[r : r + 1, :, span].clone(), layer.values[r : r + 1, :, span].clone()))
            if release:
                layer.release()
        return [(kv, None) for kv in kvs]


class SharedPromptRows:
    """Each distinct prompt's K/V held once at batch 1; per row, a cache of its generated tokens only.

    Rows of one prompt start at the same position and decode in lock-step, so their generated-token
    caches need no padding, and the first logits of a prompt are computed once for all its rows.
    """

    shared = True

    def __init__(self, gen: HFGenerator, prompts: list[Sequence[int]], room: int):
        self.gen = gen
        device = gen.device
        distinct: dict[tuple[int, ...], int] = {}
        self.group_of_row = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        prefixes_kv, first_logits = gen._prefill_rows([list(p) for p in distinct])
        group = torch.tensor(self.group_of_row, device=device)
        rows = [torch.nonzero(group == g).flatten() for g in range(len(distinct))]
        self.prefixes = prefix_attention.Prefixes(prefixes_kv, rows, len(prompts))
        self.kv = prefixes_kv  # per group, for kv_rows
        self.bases: dict[int, SharedPrefix] = {}  # per group, made by the first kv_rows that needs it
        self.logits = torch.stack(first_logits)[group]  # [B, V]
        self.cache = roomy_cache(room)  # generated tokens only
        self.fed = 0
        self.last_pos = torch.tensor([[len(p) - 1] for p in prompts], device=device)  # [B, 1]
        self.decoder = gen.model.get_decoder()

    def advance(self, feed: torch.Tensor) -> torch.Tensor:
        self.fed += 1
        self.last_pos = self.last_pos + 1
        mask = torch.ones((len(feed), 1, 1, self.fed), dtype=torch.bool, device=feed.device)  # [B, 1, 1, K]
        with prefix_attention.shared_prefix_attention(self.decoder):
            return self.gen._logits(
                input_ids=feed[:, None], attention_mask=mask, position_ids=self.last_pos,
                past_key_values=self.cache, shared_prefix=self.prefixes,
            )  # fmt: skip

    def keep(self, index: torch.Tensor) -> None:
        self.cache.batch_select_indices(index)
        self.prefixes = self.prefixes.select(index)
        self.last_pos = self.last_pos[index]
        self.group_of_row = [self.group_of_row[i] for i in index.tolist()]

    def kv_rows(self, rows: list[tuple[int, int, int]], *, release: bool = False) -> list[RowKV]:
        """Per ``(cache row, prompt index, generated tokens fed)``: the row's fed tokens' K/V and its
        prompt's :class:`SharedPrefix` (one per prompt, shared by its rows' cache entries)."""
        out: list[RowKV] = []
        for r, _, fed in rows:
            group = self.group_of_row[r]
            if group not in self.bases:
                self.bases[group] = SharedPrefix(self.kv[group])
            out.append(([(layer.keys[r : r + 1, :, :fed].clone(), layer.values[r : r + 1, :, :fed].clone())
                         for layer in self.cache.layers], self.bases[group]))  # fmt: skip
        if release:
            for layer in self.cache.layers:
                layer.release()
        return out


def decode_rows(gen: HFGenerator, prompts: list[Sequence[int]], room: int) -> PaddedRows | SharedPromptRows:
    """The layout for this batch: shared prompts where rows repeat them, the generator allows it
    (``share_prompts``, a prefix cache) and the model's attention takes a function; else padded."""
    if (
        gen.share_prompts
        and gen.prefix_cache is not None
        and shares_prompts(prompts)
        and prefix_attention.supported(gen.model.get_decoder())
    ):
        return SharedPromptRows(gen, prompts, room)
    return PaddedRows(gen, prompts, room)


__all__ = ["PaddedRows", "RowKV", "SharedPromptRows", "decode_rows", "shares_prompts"]
