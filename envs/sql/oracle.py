"""A scripted SQL agent that knows the gold query and solves tasks through the env's real tools.

Turns: ``list_tables()``, ``describe(<first table of the gold query>)``, ``query(<gold SQL>)``, then the
answer: for half the tasks (by a stable hash of the id) the gold SQL itself, for the other half the
values read back from the query observation as a JSON list of rows. It exercises the sandbox, the
guard, the observation format and both answer forms.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentrl.env import Task, play_policy
from agentrl.envs.scripted import TurnScript, stable_coin, tool_call

_FROM = re.compile(r"\bFROM\s+([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)


def rows_from_observation(observation: str) -> list[list[str | None]] | None:
    """Rows of a ``query`` observation (None when it is cut or a cell could be ambiguous)."""
    lines = observation.splitlines()
    if len(lines) < 2 or not re.fullmatch(r"\(\d+ rows?\)", lines[-1]):
        return None
    n_cols = len(lines[0].split(" | "))
    rows = []
    for line in lines[1:-1]:
        cells = line.split(" | ")
        if len(cells) != n_cols:
            return None
        rows.append([None if c == "NULL" else c for c in cells])
    return rows


class SQLOracle(TurnScript):
    """``reset(task)`` then ``act(observation) -> action text`` until the episode ends."""

    def __init__(self, answer_form: str = "mixed"):
        if answer_form not in ("mixed", "sql", "values"):
            raise ValueError(f"answer_form must be mixed, sql or values; got {answer_form!r}")
        super().__init__()
        self.answer_form = answer_form

    def turn_action(self, task: Task, turn: int, observation: str) -> str:
        gold_sql = task.payload["gold_sql"]
        if turn == 1:
            return "Let me look at the tables.\n" + tool_call("list_tables")
        if turn == 2:
            found = _FROM.search(gold_sql)
            return tool_call("describe", table=found.group(1) if found else "")
        if turn == 3:
            return tool_call("query", sql=gold_sql)
        form = self.answer_form
        if form == "mixed":
            form = "sql" if stable_coin(task.id) else "values"
        rows = rows_from_observation(observation) if form == "values" else None
        if rows is None:
            return f"<answer>{gold_sql}</answer>"
        return f"<answer>{json.dumps(rows)}</answer>"


def run_oracle(env: Any, task: Task | None = None, seed: int | None = None) -> tuple[float, dict[str, Any]]:
    """Play one episode of ``env`` (made with ``agentrl.make``) with a fresh :class:`SQLOracle`."""
    return play_policy(env, SQLOracle(), task=task, seed=seed)
