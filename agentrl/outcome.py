"""Typed results of env steps, from the tool call to the evaluation record.

An env step's ``info`` dict carries one :class:`StepOutcome` under :data:`OUTCOME`: the typed
:class:`~agentrl.tools.base.ToolOutcome` of each call, whether the turn was void, the malformed-
action kinds, and on the last step the answer, the gold answer and the episode's
:class:`EpisodeMetrics`. The episode loop, process rewards and evaluation read attributes of these
objects; the flat keys of the gymnasium contract (``tool_calls``, ``void_turn``, ``action_problems``,
``answer``, ``ground_truth``, ``metrics``) are derived from them in one place
(:meth:`StepOutcome.info`) for users of ``env.step`` outside agentrl.

Metrics: every env keeps the counters and totals :class:`EpisodeMetrics` declares as fields; an
env's own score metrics (``Score.metrics``: ``em``, ``f1``, ``correct`` ...) are its ``score``.
A saved episode's flat ``metrics`` come back typed with :meth:`EpisodeMetrics.from_flat`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrl.tools.base import ToolOutcome

#: the ``info`` key that holds the step's :class:`StepOutcome`
OUTCOME = "outcome"

_COUNTERS = ("tool_calls", "tool_errors", "format_errors", "void_turns")
_TOTALS = ("reward", "turns", "truncated", "answered")


@dataclass(frozen=True)
class EpisodeMetrics:
    """An episode's metrics: the counters and totals every env keeps, and its own score metrics."""

    tool_calls: float = 0.0
    tool_errors: float = 0.0
    format_errors: float = 0.0
    void_turns: float = 0.0
    reward: float = 0.0
    turns: float = 0.0
    truncated: float = 0.0
    answered: float = 0.0
    #: the env's own metrics (its ``Score.metrics``, and what the loop adds, e.g. ``agent_truncated``)
    score: dict[str, float] = field(default_factory=dict)

    def flat(self) -> dict[str, float]:
        """One name -> value mapping (``info["metrics"]``, ``Episode.metrics``); a total beats a score
        metric of the same name, a score metric beats a counter."""
        counters = {name: getattr(self, name) for name in _COUNTERS}
        return {**counters, **self.score, **{name: getattr(self, name) for name in _TOTALS}}

    @classmethod
    def from_flat(cls, metrics: Mapping[str, Any]) -> EpisodeMetrics:
        """From a flat mapping (a saved ``Episode.metrics``); names that are not fields go to ``score``."""
        names = {f.name for f in dataclasses.fields(cls)} - {"score"}
        numbers = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
        return cls(
            **{k: v for k, v in numbers.items() if k in names},
            score={k: v for k, v in numbers.items() if k not in names},
        )

    def value(self, name: str, default: float) -> float:
        """The metric called ``name`` (a field or a score metric), or ``default`` when there is none."""
        if name in self.score:
            return self.score[name]
        return float(getattr(self, name)) if name in _COUNTERS + _TOTALS else default


@dataclass(frozen=True)
class StepOutcome:
    """What one env step did (``info[OUTCOME]``)."""

    calls: tuple[ToolOutcome, ...] = ()
    void: bool = False
    #: the kinds of what was malformed in the action (``agentrl.actions``: ``no_action``, ``bad_json`` ...)
    problems: tuple[str, ...] = ()
    #: the last step only (``ended``): the final answer, the gold answer, the episode's metrics
    ended: bool = False
    answer: str | None = None
    ground_truth: Any = None
    metrics: EpisodeMetrics | None = None

    def info(self, turn: int) -> dict[str, Any]:
        """The gymnasium ``info`` dict of this step: its flat keys, and this object under :data:`OUTCOME`."""
        info: dict[str, Any] = {"turn": turn, "tool_calls": self.tool_call_records(), "void_turn": self.void}
        if self.problems:
            info["action_problems"] = list(self.problems)
        return {**info, **self.final_fields(), OUTCOME: self}

    def final_fields(self) -> dict[str, Any]:
        """The last step's flat keys (none before it)."""
        if not self.ended:
            return {}
        metrics = self.metrics.flat() if self.metrics is not None else {}
        return {"answer": self.answer, "ground_truth": self.ground_truth, "metrics": metrics}

    def finished(self, final: StepOutcome) -> StepOutcome:
        """This step, ended with ``final``'s answer, gold answer and metrics."""
        return dataclasses.replace(
            self, ended=True, answer=final.answer, ground_truth=final.ground_truth, metrics=final.metrics
        )

    def tool_call_records(self) -> list[dict[str, Any]]:
        """The calls as the episode record stores them (``Turn.tool_calls``)."""
        return [
            {"name": o.name, "arguments": o.arguments, "ok": o.ok, "error_kind": o.error_kind,
             "seconds": o.seconds, "usage": o.usage}
            for o in self.calls
        ]  # fmt: skip

    def usage(self) -> dict[str, float] | None:
        """The sandbox usage of the step's calls, summed per key (None when no call reported any)."""
        total: dict[str, float] = {}
        for call in self.calls:
            for key, value in (call.usage or {}).items():
                if isinstance(value, int | float):
                    total[key] = total.get(key, 0.0) + float(value)
        return total or None

    def error(self) -> str | None:
        """What failed in the step's action (``Turn.error``, read by FoldGRPO's failure penalty), or None:
        a tool call that returned an error, or a malformed action; a void turn (``no_action``: no call
        at all) is not a failed call."""
        failed = [f"{c.name} ({c.error_kind or 'error'})" for c in self.calls if not c.ok]
        malformed = [kind for kind in self.problems if kind != "no_action"]
        problems = [f"tool call failed: {', '.join(failed)}"] if failed else []
        problems += [f"malformed action: {', '.join(malformed)}"] if malformed else []
        return "; ".join(problems) or None


def end_step(info: dict[str, Any], final: dict[str, Any]) -> dict[str, Any]:
    """A step's ``info`` merged with ``final_info``'s (the step that ends the episode): flat keys and
    the typed outcome both say how it ended."""
    outcome: StepOutcome = info[OUTCOME]
    return {**info, **final, OUTCOME: outcome.finished(final[OUTCOME])}
