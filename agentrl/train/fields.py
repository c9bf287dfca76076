"""Batch fields on demand: the adapter between episodes and the objectives library.

Estimators and losses in :mod:`agentrl.algos` read canonical fields from a mapping (``outcome``,
``group_id``, ``turn_id``, ``entropy``, ``values``, ``gt_logprob``, ...). Each field has a builder
registered here by name; :class:`LazyBatch` builds a field the first time an objective reads it
and caches it. So GRPO never pays for IGPO's ground-truth scoring pass, GAE asks for ``values``
only when it runs, and adding an estimator that needs a new input means registering one builder,
never an ``if advantage == ...`` in the trainer.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from agentrl.errors import ConfigError
from agentrl.registry import Registry
from agentrl.trajectory import Episode, Source, TokenBatch, turn_table

BATCH_FIELDS = Registry("batch field")


@dataclass
class StepData:
    """Everything a builder may read for one training step.

    Attributes:
        episodes: the step's episodes (failed ones already removed); rollout index = position.
        tokens: ``build_batch(episodes)``; row ``b`` belongs to episode ``tokens.row_episode[b]``.
        old: outputs of the no-grad pass before the update (``logp``, ``entropy``, ``values``).
        config: the RunConfig.
        ig_scorer: ``callable(episodes) -> [R, K+1]`` gold-answer confidences (IGPO), or None.
    """

    episodes: list[Episode]
    tokens: TokenBatch
    old: Mapping[str, Tensor | None]
    config: Any
    ig_scorer: Callable[[list[Episode]], Tensor] | None = None
    extra: dict[str, Tensor] = field(default_factory=dict)


class LazyScores(Mapping[str, Tensor | None]):
    """The pre-update pass (``logp``, ``entropy``, ``values``), run only when a field reads it.

    With sampler log-probs and an estimator that needs neither entropy nor values (GRPO), the
    whole extra forward pass over the batch is skipped.
    """

    def __init__(self, compute: Callable[[], dict[str, Tensor | None]]):
        self._compute = compute
        self._scores: dict[str, Tensor | None] | None = None

    def _get(self) -> dict[str, Tensor | None]:
        if self._scores is None:
            self._scores = self._compute()
        return self._scores

    def __getitem__(self, name: str) -> Tensor | None:
        return self._get()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    @property
    def computed(self) -> bool:
        return self._scores is not None


class LazyBatch(Mapping[str, Tensor]):
    """Mapping whose values are built by :data:`BATCH_FIELDS` builders the first time they are read."""

    def __init__(self, step: StepData):
        self.step = step
        self._cache: dict[str, Tensor] = dict(step.extra)

    def __contains__(self, name: object) -> bool:
        return name in self._cache or (isinstance(name, str) and name in BATCH_FIELDS)

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._cache:
            if name not in BATCH_FIELDS:
                raise KeyError(name)
            self._cache[name] = BATCH_FIELDS.get(name)(self.step)
        return self._cache[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._cache)

    def __len__(self) -> int:
        return len(self._cache)

    def built(self) -> dict[str, Tensor]:
        """The fields built so far."""
        return dict(self._cache)


def field_builder(name: str) -> Callable[[Callable[[StepData], Tensor]], Callable[[StepData], Tensor]]:
    """Decorator: register the builder of batch field ``name``."""
    return BATCH_FIELDS.register(name)


# --------------------------------------------------------------------------- per token [B, L]
@field_builder("loss_mask")
def _loss_mask(step: StepData) -> Tensor:
    return step.tokens.loss_mask


@field_builder("turn_id")
def _turn_id(step: StepData) -> Tensor:
    return step.tokens.turn_id


@field_builder("old_logp")
def _old_logp(step: StepData) -> Tensor:
    if step.config.algo.old_logprobs == "sampler":
        return step.tokens.old_logprobs
    return step.old["logp"]


@field_builder("entropy")
def _entropy(step: StepData) -> Tensor:
    """Rollout-policy entropy: the sampler's when it recorded one, else the pre-update pass."""
    if step.tokens.entropy is not None:
        return step.tokens.entropy
    return step.old["entropy"]


@field_builder("values")
def _values(step: StepData) -> Tensor:
    if step.old.get("values") is None:
        raise ConfigError(
            "algo.critic",
            f"advantage {step.config.algo.advantage!r} needs critic values",
            "set algo.critic=true",
        )
    return step.old["values"]


@field_builder("old_values")
def _old_values(step: StepData) -> Tensor:
    return _values(step)


@field_builder("process_reward")
def _process_reward(step: StepData) -> Tensor:
    return step.tokens.process_reward


@field_builder("token_kind")
def _token_kind(step: StepData) -> Tensor:
    """FoldAct kinds: summary tokens 4, other generated tokens 0, everything else 3 (observation)."""
    source = step.tokens.source
    kind = torch.full_like(source, 3)
    kind[source == int(Source.MODEL)] = 0
    kind[source == int(Source.SUMMARY)] = 4
    return kind


@field_builder("token_rewards")
def _token_rewards(step: StepData) -> Tensor:
    """GAE rewards: each turn's env reward on its last generated token; the outcome on the last turn's.

    The episode's outcome replaces the final turn's step reward (they are the same reward, so it is
    counted once).
    """
    tokens = step.tokens
    rewards = torch.zeros_like(tokens.loss_mask)  # [B, L]
    table, _ = turn_table(step.episodes)
    for row, e_idx in enumerate(tokens.row_episode.tolist()):
        turns = table[e_idx]
        last_index = turns[-1].index if turns else -1
        by_index = {t.index: t for t in turns}
        turn_ids = tokens.turn_id[row]
        for k in torch.unique(turn_ids[turn_ids >= 0]).tolist():
            pos = int((turn_ids == k).nonzero().max())
            reward = step.episodes[e_idx].outcome if k == last_index else by_index[k].reward
            rewards[row, pos] = float(reward)
    return rewards


# --------------------------------------------------------------------------- per row [B] / rollout [R]
@field_builder("row_rollout")
def _row_rollout(step: StepData) -> Tensor:
    return step.tokens.row_episode


@field_builder("outcome")
def _outcome(step: StepData) -> Tensor:
    return torch.tensor([float(ep.outcome) for ep in step.episodes], dtype=torch.float32)


@field_builder("group_id")
def _group_id(step: StepData) -> Tensor:
    ids: dict[str, int] = {}
    return torch.tensor([ids.setdefault(ep.group_id or ep.episode_id, len(ids)) for ep in step.episodes])


@field_builder("finished")
def _finished(step: StepData) -> Tensor:
    """SUPO: a rollout is finished when it ended on its own (not cut by a budget)."""
    return torch.tensor([bool(ep.terminated and not ep.truncated) for ep in step.episodes])


# --------------------------------------------------------------------------- per turn [B, K]
def _num_turns(table: list[list[Any]]) -> int:
    return max((t.index + 1 for turns in table for t in turns), default=1)


def _per_row_turns(step: StepData, value: Callable[[Any], float]) -> Tensor:
    table, _ = turn_table(step.episodes)
    num_turns = _num_turns(table)
    rows = step.tokens.row_episode.tolist()
    out = torch.zeros(len(rows), num_turns)
    for row, e_idx in enumerate(rows):
        for turn in table[e_idx]:
            out[row, turn.index] = value(turn)
    return out


@field_builder("step_reward")
def _step_reward(step: StepData) -> Tensor:
    return _per_row_turns(step, lambda turn: turn.reward)


@field_builder("anchor_id")
def _anchor_id(step: StepData) -> Tensor:
    """GiGPO anchor states: turns that saw the same preceding observation share an id."""
    table, _ = turn_table(step.episodes)
    num_turns = _num_turns(table)
    rows = step.tokens.row_episode.tolist()
    out = torch.zeros(len(rows), num_turns, dtype=torch.long)
    for row, e_idx in enumerate(rows):
        previous = f"task:{step.episodes[e_idx].task_id}"
        for turn in table[e_idx]:
            out[row, turn.index] = zlib.crc32(previous.encode())
            previous = turn.observation
    return out


@field_builder("gt_logprob")
def _gt_logprob(step: StepData) -> Tensor:
    """IGPO: ``[B, K+1]`` mean log-prob of the gold answer after 0..K turns (no gradient)."""
    if step.ig_scorer is None:
        raise ConfigError(
            "algo.advantage",
            f"{step.config.algo.advantage!r} needs gold-answer scoring, which this trainer was not given",
            "use an env whose tasks have answers (search) and the HF/torch learner",
        )
    per_rollout = step.ig_scorer(step.episodes)  # [R, K+1]
    return per_rollout[step.tokens.row_episode]


__all__ = ["BATCH_FIELDS", "LazyBatch", "LazyScores", "StepData", "field_builder"]
