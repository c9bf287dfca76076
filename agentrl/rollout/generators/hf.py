"""Hugging Face transformers generator: batched, left-padded, KV-cached sampling on CPU or GPU.

The reference backend: its own sampling loop (not ``model.generate``) so the log-prob and entropy
it reports are computed from exactly the distribution each token was drawn from (see
:mod:`agentrl.rollout.generators.base` for the convention).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from agentrl.errors import GeneratorError
from agentrl.rollout.generators.base import (
    GenerationOutput,
    Generator,
    SamplingParams,
    TokenCallback,
    check_prompts,
    derive_seed,
)
from agentrl.rollout.generators.sampling import sample_next, top_pairs


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every id that ends an assistant turn: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None) if config is not None else None
    if isinstance(eos, int):
        ids.add(eos)
    elif eos:
        ids.update(int(e) for e in eos)
    return ids


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


def _remap_row(
    on_token: TokenCallback, rows: list[int], row: int, token: int, logprob: float, top: Any
) -> bool:
    return on_token(rows[row], token, logprob, top)


class PrefixCache:
    """KV caches of recent sequences, so a multi-turn prompt only prefills its new suffix.

    An agent's next prompt is its previous prompt + the sampled ids + the bridge ids; the cache
    entry of the previous call covers all but its last sampled token. Bounded by total tokens
    (LRU); cleared on weight updates.
    """

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.entries: OrderedDict[int, tuple[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]]] = (
            OrderedDict()
        )
        self.tokens = 0
        self.hits = 0
        self.reused_tokens = 0
        self._next = 0

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
        """Per-layer k/v views of entry ``key``'s first ``n`` positions."""
        return [(k[:, :, :n], v[:, :, :n]) for k, v in self.entries[key][1]]

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

    def store(self, ids: Sequence[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> int | None:
        """Keep ``kv`` for ``ids`` (dropping entries it extends, then the least recently used past
        the budget); returns the entry's key, or None when it is longer than the whole budget."""
        if not ids or len(ids) > self.max_tokens:
            return None
        ids = tuple(ids)
        for key, (old, _) in list(self.entries.items()):  # superseded: an earlier turn of this sequence
            if len(old) <= len(ids) and ids[: len(old)] == old:
                del self.entries[key]
                self.tokens -= len(old)
        self.entries[self._next] = (ids, kv)
        self._next += 1
        self.tokens += len(ids)
        while self.tokens > self.max_tokens and self.entries:
            _, (old, _) = self.entries.popitem(last=False)
            self.tokens -= len(old)
        return self._next - 1 if self._next - 1 in self.entries else None

    def discard(self, keys: Iterable[int | None]) -> None:
        """Drop the entries ``keys`` (those still held)."""
        for key in keys:
            entry = self.entries.pop(key, None) if key is not None else None
            if entry is not None:
                self.tokens -= len(entry[0])

    def clear(self) -> None:
        self.entries.clear()
        self.tokens = 0


def kv_bytes_per_token(model: Any) -> int:
    """Bytes of K/V one cached token takes in ``model`` (all layers, keys and values)."""
    cfg = model.config
    cfg = getattr(cfg, "text_config", None) or cfg
    heads = int(cfg.num_attention_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    dtype = next(model.parameters()).dtype
    return 2 * int(cfg.num_hidden_layers) * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()


def memory_bytes(device: torch.device) -> int:
    """Total memory of ``device``: the GPU's, or the host's RAM. Total, not free, so one machine
    resolves the same budget every run (a budget that moved with free memory would change which
    prefixes are reused, and so the sampler's float rounding, between runs of one seed)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def prefix_cache_budget(
    model: Any, working_set: int, share: float = 0.25, floor: int = 65_536
) -> tuple[int, str]:
    """Prefix-cache tokens for ``working_set`` (the tokens of every episode in flight, e.g.
    concurrency x max_context_tokens), at least ``floor`` (the generator's default, so a small wave
    keeps earlier episodes' prefixes, e.g. its group's shared prompt, as before), capped at ``share``
    of the device's memory.

    A lock-step wave reads every episode's cache once per turn, so a budget below the working set
    loses the rows it cannot hold; in a wave the cache and the decode batch hold the same rows at
    different times (entries are dropped while their rows decode), so the budget adds little to the
    peak. Returns ``(tokens, why)``."""
    per_token = kv_bytes_per_token(model)
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
                shape = (*key_states.shape[:2], n + s + self.room, key_states.shape[-1])
                keys, values = key_states.new_empty(shape), value_states.new_empty(shape)
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


class HFGenerator(Generator):
    """Generator over an in-process transformers causal LM (optionally the learner's live model)."""

    name = "hf"
    shared_batches = True
    supports_entropy = True
    supports_score = True
    supports_row_seeds = True
    supports_streaming = True
    supports_top_logprobs = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 32,
        score_batch_size: int = 8,
        seed: int = 0,
        prefix_cache_tokens: int = 65536,
    ):
        """Args:
        max_batch_size: rows decoded together; larger requests are split.
        score_batch_size: rows per forward in :meth:`score`.
        seed: seed of the shared sampling RNG, used by rows without a seed of their own (see
            :meth:`generate`).
        prefix_cache_tokens: K/V tokens kept for prefix reuse across turns (0 disables).
        """
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.score_batch_size = score_batch_size
        self.stop_ids = eos_ids(model, tokenizer)
        if not self.stop_ids:
            raise GeneratorError("the tokenizer has no EOS id; pass a tokenizer with eos_token set")
        self.pad_id = int(
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.stop_ids)
        )
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self._rng = torch.Generator(device="cpu").manual_seed(seed)
        self._lock = threading.Lock()
        # 0 disables; SmolLM2 keeps ~46 KB of fp32 K/V per token
        self.prefix_cache = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens > 0 else None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingParams,
        on_token: TokenCallback | None = None,
        *,
        seeds: Sequence[int | None] | None = None,
    ) -> list[GenerationOutput]:
        """Sample one continuation per prompt.

        Randomness: prompt ``i`` samples from its own stream, seeded by ``seeds[i]`` when given,
        else by ``(sampling.seed, i)`` when the request has a seed, else it draws from the
        generator's shared stream (then its tokens depend on what was sampled before). A seeded
        row's continuation is the same in any batch, at any batch size.
        """
        check_prompts(prompts, self.vocab_size)
        if seeds is not None and len(seeds) != len(prompts):
            raise GeneratorError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        longest = max((len(p) for p in prompts), default=0)
        if longest + sampling.max_new_tokens > self.max_positions:
            raise GeneratorError(
                f"prompt of {longest} tokens + {sampling.max_new_tokens} new tokens exceeds the model's "
                f"{self.max_positions} positions; lower rollout.max_context_tokens"
            )
        if seeds is None and sampling.seed is not None:
            seeds = [derive_seed(sampling.seed, i) for i in range(len(prompts))]
        outputs: list[GenerationOutput | None] = [None] * len(prompts)
        # Similar lengths share a batch, so less padding is computed.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        with self._lock:
            rngs = [
                self._rng if seeds is None or seeds[i] is None else torch.Generator().manual_seed(seeds[i])
                for i in range(len(prompts))
            ]
            for start in range(0, len(order), self.max_batch_size):
                chunk = order[start : start + self.max_batch_size]
                callback = None
                if on_token is not None:
                    callback = functools.partial(_remap_row, on_token, chunk)
                batch_out = self._generate_batch(
                    [prompts[i] for i in chunk], sampling, [rngs[i] for i in chunk], callback
                )
                for idx, out in zip(chunk, batch_out, strict=True):
                    outputs[idx] = out
        return outputs  # type: ignore[return-value]

    @torch.no_grad()
    def _generate_batch(
        self,
        prompts: list[Sequence[int]],
        sampling: SamplingParams,
        rngs: list[torch.Generator],
        on_token: TokenCallback | None = None,
    ) -> list[GenerationOutput]:
        """Prefill, then decode the batch step by step. Rows that stopped leave the batch once a
        quarter of it has (their cache rows are dropped), so the rest decode at a smaller batch."""
        t0 = time.perf_counter()
        device = self.device
        stop = torch.tensor(sorted(self.stop_ids | set(sampling.stop_ids)), device=device)
        batch = len(prompts)
        room = sampling.max_new_tokens
        if self.prefix_cache is not None:
            cache, logits, attention, pads = self._prefill_with_prefix_cache(prompts, room)
        else:
            input_ids, attention = left_pad(prompts, self.pad_id, device)  # [B, L]
            pads = [input_ids.shape[1] - len(p) for p in prompts]
            cache = roomy_cache(room)
            logits = self._prefill(
                input_ids=input_ids,
                attention_mask=attention,
                position_ids=(attention.cumsum(-1) - 1).clamp(min=0),
                past_key_values=cache,
            )
        prefill_s = time.perf_counter() - t0
        last_pos = (attention.cumsum(-1) - 1).clamp(min=0)[:, -1:]  # [B, 1]
        ids: list[list[int]] = [[] for _ in range(batch)]
        logps: list[list[float]] = [[] for _ in range(batch)]
        ents: list[list[float]] = [[] for _ in range(batch)]
        tops: list[list[list[tuple[int, float]]]] = [[] for _ in range(batch)]
        reasons = ["length"] * batch
        rows = list(range(batch))  # prompt index of each row still in the batch
        finished = [False] * batch  # per row of the current batch
        for step in range(sampling.max_new_tokens):
            tokens, logp, entropy, dist = sample_next(logits, sampling, [rngs[b] for b in rows])
            is_stop = torch.isin(tokens, stop)
            tok_l, lp_l, ent_l, stop_l = tokens.tolist(), logp.tolist(), entropy.tolist(), is_stop.tolist()
            top_l = top_pairs(dist, sampling.top_logprobs)
            for r, b in enumerate(rows):
                if finished[r]:
                    continue
                ids[b].append(tok_l[r])
                logps[b].append(lp_l[r])
                ents[b].append(ent_l[r])
                if top_l is not None:
                    tops[b].append(top_l[r])
                ended = on_token(b, tok_l[r], lp_l[r], top_l[r] if top_l else None) if on_token else False
                if stop_l[r] or ended:
                    finished[r] = True
                    reasons[b] = "stop"
            if all(finished) or step + 1 == sampling.max_new_tokens:
                break
            if sum(finished) * 4 >= len(rows):  # drop the stopped rows
                keep = [r for r in range(len(rows)) if not finished[r]]
                self._store_rows(
                    cache, [(r, rows[r]) for r in range(len(rows)) if finished[r]], prompts, ids, pads
                )
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                attention, last_pos, tokens = attention[index], last_pos[index], tokens[index]
                rows, finished = [rows[r] for r in keep], [False] * len(keep)
            feed = torch.where(
                torch.tensor(finished, device=device), torch.full_like(tokens, self.pad_id), tokens
            )
            attention = torch.cat(
                [attention, torch.ones((len(rows), 1), dtype=attention.dtype, device=device)], -1
            )
            last_pos = last_pos + 1
            out = self.model(
                input_ids=feed[:, None],
                attention_mask=attention,
                position_ids=last_pos,
                past_key_values=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1, :]  # [B, V]
        self._store_rows(cache, list(enumerate(rows)), prompts, ids, pads, release=True)
        total_s = time.perf_counter() - t0
        timings = {"prefill_s": prefill_s, "generate_s": total_s, "batch": float(batch)}
        return [
            GenerationOutput(
                ids=ids[b],
                logprobs=logps[b],
                entropy=ents[b] if sampling.return_entropy else None,
                finish_reason=reasons[b],
                timings=dict(timings),
                top_logprobs=tops[b] if sampling.top_logprobs else None,
            )
            for b in range(batch)
        ]

    def _prefill(self, **inputs: Any) -> torch.Tensor:
        """Logits ``[B, V]`` at the last position of a cached forward over ``inputs``."""
        return self.model(**inputs, use_cache=True, logits_to_keep=1).logits[:, -1, :]

    def _store_rows(
        self,
        cache: Any,
        rows: list[tuple[int, int]],
        prompts: list[Sequence[int]],
        ids: list[list[int]],
        pads: list[int],
        *,
        release: bool = False,
    ) -> None:
        """Put the K/V of ``(cache row, prompt index)`` pairs in the prefix cache: prompt + sampled ids
        but the last (never fed). ``release``: the batch is done, so each layer's buffers are let go
        once copied (one batch copy plus one layer at a time, not two)."""
        if self.prefix_cache is None:
            return
        fed = [list(prompts[b]) + ids[b][:-1] for _, b in rows]
        spans = [slice(pads[b], pads[b] + len(f)) for (_, b), f in zip(rows, fed, strict=True)]
        kvs: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in rows]
        for layer in cache.layers:
            for kv, (r, _), span in zip(kvs, rows, spans, strict=True):
                kv.append((layer.keys[r : r + 1, :, span].clone(), layer.values[r : r + 1, :, span].clone()))
            if release:
                layer.release()
        for f, kv in zip(fed, kvs, strict=True):
            self.prefix_cache.store(f, kv)

    def _prefill_with_prefix_cache(
        self, prompts: list[Sequence[int]], room: int
    ) -> tuple[Any, torch.Tensor, torch.Tensor, list[int]]:
        """Prefill each prompt alone, reusing its cached prefix; merge into one left-padded batch cache
        with ``room`` spare positions per layer.

        Returns ``(cache, last_logits [B, V], attention_mask [B, L], left pads per row)``.
        """
        assert self.prefix_cache is not None
        device = self.device
        # Each row's cached prefix is found (and held) before any prompt is stored: in a lock-step
        # wave the least recently used entries are the rows about to be read, so storing first
        # would evict them one by one and no row would hit once the wave outgrows the budget.
        pins: list[Any] = []
        for prompt in prompts:
            key, n = self.prefix_cache.find(prompt)
            pins.append((n, self.prefix_cache.view(key, n)) if key is not None else (0, None))
        rows_kv: list[list[Any]] = []
        rows_logits, prompt_keys = [], []
        for row, prompt in enumerate(prompts):
            n, kv = self.prefix_cache.lookup(prompt, pins[row], among=prompt_keys)
            pins[row] = None
            row_cache = roomy_cache(0)
            if kv is not None:
                for layer, (k, v) in enumerate(kv):
                    row_cache.update(k.to(device), v.to(device), layer)
            suffix = torch.tensor([list(prompt[n:])], dtype=torch.long, device=device)  # [1, S]
            logits = self._prefill(
                input_ids=suffix,
                attention_mask=torch.ones((1, len(prompt)), dtype=torch.long, device=device),
                position_ids=torch.arange(n, len(prompt), device=device)[None],
                past_key_values=row_cache,
            )
            rows_logits.append(logits[0])
            rows_kv.append([(layer.keys, layer.values) for layer in row_cache.layers])
            # later rows of this batch (group rollouts of one task) reuse this prompt at once
            prompt_keys.append(self.prefix_cache.store(prompt, rows_kv[-1]))
        del row_cache
        # Every row stores prompt + sampled ids when it ends, which covers its prompt: the prompt
        # entries would only double the batch's K/V while it decodes.
        self.prefix_cache.discard(prompt_keys)
        length = max(len(p) for p in prompts)
        pads = [length - len(p) for p in prompts]
        attention = torch.zeros((len(prompts), length), dtype=torch.long, device=device)
        for row, pad in enumerate(pads):
            attention[row, pad:] = 1
        cache = left_padded_cache(rows_kv, room)
        return cache, torch.stack(rows_logits), attention, pads

    # ------------------------------------------------------------------ scoring
    @torch.no_grad()
    def score(
        self, contexts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], *, temperature: float = 1.0
    ) -> list[list[float]]:
        if len(contexts) != len(targets):
            raise GeneratorError(f"{len(contexts)} contexts but {len(targets)} targets")
        check_prompts(contexts, self.vocab_size)
        results: list[list[float]] = []
        with self._lock:
            for start in range(0, len(contexts), self.score_batch_size):
                ctx = contexts[start : start + self.score_batch_size]
                tgt = targets[start : start + self.score_batch_size]
                results += self._score_batch(ctx, tgt, temperature)
        return results

    def _score_batch(
        self, contexts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], temperature: float
    ) -> list[list[float]]:
        seqs = [list(c) + list(t) for c, t in zip(contexts, targets, strict=True)]
        span = max(len(t) for t in targets)
        if span == 0:
            return [[] for _ in targets]
        input_ids, attention = left_pad(seqs, self.pad_id, self.device)  # [B, L]
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(
            input_ids=input_ids, attention_mask=attention, position_ids=positions, logits_to_keep=span + 1
        ).logits[:, :-1, :]  # [B, span, V]: predictions for the last `span` tokens
        logp = torch.log_softmax(logits.float() / temperature, dim=-1)
        taken = input_ids[:, -span:]  # [B, span]
        token_logp = logp.gather(-1, taken[..., None]).squeeze(-1)  # [B, span]
        return [token_logp[b, span - len(t) :].tolist() if t else [] for b, t in enumerate(targets)]

    def reset_cache(self) -> None:
        if self.prefix_cache is not None:
            with self._lock:
                self.prefix_cache.clear()

    # ------------------------------------------------------------------ weights
    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        params = dict(self.model.named_parameters())
        if self.prefix_cache is not None:
            self.prefix_cache.clear()  # cached K/V came from the old weights
        with self._lock, torch.no_grad():
            for name, tensor in named_tensors:
                if name not in params:
                    raise GeneratorError(f"update_weights: the model has no parameter {name!r}")
                params[name].copy_(tensor.to(params[name].device, params[name].dtype))
