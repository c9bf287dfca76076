"""Scripted oracle for local-gaia: runs each task's solution program through the real tools.

Follows the oracle protocol (``reset(task)``, ``act(observation, info) -> action text``). It reads
the task's *program* (payload ``program``: which pages to look up, how to use the attachment, what
to compute), never the gold answer, and acts only with Hermes tool calls and a ``FINAL ANSWER:``
line: it searches a name, opens the result whose title is exactly that name (skipping
near-duplicate distractors), reads the infobox line, reads the attachment with ``read_file`` and
parses the table it shows, and runs each computation in the ``python`` tool. When the python tool
is missing or fails, it computes the value itself and counts it in ``python_fallbacks``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Generator
from typing import Any

from agentrl.env import Task
from agentrl.envs.scripted import tool_call
from agentrl.envs.search.oracle import KIND_HINTS, RESULT_RE

Table = list[dict[str, Any]]


def _count_greater(left: list[float], right: list[float]) -> int:
    return sum(1 for a, b in zip(left, right, strict=True) if a > b)


# name -> (local function, python source template with {0}, {1} for the arguments)
COMPUTATIONS: dict[str, tuple[Callable[..., Any], str]] = {
    "sub": (lambda a, b: a - b, "print({0} - {1})"),
    "ratio2": (lambda a, b: round(a / b, 2), "print(round({0} / {1}, 2))"),
    "count_greater": (_count_greater, "print(sum(1 for a, b in zip({0}, {1}) if a > b))"),
}


def column_key(name: str) -> str:
    """How a column name compares across formats (``Reported employees`` == ``reported_employees``)."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def to_number(text: Any) -> Any:
    """``"1,204"`` -> 1204, ``"12.50"`` -> 12.5, anything else unchanged."""
    if isinstance(text, int | float):
        return int(text) if float(text).is_integer() else text
    cleaned = str(text).strip().replace(",", "")
    try:
        value = float(cleaned)
    except ValueError:
        return str(text).strip()
    return int(value) if value.is_integer() else value


def parse_table(text: str) -> Table:
    """Rows of the first table in a ``read_file`` observation (``a | b`` lines or the JSON records)."""
    stripped = re.sub(r"\n\[page \d+ of \d+;.*\]$", "", text.strip())
    if stripped.startswith("{"):
        return [{column_key(k): v for k, v in record.items()} for record in json.loads(stripped)["records"]]
    rows: list[list[str]] = []
    for line in stripped.splitlines():
        cells = [c.strip() for c in line.split(" | ")]
        if len(cells) >= 2 and (not rows or len(cells) == len(rows[0])):
            rows.append(cells)
        elif rows:
            break
    if not rows:
        raise ValueError("no table found in the file")
    header = [column_key(c) for c in rows[0]]
    return [dict(zip(header, row, strict=True)) for row in rows[1:]]


class LocalGaiaOracle:
    """Solves ``agentrl/GAIA-v0`` tasks by executing their program with the env's tools."""

    def __init__(self, first_k: int = 5, max_k: int = 10, python: bool = True):
        self.first_k, self.max_k, self.python = first_k, max_k, python
        self.python_fallbacks = 0
        self._steps: Generator[str, str, None] | None = None

    def reset(self, task: Task) -> None:
        self.task = task
        self.values: dict[str, Any] = {}
        self.pages: dict[str, str] = {}
        self._steps = self._run(task)
        self._primed = False

    def act(self, observation: str, info: dict[str, Any] | None = None) -> str:
        if self._steps is None:
            raise RuntimeError("call reset(task) before act()")
        if not self._primed:
            self._primed = True
            return next(self._steps)
        try:
            return self._steps.send(observation)
        except StopIteration:
            return "FINAL ANSWER: unknown"

    # ------------------------------------------------------------------ the program interpreter
    def _fill(self, template: str) -> str:
        return re.sub(r"\{(\w+)\}", lambda m: str(self.values[m.group(1)]), template)

    def _run(self, task: Task) -> Generator[str, str, None]:
        for op in task.payload["program"]:
            kind = op["op"]
            if kind == "lookup":
                value = yield from self._lookup(self._fill(op["name"]), op["kind"], op["label"])
                self.values[op["out"]] = value
            elif kind == "read_file":
                text = yield tool_call("read_file", file_name=task.payload["file_name"])
                self.values[op["out"]] = parse_table(text)
            elif kind == "argmax":
                table: Table = self.values[op["table"]]
                best = max(table, key=lambda row: to_number(row[column_key(op["key"])]))
                self.values[op["out"]] = best[column_key(op["value"])]
            elif kind == "filter_sum":
                table = self.values[op["table"]]
                wanted = self._fill(op["equals"]).strip().lower()
                total = sum(
                    to_number(row[column_key(op["sum"])])
                    for row in table
                    if str(row[column_key(op["where"])]).strip().lower() == wanted
                )
                self.values[op["out"]] = total
            elif kind == "column":
                table = self.values[op["table"]]
                self.values[op["out"]] = [to_number(row[column_key(op["column"])]) for row in table]
            elif kind == "lookup_each":
                values = []
                for row in self.values[op["table"]]:
                    found = yield from self._lookup(
                        str(row[column_key(op["column"])]), op["kind"], op["label"]
                    )
                    values.append(to_number(found))
                self.values[op["out"]] = values
            elif kind == "compute":
                self.values[op["out"]] = yield from self._compute(op["fn"], op["args"])
            elif kind == "answer":
                yield f"FINAL ANSWER: {self._fill(op['value'])}"
                return
            else:
                raise ValueError(f"unknown program op {kind!r}")

    def _lookup(self, name: str, kind: str, label: str) -> Generator[str, str, str]:
        if name not in self.pages:
            queries = [(name, self.first_k), (f"{name} {KIND_HINTS[kind]}", self.max_k)]
            doc_id = None
            for query, k in queries:
                results = yield tool_call("search", query=query, k=k)
                doc_id = next((d for d, title in RESULT_RE.findall(results) if title.strip() == name), None)
                if doc_id is not None:
                    break
            if doc_id is None:
                return "unknown"
            self.pages[name] = yield tool_call("open", doc_id=doc_id)
        found = re.search(rf"^{re.escape(label)}: (.+)$", self.pages[name], re.MULTILINE)
        return found.group(1).strip() if found else "unknown"

    def _compute(self, fn: str, args: list[str]) -> Generator[str, str, Any]:
        local, source = COMPUTATIONS[fn]
        values = [self._resolve(a) for a in args]
        if self.python:
            output = yield tool_call("python", code=source.format(*map(repr, values)))
            lines = output.strip().splitlines()
            result = to_number(lines[-1]) if lines and not output.startswith("Error") else None
            if isinstance(result, int | float):
                return result
        self.python_fallbacks += 1
        return local(*values)

    def _resolve(self, arg: str) -> Any:
        found = re.fullmatch(r"\{(\w+)\}", arg)
        value = self.values[found.group(1)] if found else arg
        return [to_number(v) for v in value] if isinstance(value, list) else to_number(value)
