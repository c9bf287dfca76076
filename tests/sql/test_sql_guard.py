"""The SQL statement guard (first layer; the sandbox's read-only connection is tested in test_sql_env)."""

from __future__ import annotations

import pytest

from agentrl.tools.sql import check_sql


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM Track",
        "select count(*) from Track where Name = 'DROP TABLE Track; --'",  # keywords inside strings are data
        'SELECT "Delete" FROM t',  # quoted identifiers too
        "WITH a AS (SELECT 1 AS x) SELECT x FROM a",
        "SELECT REPLACE(Name, 'a', 'b') FROM Artist",  # replace() the function is fine
        "SELECT CASE WHEN 1 THEN 'a' ELSE 'b' END",
        "SELECT 1; ",
        "SELECT 1 -- trailing comment; DROP TABLE x",
        "VALUES (1), (2)",
        "SELECT * FROM pragma_table_info('Track')",
    ],
)
def test_allowed(sql):
    assert check_sql(sql) is None


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("DROP TABLE Track", "DROP is not allowed"),
        ("drop table Track", "DROP is not allowed"),
        ("DELETE FROM Track", "DELETE is not allowed"),
        ("UPDATE Track SET Name = 'x'", "UPDATE is not allowed"),
        ("INSERT INTO Genre VALUES (99, 'x')", "INSERT is not allowed"),
        ("REPLACE INTO Genre VALUES (1, 'x')", "REPLACE is not allowed"),
        ("ATTACH '/etc/passwd' AS p", "ATTACH is not allowed"),
        ("ATTACH DATABASE 'file:/etc/passwd?mode=ro' AS p", "ATTACH is not allowed"),
        ("PRAGMA writable_schema = 1", "PRAGMA is not allowed"),
        ("PRAGMA query_only = 0", "PRAGMA is not allowed"),
        ("VACUUM INTO '/tmp/x.db'", "VACUUM is not allowed"),
        ("CREATE TABLE x (a)", "CREATE is not allowed"),
        ("BEGIN; SELECT 1", "BEGIN is not allowed"),
        ("SELECT 1; DELETE FROM Track", "only one SQL statement"),
        ("SELECT 1; SELECT 2", "only one SQL statement"),
        ("SELECT 1;/* sneaky */SELECT 2", "only one SQL statement"),
        ("WITH a AS (SELECT 1) DELETE FROM Track", "DELETE is not allowed"),
        ("SELECT load_extension('/tmp/evil.so')", "load_extension is not allowed"),
        ("EXPLAIN SELECT 1", "only SELECT queries"),
        ("", "empty"),
        ("   -- only a comment", "empty"),
    ],
)
def test_refused(sql, reason):
    problem = check_sql(sql)
    assert problem is not None and reason in problem
