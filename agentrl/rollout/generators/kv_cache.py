"""The HF generator's K/V cache: kept prefixes between turns, their memory budget, roomy decode caches.

Split out of :mod:`agentrl.rollout.generators.hf` (issue #45: one job per module; the code moved
as it was). :class:`PrefixCache` keeps recent sequences' keys/values so a multi-turn prompt only
prefills its new suffix; :func:`prefix_cache_budget` sizes it (``rollout.prefix_cache_tokens``
unset) from :func:`kv_bytes_per_token` and the device's :func:`memory_bytes`; :func:`roomy_cache`
is a transformers ``DynamicCache`` that decodes in place, and :func:`left_padded_cache` merges
per-row caches into one batch cache (the generator's waves, the learner's cached scoring, the
server's continuous batching).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import torch


def cache_arg(model: Any) -> str:
    """The keyword ``model``'s forward takes its K/V cache by: ``cache`` in transformers releases that
    renamed it (there ``past_key_values`` still works but prints a FutureWarning in the user's
    terminal), ``past_key_values`` before (there ``cache`` would land in ``**kwargs`` unread). A PEFT
    model is asked about the model it wraps."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _cache_arg_of(type(base))


@functools.cache
def _cache_arg_of(cls: type) -> str:
    params = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in params and "past_key_values" not in params else "past_key_values"


def with_cache(model: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """``inputs`` for ``model``'s forward with a ``past_key_values`` entry under :func:`cache_arg`."""
    if "past_key_values" not in inputs or cache_arg(model) == "past_key_values":
        return inputs
    inputs = dict(inputs)
    inputs["cache"] = inputs.pop("past_key_values")
    return inputs


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    if a[:n] == tuple(b[:n]):
        return n
    lo, hi = 0, n  # binary search on the first mismatch (prefix equality is monotone)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == tuple(b[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


class SharedPrefix:
    """The K/V of one prompt that several cache entries start with (a tree's branches, a group's
    samples of one prompt), held once: each such entry keeps only the K/V past it. Without it, the
    16 branches of a quickstart tree stored 16 copies of their ~600-token prompt when they ended
    (~10,000 tokens a wave), which evicted the trunks of the trees still to branch, so their branches
    prefilled again (~0.85 s a wave on 2 cores)."""

    def __init__(self, kv: list[tuple[torch.Tensor, torch.Tensor]]):
        # its own copy: the prompt's tensors may be views of a larger batch buffer
        self.kv = [(k.clone(), v.clone()) for k, v in kv]
        self.length = int(kv[0][0].shape[2]) if kv else 0


class PrefixCache:
    """KV caches of recent sequences, so a multi-turn prompt only prefills its new suffix.

    An agent's next prompt is its previous prompt + the sampled ids + the bridge ids; the cache
    entry of the previous call covers all but its last sampled token. Bounded by total tokens
    (LRU); cleared on weight updates. Entries stored with a :class:`SharedPrefix` hold only their
    K/V past it, and the prefix counts once against the budget while any of them is held.
    """

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        # key -> (ids, K/V of ids[base.length:] (all of ids without a base), base or None)
        self.entries: OrderedDict[
            int, tuple[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]], SharedPrefix | None]
        ] = OrderedDict()
        self.tokens = 0
        self.hits = 0
        self.asked_tokens = 0  # prompt tokens looked up (every prefilled row's whole prompt)
        self.reused_tokens = 0  # of them, read from the cache instead of prefilled
        self._next = 0
        self._base_refs: dict[int, int] = {}  # id(SharedPrefix) -> entries holding it

    def find(
        self, prompt: Sequence[int], among: Iterable[int | None] | None = None
    ) -> tuple[int | None, int]:
        """``(key, length)`` of the entry (of those held, or of the keys ``among`` still held)
        sharing the longest prefix with ``prompt`` (leaving >= 1 token to prefill), or ``(None, 0)``
        when none shares 16+ tokens; no bookkeeping."""
        best_key, best_len = None, 0
        limit = len(prompt) - 1
        keys = self.entries.keys() if among is None else [k for k in among if k in self.entries]
        for key in keys:
            n = _common_prefix(self.entries[key][0], prompt, limit)
            if n > best_len:
                best_key, best_len = key, n
        if best_key is None or best_len < 16:  # tiny overlaps are not worth the copies
            return None, 0
        return best_key, best_len

    def view(self, key: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer k/v of entry ``key``'s first ``n`` positions: views, or (an entry past its
        shared prefix) the prefix and the entry's own K/V joined."""
        _, kv, base = self.entries[key]
        if base is None:
            return [(k[:, :, :n], v[:, :, :n]) for k, v in kv]
        if n <= base.length:
            return [(k[:, :, :n], v[:, :, :n]) for k, v in base.kv]
        own = n - base.length
        return [
            (torch.cat([bk, k[:, :, :own]], dim=2), torch.cat([bv, v[:, :, :own]], dim=2))
            for (bk, bv), (k, v) in zip(base.kv, kv, strict=True)
        ]

    def lookup(
        self,
        prompt: Sequence[int],
        pinned: tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None] = (0, None),
        among: Iterable[int | None] | None = None,
    ) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """Longest common prefix of ``prompt`` with any cached sequence (leaving >= 1 token to
        prefill): ``(length, per-layer k/v views)``. Episodes share the system prompt and tools, and
        group rollouts share the whole first prompt, so entries are read, never consumed.
        ``pinned``: ``(length, views)`` found earlier (see :meth:`find`), used when no entry searched
        now shares more; ``among``: search only these keys (those stored since ``pinned`` was found:
        older entries were searched then)."""
        self.asked_tokens += len(prompt)
        key, n = self.find(prompt, among)
        if key is not None and n > pinned[0]:
            self.entries.move_to_end(key)
            kv = self.view(key, n)
        else:
            n, kv = pinned
        if kv is None:
            return 0, None
        self.hits += 1
        self.reused_tokens += n
        return n, kv

    def store(
        self,
        ids: Sequence[int],
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        base: SharedPrefix | None = None,
    ) -> int | None:
        """Keep ``kv`` for ``ids`` (dropping entries it extends, then the least recently used past
        the budget); returns the entry's key, or None when it is longer than the whole budget.
        ``base``: ``ids`` start with this prefix, and ``kv`` covers only the positions past it."""
        if not ids or len(ids) > self.max_tokens:
            return None
        ids = tuple(ids)
        for key, (old, _, _) in list(self.entries.items()):  # superseded: an earlier turn of this sequence
            if len(old) <= len(ids) and ids[: len(old)] == old:
                self._drop(key)
        self.entries[self._next] = (ids, kv, base)
        self._next += 1
        self.tokens += len(ids) - (base.length if base is not None else 0)
        if base is not None:
            refs = self._base_refs.get(id(base), 0)
            self.tokens += 0 if refs else base.length
            self._base_refs[id(base)] = refs + 1
        while self.tokens > self.max_tokens and self.entries:
            self._drop(next(iter(self.entries)))
        return self._next - 1 if self._next - 1 in self.entries else None

    def _drop(self, key: int) -> None:
        ids, _, base = self.entries.pop(key)
        self.tokens -= len(ids) - (base.length if base is not None else 0)
        if base is not None:
            refs = self._base_refs.pop(id(base)) - 1
            if refs:
                self._base_refs[id(base)] = refs
            else:
                self.tokens -= base.length

    def discard_within(self, ids: Sequence[int]) -> int:
        """Drop the entries whose ids begin ``ids`` (an ended episode's turns); returns how many."""
        ids = tuple(ids)
        gone = [key for key, (old, _, _) in self.entries.items() if len(old) <= len(ids) and ids[: len(old)] == old]
        for key in gone:
            self._drop(key)
        return len(gone)

    def discard(self, keys: Iterable[int | None]) -> None:
        """Drop the entries ``keys`` (those still held)."""
        for key in keys:
            if key is not None and key in self.entries:
                self._drop(key)

    def clear(self) -> None:
        self.entries.clear()
        self._base_refs.clear()
        self.tokens = 0


def kv_bytes_per_token(model: Any, dtype: torch.dtype | None = None) -> int:
    """Bytes of K/V one cached token takes in ``model`` (all layers, keys and values), sampled in
    ``dtype`` (None: the model's)."""
    cfg = model.config
    cfg = getattr(cfg, "text_config", None) or cfg
    heads = int(cfg.num_attention_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    dtype = dtype or next(model.parameters()).dtype
    return 2 * int(cfg.num_hidden_layers) * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()


def memory_bytes(device: torch.device) -> int:
    """Total memory of ``device``: the GPU's, or the host's RAM. Total, not free, so one machine
    resolves the same budget every run (a budget that moved with free memory would change which
    prefixes are reused, and so the sampler's float rounding, between runs of one seed)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def prefix_cache_budget(
    model: Any, working_set: int, share: float = 0.25, floor: int = 65_536, dtype: torch.dtype | None = None
) -> tuple[int, str]:
    """Prefix-cache tokens for ``working_set`` (the tokens of every episode in flight, e.g.
    concurrency x max_context_tokens), at least ``floor`` (the generator's default, so a small wave
    keeps earlier episodes' prefixes, e.g. its group's shared prompt, as before), capped at ``share``
    of the device's memory.

    A lock-step wave reads every episode's cache once per turn, so a budget below the working set
    loses the rows it cannot hold; in a wave the cache and the decode batch hold the same rows at
    different times (entries are dropped while their rows decode), so the budget adds little to the
    peak. Returns ``(tokens, why)``."""
    per_token = kv_bytes_per_token(model, dtype)
    fit = int(share * memory_bytes(next(model.parameters()).device) / per_token)
    wanted = max(working_set, floor)
    tokens = max(0, min(wanted, fit))
    size = f"{tokens * per_token / 2**30:.1f} GiB at {per_token / 1024:.0f} KiB/token"
    if tokens == working_set:
        return tokens, f"{tokens} tokens ({size}): every episode in flight"
    if tokens == wanted:
        return (
            tokens,
            f"{tokens} tokens ({size}): the default, above the {working_set} of every episode in flight",
        )
    return (
        tokens,
        f"{tokens} tokens ({size}): {share:.0%} of the memory, below the {working_set} of every episode in flight",
    )


@functools.cache
def _roomy_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class RoomyLayer(DynamicLayer):
        """Keeps keys/values in a buffer with ``room`` spare positions, so a decode step writes one
        position in place instead of re-concatenating the whole cache (``DynamicLayer``'s
        ``torch.cat``, ~40% of a batch-32 SmolLM2 decode step on CPU). ``keys``/``values`` are views."""

        def __init__(self, room: int) -> None:
            super().__init__()
            self.room = room
            self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n, s = self.get_seq_length(), key_states.shape[-2]
            if self.buffers is None or n + s > self.buffers[0].shape[-2]:
                shape = (*key_states.shape[:2], n + s + self.room)
                # values may be narrower than keys (the hidden-state slot: generators/hidden.py)
                keys = key_states.new_empty((*shape, key_states.shape[-1]))
                values = value_states.new_empty((*shape, value_states.shape[-1]))
                if n:
                    keys[:, :, :n].copy_(self.keys)
                    values[:, :, :n].copy_(self.values)
                self.buffers = (keys, values)
            keys, values = self.buffers
            keys[:, :, n : n + s].copy_(key_states)
            values[:, :, n : n + s].copy_(value_states)
            self.keys, self.values = keys[:, :, : n + s], values[:, :, : n + s]
            return self.keys, self.values

        def adopt(self, keys: torch.Tensor, values: torch.Tensor, n: int) -> None:
            """Take ``keys``/``values`` ``[B, H, n + room, D]`` as the buffers, their first ``n``
            positions filled (no copy)."""
            self.lazy_initialization(keys, values)
            self.buffers = (keys, values)
            self.keys, self.values = keys[:, :, :n], values[:, :, :n]

        def release(self) -> None:
            """Let go of the buffers (the cache is done with)."""
            self.buffers = None
            self.keys = self.values = self.keys.new_empty(0)

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.buffers is not None:
                n = self.get_seq_length()
                self.buffers = (self.buffers[0][indices], self.buffers[1][indices])
                self.keys, self.values = self.buffers[0][:, :, :n], self.buffers[1][:, :, :n]

    return RoomyLayer


def roomy_cache(room: int) -> Any:
    """A transformers ``DynamicCache`` whose layers keep ``room`` spare positions (no per-step concat)."""
    from transformers.cache_utils import Cache, DynamicCache

    cache = DynamicCache()
    Cache.__init__(cache, layer_class_to_replicate=functools.partial(_roomy_layer_class(), room))
    return cache


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists into ``(input_ids [B, L], attention_mask [B, L])``."""
    length = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), length), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        if prompt:
            input_ids[row, length - len(prompt) :] = torch.as_tensor(list(prompt), dtype=torch.long)
            attention[row, length - len(prompt) :] = 1
    return input_ids.to(device), attention.to(device)


def left_padded_cache(rows: list[list[tuple[torch.Tensor, torch.Tensor] | None]], room: int = 0) -> Any:
    """One batch cache (:func:`roomy_cache`) from per-row caches: ``rows[r][layer] = (keys, values)``
    of shape ``[1, H, T_r, D]``, left-padded with zeros to the longest row (the caller's attention
    mask hides the pad positions), with ``room`` spare positions.

    Each row's layer is set to None once copied, so where nothing else holds the row tensors the
    merge needs one batch copy plus one layer, not two copies of everything."""
    length = max(row[0][0].shape[2] for row in rows)  # type: ignore[index]
    cache = roomy_cache(room)
    for layer in range(len(rows[0])):
        k0, v0 = rows[0][layer]  # type: ignore[misc]
        keys = k0.new_zeros((len(rows), k0.shape[1], length + room, k0.shape[3]))  # [B, H, L + room, D]
        values = v0.new_zeros((len(rows), v0.shape[1], length + room, v0.shape[3]))
        for r, row in enumerate(rows):
            k, v = row[layer]  # type: ignore[misc]
            keys[r, :, length - k.shape[2] : length] = k[0]
            values[r, :, length - v.shape[2] : length] = v[0]
            row[layer] = None
        while len(cache.layers) <= layer:
            cache.layers.append(cache.layer_class_to_replicate())
        cache.layers[layer].adopt(keys, values, length)
    return cache
