"""The vocabulary the SQL question templates are written in: a candidate :class:`Question`, SQL
literals and value look-ups (``templates_*.py`` import this; :mod:`.questions` checks their output)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any


def lit(value: Any) -> str:
    """A SQL literal for a trusted value (strings quoted, quotes doubled)."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


@dataclass(frozen=True)
class Question:
    """One candidate question before its gold result is checked."""

    template: str
    level: int
    question: str
    sql: str
    ordered: bool = False
    tie_sql: str | None = None  # sort keys of the full ordering (checked for ties)
    limit: int | None = None  # the top-k of an ordered question


def values(con: sqlite3.Connection, sql: str) -> list[Any]:
    return [row[0] for row in con.execute(sql).fetchall()]


def make_question(template: str, level: int, question: str, sql: str, **kw: Any) -> Question:
    return Question(template, level, question, " ".join(sql.split()), **kw)
