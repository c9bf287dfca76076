"""Registry entries: one declared contract between the objectives and whatever feeds them.

An estimator is declared by its function (:class:`Estimator`, :func:`estimator`): the positional
parameters are the canonical names of the tensors it reads (``needs``, derived; the producers of
those names are registered in :mod:`agentrl.train.fields`, one per name, and an estimator may bring
the producer of a new one), the keyword-only parameters with defaults are its options. A loss
declares its tensors (``head``, ``keywords``) and takes its options from the raw function's keyword
defaults. ``option_defaults`` gives the options (function defaults, then the entry's presets);
:meth:`Estimator.from_batch` / :meth:`Loss.from_batch` hand the function exactly the declared
needs and nothing else, so a declaration that lies fails at once.

Each entry is also callable exactly like the raw function (presets applied first).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from agentrl.algos import advantages as adv_lib
from agentrl.algos import kl as kl_lib
from agentrl.algos import losses as loss_lib

Batch = Mapping[str, Tensor]


def gather(batch: Batch, names: tuple[str, ...], who: str) -> dict[str, Tensor]:
    """``{name: batch[name]}`` for exactly ``names``; a missing one raises naming every missing field."""
    missing = [n for n in names if n not in batch or batch[n] is None]
    if missing:
        have = ", ".join(sorted(batch)) or "(empty)"  # keys only: a lazy batch builds nothing here
        raise KeyError(f"{who} needs batch field(s) {', '.join(map(repr, missing))}; the batch has: {have}")
    return {n: batch[n] for n in names}


def keyword_defaults(*fns: Callable[..., Any]) -> dict[str, Any]:
    """Keyword-only parameters with defaults of ``fns`` (first one wins on a clash)."""
    out: dict[str, Any] = {}
    for fn in fns:
        for p in inspect.signature(fn).parameters.values():
            if p.kind is p.KEYWORD_ONLY and p.default is not p.empty:
                out.setdefault(p.name, p.default)
    return out


LEVEL_NEEDS = {"rollout": ("row_rollout", "loss_mask"), "turn": ("turn_id", "loss_mask"), "token": ("loss_mask",)}
"""What :meth:`Estimator.from_batch` itself reads to spread each level's output over tokens."""


def tensor_parameters(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The names of ``fn``'s parameters that take batch fields: every positional one without a default."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(
        p.name for p in inspect.signature(fn).parameters.values() if p.kind in kinds and p.default is p.empty
    )


def call_with(fn: Callable[..., Any], batch: Batch, options: Mapping[str, Any], who: str) -> Any:
    """``fn(**{name: batch[name] for its tensor parameters}, **options)``."""
    return fn(**gather(batch, tensor_parameters(fn), who), **options)


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator, declared by its function.

    ``call``'s parameters say everything: its positional parameters are canonical batch-field names
    (``outcome``, ``group_id``, ``turn_id``, ... : :mod:`agentrl.train.fields`), and the estimator
    receives exactly those tensors; its keyword-only parameters with defaults are options, as are
    ``fn``'s (or ``option_fns``'s) when ``call`` forwards ``**options`` to them. ``call`` is ``fn``
    itself when the raw function's parameters already carry canonical names (``grpo``,
    ``tree_grpo``). :attr:`needs` is derived: ``call``'s tensors plus what ``level`` needs to spread
    the output over tokens (:data:`LEVEL_NEEDS`).

    ``level`` says what ``call`` returns: ``rollout`` ``[R]``, ``turn`` ``[B, K]`` or ``token``
    ``[B, L]``; :meth:`from_batch` always returns token-level advantages.
    ``keep_rollouts`` (optional, declared the same way) gives the ``[R]`` bool rollouts whose rows
    may train under the given options (SUPO's overlong masking); the trainer removes the other rows
    from the loss mask, so they contribute exactly zero to the loss, its denominators, KL and entropy.
    ``producers``: the producers (:class:`agentrl.train.fields.Producer`) of fields only this
    estimator reads; the objective plan registers them when a config selects the estimator.
    """

    name: str
    fn: Callable[..., Any]
    level: str
    call: Callable[..., Any] | None = None  # (**needed tensors, **options) -> raw output; None: fn
    presets: Mapping[str, Any] = field(default_factory=dict)
    option_fns: tuple[Callable[..., Any], ...] = ()  # whose keyword options ``call`` forwards (default: fn)
    keep_rollouts: Callable[..., Tensor | None] | None = None
    diagnose: Callable[..., dict[str, float]] | None = None
    """(**needed tensors, **options) -> mechanism metrics (IGPO's info gains, EMPG's scaling spread), logged per step."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """What a study report calls each ``diagnose`` metric it aggregates (metric key -> label)."""
    table: tuple[str, ...] = ()
    """The ``labels`` keys a study's report.md table shows (when any arm logged them)."""
    producers: tuple[Any, ...] = ()
    needs: tuple[str, ...] = field(init=False, default=())
    """The batch fields this estimator reads: ``call``'s tensor parameters, then the level's."""

    def __post_init__(self) -> None:
        if self.level not in LEVEL_NEEDS:
            raise ValueError(f"estimator '{self.name}': level must be one of {', '.join(LEVEL_NEEDS)}, got {self.level!r}")
        if self.call is None:
            object.__setattr__(self, "call", self.fn)
        needs = tensor_parameters(self.call)
        for what, fn in (("keep_rollouts", self.keep_rollouts), ("diagnose", self.diagnose)):
            extra = [n for n in tensor_parameters(fn) if n not in needs] if fn is not None else []
            if extra:
                raise ValueError(f"estimator '{self.name}': {what} reads {', '.join(extra)}, which its function "
                                 f"does not take; name them as parameters of the estimator's function")  # fmt: skip
        missing = [k for k in self.table if k not in self.labels]
        if missing:
            raise ValueError(f"estimator '{self.name}': table names {', '.join(missing)} without a label")
        object.__setattr__(self, "needs", needs + tuple(n for n in LEVEL_NEEDS[self.level] if n not in needs))

    def __call__(self, *args: Any, **options: Any) -> Any:
        return self.fn(*args, **{**self.presets, **options})

    def option_defaults(self) -> dict[str, Any]:
        """Every option this estimator takes with its resolved default (``call``'s own keyword
        options, then the raw function's, then presets)."""
        own = keyword_defaults(self.call) if self.call is not self.fn else {}
        return {**keyword_defaults(*(self.option_fns or (self.fn,))), **own, **self.presets}

    def resolve(self, explicit: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults, then presets, then ``explicit`` (an explicit value always wins)."""
        return {**self.option_defaults(), **explicit}

    def _options_for(self, fn: Callable[..., Any], options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` (presets first) as ``fn`` takes them: all of them where it has ``**``."""
        params = inspect.signature(fn).parameters.values()
        opts = {**self.presets, **options}
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return opts
        return {k: v for k, v in opts.items() if k in {p.name for p in params if p.kind is p.KEYWORD_ONLY}}

    def row_keep(self, batch: Batch, options: Mapping[str, Any]) -> Tensor | None:
        """``[R]`` bool rollouts allowed to train (None: all)."""
        if self.keep_rollouts is None:
            return None
        return call_with(self.keep_rollouts, batch, self._options_for(self.keep_rollouts, options),
                         f"advantage '{self.name}'")  # fmt: skip

    @torch.no_grad()
    def diagnostics(self, batch: Batch, options: Mapping[str, Any]) -> dict[str, float]:
        """What this estimator did on ``batch`` (``{}`` when it declares no ``diagnose``)."""
        if self.diagnose is None:
            return {}
        return call_with(self.diagnose, batch, self._options_for(self.diagnose, options), f"advantage '{self.name}'")

    @torch.no_grad()
    def from_batch(self, batch: Batch, **options: Any) -> tuple[Tensor, Tensor | None]:
        """``(advantages [B, L], returns [B, L] or None)``, zero off ``loss_mask``."""
        b = gather(batch, self.needs, f"advantage '{self.name}'")
        out = call_with(self.call, b, {**self.presets, **options}, f"advantage '{self.name}'")
        returns = None
        if isinstance(out, tuple):
            out, returns = out
        mask = b["loss_mask"].bool()
        if self.level == "rollout":
            out = out[b["row_rollout"]][:, None].expand(mask.shape)
        elif self.level == "turn":
            out = adv_lib.to_tokens(out, torch.where(mask, b["turn_id"], -1))
        return torch.where(mask, out, torch.zeros_like(out)), returns


def estimator(name: str, level: str, **declaration: Any) -> Callable[[Callable[..., Any]], Estimator]:
    """Decorator: declare a function as advantage estimator ``name`` and register it.

    The function's positional parameters are canonical batch-field names, its keyword-only
    parameters the options; ``declaration`` takes :class:`Estimator`'s other fields (``presets``,
    ``keep_rollouts``, ``diagnose``, ``labels``, ``table``, ``producers`` for a new field)::

        @estimator("rloo", "rollout")
        def rloo(outcome, group_id, *, scale=1.0): ...

    A config selects it as ``algo.advantage: rloo`` once the module is imported, or as
    ``algo.advantage: my_package.my_module:rloo`` (importing it on the way).
    """
    from agentrl.registry import ADVANTAGES

    def register(fn: Callable[..., Any]) -> Estimator:
        entry = Estimator(name, fn, level, **declaration)
        ADVANTAGES.register(name, entry)
        return entry

    return register


def _always(_: Mapping[str, Any]) -> bool:
    return True


@dataclass(frozen=True)
class Loss:
    """A loss: its needs, options, presets and batch adapter.

    The raw function's positional arguments are ``(needs[0], needs[1], target, needs[2])``: for
    policy losses ``(logp, old_logp, advantages, loss_mask)``, for the value loss
    ``(values, old_values, returns, loss_mask)``. ``keywords`` are tensor keyword arguments, each
    needed when its predicate on the resolved options holds (``turn_id`` only for ``ratio="turn"``).
    ``agg_unit`` (when the entry takes it) is what a "sequence" is in the seq-mean and constant
    aggregations: ``row`` or ``rollout`` (all rows of a rollout, via the ``seq_id`` tensor).
    ``role``: ``policy`` (selectable as ``algo.loss``) or ``auxiliary`` (used by the trainer).
    """

    name: str
    fn: Callable[..., tuple[Tensor, dict[str, float]]]
    presets: Mapping[str, Any] = field(default_factory=dict)
    head: tuple[str, str, str] = ("logp", "old_logp", "loss_mask")
    keywords: Mapping[str, Callable[[Mapping[str, Any]], bool]] = field(default_factory=dict)
    extra_options: Mapping[str, Any] = field(default_factory=dict)
    role: str = "policy"
    inert_at_zero_advantage: bool = False
    """The loss and its gradient are exactly 0 on a token whose advantage is 0, whatever the
    ratio (PPO-clip and its variants), so rows with no non-zero advantage may skip the learner
    pass (``train.skip_zero_advantage``). False where another term acts on every token (FoldAct)."""

    def __call__(self, *args: Any, **options: Any) -> tuple[Tensor, dict[str, float]]:
        return self.fn(*args, **{**self.presets, **options})

    def option_defaults(self) -> dict[str, Any]:
        """Every option with its resolved default (function default, then preset); tensors excluded."""
        defaults = {k: v for k, v in keyword_defaults(self.fn).items() if k not in self.keywords}
        return {**defaults, **self.extra_options, **self.presets}

    def resolve(self, explicit: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults, then presets, then ``explicit`` (an explicit value always wins)."""
        return {**self.option_defaults(), **explicit}

    def needs(self, options: Mapping[str, Any] | None = None) -> tuple[str, ...]:
        """The tensors this loss reads under ``options`` (resolved; presets apply when omitted)."""
        opts = self.resolve(options or {})
        return self.head + tuple(k for k, when in self.keywords.items() if when(opts))

    def from_batch(self, batch: Batch, target: Tensor, **options: Any) -> tuple[Tensor, dict[str, float]]:
        """``fn(b[head[0]], b[head[1]], target, b[head[2]], **keyword needs, **options)``."""
        opts = {**self.presets, **options}
        b = gather(batch, self.needs(opts), f"loss '{self.name}'")
        first, second, mask = (b.pop(name) for name in self.head)
        for name in self.extra_options:  # e.g. agg_unit: chose which tensors are needed; not arguments
            opts.pop(name, None)
        return self.fn(first, second, target, mask, **b, **opts)


def pairing_problem(estimator: Estimator, loss: Loss, loss_options: Mapping[str, Any]) -> str | None:
    """Why ``estimator`` cannot train with ``loss`` under these (resolved) options, or None."""
    if loss.role != "policy":
        return f"'{loss.name}' is not a policy loss (the trainer uses it itself)"
    if loss_options.get("ratio") == "sequence" and estimator.level != "rollout":
        return (
            f"a sequence-level ratio (GSPO) weights a whole row by one advantage, but '{estimator.name}' "
            f"gives {estimator.level}-level advantages that vary within a row"
        )
    return None


# --------------------------------------------------------------------------- estimators
# Each adapter's parameters are canonical batch-field names (its needs); ``**o`` are the options,
# forwarded to the raw function in agentrl.algos.advantages. grpo and tree_grpo need none.
def _gae(token_rewards: Tensor, values: Tensor, loss_mask: Tensor, **o: Any) -> tuple[Tensor, Tensor]:
    return adv_lib.gae(token_rewards, values, loss_mask, **o)


def _igpo_gain(gt_logprob: Tensor, turn_id: Tensor, loss_mask: Tensor, kind: str) -> tuple[Tensor, Tensor]:
    """``(info gain [B, K], turn mask [B, K])`` of the configured ``info_gain_kind``."""
    _, turn_mask = adv_lib.turn_mean(loss_mask.to(torch.float32), turn_id, loss_mask, gt_logprob.shape[1] - 1)
    return adv_lib.info_gain(gt_logprob, turn_mask, kind=kind), turn_mask


def _igpo(outcome: Tensor, group_id: Tensor, gt_logprob: Tensor, turn_id: Tensor, loss_mask: Tensor,
          row_rollout: Tensor, *, info_gain_kind: str = "log_prob_diff", **o: Any) -> Tensor:  # fmt: skip
    gain, turn_mask = _igpo_gain(gt_logprob, turn_id, loss_mask, info_gain_kind)
    return adv_lib.igpo(outcome[row_rollout], gain, turn_mask, group_id[row_rollout], **o)


def _igpo_diagnose(gt_logprob: Tensor, turn_id: Tensor, loss_mask: Tensor, *,
                   info_gain_kind: str = "log_prob_diff", **_: Any) -> dict[str, float]:  # fmt: skip
    """Info-gain turns (every valid turn but a row's last, which gets the outcome): how many carry a
    non-zero gain, the mean of those gains and the mean |gain| over all of them."""
    gain, turn_mask = _igpo_gain(gt_logprob, turn_id, loss_mask, info_gain_kind)
    tm = turn_mask.bool()
    last = tm & (tm.long().cumsum(dim=1) == tm.long().sum(dim=1, keepdim=True))  # [B, K]
    g = gain[tm & ~last]  # [T] info-gain turns
    if g.numel() == 0:
        return {"igpo/ig_turns": 0.0}
    nonzero = g.abs() > 1e-6
    return {
        "igpo/ig_turns": float(g.numel()),
        "igpo/ig_nonzero_share": float(nonzero.float().mean()),
        "igpo/ig_nonzero_mean": float(g[nonzero].mean()) if bool(nonzero.any()) else 0.0,
        "igpo/ig_abs_mean": float(g.abs().mean()),
    }


def _empg(outcome: Tensor, group_id: Tensor, entropy: Tensor, turn_id: Tensor, loss_mask: Tensor,
          row_rollout: Tensor, **o: Any) -> Tensor:  # fmt: skip
    return adv_lib.empg_grpo(outcome[row_rollout], group_id[row_rollout], entropy, turn_id, loss_mask, **o)


def _empg_diagnose(entropy: Tensor, turn_id: Tensor, loss_mask: Tensor, *, k: float = 1.0, eps: float = 1e-8,
                   **_: Any) -> dict[str, float]:  # fmt: skip
    """Spread of EMPG's scaling ``g(H)`` over the batch's steps (mean 1 by construction)."""
    step_entropy, turn_mask = adv_lib.turn_mean(entropy, turn_id, loss_mask)  # [B, K] each
    if not bool(turn_mask.any()):
        return {"empg/steps": 0.0}
    g, _ = adv_lib.empg_scale(step_entropy, turn_mask, k=k, eps=eps)
    g = g[turn_mask.bool()]  # [S]
    q = torch.quantile(g.double(), torch.tensor([0.1, 0.5, 0.9], dtype=torch.double)).tolist()
    return {
        "empg/steps": float(g.numel()),
        "empg/scale_p10": q[0],
        "empg/scale_p50": q[1],
        "empg/scale_p90": q[2],
        "empg/scale_std": float(g.std(unbiased=False)),
        "empg/step_entropy_mean": float(step_entropy[turn_mask.bool()].mean()),
    }


def _gigpo(outcome: Tensor, group_id: Tensor, step_reward: Tensor, anchor_id: Tensor, turn_id: Tensor,
           loss_mask: Tensor, row_rollout: Tensor, **o: Any) -> Tensor:  # fmt: skip
    _, turn_mask = adv_lib.turn_mean(loss_mask.to(torch.float32), turn_id, loss_mask, step_reward.shape[1])
    return adv_lib.gigpo(outcome[row_rollout], group_id[row_rollout], step_reward, anchor_id, turn_mask, **o)


def _foldgrpo(process_reward: Tensor, outcome: Tensor, group_id: Tensor, row_rollout: Tensor, **o: Any) -> Tensor:
    return adv_lib.foldgrpo(outcome, row_rollout, process_reward, group_id, **o)


def _supo(finished: Tensor, outcome: Tensor, group_id: Tensor, **o: Any) -> Tensor:
    return adv_lib.supo(outcome, group_id, finished, **o)


def _supo_keep(finished: Tensor, *, mask_unfinished: bool = True, **_: Any) -> Tensor | None:
    return finished.bool() if mask_unfinished else None


ESTIMATORS: tuple[Estimator, ...] = (
    Estimator("grpo", adv_lib.grpo, "rollout"),
    Estimator("drgrpo", adv_lib.grpo, "rollout", presets={"std_normalize": False}),
    Estimator("gae", adv_lib.gae, "token", _gae),
    Estimator(
        "igpo",
        adv_lib.igpo,
        "turn",
        _igpo,
        diagnose=_igpo_diagnose,
        labels={
            "igpo/ig_nonzero_share": "IGPO: share of IG turns with non-zero gain",
            "igpo/ig_nonzero_mean": "IGPO: mean non-zero gain",
            "igpo/ig_abs_mean": "IGPO: mean |gain|",
        },
        table=("igpo/ig_nonzero_share", "igpo/ig_nonzero_mean"),
    ),  # fmt: skip
    Estimator(
        "empg",
        adv_lib.empg,
        "turn",
        _empg,
        option_fns=(adv_lib.empg_grpo, adv_lib.empg),
        diagnose=_empg_diagnose,
        labels={
            "empg/scale_p10": "EMPG: scale g(H) p10",
            "empg/scale_p50": "EMPG: scale g(H) p50",
            "empg/scale_p90": "EMPG: scale g(H) p90",
            "empg/scale_std": "EMPG: scale g(H) std",
        },
        table=("empg/scale_p10", "empg/scale_p90"),
    ),  # fmt: skip
    Estimator("gigpo", adv_lib.gigpo, "turn", _gigpo),
    Estimator("foldgrpo", adv_lib.foldgrpo, "token", _foldgrpo),
    Estimator("supo", adv_lib.supo, "rollout", _supo, keep_rollouts=_supo_keep),
    # Tree-GRPO (tree rollouts, rollout.branches > 0): intra-tree + inter-tree, and each term alone
    Estimator("tree_grpo", adv_lib.tree_grpo, "rollout"),
    Estimator("tree_intra", adv_lib.tree_grpo, "rollout", presets={"inter": 0.0}),
    Estimator("tree_inter", adv_lib.tree_grpo, "rollout", presets={"intra": 0.0}),
)


# --------------------------------------------------------------------------- losses
def _turn_ratio(o: Mapping[str, Any]) -> bool:
    return o.get("ratio") == "turn"


def _per_rollout(o: Mapping[str, Any]) -> bool:
    return o.get("agg_unit") == "rollout"


def _tis(o: Mapping[str, Any]) -> bool:
    return o.get("mismatch_correction") == "tis"


_PPO = {"turn_id": _turn_ratio, "seq_id": _per_rollout, "is_weight": _tis}
_UNIT = {"agg_unit": "row"}
# sampler-learner mismatch (agentrl.algos.mismatch): tis reads the is_weight tensor; the masks act
# through loss_mask (agentrl.train.fields), so the loss function itself takes neither option
_MISMATCH = {"mismatch_correction": "none", "mismatch_cap": 2.0}


def _ppo(
    name: str, presets: Mapping[str, Any] | None = None, fn: Callable[..., Any] = loss_lib.ppo_clip
) -> Loss:
    return Loss(name, fn, dict(presets or {}), keywords=_PPO, extra_options={**_UNIT, **_MISMATCH},
                inert_at_zero_advantage=True)


LOSS_ENTRIES: tuple[Loss, ...] = (
    _ppo("ppo_clip"),
    _ppo("grpo", {"agg": "seq-mean-token-mean"}),
    _ppo("drgrpo", {"agg": "constant"}),
    _ppo("dapo", {"clip_high": 0.28, "agg": "token-mean"}),
    _ppo("gspo", {"ratio": "sequence", "clip_low": 3e-4, "clip_high": 4e-4, "agg": "seq-mean-token-mean"}),
    _ppo("turn_ppo", {"ratio": "turn"}),
    _ppo("foldgrpo", {"clip_high": 0.28, "agg": "token-mean"}),
    Loss("foldact", loss_lib.foldact, keywords={"token_kind": _always, "full_ctx_logp": _always}),
    Loss("clip_bias_norm", loss_lib.clip_bias_norm, keywords=_PPO, extra_options=_UNIT, role="auxiliary"),
    Loss("value", loss_lib.value_loss, head=("values", "old_values", "loss_mask"), role="auxiliary"),
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
