"""The objective a config asks for, resolved and checked before anything runs.

:func:`objective_plan` looks the estimator and the loss up by name, resolves every option
(function default, then the entry's preset, then the config's explicit value, which always wins),
and refuses with a :class:`~agentrl.errors.ConfigError` naming the field and the fix:

- an option the objective does not take (it would be silently ignored);
- a declared need whose producer (:data:`agentrl.train.fields.BATCH_FIELDS`) this config does not
  enable, naming the producer and the setting that provides it;
- an estimator/loss pair that cannot train together (:func:`agentrl.algos.spec.pairing_problem`).

``RunConfig.validate`` calls it; the update uses the same plan, so what was validated is what runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.errors import ConfigError

# AlgoConfig fields that are loss / estimator options; None = unset (the preset or default applies)
LOSS_FIELDS = ("ratio", "agg", "agg_unit", "clip_low", "clip_high", "mismatch_correction", "mismatch_cap")
ESTIMATOR_FIELDS = ("gamma", "lam")


@dataclass(frozen=True)
class ObjectivePlan:
    """A config's estimator and policy loss with every option resolved, and what they read."""

    estimator: Any  # agentrl.algos.spec.Estimator
    loss: Any  # agentrl.algos.spec.Loss
    advantage_options: dict[str, Any]
    loss_options: dict[str, Any]

    @property
    def loss_needs(self) -> tuple[str, ...]:
        return self.loss.needs(self.loss_options)

    def summary(self) -> dict[str, Any]:
        """JSON-able record of the resolved objective (printed at start, saved in summary.json)."""

        def plain(value: Any) -> Any:
            return list(value) if isinstance(value, tuple) else value

        return {
            "advantage": self.estimator.name,
            "advantage_options": {k: plain(v) for k, v in sorted(self.advantage_options.items())},
            "advantage_needs": list(self.estimator.needs),
            "loss": self.loss.name,
            "loss_options": {k: plain(v) for k, v in sorted(self.loss_options.items())},
            "loss_needs": list(self.loss_needs),
        }


def _explicit(algo: Any, fields: tuple[str, ...], extra: dict[str, Any], entry: Any, what: str,
              section: str) -> dict[str, Any]:  # fmt: skip
    accepted = entry.option_defaults()
    explicit = {k: getattr(algo, k) for k in fields if getattr(algo, k) is not None}
    for key in explicit:
        if key not in accepted:
            raise ConfigError(
                f"algo.{key}",
                f"is set but {what} '{entry.name}' takes no {key!r}, so it would be ignored",
                f"remove it; {entry.name} takes: {', '.join(sorted(accepted)) or '(nothing)'}",
            )
    for key in extra:
        if key not in accepted:
            raise ConfigError(
                f"algo.{section}.{key}",
                f"{what} '{entry.name}' has no option {key!r}",
                f"use one of: {', '.join(sorted(accepted)) or '(none)'}",
            )
    return {**explicit, **extra}


def _check_producers(config: Any, who: str, needs: tuple[str, ...]) -> None:
    from agentrl.train.fields import BATCH_FIELDS

    for name in needs:
        if name not in BATCH_FIELDS:
            raise ConfigError("algo", f"{who} needs '{name}', which no registered producer makes")
        made = BATCH_FIELDS.get(name)
        if not made.available(config):
            raise ConfigError(
                made.setting.partition("=")[0],
                f"{who} needs '{name}', produced by the {made.kind} ({made.doc}), which this config does not enable",
                f"set {made.setting}",
            )


def objective_plan(config: Any) -> ObjectivePlan:
    """Resolve and check ``config.algo`` against the registered objectives and producers."""
    import agentrl.algos  # noqa: F401  (registers the objectives)
    from agentrl.algos.spec import Estimator, pairing_problem
    from agentrl.registry import ADVANTAGES, LOSSES
    from agentrl.train.fields import register_producers

    algo = config.algo
    estimator = ADVANTAGES.get(algo.advantage, field="algo.advantage")
    if not isinstance(estimator, Estimator):
        raise ConfigError("algo.advantage", f"{algo.advantage!r} is a {type(estimator).__name__}, not an estimator",
                          "declare it with @agentrl.algos.spec.estimator(name, level) on its function")  # fmt: skip
    register_producers(estimator.producers, f"advantage '{estimator.name}'", "algo.advantage")
    loss = LOSSES.get(algo.loss, field="algo.loss")
    if loss.role != "policy":
        policy = [n for n in LOSSES.names() if LOSSES.get(n).role == "policy"]
        raise ConfigError("algo.loss", f"'{loss.name}' is not a policy loss (the trainer uses it itself)",
                          f"use one of: {', '.join(policy)}")  # fmt: skip
    adv_options = estimator.resolve(
        _explicit(algo, ESTIMATOR_FIELDS, dict(algo.options), estimator, "advantage", "options")
    )
    loss_options = loss.resolve(
        _explicit(algo, LOSS_FIELDS, dict(algo.loss_options), loss, "loss", "loss_options")
    )
    problem = pairing_problem(estimator, loss, loss_options)
    if problem is not None:
        pairs = [
            name for name in LOSSES.names()
            if pairing_problem(estimator, LOSSES.get(name), LOSSES.get(name).resolve({})) is None
        ]  # fmt: skip
        raise ConfigError(
            "algo.loss",
            f"advantage '{estimator.name}' cannot train with loss '{loss.name}': {problem}",
            f"use a loss that pairs with {estimator.name}: {', '.join(pairs)}",
        )
    plan = ObjectivePlan(estimator, loss, adv_options, loss_options)
    _check_producers(config, f"advantage '{estimator.name}'", estimator.needs)
    _check_producers(config, f"loss '{loss.name}'", plan.loss_needs)
    if getattr(config.env, "mixture", ()):  # each env of a mixture must feed what the objective reads
        from agentrl.train.mixture import check_envs_feed

        check_envs_feed(config, f"advantage '{estimator.name}'", estimator.needs)
        check_envs_feed(config, f"loss '{loss.name}'", plan.loss_needs)
    if algo.clip_bias_correction and "ratio" not in loss_options:
        raise ConfigError(
            "algo.clip_bias_correction",
            f"the clipping-bias correction needs a PPO-clip loss; '{loss.name}' is not one",
            "use loss ppo_clip | turn_ppo | dapo | grpo | ... or set algo.clip_bias_correction=false",
        )
    _check_skip_zero_advantage(config, loss)
    _check_mismatch(config, loss_options)
    if config.rollout.branch_concurrency is not None and not config.rollout.branches:
        raise ConfigError("rollout.branch_concurrency", "has effect only with tree rollouts (rollout.branches > 0)",
                          "set rollout.branches > 0, or rollout.branch_concurrency=null (the quickstart sets 120)")  # fmt: skip
    return plan


def _check_mismatch(config: Any, loss_options: dict[str, Any]) -> None:
    """A sampler-mismatch correction weighs the learner's behaviour pass against the sampler's
    log-probs; with ``old_logprobs=sampler`` that pass is not the ratio's denominator."""
    rollout = config.rollout
    branch_t = rollout.branch_temperature
    if branch_t is not None and not rollout.branches:
        raise ConfigError("rollout.branch_temperature", "has effect only with tree rollouts (rollout.branches > 0)",
                          "set rollout.branches or leave rollout.branch_temperature unset")  # fmt: skip
    if branch_t is not None and branch_t != rollout.temperature and config.algo.old_logprobs != "recompute":
        raise ConfigError("rollout.branch_temperature",
                          f"branches sample at {branch_t:g} but the learner's log-probs are at rollout.temperature "
                          f"{rollout.temperature:g}, so the sampler's log-probs cannot be the ratio's denominator",
                          "set algo.old_logprobs=recompute (the learner's own pass before the update)")  # fmt: skip
    correction = loss_options.get("mismatch_correction", "none")
    if correction != "none" and config.algo.old_logprobs != "recompute":
        raise ConfigError("algo.mismatch_correction",
                          f"{correction!r} corrects the learner's recomputed behaviour log-probs toward the sampler's, "
                          "but algo.old_logprobs=sampler already takes the ratio against the sampler",
                          "set algo.old_logprobs=recompute, or algo.mismatch_correction=none")  # fmt: skip


def _check_skip_zero_advantage(config: Any, loss: Any) -> None:
    """``train.skip_zero_advantage`` is exact only where a zero-advantage row adds nothing at all."""
    if not config.train.skip_zero_advantage:
        return
    algo, train = config.algo, config.train
    fix = "set train.skip_zero_advantage=false"
    if not loss.inert_at_zero_advantage:
        raise ConfigError("train.skip_zero_advantage",
                          f"loss '{loss.name}' acts on tokens whose advantage is 0, so skipping them would change the update",
                          f"{fix}, or use a PPO-clip loss (ppo_clip | grpo | dapo | turn_ppo | foldgrpo | ...)")  # fmt: skip
    for name, value in (("algo.kl_coef", algo.kl_coef), ("algo.entropy_coef", algo.entropy_coef)):
        if value:
            raise ConfigError(name, f"is {value:g}: this term acts on every token, so rows with zero advantage "
                              "cannot skip the learner pass (train.skip_zero_advantage)", f"{fix}, or set {name}=0")  # fmt: skip
    if algo.critic:
        raise ConfigError("algo.critic", "the value loss trains on every row, so rows with zero advantage cannot "
                          "skip the learner pass (train.skip_zero_advantage)", f"{fix}, or set algo.critic=false")  # fmt: skip
    if train.engine != "torch":
        raise ConfigError("train.skip_zero_advantage", f"needs engine=torch (DeepSpeed steps inside each backward), got {train.engine!r}",
                          f"{fix}, or set train.engine=torch")  # fmt: skip


__all__ = ["ESTIMATOR_FIELDS", "LOSS_FIELDS", "ObjectivePlan", "objective_plan"]
