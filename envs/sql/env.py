"""Text-to-SQL with tools: explore a SQLite database, query it read-only, answer a question.

Tools: ``list_tables()``, ``describe(table)``, ``query(sql)``. Queries run inside a sandbox against a
read-only copy of the database (see :mod:`agentrl.tools.sql` for the layers of defence); results show
at most ``max_rows`` rows and a statement stops after ``timeout_s`` seconds. By default the env keeps
its sandbox across episodes (``keep_sandbox``): no model code runs in it, so the database copies and the
read-only connections stay warm and a query costs about a millisecond.

The final answer takes one of two forms (both in the system prompt):

- a SQL query: ``<answer>SELECT ...</answer>``; it runs like ``query`` (read-only, in the sandbox)
  and its full result is compared with the gold result;
- a value list: ``<answer>[["Rock", 1297], ["Jazz", 130]]</answer>``, ``<answer>42</answer>``,
  ``<answer>["AC/DC", "Accept"]</answer>``, or one row per line with cells separated by ``|``.

Reward: execution accuracy, 1.0 when the answer's rows equal the gold rows as a multiset (as a list
when the question asks for an order), else 0.0 (see :mod:`agentrl.envs.sql.compare`).

Task payload: ``database``, ``gold_sql``, ``columns``, ``ordered``; ``Task.answer`` is the gold rows.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.env import Score, Task, TextEnv
from agentrl.envs.sql.compare import is_sql, parse_values, rows_match, strip_fence
from agentrl.envs.sql.databases import DATABASES, database_path, open_readonly
from agentrl.envs.sql.questions import build_questions
from agentrl.errors import ConfigError, SandboxError, ToolError
from agentrl.tools.base import Tool
from agentrl.tools.python import SandboxSlot
from agentrl.tools.sql import SandboxSQL, TableInfo, database_schema, make_sql_tools

SYSTEM_PROMPT = """You answer questions about a SQLite database by exploring it with tools.
Tools: list_tables() lists the tables; describe(table) shows a table's columns and example rows;
query(sql) runs one read-only SELECT statement (SQLite dialect) and shows at most {max_rows} rows.
Call a tool with <tool_call>{{"name": "query", "arguments": {{"sql": "SELECT ..."}}}}</tool_call>.
The database is read-only: writes, ATTACH, PRAGMA and multiple statements are refused.
Give the final answer in one of two forms:
1. a SQL query whose result is the answer: <answer>SELECT Name FROM Genre WHERE GenreId = 1</answer>
2. the values themselves: <answer>42</answer>, <answer>["AC/DC", "Accept"]</answer>, or one row per
   line with cells separated by " | " (e.g. <answer>Rock | 1297
Jazz | 130</answer>), or a JSON list of rows [["Rock", 1297], ["Jazz", 130]].
Return exactly the columns the question asks for. Row order matters only when the question asks for one."""

SCORE_MAX_ROWS_SLACK = 1  # an answer query fetches the gold row count + 1 (more rows is wrong anyway)


@functools.lru_cache(maxsize=8)
def _database(name: str) -> tuple[Path, dict[str, TableInfo], tuple[Any, ...]]:
    path = database_path(name)
    con = open_readonly(path)
    try:
        questions = tuple(build_questions(name, con))
    finally:
        con.close()
    return path, database_schema(path), questions


class SQLEnv(TextEnv):
    """Text-to-SQL over Chinook and generated databases (see the module docstring).

    Args:
        split: "train" | "dev" | "test".
        database: "all" or one of "chinook", "shop", "university".
        levels: difficulty levels to keep (1 one table, 2 joins/grouping, 3 nesting/having/top-k).
        max_rows: rows shown per query observation.
        timeout_s: statement timeout (seconds) for queries and answer queries.
        sandbox_backend: "auto" | "docker" | "bwrap".
        pool_size: size of the shared sandbox pool (with ``keep_sandbox``, at least the number of SQL envs
            alive at once in the process).
        keep_sandbox: keep the leased sandbox across episodes, with its database copies and its warm
            interpreter (safe: the SQL sandbox never runs model code, and its connections are read-only);
            False gives it back to the pool at the end of every episode.
    """

    success_metric = "correct"
    splits = ("train", "dev", "test")
    # the database is read-only, so the state is the episode's history: a fork copies it and leases
    # a sandbox of its own from the same pool (its database copy is made on its first query)
    fork_method = "history"
    shared_services = ("sandbox_pool",)  # with env.placement ray: one sandbox pool per node

    def __init__(
        self,
        *,
        split: str = "train",
        render_mode: str | None = None,
        database: str = "all",
        levels: Sequence[int] = (1, 2, 3),
        max_rows: int = 50,
        timeout_s: float = 5.0,
        sandbox_backend: str = "auto",
        pool_size: int = 8,
        keep_sandbox: bool = True,
    ):
        super().__init__(split=split, render_mode=render_mode)
        if database != "all" and database not in DATABASES:
            raise ConfigError(
                "env.database", f"unknown database {database!r}", f"use 'all' or one of {sorted(DATABASES)}"
            )
        bad_levels = [lv for lv in levels if lv not in (1, 2, 3)]
        if bad_levels or not levels:
            raise ConfigError(
                "env.levels", f"levels must be a non-empty subset of 1, 2, 3; got {list(levels)}"
            )
        if max_rows < 1 or timeout_s <= 0:
            raise ConfigError("env.max_rows/timeout_s", "must be positive", "e.g. max_rows=50, timeout_s=5")
        self.databases = sorted(DATABASES) if database == "all" else [database]
        self.levels = tuple(levels)
        self.max_rows = max_rows
        self.timeout_s = timeout_s
        self.slot = SandboxSlot(sandbox_backend, pool_size)
        self.keep_sandbox = keep_sandbox
        self.runner: SandboxSQL | None = None
        self._runners: dict[str, SandboxSQL] = {}  # one per database; each knows if its copy is in place
        self.system_prompt = SYSTEM_PROMPT.format(max_rows=max_rows)

    # ----------------------------------------------------------------- hooks
    def load_tasks(self, split: str) -> Sequence[Task]:
        tasks = []
        for name in self.databases:
            for q in _database(name)[2]:
                if q.split == split and q.level in self.levels:
                    payload = {
                        "database": name,
                        "gold_sql": q.sql,
                        "columns": q.columns,
                        "ordered": q.ordered,
                    }
                    tasks.append(Task(q.id, q.question, q.rows, q.split, q.level, payload))
        return tasks

    def render_task(self, task: Task) -> str:
        db = DATABASES[self._task_database(task)]
        return f"Database: {db.description}.\nQuestion: {task.question}"

    def _task_database(self, task: Task) -> str:
        name = task.payload.get("database", self.databases[0])
        if name not in DATABASES:
            raise ConfigError(
                "task.payload.database", f"unknown database {name!r}", f"one of {sorted(DATABASES)}"
            )
        return name

    def make_tools(self) -> list[Tool]:
        if not self.keep_sandbox:
            self._release()
        self.slot.reset_timings()
        name = self._task_database(self.task) if self.task is not None else self.databases[0]
        path, schema, _ = _database(name)
        if name not in self._runners:
            self._runners[name] = SandboxSQL(path, self.slot, timeout_s=self.timeout_s)
        self.runner = self._runners[name]
        return make_sql_tools(self.runner, schema, max_rows=self.max_rows)

    def score(self, answer: str | None, task: Task) -> Score:
        metrics = {"correct": 0.0, "answer_form_sql": 0.0, "answer_form_values": 0.0, "answer_error": 0.0}
        try:
            if answer is None or not answer.strip():
                return Score(0.0, metrics)
            gold = [list(row) for row in task.answer or []]
            columns = list(task.payload.get("columns") or ([""] * len(gold[0]) if gold else [""]))
            if is_sql(answer):
                metrics["answer_form_sql"] = 1.0
                rows = self._answer_rows(strip_fence(answer).rstrip().rstrip(";"), len(gold))
                if rows is None:
                    metrics["answer_error"] = 1.0
                    return Score(0.0, metrics)
            else:
                metrics["answer_form_values"] = 1.0
                rows = parse_values(answer, columns, len(gold))
            correct = rows_match(rows, gold, bool(task.payload.get("ordered", False)))
            metrics["correct"] = float(correct)
            return Score(float(correct), metrics)
        finally:
            if not self.keep_sandbox:
                self._release()  # the episode is over: its sandbox goes back to the pool now

    def _answer_rows(self, sql: str, gold_rows: int) -> list[list[Any]] | None:
        if self.runner is None:
            self.make_tools()
        assert self.runner is not None
        try:
            result = self.runner.run(sql, max_rows=gold_rows + SCORE_MAX_ROWS_SLACK, count_limit=0)
        except (ToolError, SandboxError):
            return None
        return None if result.error else result.rows

    def fork_detach(self) -> None:
        self.slot = self.slot.sibling()
        self.runner = None
        self._runners = {}

    def _release(self) -> None:
        for runner in self._runners.values():
            runner.release()
        self.slot.release()

    def on_close(self) -> None:
        self._release()
