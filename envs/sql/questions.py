"""Text-to-SQL questions with gold SQL, generated from templates and checked by execution.

Each template fills its slots with values read from the database (genres, customers, years ...), so
every question is about something that exists. A question is kept only when its gold SQL, run on the
trusted host copy, returns a non-empty result of at most ``MAX_GOLD_ROWS`` rows, and, when it asks
for an order or a top-k, when no tie makes the answer ambiguous (``tie_sql`` lists the sort keys).
Levels: 1 = one table, 2 = a join or a grouping, 3 = nesting, HAVING, anti-joins or ranked top-k.
Splits are assigned by a stable hash of the question id (70% train, 15% dev, 15% test).
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from agentrl.envs.sql.template_kit import Question, values
from agentrl.envs.sql.templates_chinook import chinook_questions
from agentrl.envs.sql.templates_generated import shop_questions, university_questions

MAX_GOLD_ROWS = 60


@dataclass(frozen=True)
class CheckedQuestion:
    """A question whose gold SQL ran and passed the checks."""

    id: str
    database: str
    split: str
    level: int
    question: str
    sql: str
    columns: list[str]
    rows: list[list[Any]]
    ordered: bool


def generators() -> dict[str, Callable[[sqlite3.Connection], Iterator[Question]]]:
    """Template generator per database."""
    return {"chinook": chinook_questions, "shop": shop_questions, "university": university_questions}


def split_of(question_id: str) -> str:
    bucket = int(hashlib.sha256(question_id.encode()).hexdigest()[:8], 16) % 100
    return "train" if bucket < 70 else "dev" if bucket < 85 else "test"


def _ambiguous(con: sqlite3.Connection, question: Question) -> bool:
    if not question.ordered or question.tie_sql is None:
        return False
    keys = values(con, question.tie_sql)
    if question.limit is not None:
        return len(keys) > question.limit and keys[question.limit - 1] == keys[question.limit]
    return len(set(keys)) != len(keys)


def build_questions(database: str, con: sqlite3.Connection) -> list[CheckedQuestion]:
    """All questions of ``database`` that pass the checks, with their gold results."""
    checked = []
    counters: dict[str, int] = {}
    for question in generators()[database](con):
        number = counters.get(question.template, 0)
        counters[question.template] = number + 1
        cur = con.execute(question.sql)
        rows = [list(row) for row in cur.fetchall()]
        if not rows or len(rows) > MAX_GOLD_ROWS or all(v is None for row in rows for v in row):
            continue
        if _ambiguous(con, question):
            continue
        columns = [d[0] for d in cur.description]
        qid = f"{database}-{question.template}-{number}"
        checked.append(
            CheckedQuestion(
                qid, database, split_of(qid), question.level, question.question, question.sql,
                columns, rows, question.ordered,
            )
        )  # fmt: skip
    return checked
