"""A run setting's declaration: its default, and what it means to a held-out eval.

Every field of the run config's sections (``agentrl.config``'s model/env/algo/train and
:class:`agentrl.rollout.settings.RolloutConfig`) is declared with :func:`setting`, so whether it
shapes what a held-out eval measures is said once, where the field is, not in a second list of
field names::

    max_turns: int | None = setting(None, eval=True)
    lora_rank: int = setting(0, eval="a fresh adapter starts at zero (B = 0): the weights are the warm-up's")

``eval``: ``True`` (two runs that differ in it evaluate differently), :data:`WHEN_SAMPLED` (a
sampling filter: only when the eval samples, ``train.eval_temperature > 0``), or the reason it does
not shape the eval. ``agentrl.config.EVAL_SETTINGS`` and ``NOT_EVAL_SETTINGS`` are read from here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: ``eval=`` of a sampling filter: it shapes a held-out eval only when that eval samples
WHEN_SAMPLED = "when sampled"


def setting(
    default: Any = dataclasses.MISSING, *, eval: bool | str, default_factory: Any = dataclasses.MISSING
) -> Any:
    """A section field with ``default`` (or ``default_factory``) and its eval classification."""
    if eval is False or eval == "":
        raise ValueError(
            "eval= is True, WHEN_SAMPLED, or the reason the setting does not shape a held-out eval"
        )
    metadata = {"eval": eval}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def eval_class(field: dataclasses.Field) -> bool | str | None:
    """A field's ``eval=`` (None: declared without :func:`setting`)."""
    return field.metadata.get("eval")
