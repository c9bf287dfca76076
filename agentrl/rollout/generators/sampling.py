"""Sampling one token per row from logits: temperature, top-k, top-p, and the reported log-probs."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from agentrl.rollout.generators.base import SamplingParams


def sample_next(
    logits: torch.Tensor, sampling: SamplingParams, rngs: Sequence[torch.Generator] | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pick next tokens from raw logits ``[B, V]``, row ``b`` drawing from ``rngs[b]``.

    Each row takes exactly one uniform from its own generator and inverts its (truncated) CDF, so
    a row's token depends only on its logits and its stream, never on the other rows of the batch
    (``torch.multinomial`` draws a whole batch from one stream). ``rngs`` may repeat one
    generator; it is unused when greedy.

    Returns ``(tokens [B], logprobs [B], entropy [B], logp [B, V])`` where log-prob and entropy come
    from ``logp = log_softmax(logits / T)`` (before top-p/top-k truncation).
    """
    logp = torch.log_softmax(logits.float() / sampling.scale, dim=-1)  # [B, V]
    entropy = -(logp.exp() * logp).sum(-1)  # [B]
    if sampling.greedy or rngs is None:
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
        cdf = probs.cumsum(-1)  # [B, V]
        total = cdf[:, -1:]  # [B, 1]
        u = torch.cat([torch.rand(1, generator=g) for g in rngs]).to(cdf.device)[:, None]  # [B, 1]
        # strictly below the total, so the first index whose CDF exceeds it has probability > 0
        x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
        tokens = torch.searchsorted(cdf, x, right=True).squeeze(-1)  # [B]
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1), entropy, logp


def stop_set(sampling: SamplingParams, eos: Collection[int]) -> set[int]:
    """The ids that end a turn: the generator's EOS ids (unless ``ignore_eos``) and the request's."""
    return (set() if sampling.ignore_eos else set(eos)) | set(sampling.stop_ids)


def hold_stops(logits: torch.Tensor, rows: Sequence[int], stops: Collection[int]) -> torch.Tensor:
    """``logits [B, V]`` with the ``stops`` ids of ``rows`` at -inf (a turn shorter than
    ``min_tokens``: no stop id is sampled there, and log-probs come from what is sampled from);
    ``logits`` itself when there is nothing to hold."""
    ids = [t for t in stops if 0 <= t < logits.shape[-1]]
    if not rows or not ids:
        return logits
    held = logits.float().clone()  # sample_next reads float logits anyway
    index = torch.tensor(list(rows), device=logits.device)[:, None]
    # finite, so the entropy's p * log p is 0 there, not nan; any temperature keeps it finite
    held[index, torch.tensor(ids, device=logits.device)[None]] = -1e30
    return held


def top_pairs(logp: torch.Tensor, k: int) -> list[list[tuple[int, float]]] | None:
    """The ``k`` most likely ``(id, logprob)`` pairs per row of ``logp [B, V]`` (None when k = 0)."""
    if k <= 0:
        return None
    values, indices = logp.topk(k, dim=-1)  # [B, k]
    return [list(zip(i, v, strict=True)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)]
