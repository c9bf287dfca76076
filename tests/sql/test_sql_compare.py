"""Execution accuracy: reading value-list answers and comparing results as multisets."""

from __future__ import annotations

import pytest

from agentrl.envs.sql.compare import canonical, is_sql, parse_values, rows_match


def test_is_sql():
    assert (
        is_sql("SELECT 1")
        and is_sql("  with a as (select 1) select * from a")
        and is_sql("```sql\nSELECT 1\n```")
    )
    assert not is_sql("42") and not is_sql('["Selected works"]')


def test_canonical_cells():
    assert canonical(3) == canonical(3.0) == canonical("3") == canonical(" 3.000 ")
    assert canonical(2328.6000000000004) == canonical(2328.6)
    assert canonical("1,234") == canonical(1234)
    assert canonical(" Rock ") == canonical("rock")
    assert canonical(None) is canonical("NULL") is None
    assert canonical(1.5) != canonical(1.51)


@pytest.mark.parametrize(
    ("answer", "columns", "n_rows", "rows"),
    [
        ("42", ["c"], 1, [[42]]),
        ('"AC/DC"', ["c"], 1, [["AC/DC"]]),
        ("AC/DC", ["c"], 1, [["AC/DC"]]),
        ("Angus Young, Malcolm Young", ["c"], 1, [["Angus Young, Malcolm Young"]]),  # one value with a comma
        ('["AC/DC", "Accept"]', ["c"], 2, [["AC/DC"], ["Accept"]]),
        ("AC/DC, Accept", ["c"], 2, [["AC/DC"], ["Accept"]]),
        ('["Luis", "Goncalves"]', ["first", "last"], 1, [["Luis", "Goncalves"]]),  # flat list = one row
        ('[["Rock", 1297], ["Jazz", 130]]', ["g", "n"], 2, [["Rock", 1297], ["Jazz", 130]]),
        ("[('Rock', 1297), ('Jazz', 130)]", ["g", "n"], 2, [["Rock", 1297], ["Jazz", 130]]),
        ("Rock | 1297\nJazz | 130", ["g", "n"], 2, [["Rock", "1297"], ["Jazz", "130"]]),
        ("| g | n |\n|---|---|\n| Rock | 1297 |", ["g", "n"], 1, [["Rock", "1297"]]),
        ("```json\n[1, 2]\n```", ["c"], 2, [[1], [2]]),
    ],
)
def test_parse_values(answer, columns, n_rows, rows):
    assert parse_values(answer, columns, n_rows) == rows


def test_rows_match_multiset_order_and_columns():
    gold = [["Rock", 1297], ["Jazz", 130]]
    assert rows_match([["Jazz", 130], ["Rock", 1297]], gold, ordered=False)
    assert not rows_match([["Jazz", 130], ["Rock", 1297]], gold, ordered=True)
    assert rows_match([["Rock", 1297], ["Jazz", 130]], gold, ordered=True)
    assert rows_match([[1297, "Rock"], [130, "Jazz"]], gold, ordered=False)  # columns swapped consistently
    assert not rows_match([[1297, "Rock"], ["Jazz", 130]], gold, ordered=False)  # no single column order fits
    assert not rows_match([["Rock", 1297]], gold, ordered=False)  # a missing row
    assert not rows_match([["Rock", 1297], ["Rock", 1297]], gold, ordered=False)  # duplicates count
    assert not rows_match([["Rock", 1297, 1], ["Jazz", 130, 1]], gold, ordered=False)  # extra column
    assert rows_match([["rock", "1297"], ["JAZZ", "130.0"]], gold, ordered=False)
