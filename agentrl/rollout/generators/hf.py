"""Hugging Face transformers generator: batched, left-padded, KV-cached sampling on CPU or GPU.

The reference backend: its own sampling loop (not ``model.generate``) so the log-prob and entropy
it reports are computed from exactly the distribution each token was drawn from (see
:mod:`agentrl.rollout.generators.base` for the convention).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from agentrl.errors import GeneratorError
from agentrl.rollout.generators.base import GenerationOutput, Generator, SamplingParams, check_prompts


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


def sample_next(
    logits: torch.Tensor, sampling: SamplingParams, rng: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pick next tokens from raw logits ``[B, V]``.

    Returns ``(tokens [B], logprobs [B], entropy [B])`` where log-prob and entropy come from
    ``log_softmax(logits / T)`` (before top-p/top-k truncation).
    """
    logp = torch.log_softmax(logits.float() / sampling.scale, dim=-1)  # [B, V]
    entropy = -(logp.exp() * logp).sum(-1)  # [B]
    if sampling.greedy:
        tokens = logits.argmax(-1)
    else:
        probs = logp.exp()
        if sampling.top_k > 0:
            kth = torch.topk(probs, min(sampling.top_k, probs.shape[-1]), dim=-1).values[:, -1:]
            probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
        if sampling.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            before = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly before each token
            sorted_probs = torch.where(before >= sampling.top_p, torch.zeros_like(sorted_probs), sorted_probs)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        tokens = torch.multinomial(probs / probs.sum(-1, keepdim=True), 1, generator=rng).squeeze(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1), entropy


class HFGenerator(Generator):
    """Generator over an in-process transformers causal LM (optionally the learner's live model)."""

    name = "hf"
    supports_entropy = True
    supports_score = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 32,
        score_batch_size: int = 8,
        seed: int = 0,
    ):
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

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[GenerationOutput]:
        check_prompts(prompts, self.vocab_size)
        longest = max((len(p) for p in prompts), default=0)
        if longest + sampling.max_new_tokens > self.max_positions:
            raise GeneratorError(
                f"prompt of {longest} tokens + {sampling.max_new_tokens} new tokens exceeds the model's "
                f"{self.max_positions} positions; lower rollout.max_context_tokens"
            )
        outputs: list[GenerationOutput | None] = [None] * len(prompts)
        # Similar lengths share a batch, so less padding is computed.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        with self._lock:
            rng = self._rng
            if sampling.seed is not None:
                rng = torch.Generator(device="cpu").manual_seed(sampling.seed)
            for start in range(0, len(order), self.max_batch_size):
                chunk = order[start : start + self.max_batch_size]
                for idx, out in zip(
                    chunk, self._generate_batch([prompts[i] for i in chunk], sampling, rng), strict=True
                ):
                    outputs[idx] = out
        return outputs  # type: ignore[return-value]

    @torch.no_grad()
    def _generate_batch(
        self, prompts: list[Sequence[int]], sampling: SamplingParams, rng: torch.Generator
    ) -> list[GenerationOutput]:
        t0 = time.perf_counter()
        device = self.device
        stop = torch.tensor(sorted(self.stop_ids | set(sampling.stop_ids)), device=device)
        input_ids, attention = left_pad(prompts, self.pad_id, device)  # [B, L]
        positions = (attention.cumsum(-1) - 1).clamp(min=0)  # [B, L]
        batch = len(prompts)
        ids: list[list[int]] = [[] for _ in range(batch)]
        logps: list[list[float]] = [[] for _ in range(batch)]
        ents: list[list[float]] = [[] for _ in range(batch)]
        finished = [False] * batch
        reasons = ["length"] * batch
        from transformers import DynamicCache

        cache = DynamicCache()
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        prefill_s = time.perf_counter() - t0
        last_pos = positions[:, -1:]  # [B, 1]
        for _step in range(sampling.max_new_tokens):
            logits = out.logits[:, -1, :]  # [B, V]
            tokens, logp, entropy = sample_next(logits, sampling, rng if not sampling.greedy else None)
            is_stop = torch.isin(tokens, stop)
            tok_l, lp_l, ent_l, stop_l = tokens.tolist(), logp.tolist(), entropy.tolist(), is_stop.tolist()
            for b in range(batch):
                if finished[b]:
                    continue
                ids[b].append(tok_l[b])
                logps[b].append(lp_l[b])
                ents[b].append(ent_l[b])
                if stop_l[b]:
                    finished[b] = True
                    reasons[b] = "stop"
            if all(finished):
                break
            feed = torch.where(
                torch.tensor(finished, device=device), torch.full_like(tokens, self.pad_id), tokens
            )
            attention = torch.cat(
                [attention, torch.ones((batch, 1), dtype=attention.dtype, device=device)], -1
            )
            last_pos = last_pos + 1
            out = self.model(
                input_ids=feed[:, None],
                attention_mask=attention,
                position_ids=last_pos,
                past_key_values=cache,
                use_cache=True,
            )
        total_s = time.perf_counter() - t0
        timings = {"prefill_s": prefill_s, "generate_s": total_s, "batch": float(batch)}
        return [
            GenerationOutput(
                ids=ids[b],
                logprobs=logps[b],
                entropy=ents[b] if sampling.return_entropy else None,
                finish_reason=reasons[b],
                timings=dict(timings),
            )
            for b in range(batch)
        ]

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

    # ------------------------------------------------------------------ weights
    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        params = dict(self.model.named_parameters())
        with self._lock, torch.no_grad():
            for name, tensor in named_tensors:
                if name not in params:
                    raise GeneratorError(f"update_weights: the model has no parameter {name!r}")
                params[name].copy_(tensor.to(params[name].device, params[name].dtype))
