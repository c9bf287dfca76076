"""IGPO ground-truth scoring: how confident the policy is in the gold answer after each turn.

For rollout ``i`` and turn boundary ``k`` (0 = the prompt alone, ``k`` = after turn ``k - 1`` and
its observation) the context is the segment's token ids up to that point plus the template's
prefix ("Now there's enough information to answer.\\n<answer>"); the target is the tokenized
gold answer, and ``s[i, k]`` is its mean teacher-forced log-prob (no gradient), computed by the
learner itself before the update (θ_old, as in the IGPO code), so it works with every rollout
backend and engine. The column after a rollout's last turn is never used by the estimator and is
left at 0. With :func:`learner_continuation_scorer` each segment runs once and every turn boundary
reuses its keys/values (about one forward per episode instead of one per turn).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from agentrl.trajectory import Episode, TokenBatch


def gold_text(ground_truth: Any) -> str:
    """The first gold alternative as text (IGPO scores the first when there are several)."""
    if isinstance(ground_truth, list | tuple):
        return str(ground_truth[0]) if ground_truth else ""
    if isinstance(ground_truth, dict):
        for key in ("answer", "answers", "text"):
            if key in ground_truth:
                return gold_text(ground_truth[key])
    return "" if ground_truth is None else str(ground_truth)


def learner_score_mean(engine: Any, micro_batch_size: int, pad_id: int):
    """``score_mean(contexts, targets) -> list[float]`` with the learner (no gradient, any engine)."""
    from agentrl.train.update import score_tokens

    def score_mean(contexts: Sequence[list[int]], targets: Sequence[list[int]]) -> list[float]:
        rows = [c + t for c, t in zip(contexts, targets, strict=True)]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        attention = torch.zeros(len(rows), width, dtype=torch.long)
        loss_mask = torch.zeros(len(rows), width)
        for i, (context, target) in enumerate(zip(contexts, targets, strict=True)):
            ids[i, : len(context) + len(target)] = torch.tensor(context + target)
            attention[i, : len(context) + len(target)] = 1
            loss_mask[i, len(context) : len(context) + len(target)] = 1.0
        tokens = TokenBatch(ids, attention, loss_mask, None, None, None, None, None, None)
        logp = score_tokens(engine, tokens, micro_batch_size)["logp"]  # [N, W]
        return ((logp * loss_mask).sum(1) / loss_mask.sum(1).clamp_min(1)).tolist()

    return score_mean


def learner_continuation_scorer(engine: Any):
    """``score(sequence, boundaries, continuation) -> [K, S]`` log-probs with the learner (no gradient)."""

    def score(sequence: list[int], boundaries: list[int], continuation: list[int]) -> Tensor:
        policy = engine.policy
        device = policy.lm.device
        gather = getattr(engine, "gathered_parameters", None)  # ZeRO-3: full weights outside forward
        with gather() if gather is not None else contextlib.nullcontext():
            return policy.continuation_logprobs(
                torch.tensor(sequence, device=device), boundaries, torch.tensor(continuation, device=device)
            ).cpu()

    return score


class GoldAnswerScorer:
    """``scorer(episodes) -> [R, K + 1]`` gold-answer confidences for IGPO.

    Args:
        score_mean: ``(contexts, targets) -> mean target log-prob`` per pair
            (:func:`learner_score_mean`, or a generator's ``score_mean``); or None with
        continuation: ``(sequence, boundaries, continuation) -> [K, S]`` log-probs
            (:func:`learner_continuation_scorer`), which shares one pass per segment.
        tokenizer: the policy tokenizer.
        template: text with one ``{answer}`` placeholder; only the answer's tokens are averaged.
    """

    def __init__(self, score_mean: Any, tokenizer: Any, template: str, *, continuation: Any = None):
        if "{answer}" not in template:
            raise ValueError("algo.ig_template must contain {answer}")
        if score_mean is None and continuation is None:
            raise ValueError("GoldAnswerScorer needs score_mean or continuation")
        self.score_mean = score_mean
        self.continuation = continuation
        self.tokenizer = tokenizer
        self.prefix = template.split("{answer}")[0]

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def __call__(self, episodes: Sequence[Episode]) -> Tensor:
        prefix_ids = self._ids(self.prefix)
        num_cols = max((t.index + 2 for ep in episodes for t in ep.turns), default=1)
        out = torch.zeros(len(episodes), num_cols)  # [R, K + 1]
        contexts: list[list[int]] = []
        targets: list[list[int]] = []
        slots: list[tuple[int, int]] = []
        for r, episode in enumerate(episodes):
            answer = self._ids(gold_text(episode.ground_truth))
            if not answer:
                continue
            for segment in episode.segments:
                ids = list(segment.prompt_ids)
                bounds, cols = [], []
                if segment.fold_id == 0:
                    bounds.append(len(ids))
                    cols.append(0)
                for turn in segment.turns[:-1] if segment is episode.segments[-1] else segment.turns:
                    ids = ids + turn.output_ids + turn.obs_ids
                    bounds.append(len(ids))
                    cols.append(turn.index + 1)
                if not bounds:
                    continue
                if self.continuation is not None:
                    logp = self.continuation(ids, bounds, prefix_ids + answer)[:, len(prefix_ids) :]  # [K, A]
                    for col, value in zip(cols, logp.mean(1).tolist(), strict=True):
                        out[r, col] = float(value)
                    continue
                for bound, col in zip(bounds, cols, strict=True):
                    contexts.append(ids[:bound] + prefix_ids)
                    targets.append(answer)
                    slots.append((r, col))
        if contexts:
            scores = self.score_mean(contexts, targets)
            for (r, col), value in zip(slots, scores, strict=True):
                out[r, col] = float(value)
        return out


__all__ = ["GoldAnswerScorer", "gold_text", "learner_continuation_scorer", "learner_score_mean"]
