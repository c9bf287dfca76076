"""IGPO's ground-truth confidence pass (ALGORITHMS.md §1.1), on any generator that can score.

After the prompt and after each turn's observation, the gold answer is teacher-forced as the
start of the next assistant message (``<answer>{gold}</answer>``) and its length-normalised
log-prob is read (no gradient, batched). Only the gold span is averaged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from agentrl.errors import GeneratorError
from agentrl.rollout.generators.base import Generator
from agentrl.trajectory import Episode


def gold_text(ground_truth: Any) -> str | None:
    """The first alternative of a gold answer (lists of aliases use their first entry)."""
    if ground_truth is None:
        return None
    if isinstance(ground_truth, list | tuple):
        return str(ground_truth[0]) if ground_truth else None
    return str(ground_truth)


def score_contexts(episode: Episode) -> list[tuple[int, list[int]]]:
    """``(after_turn, context ids)`` where the policy would write its next message: the prompt
    (after_turn = -1) and the end of every turn that has observation ids, in turn order."""
    contexts: list[tuple[int, list[int]]] = []
    for seg in episode.segments:
        ids = list(seg.prompt_ids)
        if not contexts:
            contexts.append((-1, list(ids)))
        for turn in seg.turns:
            ids += turn.output_ids + turn.obs_ids
            if turn.obs_ids:
                contexts.append((turn.index, list(ids)))
    contexts.sort(key=lambda c: c[0])
    return contexts


def ground_truth_logprobs(
    generator: Generator,
    tokenizer: Any,
    episodes: Sequence[Episode],
    *,
    answer_prefix: str = "<answer>",
    temperature: float = 1.0,
) -> list[list[float]]:
    """Per episode, ``s_t`` for t = 0 (prompt) and after each turn with an observation.

    Returns one list per episode, aligned with :func:`score_contexts` (``[s_0, s_1, ...]``);
    episodes without a gold answer or failed ones get an empty list. Use
    ``math.exp`` for IGPO v1's probability form.
    """
    if not generator.supports_score:
        raise GeneratorError(
            f"the {generator.name} generator cannot score; IGPO needs the hf or vllm backend"
        )
    prefix = list(tokenizer(answer_prefix, add_special_tokens=False)["input_ids"]) if answer_prefix else []
    flat_ctx, flat_tgt, owners = [], [], []
    for e_index, episode in enumerate(episodes):
        gold = gold_text(episode.ground_truth)
        if gold is None or episode.failed or not episode.segments:
            continue
        target = list(tokenizer(gold, add_special_tokens=False)["input_ids"])
        for _after, context in score_contexts(episode):
            flat_ctx.append(context + prefix)
            flat_tgt.append(target)
            owners.append(e_index)
    means = generator.score_mean(flat_ctx, flat_tgt, temperature=temperature) if flat_ctx else []
    out: list[list[float]] = [[] for _ in episodes]
    for owner, value in zip(owners, means, strict=True):
        out[owner].append(value if math.isfinite(value) else -1e9)
    return out
