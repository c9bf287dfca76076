"""Hugging Face transformers generator: batched, left-padded, KV-cached sampling on CPU or GPU.

The reference backend: its own sampling loop (not ``model.generate``) so the log-prob and entropy
it reports are computed from exactly the distribution each token was drawn from (see
:mod:`agentrl.rollout.generators.base` for the convention).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
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
from agentrl.rollout.generators.batch_rows import PaddedRows, SharedPromptRows, decode_rows
from agentrl.rollout.generators.head import last_logits, packed_head_for
from agentrl.rollout.generators.hidden import HiddenTap, row_hidden
from agentrl.rollout.generators.kv_cache import PrefixCache, left_pad, left_padded_cache, roomy_cache
from agentrl.rollout.generators.sampling import hold_stops, sample_next, stop_set, top_pairs
from agentrl.rollout.model import eos_ids, sampling_copy

#: Prompts whose suffix past a cached prefix is at most this many tokens are prefilled together, in
#: one forward over the batch (a tree branch's last observation, a short tool result): alone, each
#: such forward reads every weight for a few tokens (~0.12 s a row for SmolLM2 on 2 CPU cores,
#: whatever the suffix). Longer suffixes are prefilled one row at a time, so a later row of the same
#: wave (a group's shared first prompt) reuses an earlier row's K/V at once.
SHORT_SUFFIX = 64


def _remap_row(
    on_token: TokenCallback, rows: list[int], row: int, token: int, logprob: float, top: Any
) -> bool:
    return on_token(rows[row], token, logprob, top)


class HFGenerator(Generator):
    """Generator over an in-process transformers causal LM (optionally the learner's live model)."""

    name = "hf"
    shared_batches = True
    supports_entropy = True
    supports_score = True
    supports_row_seeds = True
    supports_streaming = True
    supports_top_logprobs = True
    supports_min_tokens = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 32,
        score_batch_size: int = 8,
        seed: int = 0,
        prefix_cache_tokens: int = 65536,
        share_prompts: bool = True,
        sample_dtype: torch.dtype | None = None,
        hidden_layer: int | None = None,
    ):
        """Args:
        max_batch_size: rows decoded together; larger requests are split.
        score_batch_size: rows per forward in :meth:`score`.
        seed: seed of the shared sampling RNG, used by rows without a seed of their own (see
            :meth:`generate`).
        prefix_cache_tokens: K/V tokens kept for prefix reuse across turns (0 disables).
        share_prompts: a batch whose rows repeat prompts (a tree's branches) holds and reads each
            prompt's K/V once (:class:`~agentrl.rollout.generators.batch_rows.SharedPromptRows`;
            needs the prefix cache); False copies it per row.
        sample_dtype: sample from a copy of ``model`` in this dtype (e.g. bfloat16 from a float32 learner),
            which :meth:`update_weights` refreshes; None or the model's dtype: sample from ``model``.
        hidden_layer: keep what this decoder block receives for every token (needs the prefix
            cache; :mod:`.hidden`); generations carry it while :attr:`return_hidden` is set (the
            trainer's rollouts, not its evals). None: not kept.
        """
        if sample_dtype is not None and sample_dtype != next(model.parameters()).dtype:
            model = sampling_copy(model, sample_dtype)
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
        self.share_prompts = share_prompts
        self.head = packed_head_for(model)  # the LM head prepacked on CPU (head.py); None: the model's forward
        if hidden_layer is not None and self.prefix_cache is None:
            raise GeneratorError("keeping hidden states (hidden_layer) needs the prefix cache: prefix_cache_tokens > 0")
        self.tap = HiddenTap(model, hidden_layer) if hidden_layer is not None else None
        if self.tap is not None:  # the hook goes with the generator, not with the model it shares
            weakref.finalize(self, self.tap.remove)
        self.return_hidden = False
        self._ended: collections.deque[tuple[int, ...]] = collections.deque()  # release(): applied under the lock

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
        # the states are kept only while asked for: every runner run starts and ends with an empty
        # prefix cache, so a run's entries all have the slot or none has
        keep = self.tap is not None and self.return_hidden
        with self._lock, self.tap.active() if keep else contextlib.nullcontext():
            self._drop_ended()
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
        stops = stop_set(sampling, self.stop_ids)
        stop = torch.tensor(sorted(stops), dtype=torch.long, device=device)
        batch = len(prompts)
        state = decode_rows(self, prompts, sampling.max_new_tokens)
        logits = state.logits
        prefill_s = time.perf_counter() - t0
        ids: list[list[int]] = [[] for _ in range(batch)]
        logps: list[list[float]] = [[] for _ in range(batch)]
        ents: list[list[float]] = [[] for _ in range(batch)]
        tops: list[list[list[tuple[int, float]]]] = [[] for _ in range(batch)]
        reasons = ["length"] * batch
        hidden: dict[int, tuple[torch.Tensor, ...]] = {}  # prompt index -> kept states (self.return_hidden)
        rows = list(range(batch))  # prompt index of each row still in the batch
        finished = [False] * batch  # per row of the current batch
        for step in range(sampling.max_new_tokens):
            if step < sampling.min_tokens:
                logits = hold_stops(logits, range(len(rows)), stops)
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
                self._store_rows(state, [(r, rows[r]) for r in range(len(rows)) if finished[r]], prompts, ids, hidden)
                index = torch.tensor(keep, device=device)
                state.keep(index)
                tokens = tokens[index]
                rows, finished = [rows[r] for r in keep], [False] * len(keep)
            feed = torch.where(
                torch.tensor(finished, device=device), torch.full_like(tokens, self.pad_id), tokens
            )
            logits = state.advance(feed)  # [B, V]
        self._store_rows(state, list(enumerate(rows)), prompts, ids, hidden, release=True)
        total_s = time.perf_counter() - t0
        timings = {"prefill_s": prefill_s, "generate_s": total_s, "batch": float(batch),
                   "shared_prompts": float(state.shared)}  # fmt: skip
        return [
            GenerationOutput(
                ids=ids[b],
                logprobs=logps[b],
                entropy=ents[b] if sampling.return_entropy else None,
                finish_reason=reasons[b],
                timings=dict(timings),
                top_logprobs=tops[b] if sampling.top_logprobs else None,
                hidden=hidden.get(b),
            )
            for b in range(batch)
        ]

    def _logits(self, **inputs: Any) -> torch.Tensor:
        """Logits ``[B, V]`` at the last position of a cached forward over ``inputs`` (a prefill or a
        decode step), through the prepacked head where there is one (:mod:`.head`)."""
        return last_logits(self.model, self.head, **inputs)

    def _store_rows(
        self,
        state: PaddedRows | SharedPromptRows,
        rows: list[tuple[int, int]],
        prompts: list[Sequence[int]],
        ids: list[list[int]],
        hidden: dict[int, tuple[torch.Tensor, ...]],
        *,
        release: bool = False,
    ) -> None:
        """Put the K/V of ``(batch row, prompt index)`` pairs in the prefix cache: prompt + sampled ids
        but the last (never fed). ``release``: the batch is done (:meth:`PaddedRows.kv_rows`). With
        :attr:`return_hidden`, ``hidden[prompt index]`` gets the row's kept states (:mod:`.hidden`)."""
        if self.prefix_cache is None:
            return
        kvs = state.kv_rows([(r, b, len(ids[b]) - 1) for r, b in rows], release=release)
        for (_, b), (kv, base) in zip(rows, kvs, strict=True):
            self.prefix_cache.store(list(prompts[b]) + ids[b][:-1], kv, base)
            if self.tap is not None and self.return_hidden:
                hidden[b] = row_hidden(kv, base, self.tap.slot)

    def _prefill_with_prefix_cache(
        self, prompts: list[Sequence[int]], room: int
    ) -> tuple[Any, torch.Tensor, torch.Tensor, list[int]]:
        """Prefill each prompt from its cached prefix (:meth:`_prefill_rows`); merge into one
        left-padded batch cache with ``room`` spare positions per layer.

        Returns ``(cache, last_logits [B, V], attention_mask [B, L], left pads per row)``.
        """
        rows_kv, rows_logits = self._prefill_rows(prompts)
        device = self.device
        length = max(len(p) for p in prompts)
        pads = [length - len(p) for p in prompts]
        attention = torch.zeros((len(prompts), length), dtype=torch.long, device=device)
        for row, pad in enumerate(pads):
            attention[row, pad:] = 1
        cache = left_padded_cache(rows_kv, room)
        return cache, torch.stack(rows_logits), attention, pads

    def _prefill_rows(self, prompts: list[Sequence[int]]) -> tuple[list[Any], list[torch.Tensor]]:
        """Prefill each prompt from its cached prefix: a long suffix alone (a later row may reuse it at
        once), the short ones together (:data:`SHORT_SUFFIX`).

        Returns ``(K/V per row: [(keys, values) [1, H, len(prompt), D] per layer], last logits [V] per row)``.
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
        rows_kv: list[Any] = [None] * len(prompts)
        rows_logits: list[Any] = [None] * len(prompts)
        prompt_keys: list[int | None] = []
        short: list[tuple[int, int, Any]] = []  # (row, cached tokens, their K/V): prefilled together below
        for row, prompt in enumerate(prompts):
            n, kv = self.prefix_cache.lookup(prompt, pins[row], among=prompt_keys)
            pins[row] = None
            if n and len(prompt) - n <= SHORT_SUFFIX:
                short.append((row, n, kv))
                continue
            row_cache = roomy_cache(0)
            if kv is not None:
                for layer, (k, v) in enumerate(kv):
                    row_cache.update(k.to(device), v.to(device), layer)
            suffix = torch.tensor([list(prompt[n:])], dtype=torch.long, device=device)  # [1, S]
            logits = self._logits(
                input_ids=suffix,
                attention_mask=torch.ones((1, len(prompt)), dtype=torch.long, device=device),
                position_ids=torch.arange(n, len(prompt), device=device)[None],
                past_key_values=row_cache,
            )
            rows_logits[row] = logits[0]
            rows_kv[row] = [(layer.keys, layer.values) for layer in row_cache.layers]
            # later rows of this batch (group rollouts of one task) reuse this prompt at once
            prompt_keys.append(self.prefix_cache.store(prompt, rows_kv[row]))
            del row_cache
        if short:
            self._prefill_together(prompts, short, rows_kv, rows_logits)
        # Every row stores prompt + sampled ids when it ends, which covers its prompt: the prompt
        # entries would only double the batch's K/V while it decodes.
        self.prefix_cache.discard(prompt_keys)
        return rows_kv, rows_logits

    def _prefill_together(
        self, prompts: list[Sequence[int]], short: list[tuple[int, int, Any]], rows_kv: list[Any], rows_logits: list[Any]
    ) -> None:
        """Prefill the ``short`` rows (``(row, cached tokens, their K/V)``) in one forward over
        their last ``width`` tokens, ``width`` the longest uncached suffix among them: each row
        starts from its cached K/V of all but its last ``width`` tokens (left-padded into one batch
        cache) and feeds those tokens (a row shorter than ``width`` feeds all of it, left-padded).
        Sets ``rows_kv[row]`` (views of the batch cache, the row's prompt without padding) and
        ``rows_logits[row]``."""
        device = self.device
        width = max(len(prompts[row]) - n for row, n, _ in short)
        keeps = [max(len(prompts[row]) - width, 0) for row, _, _ in short]  # cached tokens each row starts from
        past_len = max(keeps)
        cache = roomy_cache(0)
        if past_len:
            template = next(kv for (_, _, kv), keep in zip(short, keeps, strict=True) if keep)
            past = [
                [(k[:, :, :keep].to(device), v[:, :, :keep].to(device)) for k, v in kv]
                if keep
                else [(k[:, :, :0], v[:, :, :0]) for k, v in template]
                for (_, _, kv), keep in zip(short, keeps, strict=True)
            ]
            cache = left_padded_cache(past, room=width)
        fed = [list(prompts[row][keep:]) for (row, _, _), keep in zip(short, keeps, strict=True)]
        input_ids, input_mask = left_pad(fed, self.pad_id, device)  # [B, width]
        attention = torch.zeros((len(short), past_len), dtype=torch.long, device=device)
        for i, keep in enumerate(keeps):
            attention[i, past_len - keep :] = 1
        attention = torch.cat([attention, input_mask], -1)  # [B, past_len + width]
        offsets = torch.tensor(keeps, device=device)[:, None] - (width - input_mask.sum(-1, keepdim=True))
        positions = (offsets + torch.arange(width, device=device)[None]).clamp(min=0)  # [B, width]
        logits = self._logits(
            input_ids=input_ids, attention_mask=attention, position_ids=positions, past_key_values=cache
        )
        end = past_len + width
        for i, (row, _, _) in enumerate(short):
            start = end - len(prompts[row])
            rows_kv[row] = [
                (layer.keys[i : i + 1, :, start:end], layer.values[i : i + 1, :, start:end]) for layer in cache.layers
            ]
            rows_logits[row] = logits[i]

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
                self._ended.clear()

    def release(self, ids: Sequence[int]) -> None:
        """An ended episode's cache entry goes at the next generate call (queued: the caller, the
        runner's event loop, must not wait for the lock a decoding batch holds). An eval's 16
        episodes in flight then hold the cache, not also the last entries of every episode that
        ended before them until LRU pressure evicts them (up to ``prefix_cache_tokens`` of K/V)."""
        if self.prefix_cache is not None:
            self._ended.append(tuple(ids))

    def _drop_ended(self) -> None:
        """Under the lock: drop the entries of the episodes :meth:`release` queued."""
        while self._ended:
            ids = self._ended.popleft()
            if self.prefix_cache is not None:
                self.prefix_cache.discard_within(ids)

    def prefix_reuse(self) -> tuple[int, int]:
        cache = self.prefix_cache
        return (cache.asked_tokens, cache.reused_tokens) if cache is not None else (0, 0)

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

    @contextlib.contextmanager
    def sampling_in(self, dtype: torch.dtype | None) -> Iterator[None]:
        """Inside the block, sample from a copy of the model in ``dtype`` (``train.eval_sampler_dtype``:
        a held-out eval in bfloat16 from a float32 learner), made from the current weights and freed
        after it; the prefix cache is emptied on the way in and out (its K/V are the other
        model's). None or the model's own dtype: the model itself."""
        if dtype is None or dtype == next(self.model.parameters()).dtype:
            yield
            return
        model, head = self.model, self.head
        self.reset_cache()
        with self._lock:
            self.model = sampling_copy(model, dtype)
            self.head = packed_head_for(self.model)
        try:
            yield
        finally:
            with self._lock:
                self.model, self.head = model, head
            self.reset_cache()
