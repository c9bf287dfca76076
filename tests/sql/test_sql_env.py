"""The SQL env through real sandboxes: scripted episodes, adversarial SQL, read-only defence, the oracle."""

from __future__ import annotations

import hashlib
import json

import pytest

import agentrl
from agentrl.env import Task
from agentrl.envs.sql.databases import database_path
from agentrl.envs.sql.oracle import run_oracle as play_one
from agentrl.tools.python import SandboxSlot
from agentrl.tools.sql import RUNNER_SOURCE, SandboxSQL


def call(name: str, **arguments: str) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def chinook_task(question: str, sql: str, rows: list, columns: list, ordered: bool = False) -> Task:
    payload = {"database": "chinook", "gold_sql": sql, "columns": columns, "ordered": ordered}
    return Task("t-chinook", question, rows, "test", 2, payload)


ROCK = chinook_task(
    "How many tracks belong to the genre 'Rock'?",
    "SELECT COUNT(*) FROM Track t JOIN Genre g ON t.GenreId = g.GenreId WHERE g.Name = 'Rock'",
    [[1297]],
    ["COUNT(*)"],
)
ACDC = chinook_task(
    "List the titles of the albums by the artist 'AC/DC'.",
    "SELECT al.Title FROM Album al JOIN Artist ar ON al.ArtistId = ar.ArtistId WHERE ar.Name = 'AC/DC'",
    [["For Those About To Rock We Salute You"], ["Let There Be Rock"]],
    ["Title"],
)


def file_digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def env(backend):
    env = agentrl.make("agentrl/SQLChinook-v0", sandbox_backend=backend, timeout_s=2.0, max_turns=30)
    yield env
    env.close()


def test_scripted_episode_with_per_turn_rewards(env):
    obs, info = env.reset(options={"task": ROCK})
    assert "Question: How many tracks belong to the genre 'Rock'?" in obs
    script = [
        (call("list_tables"), lambda o: "Track (3503 rows)" in o and "Genre (25 rows)" in o, 0.0, False),
        ("describe[Genre]", lambda o: o.startswith("CREATE TABLE Genre") and "1 | Rock" in o, 0.0, False),
        (
            call("query", sql="SELECT GenreId FROM Genre WHERE Name = 'Rock'"),
            lambda o: o == "GenreId\n1\n(1 row)",
            0.0,
            False,
        ),
        (
            call("query", sql="SELECT COUNT(*) AS n FROM Track WHERE GenreId = 1"),
            lambda o: o == "n\n1297\n(1 row)",
            0.0,
            False,
        ),
        ("<answer>1297</answer>", lambda o: o == "", 1.0, True),
    ]
    for turn, (action, check, want_reward, want_done) in enumerate(script, start=1):
        obs, reward, terminated, truncated, info = env.step(action)
        assert check(obs), obs
        assert (reward, terminated, truncated, info["turn"]) == (want_reward, want_done, False, turn)
    assert info["metrics"]["correct"] == 1.0 and info["metrics"]["answer_form_values"] == 1.0


def test_answer_as_sql_and_as_values(env):
    env.reset(options={"task": ACDC})
    *_, reward, terminated, _, info = env.step("<answer>SELECT Title FROM Album WHERE ArtistId = 1;</answer>")
    assert (reward, terminated, info["metrics"]["answer_form_sql"]) == (1.0, True, 1.0)
    env.reset(options={"task": ACDC})
    *_, reward, _, _, info = env.step(
        '<answer>["Let There Be Rock", "For Those About To Rock We Salute You"]</answer>'
    )
    assert reward == 1.0  # order-insensitive
    env.reset(options={"task": ACDC})
    *_, reward, _, _, info = env.step("<answer>SELECT Title FROM Album WHERE ArtistId = 2</answer>")
    assert (reward, info["metrics"]["correct"]) == (0.0, 0.0)
    env.reset(options={"task": ACDC})
    *_, reward, _, _, info = env.step("<answer>SELECT Title FROM Album; DROP TABLE Album</answer>")
    assert (reward, info["metrics"]["answer_error"]) == (0.0, 1.0)


def test_row_cap_in_the_observation(env):
    env.reset(options={"task": ROCK})
    obs, *_ = env.step(call("query", sql="SELECT Name FROM Track"))
    lines = obs.splitlines()
    assert lines[0] == "Name" and len(lines) == 1 + 50 + 1
    assert lines[-1].startswith("(showing the first 50 of 3503 rows")


def test_adversarial_sql_is_refused_and_the_database_never_changes(env):
    path = database_path("chinook")
    before = file_digest(path)
    env.reset(options={"task": ROCK})
    attacks = {
        call("query", sql="DROP TABLE Track"): "DROP is not allowed",
        call("query", sql="ATTACH '/etc/passwd' AS p"): "ATTACH is not allowed",
        call("query", sql="SELECT 1; DELETE FROM Track"): "only one SQL statement",
        call("query", sql="PRAGMA query_only = 0"): "PRAGMA is not allowed",
        call("query", sql="SELECT load_extension('/tmp/x.so')"): "load_extension is not allowed",
        call("describe", table="Track; DROP TABLE Track"): "no table named",
        call("describe", table="' OR 1=1 --"): "no table named",
    }
    for action, message in attacks.items():
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs.startswith("Error:") and message in obs and not terminated, obs
        assert info["tool_calls"][0]["ok"] is False
    obs, *_ = env.step(call("query", sql="SELECT COUNT(*) FROM Track WHERE Name = 'x' OR 1=1"))
    assert obs.splitlines()[1] == "3503"  # classic injection text is just a query: read-only, harmless
    obs, *_ = env.step(call("query", sql="SELECT COUNT(*) FROM Track"))
    assert obs.splitlines()[1] == "3503"
    assert file_digest(path) == before


def test_cartesian_join_hits_the_statement_timeout(env):
    env.reset(options={"task": ROCK})
    obs, reward, terminated, truncated, info = env.step(
        call("query", sql="SELECT COUNT(*) FROM Track a, Track b, Track c")
    )
    assert "ran longer than the 2 s statement limit" in obs and not terminated
    assert info["tool_calls"][0]["seconds"] < 10
    obs, *_ = env.step(call("query", sql="SELECT COUNT(*) FROM Genre"))
    assert obs.splitlines()[1] == "25"  # the session survived and still answers


def test_the_sandbox_connection_is_read_only_even_without_the_guard(backend):
    # Defence in depth: bypass check_sql and send writes straight to the in-sandbox runner.
    slot = SandboxSlot(backend)
    runner = SandboxSQL(database_path("chinook"), slot, timeout_s=2.0)
    try:
        sandbox = runner._sandbox()
        session = sandbox.python_session("sql")
        for sql in (
            "DELETE FROM Track",
            "ATTACH '/etc/passwd' AS p",
            "PRAGMA query_only = 0",
            "CREATE TABLE x(a)",
        ):
            out = session.run(
                RUNNER_SOURCE + f"\n_agentrl_sql_query({runner.db_name!r}, {sql!r}, 5, 0, 2.0)", timeout=10
            )
            payload = json.loads(out.stdout.strip().splitlines()[-1])
            assert payload["error"] and "not authorized" in payload["error"], payload
        out = session.run(f"import os; print(oct(os.stat({runner.db_name!r}).st_mode & 0o777))", timeout=10)
        assert out.stdout.strip() == "0o444"
        assert runner.run("SELECT COUNT(*) FROM Track", max_rows=5).rows == [[3503]]
    finally:
        slot.release()


def test_scoring_an_answer_query_runs_in_the_sandbox_with_the_timeout(env):
    env.reset(options={"task": ROCK})
    *_, reward, terminated, _, info = env.step(
        "<answer>SELECT COUNT(*) FROM Track a, Track b, Track c</answer>"
    )
    assert (reward, terminated, info["metrics"]["answer_error"]) == (0.0, True, 1.0)


def run_oracle(env, tasks) -> float:
    """Mean oracle reward over ``tasks`` (one scripted episode each)."""
    return sum(play_one(env, task)[0] for task in tasks) / len(tasks)


@pytest.mark.parametrize("env_id", ["agentrl/SQL-v0"])
def test_oracle_solves_the_test_split(backend, env_id):
    env = agentrl.make(env_id, sandbox_backend=backend)
    tasks = list(env.unwrapped.tasks("test"))
    assert len(tasks) >= 100 and {t.level for t in tasks} == {1, 2, 3}
    assert run_oracle(env, tasks) >= 0.99
    reward, info = play_one(env, seed=3)  # the protocol helper, from a seeded reset
    assert reward == 1.0 and info["metrics"]["tool_calls"] == 3.0
    env.close()


@pytest.mark.slow
def test_oracle_solves_every_split_with_both_answer_forms(backend):
    env = agentrl.make("agentrl/SQL-v0", sandbox_backend=backend)
    tasks = [t for split in ("train", "dev") for t in env.unwrapped.tasks(split)][::3]  # ~210 tasks
    assert run_oracle(env, tasks) >= 0.99
    env.close()


def test_bad_kwargs_name_the_field():
    with pytest.raises(agentrl.errors.ConfigError, match="env.database"):
        agentrl.make("agentrl/SQL-v0", database="northwind")
    with pytest.raises(agentrl.errors.ConfigError, match="env.levels"):
        agentrl.make("agentrl/SQL-v0", levels=(4,))


def test_without_any_backend_the_query_tool_says_so(monkeypatch):
    # A Docker engine that does not answer: construction works, schema tools work, queries are clear errors.
    import agentrl.sandboxes.docker_backend as docker_backend

    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:9")
    monkeypatch.setattr(docker_backend, "_client", None)  # forget the process-wide client
    env = agentrl.make("agentrl/SQLChinook-v0", sandbox_backend="docker", pool_size=3)  # a pool of its own
    env.reset(options={"task": ROCK})
    obs, reward, terminated, truncated, info = env.step(call("query", sql="SELECT 1"))
    assert obs.startswith("Error: sandbox failure in query") and not terminated, obs
    assert info["tool_calls"][0]["error_kind"] == "sandbox_error"
    assert "Track (3503 rows)" in env.step(call("list_tables"))[0]  # host-side schema needs no sandbox
    *_, reward, terminated, _, info = env.step("<answer>1297</answer>")
    assert (reward, terminated) == (1.0, True)
    env.close()
