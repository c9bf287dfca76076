"""SQL tools over a read-only SQLite database: ``list_tables()``, ``describe(table)``, ``query(sql)``.

Model-written SQL runs only inside a sandbox, against a copy of the database put into the sandbox's
work dir, in layers:

1. :func:`check_sql` (host, before anything runs): one statement, starting with SELECT/WITH/VALUES,
   no write/DDL/ATTACH/PRAGMA/transaction keyword, no ``load_extension``. A refusal is an observation.
2. In the sandbox the copy is opened ``file:...?mode=ro`` with ``PRAGMA query_only=1`` and an
   authorizer that allows only reads, selects, functions and recursive CTEs; Python's sqlite3 runs one
   statement per ``execute``; a progress handler stops statements past ``timeout_s``.
3. The copy is ``chmod 0444`` and lives in the sandbox's tmpfs: the host file is never opened writable.

``list_tables`` and ``describe`` read a schema summary that the host computes from the trusted file;
their argument only selects from that summary (it is never put into SQL).
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.errors import ToolError
from agentrl.tools.base import Tool, ToolResult, tool
from agentrl.tools.python import SandboxSlot

FORBIDDEN = {
    "INSERT", "UPDATE", "DELETE", "DROP", "CREATE", "ALTER", "ATTACH", "DETACH", "PRAGMA", "VACUUM",
    "REINDEX", "ANALYZE", "BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE",
}  # fmt: skip
FORBIDDEN_FUNCTIONS = {"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"}
FIRST_WORDS = {"SELECT", "WITH", "VALUES"}
_TOKEN_RE = re.compile(
    r"""(?P<ws>\s+)|(?P<line>--[^\n]*)|(?P<block>/\*.*?(\*/|$))|(?P<str>'(?:[^']|'')*('|$))"""
    r"""|(?P<qid>"(?:[^"]|"")*("|$)|`[^`]*(`|$)|\[[^\]]*(\]|$))|(?P<word>[A-Za-z_][A-Za-z0-9_$]*)"""
    r"""|(?P<semi>;)|(?P<other>.)""",
    re.DOTALL,
)


def check_sql(sql: str) -> str | None:
    """Return why ``sql`` is refused (a message for the model), or None when it may run."""
    words: list[str] = []
    after_semicolon = False
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN_RE.finditer(sql)]
    for i, (kind, text) in enumerate(tokens):
        if kind in ("ws", "line", "block"):
            continue
        if after_semicolon:
            return "only one SQL statement per query is allowed: remove everything after the ';'"
        if kind == "semi":
            after_semicolon = True
            continue
        if kind == "word":
            upper = text.upper()
            words.append(upper)
            if upper in FORBIDDEN:
                return f"{upper} is not allowed: the database is read-only and only SELECT queries run"
            if upper == "REPLACE" and _next_significant(tokens, i) != "(":
                return "REPLACE is not allowed: the database is read-only and only SELECT queries run"
            if text.lower() in FORBIDDEN_FUNCTIONS:
                return f"the function {text} is not allowed"
    if not words:
        return "the query is empty: write one SELECT statement"
    if words[0] not in FIRST_WORDS:
        return f"only SELECT queries are allowed (this one starts with {words[0]})"
    return None


def _next_significant(tokens: list[tuple[str | None, str]], i: int) -> str | None:
    for kind, text in tokens[i + 1 :]:
        if kind not in ("ws", "line", "block"):
            return text
    return None


# Runs inside the sandbox's interpreter. Defines its helpers once per interpreter (a restarted one
# defines them again), opens the copy read-only and answers one query as a JSON line.
RUNNER_SOURCE = r"""
if "_agentrl_sql_query" not in globals():
    import json as _aj, os as _ao, sqlite3 as _asq, time as _at
    _AGENTRL_ALLOWED = {20, 21, 31, 33}  # SQLITE_READ, SELECT, FUNCTION, RECURSIVE
    _AGENTRL_DENIED_FUNCS = {"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"}
    _agentrl_cons = {}
    def _agentrl_auth(action, arg1, arg2, dbname, source):
        if action == 31 and (arg2 or "").lower() in _AGENTRL_DENIED_FUNCS:
            return _asq.SQLITE_DENY
        return _asq.SQLITE_OK if action in _AGENTRL_ALLOWED else _asq.SQLITE_DENY
    def _agentrl_con(path):
        if path not in _agentrl_cons:
            full = _ao.path.abspath(path)
            _ao.chmod(full, 0o444)
            con = _asq.connect("file:" + full + "?mode=ro", uri=True)
            con.execute("PRAGMA query_only = 1")
            con.set_authorizer(_agentrl_auth)
            _agentrl_cons[path] = con
        return _agentrl_cons[path]
    def _agentrl_cell(value):
        if isinstance(value, bytes):
            return "<blob of %d bytes>" % len(value)
        return value
    def _agentrl_sql_query(path, sql, max_rows, count_limit, timeout_s):
        con = _agentrl_con(path)
        deadline = _at.monotonic() + timeout_s
        con.set_progress_handler(lambda: 1 if _at.monotonic() > deadline else 0, 2000)
        out = {"columns": [], "rows": [], "total": 0, "counted_all": True, "error": None}
        try:
            cur = con.execute(sql)
            out["columns"] = [d[0] for d in cur.description or []]
            rows = cur.fetchmany(max_rows)
            out["rows"] = [[_agentrl_cell(v) for v in row] for row in rows]
            total = len(rows)
            if len(rows) == max_rows:
                while total < count_limit:
                    more = cur.fetchmany(1000)
                    if not more:
                        break
                    total += len(more)
                else:
                    out["counted_all"] = cur.fetchone() is None
            out["total"] = total
        except _asq.Error as exc:
            if _at.monotonic() > deadline:
                out["error"] = "timeout"
            else:
                out["error"] = "%s: %s" % (type(exc).__name__, exc)
        finally:
            con.set_progress_handler(None, 0)
        print(_aj.dumps(out))
"""


@dataclass
class QueryResult:
    """Rows of one query (at most ``max_rows``), the total count, or the error."""

    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    total: int = 0
    counted_all: bool = True
    error: str | None = None
    seconds: float = 0.0


class SandboxSQL:
    """Runs guarded, read-only queries against a copy of ``db_path`` inside the slot's sandbox."""

    def __init__(
        self,
        db_path: Path,
        slot: SandboxSlot,
        *,
        timeout_s: float = 5.0,
        session_name: str = "sql",
        db_name: str | None = None,
    ):
        self.db_path = Path(db_path)
        self.db_name = db_name or f"agentrl_{self.db_path.stem}.sqlite"  # the copy in the sandbox work dir
        self.slot = slot
        self.timeout_s = timeout_s
        self.session_name = session_name
        self._copied_to: tuple[int, int] | None = None  # (id(sandbox), generation) holding the copy

    def _sandbox(self) -> Any:
        sandbox = self.slot.get()
        where = (id(sandbox), getattr(sandbox, "generation", 0))
        if self._copied_to != where:
            start = time.perf_counter()
            try:
                sandbox.put_file(self.db_name, self.db_path.read_bytes())
            finally:
                self.slot.sandbox_seconds += time.perf_counter() - start
            self._copied_to = where
        return sandbox

    def release(self) -> None:
        """Forget the copy (the slot's sandbox is reset when it goes back to the pool)."""
        self._copied_to = None

    def run(self, sql: str, *, max_rows: int, count_limit: int = 100_000) -> QueryResult:
        """Run ``sql`` (already guarded by the caller) and return at most ``max_rows`` rows.

        Raises:
            ToolError: the guard refuses ``sql``.
            SandboxError: the sandbox failed.
        """
        problem = check_sql(sql)
        if problem:
            raise ToolError(f"query refused: {problem}")
        session = self._sandbox().python_session(self.session_name)
        call = f"_agentrl_sql_query({self.db_name!r}, {sql!r}, {int(max_rows)}, {int(count_limit)}, {self.timeout_s!r})"
        start = time.perf_counter()
        try:
            result = session.run(RUNNER_SOURCE + "\n" + call, timeout=self.timeout_s + 5.0)
        finally:
            self.slot.sandbox_seconds += time.perf_counter() - start
        seconds = time.perf_counter() - start
        if result.timed_out or result.restarted or result.oom_killed:
            why = "ran out of memory" if result.oom_killed else "timeout"
            return QueryResult(error=why, seconds=seconds)
        lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
        if not lines:
            raise ToolError(f"the query runner gave no result: {result.stderr.strip()[-500:]}")
        payload = json.loads(lines[-1])
        return QueryResult(
            columns=payload["columns"],
            rows=payload["rows"],
            total=payload["total"],
            counted_all=payload["counted_all"],
            error=payload["error"],
            seconds=seconds,
        )


def _cell_text(value: Any) -> str:
    if value is None:
        return "NULL"
    return str(value).replace("\n", "\\n")


def format_result(result: QueryResult, *, timeout_s: float, max_rows: int) -> str:
    """The observation for a query result: a pipe-separated table, then the row count."""
    if result.error == "timeout":
        raise ToolError(
            f"the query ran longer than the {timeout_s:g} s statement limit and was stopped; "
            "avoid cartesian joins (join on keys) and aggregate or add LIMIT"
        )
    if result.error:
        raise ToolError(f"the query failed: {result.error}")
    lines = [" | ".join(result.columns)] if result.columns else []
    lines += [" | ".join(_cell_text(v) for v in row) for row in result.rows[:max_rows]]
    shown = min(len(result.rows), max_rows)
    if result.total > shown:
        total = f"{result.total}{'' if result.counted_all else '+'}"
        lines.append(
            f"(showing the first {shown} of {total} rows; aggregate, filter or add LIMIT to see less)"
        )
    else:
        lines.append(f"({result.total} row{'s' if result.total != 1 else ''})")
    return "\n".join(lines)


@dataclass(frozen=True)
class TableInfo:
    """What ``describe`` shows about one table."""

    name: str
    create_sql: str
    row_count: int
    sample: str


def database_schema(path: Path, sample_rows: int = 3) -> dict[str, TableInfo]:
    """Schema summary of a trusted database file (host side; table names come from sqlite_master)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = con.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
        ).fetchall()
        info = {}
        for name, create_sql in tables:
            quoted = '"' + name.replace('"', '""') + '"'
            count = con.execute(f"SELECT COUNT(*) FROM {quoted}").fetchone()[0]
            cur = con.execute(f"SELECT * FROM {quoted} LIMIT {int(sample_rows)}")
            sample = QueryResult(
                columns=[d[0] for d in cur.description], rows=[list(r) for r in cur.fetchall()], total=count
            )
            text = format_result(sample, timeout_s=0, max_rows=sample_rows)
            info[name] = TableInfo(name, create_sql, count, text)
        return info
    finally:
        con.close()


def make_sql_tools(runner: SandboxSQL, schema: dict[str, TableInfo], *, max_rows: int = 50) -> list[Tool]:
    """Build ``list_tables``, ``describe`` and ``query`` for one episode."""

    def list_tables() -> str:
        """List the tables of the database with their row counts."""
        return "\n".join(f"{t.name} ({t.row_count} rows)" for t in schema.values())

    def describe(table: str) -> str:
        """Show a table's columns (its CREATE statement), row count and a few example rows.

        Args:
            table: the table name, as list_tables shows it.
        """
        key = table.strip().strip("\"'`[]")
        found = schema.get(key) or next((t for n, t in schema.items() if n.lower() == key.lower()), None)
        if found is None:
            raise ToolError(f"no table named {table[:80]!r}; tables: {', '.join(schema)}")
        return f"{found.create_sql}\n-- {found.row_count} rows; first rows:\n{found.sample}"

    def query(sql: str) -> ToolResult:
        """Run one read-only SQL query (SQLite dialect) and show the result rows.

        Args:
            sql: a single SELECT statement.
        """
        result = runner.run(sql, max_rows=max_rows)
        text = format_result(result, timeout_s=runner.timeout_s, max_rows=max_rows)
        return ToolResult(text, usage={"wall_s": result.seconds})

    return [tool(list_tables), tool(describe), tool(query)]
