"""Evaluation suites: which env(s), which split, what counts as success, how to slice the table.

A suite is a thin description over registered envs; the runner does the work. Suites live in
:data:`agentrl.registry.EVAL_SUITES` (name -> :class:`Suite`). A suite name may carry options,
``NAME:key=value,key=value`` (a comma splits only before the next ``key=``, so values may hold
commas; ``--suite-option key=value`` takes any value as is):

- ``k=N``: sample every task N times and report pass@k (pass@1 is the plain success rate).
- ``split=S``: another split of the env (e.g. ``local-gaia:split=dev``).
- any other key is passed to the env constructor (``search-qa-real:retriever_url=http://host:8000/retrieve``,
  ``gaia:data_dir=/data/GAIA/2023``); numbers and true/false are converted.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentrl.env import Task
from agentrl.errors import ConfigError
from agentrl.registry import EVAL_SUITES


def _level(task: Task) -> str:
    return f"level {task.level}"


def _source(task: Task) -> str:
    return str(task.payload.get("source") or task.id.split("_")[0])


@dataclass(frozen=True)
class Part:
    """One env inside a suite (math has three: MATH-500, AIME 2024, AIME 2025)."""

    env_id: str
    name: str = ""  # subset label when a suite has several parts
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Suite:
    """What to run and how to score it.

    ``success`` names the info metric that decides success (>= 1.0 counts); ``None``: each env's own
    :attr:`~agentrl.env.TextEnv.success_metric`, the one training reports too; ``metrics`` are the
    info metrics averaged in the tables; ``subset`` labels each task for the per-subset table;
    ``oracle`` is a lazy ``"module:Class"`` for the scripted oracle (None: the suite has none).
    """

    name: str
    description: str
    parts: tuple[Part, ...]
    split: str = "test"
    success: str | None = None
    metrics: tuple[str, ...] = ("correct",)
    subset: Callable[[Task], str] = _level
    oracle: str | None = None
    k: int = 1
    notes: str = ""

    def with_options(self, options: dict[str, Any]) -> Suite:
        options = dict(options)
        k = int(options.pop("k", self.k))
        if k < 1:
            raise ConfigError("suite", f"k must be >= 1, got {k}", "write e.g. math:k=4")
        split = str(options.pop("split", self.split))
        for part in self.parts:
            accepted = env_options(part.env_id)
            unknown = sorted(set(options) - accepted) if accepted is not None else []
            if unknown:
                hint = (
                    "sampling settings are agent flags, e.g. --chat-param temperature=1"
                    if "temperature" in unknown
                    else ""
                )
                raise ConfigError(
                    "--suite-option",
                    f"suite {self.name!r} ({part.env_id}) takes no option {', '.join(unknown)}",
                    f"its options: k, split, {', '.join(sorted(accepted - {'split'}))}"
                    + (f"; {hint}" if hint else ""),
                )
        parts = tuple(replace(p, kwargs={**p.kwargs, **options}) for p in self.parts)
        return replace(self, k=k, split=split, parts=parts)


def env_options(env_id: str) -> set[str] | None:
    """The keyword arguments an env id's constructor takes (None: it takes any)."""
    import inspect

    import gymnasium as gym

    import agentrl.envs  # noqa: F401  (registers the ids)
    from agentrl.registry import load_entry_point

    spec = gym.spec(env_id)
    target = spec.kwargs.get("entry_point", spec.entry_point)  # agentrl ids: build_env(entry_point=...)
    entry = load_entry_point(target) if isinstance(target, str) else target
    params = inspect.signature(entry).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return ({name for name in params if name != "self"} | set(spec.kwargs)) - {"entry_point"}


def _convert(value: str) -> Any:
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


_OPTION_SPLIT = re.compile(r",(?=\s*[A-Za-z_][A-Za-z0-9_.-]*\s*=)")


def _option(item: str, where: str) -> tuple[str, Any]:
    key, eq, value = item.partition("=")
    if not eq or not key.strip():
        raise ConfigError(
            "suite",
            f"bad suite option {item!r} in {where}",
            "write NAME:key=value,key=value or --suite-option key=value",
        )
    return key.strip(), _convert(value.strip())


def parse_suite(spec: str, extra_options: Sequence[str] = ()) -> Suite:
    """``"name"`` or ``"name:key=value,..."`` (plus ``extra_options``, ``key=value`` strings taken
    whole) -> the registered suite with those options applied."""
    name, _, option_text = spec.partition(":")
    suite: Suite = EVAL_SUITES.get(name.strip(), field="suite")
    options: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in _OPTION_SPLIT.split(option_text))):
        key, value = _option(item, repr(spec))
        options[key] = value
    for item in extra_options:
        key, value = _option(item.strip(), "--suite-option")
        options[key] = value
    return suite.with_options(options) if options else suite


def _register(suite: Suite) -> None:
    EVAL_SUITES.register(suite.name, suite, override=True)


_register(
    Suite(
        "local-gaia",
        "GAIA-shaped tasks over the fictional wiki, files, python (150 tasks, levels 50/70/30)",
        (Part("agentrl/GAIA-v0"),),
        oracle="agentrl.envs.gaia.oracle:LocalGaiaOracle",
    )
)
_register(
    Suite(
        "gaia",
        "real GAIA validation set from a local copy (data_dir=... or AGENTRL_GAIA_DIR); file reader + python",
        (Part("agentrl/GAIA-Real-v0"),),
        split="validation",
    )
)
_register(
    Suite(
        "gaia-fixture",
        "the 6-task GAIA-layout test fixture shipped in tests/fixtures (checks the real-GAIA path offline)",
        (Part("agentrl/GAIA-Real-v0", kwargs={"data_dir": "fixture"}),),
        split="validation",
        notes="the bundled 6-task fixture, not GAIA",
    )
)
_register(
    Suite(
        "webshop",
        "WebShop-style shopping: score and success on the 500 test goals",
        (Part("agentrl/WebShop-v0"),),
        metrics=("score", "success"),
        subset=lambda task: "all",
        oracle="agentrl.envs.web.oracle:WebShopOracle",
    )
)
_register(
    Suite(
        "search-qa",
        "single and multi-hop QA over the generated wiki (BM25 search/open); EM and F1",
        (Part("agentrl/Search-v0"),),
        metrics=("em", "f1"),
        subset=lambda task: f"{task.level}-hop",
        oracle="agentrl.envs.search.oracle:SearchOracle",
    )
)
_register(
    Suite(
        "search-qa-real",
        "the seven real QA sets (NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, MuSiQue, Bamboogle); closed-book "
        "unless retriever_url=... names a Search-R1 retrieval server",
        (Part("agentrl/SearchQA-v0", kwargs={"retriever_url": os.environ.get("AGENTRL_RETRIEVER_URL")}),),
        metrics=("em", "f1"),
        subset=_source,
        oracle="agentrl.envs.search.oracle:GoldQAOracle",  # answers the gold answer: a pipeline check
    )
)
_register(
    Suite(
        "sql",
        "text-to-SQL over Chinook and generated databases; execution accuracy",
        (Part("agentrl/SQL-v0"),),
        subset=lambda task: f"{task.payload.get('database', '?')} L{task.level}",
        oracle="agentrl.envs.sql.oracle:SQLOracle",
    )
)
_MATH_PARTS = (
    Part("agentrl/CodeMath500-v0", "math500"),
    Part("agentrl/CodeAIME24-v0", "aime2024"),
    Part("agentrl/CodeAIME25-v0", "aime2025"),
)
_register(
    Suite(
        "math",
        "MATH-500, AIME 2024 and AIME 2025 with the python interpreter; accuracy (pass@k with k=N)",
        _MATH_PARTS,
        subset=lambda task: "",  # the part name labels the subset
        oracle="agentrl.envs.code.oracle:CodeOracle",
    )
)
for _part in _MATH_PARTS:
    _register(
        Suite(
            _part.name,
            f"{_part.name} with the python interpreter; accuracy (pass@k with k=N)",
            (_part,),
            subset=lambda task: "",
            oracle="agentrl.envs.code.oracle:CodeOracle",
        )
    )
