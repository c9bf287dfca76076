"""Continuous batching for ``agentrl serve`` over the in-process Hugging Face model.

The :class:`~agentrl.rollout.batcher.Batcher` runs one batched ``generate`` call at a time: a
request that arrives while a batch decodes waits for the whole batch to finish. Here one worker
thread keeps a running batch instead. Between two decode steps it admits the requests that have
arrived (up to ``max_batch_size`` rows): their prompts are prefilled (reusing cached prefixes, as
the generator does), their first token is sampled, and their K/V joins the running batch's
left-padded cache; a row that ends (EOS, stop token, its own ``max_tokens``, a stop string or a
client that went away, through its ``on_token`` callback) leaves the batch at once and answers its
request. Every row keeps its own sampling parameters (temperature, top-p, top-k, seed, stop ids,
max tokens, top log-probs), so requests never wait for others with the same parameters.

Sampling is the generator's (:func:`~agentrl.rollout.generators.sampling.sample_next`: one stream per
seeded row), so log-probs follow :mod:`agentrl.rollout.generators.base`'s convention. Requests are
checked alone against the model's positions before they queue (:func:`check_fits`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentrl.rollout.batcher import RequestCallback
from agentrl.rollout.generators.base import GenerationOutput, SamplingParams, check_fits, check_prompts
from agentrl.rollout.generators.hf import HFGenerator, left_pad
from agentrl.rollout.generators.kv_cache import roomy_cache
from agentrl.rollout.generators.sampling import hold_stops, sample_next, stop_set, top_pairs


@dataclass
class _Row:
    """One request: its prompt, what it sampled so far and how to answer it."""

    prompt: list[int]
    sampling: SamplingParams
    on_token: RequestCallback | None
    future: asyncio.Future = field(repr=False)
    loop: asyncio.AbstractEventLoop = field(repr=False)
    rng: torch.Generator | None = field(default=None, repr=False)
    stops: frozenset[int] = frozenset()  # ids that end it (EOS unless ignore_eos, its stop ids)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    reason: str = "length"
    queued_at: float = field(default_factory=time.perf_counter)
    prefill_s: float = 0.0
    batch: int = 0  # the largest batch it decoded in

    @property
    def group(self) -> tuple[float, float, int]:
        s = self.sampling
        return (s.temperature, s.top_p, s.top_k)


def _merge_layer(a: torch.Tensor, b: torch.Tensor, length: int, room: int) -> torch.Tensor:
    """Two left-padded ``[B, H, T, D]`` blocks right-aligned in one ``[Ba + Bb, H, length + room, D]``."""
    out = a.new_zeros((a.shape[0] + b.shape[0], a.shape[1], length + room, a.shape[3]))
    out[: a.shape[0], :, length - a.shape[2] : length] = a
    out[a.shape[0] :, :, length - b.shape[2] : length] = b
    return out


class ContinuousBatcher:
    """Continuous batching over an :class:`HFGenerator` (see the module doc); ``submit`` has the
    :class:`~agentrl.rollout.batcher.Batcher` signature, so ``agentrl serve`` uses either."""

    def __init__(self, generator: HFGenerator, *, max_batch_size: int | None = None):
        self.generator = generator
        self.max_batch_size = max_batch_size or generator.max_batch_size
        self.requests = 0
        self.generated_tokens = 0
        self.steps = 0  # decode steps run
        self.joined = 0  # rows admitted while others were decoding
        self.computing = False  # inside a prefill or decode step (a stream's keep-alive reads it)
        self._pending: list[_Row] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        # the running batch
        self._rows: list[_Row] = []
        self._cache: Any = None
        self._attention: torch.Tensor | None = None  # [B, L]
        self._positions: torch.Tensor | None = None  # [B, 1] position of each row's next fed token
        self._next: torch.Tensor | None = None  # [B] sampled, not yet fed

    async def submit(
        self, prompt: Sequence[int], sampling: SamplingParams, on_token: RequestCallback | None = None
    ) -> GenerationOutput:
        """Queue one prompt; its continuation once its row ends (``on_token``: as in the Batcher)."""
        check_prompts([prompt], self.generator.vocab_size)  # before the row joins: a bad id fails it alone
        check_fits(len(prompt), sampling.max_new_tokens, self.generator.max_positions)
        loop = asyncio.get_running_loop()
        row = _Row(list(prompt), sampling, on_token, loop.create_future(), loop)
        row.stops = frozenset(stop_set(sampling, self.generator.stop_ids))
        if sampling.seed is not None:
            row.rng = torch.Generator().manual_seed(sampling.seed)
        with self._lock:
            self._pending.append(row)
            if self._thread is None or not self._thread.is_alive():
                self._stopping = False
                self._thread = threading.Thread(target=self._run, name="agentrl-continuous", daemon=True)
                self._thread.start()
        self._wake.set()
        self.requests += 1
        return await row.future

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30)

    # ------------------------------------------------------------------ worker thread
    def _run(self) -> None:
        while not self._stopping:
            if not self._rows:
                self._wake.wait(timeout=0.5)
            self._wake.clear()
            with self._lock:
                room = self.max_batch_size - len(self._rows)
                admitted, self._pending = self._pending[:room], self._pending[room:]
            if not admitted and not self._rows:
                continue
            try:
                with self.generator._lock, torch.no_grad():
                    self.computing = True
                    if admitted:
                        self._admit(admitted)
                    if self._rows:
                        self._step()
            except Exception as exc:  # noqa: BLE001 - handed to every waiting request, which reports it
                for row in [*self._rows, *admitted]:
                    self._answer(row, exc)
                self._reset()
            finally:
                self.computing = False
        for row in [*self._rows, *self._pending]:
            self._answer(row, asyncio.CancelledError())
        self._reset()

    def _reset(self) -> None:
        self._rows, self._cache, self._attention, self._positions, self._next = [], None, None, None, None

    def _answer(self, row: _Row, result: GenerationOutput | BaseException) -> None:
        def settle() -> None:
            if row.future.done():
                return
            if isinstance(result, asyncio.CancelledError):
                row.future.cancel()
            elif isinstance(result, BaseException):
                row.future.set_exception(result)
            else:
                row.future.set_result(result)

        try:
            row.loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the caller's loop is closed: nobody waits for this answer
            pass

    def _prefill(self, rows: list[_Row], room: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """``(cache, last logits [n, V], attention [n, L])`` of the new rows' prompts."""
        gen = self.generator
        prompts = [row.prompt for row in rows]
        if gen.prefix_cache is not None:
            cache, logits, attention, _ = gen._prefill_with_prefix_cache(prompts, room)
            return cache, logits, attention
        input_ids, attention = left_pad(prompts, gen.pad_id, gen.device)  # [n, L]
        cache = roomy_cache(room)
        logits = gen._logits(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=(attention.cumsum(-1) - 1).clamp(min=0),
            past_key_values=cache,
        )
        return cache, logits, attention

    def _admit(self, new: list[_Row]) -> None:
        """Prefill the new rows, sample their first token and join them to the running batch."""
        t0 = time.perf_counter()
        room = max(r.sampling.max_new_tokens for r in [*self._rows, *new])
        cache, logits, attention = self._prefill(new, room)
        for row in new:
            row.prefill_s = time.perf_counter() - t0
        keep = self._sample(new, logits)
        if not keep:
            for layer in cache.layers:
                layer.release()
            return
        device = self.generator.device
        index = torch.tensor(keep, device=device)
        if len(keep) < len(new):
            cache.batch_select_indices(index)
            attention = attention[index]
        new_rows = [new[i] for i in keep]
        positions = attention.sum(-1, keepdim=True)  # [n, 1]: the prompt's length
        tokens = torch.tensor([row.ids[-1] for row in new_rows], device=device)
        if not self._rows:
            self._rows, self._cache, self._attention = new_rows, cache, attention
            self._positions, self._next = positions, tokens
            return
        self.joined += len(new_rows)
        assert self._attention is not None and self._positions is not None and self._next is not None
        # drop the left columns no running row uses any more, then right-align both batches
        start = int((self._attention.cumsum(-1) == 0).sum(-1).min())
        running = self._attention[:, start:]
        length = max(running.shape[1], attention.shape[1])
        merged = roomy_cache(room)
        for layer, (old, add) in enumerate(zip(self._cache.layers, cache.layers, strict=True)):
            keys = _merge_layer(old.keys[:, :, start:], add.keys, length, room)
            values = _merge_layer(old.values[:, :, start:], add.values, length, room)
            old.release()
            add.release()
            while len(merged.layers) <= layer:
                merged.layers.append(merged.layer_class_to_replicate())
            merged.layers[layer].adopt(keys, values, length)
        pad = running.new_zeros
        self._attention = torch.cat(
            [
                torch.cat([pad((running.shape[0], length - running.shape[1])), running], -1),
                torch.cat([pad((attention.shape[0], length - attention.shape[1])), attention], -1),
            ]
        )
        self._cache = merged
        self._rows = [*self._rows, *new_rows]
        self._positions = torch.cat([self._positions, positions])
        self._next = torch.cat([self._next, tokens])

    def _sample(self, rows: list[_Row], logits: torch.Tensor) -> list[int]:
        """Sample one token per row (each with its own parameters; no stop id before its
        ``min_tokens``), record it, and return the indices of the rows that go on."""
        gen = self.generator
        tokens = [0] * len(rows)
        logps = [0.0] * len(rows)
        ents = [0.0] * len(rows)
        tops: list[Any] = [None] * len(rows)
        groups: dict[tuple[float, float, int], list[int]] = {}
        for i, row in enumerate(rows):
            groups.setdefault(row.group, []).append(i)
        for members in groups.values():
            sampling = rows[members[0]].sampling
            rngs = [rows[i].rng or gen._rng for i in members]
            part = (
                logits if len(members) == len(rows) else logits[torch.tensor(members, device=logits.device)]
            )
            held: dict[frozenset[int], list[int]] = {}  # rows short of min_tokens, by their stop ids
            for j, i in enumerate(members):
                if len(rows[i].ids) < rows[i].sampling.min_tokens:
                    held.setdefault(rows[i].stops, []).append(j)
            for stops, js in held.items():
                part = hold_stops(part, js, stops)
            tok, logp, ent, dist = sample_next(part, sampling, rngs)
            k = max(rows[i].sampling.top_logprobs for i in members)
            top = top_pairs(dist, k)
            for j, (i, t, lp, e) in enumerate(
                zip(members, tok.tolist(), logp.tolist(), ent.tolist(), strict=True)
            ):
                tokens[i], logps[i], ents[i] = t, lp, e
                if top is not None:
                    tops[i] = top[j][: rows[i].sampling.top_logprobs]
        keep = []
        for i, row in enumerate(rows):
            row.ids.append(tokens[i])
            row.logprobs.append(logps[i])
            row.entropy.append(ents[i])
            if row.sampling.top_logprobs:
                row.top.append(tops[i])
            row.batch = max(row.batch, len(rows))
            ended = row.on_token(tokens[i], logps[i], tops[i]) if row.on_token is not None else False
            if tokens[i] in row.stops or ended:
                row.reason = "stop"
                self._finish(row, None)
            elif len(row.ids) >= row.sampling.max_new_tokens:
                self._finish(row, None)
            else:
                keep.append(i)
        return keep

    def _step(self) -> None:
        """Feed every row its last token, sample the next; rows that end leave the batch."""
        assert self._attention is not None and self._positions is not None and self._next is not None
        device = self.generator.device
        self._attention = torch.cat(
            [self._attention, torch.ones((len(self._rows), 1), dtype=self._attention.dtype, device=device)],
            -1,
        )
        logits = self.generator._logits(
            input_ids=self._next[:, None],
            attention_mask=self._attention,
            position_ids=self._positions,
            past_key_values=self._cache,
        )
        self.steps += 1
        self._positions = self._positions + 1
        rows = self._rows
        keep = self._sample(rows, logits)
        for i, row in enumerate(rows):
            if i not in keep:
                self._store(i, row)
        if len(keep) == len(rows):
            self._next = torch.tensor([row.ids[-1] for row in rows], device=device)
            return
        if not keep:
            for layer in self._cache.layers:
                layer.release()
            self._reset()
            return
        index = torch.tensor(keep, device=device)
        self._cache.batch_select_indices(index)
        self._attention, self._positions = self._attention[index], self._positions[index]
        self._rows = [rows[i] for i in keep]
        self._next = torch.tensor([row.ids[-1] for row in self._rows], device=device)

    def _store(self, index: int, row: _Row) -> None:
        """Keep a finished row's K/V (prompt + sampled ids but the last, never fed) for prefix reuse."""
        prefix_cache = self.generator.prefix_cache
        if prefix_cache is None or self._cache is None:
            return
        fed = row.prompt + row.ids[:-1]
        end = self._attention.shape[1] if self._attention is not None else 0
        span = slice(end - len(fed), end)
        kv = [
            (layer.keys[index : index + 1, :, span].clone(), layer.values[index : index + 1, :, span].clone())
            for layer in self._cache.layers
        ]
        prefix_cache.store(fed, kv)

    def _finish(self, row: _Row, error: BaseException | None) -> None:
        self.generated_tokens += len(row.ids)
        wall = time.perf_counter() - row.queued_at
        output = GenerationOutput(
            ids=row.ids,
            logprobs=row.logprobs,
            entropy=row.entropy if row.sampling.return_entropy else None,
            finish_reason=row.reason,
            timings={"prefill_s": row.prefill_s, "generate_s": wall, "batch": float(row.batch)},
            top_logprobs=row.top if row.sampling.top_logprobs else None,
        )
        self._answer(row, error if error is not None else output)
