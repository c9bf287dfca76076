"""FoldAct's full-context pass: each row's trained tokens scored under the unfolded history.

With ``rollout.folding=summary`` a rollout is several rows: the first segment, then one per summary
restart (prompt = task + summary). Each row is the folded context its turns were generated in.
The *unfolded* context of a row is everything the rollout produced before it, in order (the
earlier segments, never folded away), followed by the row itself. [U] FoldAct's code keeps
summaries inline in one growing sequence; here the folded rows are the record, and the unfolded
history is their concatenation, restart prompts included.

The pass runs the learner without gradient. ``algo.full_ctx_dropout = p`` is FoldAct's selective
segment training: each turn is left out with probability p (its positions come back NaN, so the
consistency loss skips them), and a row whose turns are all left out is not run at all.
"""

from __future__ import annotations

import zlib
from typing import Any

import torch
from torch import Tensor

from agentrl.errors import ConfigError
from agentrl.trajectory import Episode

UNFOLDED_KINDS = ("main", "summary")  # segment kinds that chain into one history


def unfolded_prefixes(episodes: list[Episode]) -> list[list[int]]:
    """Per training row (``build_batch`` order), the token ids that precede it in the unfolded history.

    Rows of kind ``main``/``summary`` chain: a row's prefix is every earlier such segment of its
    rollout. Other rows (``turn`` rows of the per-turn template fallback, ``branch`` rows) already
    carry their whole history in their prompt, so their prefix is empty.
    """
    prefixes: list[list[int]] = []
    for ep in episodes:
        if ep.failed:
            continue
        history: list[int] = []
        for seg in ep.segments:
            if not seg.turns:
                continue
            chained = seg.kind in UNFOLDED_KINDS
            prefixes.append(list(history) if chained else [])
            if chained:
                history += seg.token_ids()
    return prefixes


def turn_dropout(
    turn_id: Tensor, episodes: list[Episode], row_rollout: Tensor, p: float, seed: int
) -> Tensor:
    """``[B, L]`` bool, True on tokens of turns left out (each turn of each rollout with probability p)."""
    if p <= 0:
        return torch.zeros_like(turn_id, dtype=torch.bool)
    key = zlib.crc32("|".join(ep.episode_id for ep in episodes).encode())
    gen = torch.Generator().manual_seed(seed * 1_000_003 + key)
    num_turns = int(turn_id.max()) + 1 if turn_id.numel() else 0
    drop = torch.rand(len(episodes), max(num_turns, 1), generator=gen) < p  # [R, K]
    per_token = drop[row_rollout][:, None, :].expand(-1, turn_id.shape[1], -1)  # [B, L, K]
    index = turn_id.clamp_min(0)[..., None]
    return per_token.gather(2, index).squeeze(-1) & (turn_id >= 0)


@torch.no_grad()
def full_context_logprobs(step: Any) -> Tensor:
    """``[B, L]`` log-probs of each row's trained tokens under its unfolded context (NaN where dropped)."""
    if step.engine is None:
        raise ConfigError(
            "algo.loss", "the full-context pass needs the learner engine, which this step was not given",
            "build StepData with engine=...",
        )  # fmt: skip
    tokens, config = step.tokens, step.config
    prefixes = unfolded_prefixes(step.episodes)
    lengths = tokens.attention_mask.sum(1).tolist()
    if len(prefixes) != len(lengths):
        raise RuntimeError(f"{len(prefixes)} unfolded rows for a batch of {len(lengths)}: row order changed")
    dropped = turn_dropout(tokens.turn_id, step.episodes, tokens.row_episode, config.algo.full_ctx_dropout,
                           config.train.seed)  # fmt: skip
    scored = tokens.loss_mask.bool() & ~dropped  # [B, L]
    out = torch.where(dropped & tokens.loss_mask.bool(), float("nan"), 0.0)  # [B, L]
    rows = [b for b in range(len(lengths)) if scored[b].any()]
    engine = step.engine
    device = engine.policy.lm.device
    size = max(1, config.train.micro_batch_size)
    for start in range(0, len(rows), size):
        chunk = rows[start : start + size]
        seqs = [prefixes[b] + tokens.input_ids[b, : lengths[b]].tolist() for b in chunk]
        width = max(len(s) for s in seqs)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        attn = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width)
        for i, (b, seq) in enumerate(zip(chunk, seqs, strict=True)):
            start_b = len(prefixes[b])
            ids[i, : len(seq)] = torch.tensor(seq)
            attn[i, : len(seq)] = 1
            mask[i, start_b : start_b + lengths[b]] = scored[b, : lengths[b]].float()
        logp = engine.forward(ids.to(device), attn.to(device), mask.to(device)).logp.float().cpu()  # [b, W]
        for i, b in enumerate(chunk):
            start_b = len(prefixes[b])
            row = logp[i, start_b : start_b + lengths[b]]
            keep = scored[b, : lengths[b]]
            out[b, : lengths[b]] = torch.where(keep, row, out[b, : lengths[b]])
    return out


__all__ = ["full_context_logprobs", "turn_dropout", "unfolded_prefixes"]
