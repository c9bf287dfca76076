"""IGPO ground-truth scoring: how confident the policy is in the gold answer after each turn.

For rollout ``i`` and turn boundary ``k`` (0 = the prompt alone, ``k`` = after turn ``k - 1`` and
its observation) the context is the segment's token ids up to that point plus the template's
prefix ("Now there's enough information to answer.\\n<answer>"); the target is the tokenized
gold answer, and ``s[i, k]`` is its mean teacher-forced log-prob (no gradient), computed by the
generator's ``score_mean`` (θ_old, as in the IGPO code). The column after a rollout's last turn is
never used by the estimator and is left at 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from agentrl.trajectory import Episode


def gold_text(ground_truth: Any) -> str:
    """The first gold alternative as text (IGPO scores the first when there are several)."""
    if isinstance(ground_truth, list | tuple):
        return str(ground_truth[0]) if ground_truth else ""
    if isinstance(ground_truth, dict):
        for key in ("answer", "answers", "text"):
            if key in ground_truth:
                return gold_text(ground_truth[key])
    return "" if ground_truth is None else str(ground_truth)


class GoldAnswerScorer:
    """``scorer(episodes) -> [R, K + 1]`` gold-answer confidences for IGPO.

    Args:
        generator: a backend with ``score_mean`` (the HF generator wrapping the live policy).
        tokenizer: the policy tokenizer.
        template: text with one ``{answer}`` placeholder; only the answer's tokens are averaged.
    """

    def __init__(self, generator: Any, tokenizer: Any, template: str):
        if "{answer}" not in template:
            raise ValueError("algo.ig_template must contain {answer}")
        self.generator = generator
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
                if segment.fold_id == 0:
                    contexts.append(ids + prefix_ids)
                    targets.append(answer)
                    slots.append((r, 0))
                for turn in segment.turns[:-1] if segment is episode.segments[-1] else segment.turns:
                    ids = ids + turn.output_ids + turn.obs_ids
                    contexts.append(ids + prefix_ids)
                    targets.append(answer)
                    slots.append((r, turn.index + 1))
        if contexts:
            scores = self.generator.score_mean(contexts, targets)
            for (r, col), value in zip(slots, scores, strict=True):
                out[r, col] = float(value)
        return out


__all__ = ["GoldAnswerScorer", "gold_text"]
