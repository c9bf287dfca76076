"""Producers: the one registry of every tensor an objective may read, and who makes it.

Estimators and losses in :mod:`agentrl.algos` declare their needs by canonical name
(``outcome``, ``group_id``, ``turn_id``, ``entropy``, ``values``, ``gt_logprob``, ...). Each name
has exactly one :class:`Producer` registered here: a batch builder (from the padded
:class:`~agentrl.trajectory.TokenBatch`), a rollout record (from the episodes), a learner pass
(a forward of the model) or a scorer, with the config setting that enables it. TokenBatch names
are renamed here and nowhere else (``old_logprobs`` -> ``old_logp``, ``row_episode`` ->
``row_rollout``, ``source`` -> ``token_kind``).

:func:`agentrl.train.plan.objective_plan` resolves a config's estimator and loss (presets fill only unset options;
explicit values win) and refuses, before anything runs, a need with no producer under the config
(naming the producer and the setting that provides it), an option the objective does not take,
and an unpairable estimator/loss combination. :class:`LazyBatch` builds a field the first time an
objective reads it, so GRPO never pays for IGPO's gold-answer scoring pass.
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
from agentrl.trajectory import Episode, TokenBatch, turn_table

BATCH_FIELDS = Registry("batch field")
KINDS = ("batch builder", "rollout record", "learner pass", "scorer")


@dataclass
class StepData:
    """Everything a producer may read for one training step.

    Attributes:
        episodes: the step's episodes (failed ones already removed); rollout index = position.
        tokens: ``build_batch(episodes)``; row ``b`` belongs to episode ``tokens.row_episode[b]``.
        old: outputs of the no-grad pass before the update (``logp``, ``entropy``, ``values``).
        config: the RunConfig.
        plan: its resolved objectives (:func:`agentrl.train.plan.objective_plan` of ``config``).
        ig_scorer: ``callable(episodes) -> [R, K+1]`` gold-answer confidences (IGPO), or None.
        engine: the learner engine, for producers that run a learner pass (``full_ctx_logp``).
    """

    episodes: list[Episode]
    tokens: TokenBatch
    old: Mapping[str, Tensor | None]
    config: Any
    plan: Any
    ig_scorer: Callable[[list[Episode]], Tensor] | None = None
    extra: dict[str, Tensor] = field(default_factory=dict)
    engine: Any = None


def _always(_: Any) -> bool:
    return True


@dataclass(frozen=True)
class Producer:
    """The one producer of batch field ``name``.

    ``shape`` uses ``B`` rows, ``L`` tokens, ``R`` rollouts, ``K`` turns. ``build`` is None for
    fields the update itself produces (``logp``, ``values``: its forward pass). ``available(config)``
    says whether this config enables it; ``setting`` is the override that does.
    """

    name: str
    kind: str
    shape: str
    doc: str
    build: Callable[[StepData], Tensor] | None = None
    setting: str = ""
    available: Callable[[Any], bool] = _always

    def __call__(self, step: StepData) -> Tensor:
        if self.build is None:
            raise KeyError(f"'{self.name}' is produced by the update's own forward pass, not built ahead")
        return self.build(step)


def producer(name: str, kind: str, shape: str, *, setting: str = "",
             available: Callable[[Any], bool] = _always) -> Callable[[Callable[[StepData], Tensor]], Producer]:  # fmt: skip
    """Decorator: register ``fn`` (its docstring is the doc) as the one producer of ``name``."""
    assert kind in KINDS, kind

    def register(fn: Callable[[StepData], Tensor]) -> Producer:
        doc = (fn.__doc__ or name).strip().splitlines()[0].rstrip(".")
        entry = Producer(name, kind, shape, doc, fn, setting, available)
        BATCH_FIELDS.register(name, entry)
        return entry

    return register


def register_producers(producers: tuple[Any, ...], who: str, setting: str) -> None:
    """Register the producers an objective brings with it (``Estimator.producers``); a name another
    producer already makes is refused, naming both."""
    for made in producers:
        if not isinstance(made, Producer):
            raise ConfigError(setting, f"{who} lists {made!r} as a producer", "pass agentrl.train.fields.Producer(...) objects")
        if made.name in BATCH_FIELDS and BATCH_FIELDS.get(made.name) is not made:
            other = BATCH_FIELDS.get(made.name)
            raise ConfigError(setting, f"{who} brings a producer of '{made.name}', which the {other.kind} "
                              f"({other.doc}) already produces", "give the new field its own name")  # fmt: skip
        BATCH_FIELDS.register(made.name, made, override=True)


def field_builder(name: str) -> Callable[[Callable[[StepData], Tensor]], Producer]:
    """Register a batch builder for ``name`` (shape unspecified); see :func:`producer`."""
    return producer(name, "batch builder", "?")


BATCH_FIELDS.register("logp", Producer("logp", "learner pass", "[B, L]", "current policy log-probs (the update's forward, with grad)"))  # fmt: skip


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
    """Mapping whose values are built by their :data:`BATCH_FIELDS` producers the first time they are read."""

    def __init__(self, step: StepData):
        self.step = step
        self._cache: dict[str, Tensor] = dict(step.extra)

    def __contains__(self, name: object) -> bool:
        if name in self._cache:
            return True
        return isinstance(name, str) and name in BATCH_FIELDS and BATCH_FIELDS.get(name).build is not None

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._cache:
            if name not in self:
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


# --------------------------------------------------------------------------- per token [B, L]
def _critic(config: Any) -> bool:
    return bool(config.algo.critic)


@producer("loss_mask", "batch builder", "[B, L]")
def _loss_mask(step: StepData) -> Tensor:
    """1 on trainable tokens; rows of rollouts the estimator excludes (SUPO's unfinished) are all 0,
    and so are the tokens a masking sampler-mismatch correction drops (algo.mismatch_correction)."""
    mask = step.tokens.loss_mask
    keep = step.plan.estimator.row_keep(_RowView(step), step.plan.advantage_options)
    if keep is not None:
        from agentrl.algos.shaping import rollout_row_mask

        mask = rollout_row_mask(keep, step.tokens.row_episode, mask).to(mask.dtype)
    options = step.plan.loss_options
    kind = options.get("mismatch_correction", "none")
    if kind in ("token_mask", "seq_mask"):
        from agentrl.algos.mismatch import correction_keep

        kept = correction_keep(kind, step.old["logp"], step.tokens.old_logprobs, step.tokens.loss_mask,
                               cap=options["mismatch_cap"])  # fmt: skip
        mask = mask * kept.to(mask.dtype)
    return mask


class _RowView(LazyBatch):
    """A LazyBatch whose ``loss_mask`` is the raw one (breaks the loss_mask -> estimator cycle)."""

    def __init__(self, step: StepData):
        super().__init__(step)
        self._cache["loss_mask"] = step.tokens.loss_mask


@producer("turn_id", "batch builder", "[B, L]")
def _turn_id(step: StepData) -> Tensor:
    """Turn index of each generated token, -1 elsewhere."""
    return step.tokens.turn_id


@producer("token_kind", "batch builder", "[B, L]")
def _token_kind(step: StepData) -> Tensor:
    """agentrl.trajectory.Source code of each token (SUMMARY 3, MODEL 1, ...; -1 on padding)."""
    return step.tokens.source


@producer("old_logp", "learner pass", "[B, L]", setting="algo.old_logprobs")
def _old_logp(step: StepData) -> Tensor:
    """behaviour log-probs: the pre-update pass over each row (algo.old_logprobs=recompute) or the sampler's.

    A row is exactly the (folded) context its turns were generated in (summary restarts and
    branches start new rows), so either way each turn's old log-prob is under its own folded
    context.
    """
    if step.config.algo.old_logprobs == "sampler":
        return step.tokens.old_logprobs
    return step.old["logp"]


@producer("sampler_logp", "rollout record", "[B, L]")
def _sampler_logp(step: StepData) -> Tensor:
    """log-probs the sampler reported for the tokens it generated (TokenBatch.old_logprobs)."""
    return step.tokens.old_logprobs


def _tis_on(config: Any) -> bool:
    algo = config.algo
    return (algo.mismatch_correction or algo.loss_options.get("mismatch_correction")) == "tis"


@producer("is_weight", "learner pass", "[B, L]", setting="algo.mismatch_correction=tis", available=_tis_on)
def _is_weight(step: StepData) -> Tensor:
    """truncated learner/sampler importance weight min(exp(old_logp - sampler_logp), algo.mismatch_cap)."""
    from agentrl.algos.mismatch import tis_weight

    cap = step.plan.loss_options["mismatch_cap"]
    return tis_weight(step.old["logp"], step.tokens.old_logprobs, step.tokens.loss_mask, cap=cap)


@producer("entropy", "learner pass", "[B, L]")
def _entropy(step: StepData) -> Tensor:
    """rollout-policy entropy: the sampler's when it recorded one, else the pre-update pass."""
    if step.tokens.entropy is not None:
        return step.tokens.entropy
    return step.old["entropy"]


@producer("values", "learner pass", "[B, L]", setting="algo.critic=true", available=_critic)
def _values(step: StepData) -> Tensor:
    """critic values from the pre-update pass (value head)."""
    if step.old.get("values") is None:
        raise ConfigError(
            "algo.critic",
            f"advantage {step.config.algo.advantage!r} needs critic values",
            "set algo.critic=true",
        )
    return step.old["values"]


@producer("old_values", "learner pass", "[B, L]", setting="algo.critic=true", available=_critic)
def _old_values(step: StepData) -> Tensor:
    """critic values before the update (value clipping)."""
    return _values(step)


@producer("process_reward", "rollout record", "[B, L]", setting="rollout.folding=branch",
          available=lambda c: c.rollout.folding == "branch")  # fmt: skip
def _process_reward(step: StepData) -> Tensor:
    """FoldGRPO per-token process rewards Q recorded by the folding rollout (TokenBatch.process_reward)."""
    return step.tokens.process_reward


@producer("full_ctx_logp", "learner pass", "[B, L]", setting="rollout.folding=summary",
          available=lambda c: c.rollout.folding == "summary")  # fmt: skip
def _full_ctx_logp(step: StepData) -> Tensor:
    """log-probs under the full unfolded context, no grad (agentrl.train.fullctx; NaN = turn dropped)."""
    from agentrl.train.fullctx import full_context_logprobs

    return full_context_logprobs(step)


@producer("token_rewards", "rollout record", "[B, L]")
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
@producer("row_rollout", "batch builder", "[B]")
def _row_rollout(step: StepData) -> Tensor:
    """rollout (episode) index of each row (TokenBatch.row_episode)."""
    return step.tokens.row_episode


@producer("seq_id", "batch builder", "[B]")
def _seq_id(step: StepData) -> Tensor:
    """per-rollout normaliser id of each row: its rollout (algo.agg_unit=rollout)."""
    return step.tokens.row_episode


@producer("outcome", "rollout record", "[R]")
def _outcome(step: StepData) -> Tensor:
    """outcome reward of each rollout."""
    return torch.tensor([float(ep.outcome) for ep in step.episodes], dtype=torch.float32)


@producer("group_id", "rollout record", "[R]")
def _group_id(step: StepData) -> Tensor:
    """prompt group of each rollout."""
    ids: dict[str, int] = {}
    return torch.tensor([ids.setdefault(ep.group_id or ep.episode_id, len(ids)) for ep in step.episodes])


@producer("task_group", "rollout record", "[R]")
def _task_group(step: StepData) -> Tensor:
    """task of each rollout: every tree of one task shares it (Tree-GRPO's inter-tree group; = group_id for chains)."""
    import re

    ids: dict[str, int] = {}
    groups = [re.sub(r"/tree\d+$", "", ep.group_id) if ep.group_id else ep.episode_id for ep in step.episodes]
    return torch.tensor([ids.setdefault(group, len(ids)) for group in groups])


@producer("finished", "rollout record", "[R]")
def _finished(step: StepData) -> Tensor:
    """SUPO: a rollout is finished when it ended on its own (not cut by a summary/step/context limit)."""
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


@producer("step_reward", "rollout record", "[B, K]")
def _step_reward(step: StepData) -> Tensor:
    """env reward of each turn."""
    return _per_row_turns(step, lambda turn: turn.reward)


@producer("anchor_id", "rollout record", "[B, K]")
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


@producer(
    "gt_logprob", "scorer", "[B, K+1]", setting="an env whose tasks carry gold answers (algo.ig_template)"
)
def _gt_logprob(step: StepData) -> Tensor:
    """IGPO gold-answer scorer: mean log-prob of the gold answer after 0..K turns (no gradient)."""
    if step.ig_scorer is None:
        raise ConfigError(
            "algo.advantage",
            f"{step.config.algo.advantage!r} needs gold-answer scoring, which this trainer was not given",
            "use an env whose tasks have answers (search) and the HF/torch learner",
        )
    per_rollout = step.ig_scorer(step.episodes)  # [R, K+1]
    return per_rollout[step.tokens.row_episode]


__all__ = [
    "BATCH_FIELDS", "LazyBatch", "LazyScores", "Producer", "StepData", "field_builder", "producer",
]  # fmt: skip
