"""Real QA sets: loaders on the shipped files and on a fixture, and the SearchQA env."""

from __future__ import annotations

import json

import pytest
from gymnasium.utils.env_checker import check_env

import agentrl
from agentrl.envs.search.env import wiki_retriever
from agentrl.envs.search.oracle import tool_call
from agentrl.envs.search.qa import QA_FILES, load_qa, qa_dir
from agentrl.envs.search.server import start_background
from agentrl.errors import EnvError
from agentrl.paths import benchmark_dir


def _real_qa_dir():
    return benchmark_dir("search_qa")  # shipped with the package


@pytest.fixture
def fixture_dir(tmp_path):
    rows = {
        "nq": [
            {
                "id": "nq_1",
                "source": "nq",
                "question": "capital of velora",
                "golden_answers": ["Tarn", "Tarn City"],
            }
        ],
        "bamboogle": [
            {
                "id": "Bamboogle_1",
                "source": "Bamboogle",
                "question": "Who founded X?",
                "golden_answers": ["Y"],
            },
            {"id": "Bamboogle_2", "source": "Bamboogle", "question": "When?", "golden_answers": "1901"},
        ],
    }
    for name, records in rows.items():
        (tmp_path / QA_FILES[name]).write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return tmp_path


def test_real_files_load_with_expected_sizes() -> None:
    folder = _real_qa_dir()
    sizes = {name: len(load_qa(name, folder)) for name in QA_FILES}
    assert sizes == {
        "nq": 512,
        "triviaqa": 512,
        "popqa": 512,
        "hotpotqa": 512,
        "2wiki": 512,
        "musique": 512,
        "bamboogle": 125,
    }
    for name in QA_FILES:
        for record in load_qa(name, folder):
            assert record.question and record.golden_answers and all(record.golden_answers)
    assert load_qa("popqa", folder)[0].golden_answers[0] == "Bloomsburg"


def test_env_over_real_files_is_closed_book_by_default() -> None:
    _real_qa_dir()
    env = agentrl.make("agentrl/SearchQA-v0")
    u = env.unwrapped
    assert u.tools == [] and "own knowledge" in u.system_prompt
    assert len(u.tasks("test")) == 512 * 6 + 125
    check_env(u, skip_render_check=True)
    task = u.get_task("popqa_3474310")
    env.reset(options={"task_id": task.id})
    obs, reward, terminated, truncated, info = env.step("<answer>Eyersburg</answer>")  # an alias
    assert (reward, terminated, truncated) == (1.0, True, False) and info["metrics"]["em"] == 1.0
    env.reset(options={"task_id": task.id})
    obs, *_ = env.step(tool_call("search", query="Columbia County"))
    assert obs.startswith("Unknown tool 'search'")  # closed-book: no tools
    env.close()
    env.close()


def test_fixture_loader_and_sources(fixture_dir) -> None:
    assert [r.golden_answers for r in load_qa("bamboogle", fixture_dir)] == [("Y",), ("1901",)]
    env = agentrl.make(
        "agentrl/SearchQA-v0", data_dir=str(fixture_dir), sources=["nq", "bamboogle"], reward="f1"
    )
    u = env.unwrapped
    assert [t.id for t in u.tasks("test")] == ["nq_1", "Bamboogle_1", "Bamboogle_2"]
    env.reset(options={"task_id": "nq_1"})
    _, reward, _, _, info = env.step("<answer>Tarn city centre</answer>")
    # best alias "Tarn City": P = 2/3, R = 1 -> F1 = 0.8
    assert reward == pytest.approx(0.8) and info["metrics"]["em"] == 0.0
    with pytest.raises(EnvError, match="unknown QA source"):
        agentrl.make("agentrl/SearchQA-v0", data_dir=str(fixture_dir), sources=["squad"])


def test_bad_rows_name_file_and_line(tmp_path) -> None:
    (tmp_path / "nq.jsonl").write_text(
        '{"id": "a", "source": "nq", "question": "q", "golden_answers": ["x"]}\n{"id": "b"}\n'
    )
    with pytest.raises(EnvError, match=r"nq.jsonl:2: bad QA row"):
        load_qa("nq", tmp_path)
    with pytest.raises(EnvError, match="no QA folder"):
        qa_dir(tmp_path / "absent")


def test_remote_retriever_needs_a_url_and_works_with_one(fixture_dir) -> None:
    with pytest.raises(EnvError, match="retriever_url='http://HOST:PORT/retrieve'"):
        agentrl.make("agentrl/SearchQA-v0", data_dir=str(fixture_dir), retriever="remote")
    with pytest.raises(EnvError, match="no local corpus"):
        agentrl.make("agentrl/SearchQA-v0", data_dir=str(fixture_dir), retriever="bm25")
    with start_background(wiki_retriever(0, 2000, "bm25")) as server:
        env = agentrl.make("agentrl/SearchQA-v0", data_dir=str(fixture_dir), retriever_url=server.url)
        assert [t["function"]["name"] for t in env.unwrapped.tools] == ["search", "open"]
        env.reset(seed=0)
        obs, *_ = env.step(tool_call("search", query="Port Lidiark", k=2))
        assert obs.startswith('Results for "Port Lidiark":\n[1] d000064 | Port Lidiark')
        env.close()


def test_gold_oracle_scores_every_real_row() -> None:
    from agentrl.env import play_policy
    from agentrl.envs.search.oracle import GoldQAOracle

    env = agentrl.make("agentrl/SearchQA-v0", sources=["bamboogle"])  # the shipped file
    tasks = env.unwrapped.tasks("test")
    assert len(tasks) == 125
    rewards = [play_policy(env, GoldQAOracle(), task=task)[0] for task in tasks]
    assert rewards == [1.0] * 125  # the gold answer parses and scores EM 1 on every row
    env.close()
