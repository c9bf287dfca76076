"""Registry entries: one uniform way for the trainer to call any estimator or loss by name.

Each registered object is callable exactly like the raw function (preset options applied first),
and also has a ``from_batch`` method that takes the trainer's token batch (a mapping of canonical
field names, listed in :mod:`agentrl.algos`) plus config options, so the trainer never branches on
an algorithm's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from agentrl.algos import advantages as adv_lib
from agentrl.algos import kl as kl_lib
from agentrl.algos import losses as loss_lib

Batch = Mapping[str, Tensor]


# Canonical field -> the name ``agentrl.trajectory.TokenBatch`` uses for it, so a batch can be
# ``{**vars(token_batch), "logp": ..., "outcome": ..., "group_id": ...}``.
ALIASES = {"old_logp": "old_logprobs", "row_rollout": "row_episode", "token_kind": "source"}


def _get(batch: Batch, name: str) -> Tensor | None:
    if name in batch and batch[name] is not None:
        return batch[name]
    alias = ALIASES.get(name)
    return batch.get(alias) if alias is not None else None


def _field(batch: Batch, name: str, who: str) -> Tensor:
    value = _get(batch, name)
    if value is None:
        have = ", ".join(sorted(batch)) or "(empty)"  # keys only: a lazy batch builds nothing here
        alias = f" (or '{ALIASES[name]}')" if name in ALIASES else ""
        raise KeyError(f"{who} needs batch field '{name}'{alias}; the batch has: {have}")
    return value


def _row_rollout(batch: Batch) -> Tensor:
    """``[B]`` rollout index of each row; identity when every rollout is one row."""
    rows = _get(batch, "row_rollout")
    if rows is not None:
        return rows
    return torch.arange(batch["loss_mask"].shape[0], device=batch["loss_mask"].device)


def _per_row(batch: Batch, name: str, who: str) -> Tensor:
    """A per-rollout field ``[R]`` indexed to rows ``[B]``."""
    return _field(batch, name, who)[_row_rollout(batch)]


def _turn_mask(batch: Batch, num_turns: int) -> Tensor:
    if "turn_mask" in batch:
        return batch["turn_mask"].bool()
    _, mask = adv_lib.turn_mean(
        batch["loss_mask"].to(torch.float32), batch["turn_id"], batch["loss_mask"], num_turns
    )
    return mask


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator with its preset options and its batch adapter.

    ``level`` says what the raw function returns: ``rollout`` ``[R]``, ``turn`` ``[B, K]`` or
    ``token`` ``[B, L]``; :meth:`from_batch` always returns token-level advantages.
    """

    name: str
    fn: Callable[..., Any]
    level: str
    call: Callable[[Batch, dict[str, Any]], Any]  # (batch, options) -> raw output
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self, *args: Any, **options: Any) -> Any:
        return self.fn(*args, **{**self.defaults, **options})

    @torch.no_grad()
    def from_batch(self, batch: Batch, **options: Any) -> tuple[Tensor, Tensor | None]:
        """``(advantages [B, L], returns [B, L] or None)``, zero off ``batch["loss_mask"]``."""
        out = self.call(batch, {**self.defaults, **options})
        returns = None
        if isinstance(out, tuple):
            out, returns = out
        mask = batch["loss_mask"].bool()
        if self.level == "rollout":
            out = out[_row_rollout(batch)][:, None].expand(mask.shape)
        elif self.level == "turn":
            out = adv_lib.to_tokens(out, torch.where(mask, batch["turn_id"], -1))
        return torch.where(mask, out, torch.zeros_like(out)), returns


@dataclass(frozen=True)
class Loss:
    """A loss with preset options and its batch adapter.

    The raw function's positional arguments are ``(head[0], head[1], target, head[2])``: for policy
    losses ``(logp, old_logp, advantages, loss_mask)``, for the value loss
    ``(values, old_values, returns, loss_mask)``. ``inputs`` are extra batch fields passed as
    keywords when present; ``required`` ones must be present.
    """

    name: str
    fn: Callable[..., tuple[Tensor, dict[str, float]]]
    inputs: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    head: tuple[str, str, str] = ("logp", "old_logp", "loss_mask")
    required: tuple[str, ...] = ()

    def __call__(self, *args: Any, **options: Any) -> tuple[Tensor, dict[str, float]]:
        return self.fn(*args, **{**self.defaults, **options})

    def from_batch(self, batch: Batch, target: Tensor, **options: Any) -> tuple[Tensor, dict[str, float]]:
        """``fn(batch[head[0]], batch[head[1]], target, batch[head[2]], **extras, **options)``."""
        who = f"loss '{self.name}'"
        first, second, mask = (_field(batch, name, who) for name in self.head)
        extras = {k: _get(batch, k) for k in self.inputs if _get(batch, k) is not None}
        extras.update({k: _field(batch, k, who) for k in self.required})
        return self.fn(first, second, target, mask, **extras, **{**self.defaults, **options})


def _grpo(b: Batch, o: dict[str, Any]) -> Tensor:
    return adv_lib.grpo(_field(b, "outcome", "grpo"), _field(b, "group_id", "grpo"), **o)


def _gae(b: Batch, o: dict[str, Any]) -> tuple[Tensor, Tensor]:
    return adv_lib.gae(_field(b, "token_rewards", "gae"), _field(b, "values", "gae"), b["loss_mask"], **o)


def _igpo(b: Batch, o: dict[str, Any]) -> Tensor:
    o = dict(o)
    kind = o.pop("info_gain_kind", "log_prob_diff")
    gt = _field(b, "gt_logprob", "igpo")  # [B, K + 1]
    turn_mask = _turn_mask(b, gt.shape[1] - 1)
    gain = adv_lib.info_gain(gt, turn_mask, kind=kind)
    return adv_lib.igpo(_per_row(b, "outcome", "igpo"), gain, turn_mask, _per_row(b, "group_id", "igpo"), **o)


def _empg(b: Batch, o: dict[str, Any]) -> Tensor:
    return adv_lib.empg_grpo(
        _per_row(b, "outcome", "empg"),
        _per_row(b, "group_id", "empg"),
        _field(b, "entropy", "empg"),
        _field(b, "turn_id", "empg"),
        b["loss_mask"],
        **o,
    )


def _gigpo(b: Batch, o: dict[str, Any]) -> Tensor:
    step_reward = _field(b, "step_reward", "gigpo")
    return adv_lib.gigpo(
        _per_row(b, "outcome", "gigpo"),
        _per_row(b, "group_id", "gigpo"),
        step_reward,
        _field(b, "anchor_id", "gigpo"),
        _turn_mask(b, step_reward.shape[1]),
        **o,
    )


def _foldgrpo(b: Batch, o: dict[str, Any]) -> Tensor:
    return adv_lib.foldgrpo(
        _field(b, "outcome", "foldgrpo"),
        _row_rollout(b),
        _field(b, "process_reward", "foldgrpo"),
        _field(b, "group_id", "foldgrpo"),
        **o,
    )


def _supo(b: Batch, o: dict[str, Any]) -> Tensor:
    return adv_lib.supo(
        _field(b, "outcome", "supo"), _field(b, "group_id", "supo"), _field(b, "finished", "supo"), **o
    )


ESTIMATORS: tuple[Estimator, ...] = (
    Estimator("grpo", adv_lib.grpo, "rollout", _grpo),
    Estimator("drgrpo", adv_lib.grpo, "rollout", _grpo, {"std_normalize": False}),
    Estimator("gae", adv_lib.gae, "token", _gae),
    Estimator("igpo", adv_lib.igpo, "turn", _igpo),
    Estimator("empg", adv_lib.empg, "turn", _empg),
    Estimator("gigpo", adv_lib.gigpo, "turn", _gigpo),
    Estimator("foldgrpo", adv_lib.foldgrpo, "token", _foldgrpo),
    Estimator("supo", adv_lib.supo, "rollout", _supo),
)

_PPO_INPUTS = ("turn_id", "seq_id")
LOSS_ENTRIES: tuple[Loss, ...] = (
    Loss("ppo_clip", loss_lib.ppo_clip, _PPO_INPUTS),
    Loss("grpo", loss_lib.ppo_clip, _PPO_INPUTS, {"agg": "seq-mean-token-mean"}),
    Loss("drgrpo", loss_lib.ppo_clip, _PPO_INPUTS, {"agg": "constant"}),
    Loss("dapo", loss_lib.ppo_clip, _PPO_INPUTS, {"clip_high": 0.28, "agg": "token-mean"}),
    Loss(
        "gspo",
        loss_lib.ppo_clip,
        _PPO_INPUTS,
        {"ratio": "sequence", "clip_low": 3e-4, "clip_high": 4e-4, "agg": "seq-mean-token-mean"},
    ),
    Loss("turn_ppo", loss_lib.ppo_clip, _PPO_INPUTS, {"ratio": "turn"}),
    Loss("foldgrpo", loss_lib.ppo_clip, _PPO_INPUTS, {"clip_high": 0.28, "agg": "token-mean"}),
    # The entry reads agentrl.trajectory.Source codes (MODEL = 1 action, SUMMARY = 3 summary) so it
    # works on TokenBatch.source; the raw function defaults to FoldAct's own token kinds.
    Loss(
        "foldact",
        loss_lib.foldact,
        defaults={"summary_kinds": (3,), "action_kinds": (1,)},
        required=("token_kind", "full_ctx_logp"),
    ),
    Loss("clip_bias_norm", loss_lib.clip_bias_norm, _PPO_INPUTS),
    Loss("value", loss_lib.value_loss, head=("values", "old_values", "loss_mask")),
)


def kl_estimator(kind: str) -> Callable[..., Tensor]:
    """``fn(logp, ref_logp, *, mask=None, clamp=None) -> [B, L]`` for one estimator kind."""

    def estimate(
        logp: Tensor, ref_logp: Tensor, *, mask: Tensor | None = None, clamp: float | None = None
    ) -> Tensor:
        return kl_lib.kl(logp, ref_logp, kind, mask=mask, clamp=clamp)

    estimate.__name__ = f"kl_{kind}"
    estimate.__doc__ = f"KL estimator {kind} (see agentrl.algos.kl.kl)."
    return estimate
