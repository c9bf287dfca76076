"""Which settings shape a held-out eval, read from the fields' declarations.

Each setting says once, where it is declared (``setting(default, eval=...)``, :mod:`agentrl.setting`),
whether it shapes what a held-out eval measures: two runs that agree on :data:`EVAL_SETTINGS`
evaluate alike, so one may take the other's eval before RL (``train.eval_before_from``);
:data:`SAMPLED_EVAL_SETTINGS` shape it only when it samples (``train.eval_temperature > 0``);
:data:`NOT_EVAL_SETTINGS` maps every other setting to why it does not.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from agentrl.config.load import resolve_env_budgets
from agentrl.config.sections import RunConfig
from agentrl.setting import WHEN_SAMPLED, eval_class


def _eval_classes() -> dict[str, bool | str]:
    """Each setting's ``eval=`` (:func:`agentrl.setting.setting`), dotted key -> True / WHEN_SAMPLED / why not."""
    hints = typing.get_type_hints(RunConfig)
    return {f"{section.name}.{f.name}": eval_class(f) for section in dataclasses.fields(RunConfig)
            for f in dataclasses.fields(hints[section.name])}  # fmt: skip


EVAL_SETTINGS = tuple(k for k, v in _eval_classes().items() if v is True or v == WHEN_SAMPLED)
SAMPLED_EVAL_SETTINGS = tuple(k for k, v in _eval_classes().items() if v == WHEN_SAMPLED)
NOT_EVAL_SETTINGS = {k: v for k, v in _eval_classes().items() if isinstance(v, str) and v != WHEN_SAMPLED}


def eval_settings(config: RunConfig) -> dict[str, Any]:
    """``EVAL_SETTINGS`` of a run config, dotted key -> value (a greedy eval's sampling filters as
    ``None``: unused)."""
    config = resolve_env_budgets(config)  # an unset turn budget evaluates as the registration's
    values = {}
    for key in EVAL_SETTINGS:
        section, name = key.split(".")
        values[key] = getattr(getattr(config, section), name)
    if not config.train.eval_temperature:
        values.update(dict.fromkeys(SAMPLED_EVAL_SETTINGS))
    return values


def eval_differences(a: RunConfig, b: RunConfig) -> list[str]:
    """The eval settings two configs disagree on, as ``key: a -> b``."""
    left, right = eval_settings(a), eval_settings(b)
    return [f"{k}: {left[k]!r} -> {right[k]!r}" for k in EVAL_SETTINGS if left[k] != right[k]]
