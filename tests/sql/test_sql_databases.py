"""Databases (Chinook conversion, seeded generated ones) and the template questions' gold results."""

from __future__ import annotations

import collections
import sqlite3

import pytest

from agentrl.envs.sql.databases import DATABASES, build_shop, build_university, database_path, open_readonly
from agentrl.envs.sql.questions import Question, _ambiguous, build_questions

CHINOOK_ROWS = {
    "Artist": 275, "Album": 347, "Track": 3503, "Invoice": 412, "InvoiceLine": 2240, "Customer": 59,
    "Employee": 8, "Genre": 25, "MediaType": 5, "Playlist": 18, "PlaylistTrack": 8715,
}  # fmt: skip


def test_chinook_conversion_matches_the_known_database(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))  # build from the fixture, not from a cache
    path = database_path("chinook")
    assert path.parent == tmp_path / "sql" and not (path.stat().st_mode & 0o222)  # cached read-only
    con = open_readonly(path)
    for table, count in CHINOOK_ROWS.items():
        assert con.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == count
    # well-known facts of the public Chinook sample
    assert con.execute("SELECT ROUND(SUM(Total), 2) FROM Invoice").fetchone()[0] == 2328.6
    rock = "SELECT COUNT(*) FROM Track t JOIN Genre g ON g.GenreId = t.GenreId WHERE g.Name = 'Rock'"
    assert con.execute(rock).fetchone()[0] == 1297
    acdc = "SELECT Title FROM Album WHERE ArtistId = (SELECT ArtistId FROM Artist WHERE Name = 'AC/DC')"
    assert sorted(r[0] for r in con.execute(acdc)) == [
        "For Those About To Rock We Salute You",
        "Let There Be Rock",
    ]
    assert (
        con.execute("SELECT InvoiceDate FROM Invoice WHERE InvoiceId = 1").fetchone()[0]
        == "2007-01-01 00:00:00"
    )
    with pytest.raises(sqlite3.OperationalError):
        con.execute("DELETE FROM Genre")


@pytest.mark.parametrize("builder", [build_shop, build_university])
def test_generated_databases_are_deterministic(tmp_path, builder):
    dumps = []
    for name in ("a.sqlite", "b.sqlite"):
        builder(tmp_path / name)
        con = sqlite3.connect(tmp_path / name)
        dumps.append(list(con.iterdump()))
        con.close()
    assert dumps[0] == dumps[1] and len(dumps[0]) > 300


@pytest.mark.parametrize("name", sorted(DATABASES))
def test_questions_are_checked_by_execution(name):
    con = open_readonly(database_path(name))
    questions = build_questions(name, con)
    assert len({q.id for q in questions}) == len(questions) >= 90
    levels = collections.Counter(q.level for q in questions)
    assert set(levels) == {1, 2, 3} and min(levels.values()) >= 10, levels
    assert {q.split for q in questions} == {"train", "dev", "test"}
    for q in questions:
        rows = [list(r) for r in con.execute(q.sql).fetchall()]
        assert rows == q.rows and rows and len(q.columns) == len(rows[0])
    assert build_questions(name, con) == questions  # deterministic


def test_ties_at_the_top_k_cut_make_a_question_ambiguous():
    con = sqlite3.connect(":memory:")
    con.executescript(
        "CREATE TABLE t (name TEXT, score INT); INSERT INTO t VALUES ('a', 3), ('b', 2), ('c', 2);"
    )
    tie = "SELECT score FROM t ORDER BY score DESC"
    top = "SELECT name FROM t ORDER BY score DESC LIMIT {k}"
    assert not _ambiguous(con, Question("x", 3, "q", top.format(k=1), ordered=True, limit=1, tie_sql=tie))
    assert _ambiguous(con, Question("x", 3, "q", top.format(k=2), ordered=True, limit=2, tie_sql=tie))
    assert not _ambiguous(con, Question("x", 3, "q", top.format(k=3), ordered=True, limit=3, tie_sql=tie))
