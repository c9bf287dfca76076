"""The real-GAIA loader and env on the fixture in GAIA's own layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import agentrl
from agentrl.envs.gaia.real import FIXTURE_DIR, GaiaRealEnv, load_gaia_split
from agentrl.errors import ConfigError, EnvError

FIXTURE = FIXTURE_DIR  # shipped with agentrl.envs.gaia


def test_loader_reads_metadata_and_hides_annotator_metadata() -> None:
    tasks = load_gaia_split(FIXTURE, "validation")
    assert [t.level for t in tasks] == [1, 1, 2, 2, 3, 1]
    first_with_file = tasks[1]
    assert first_with_file.answer == "2445"
    assert Path(first_with_file.payload["file_path"]).is_file()
    assert first_with_file.payload["annotator_metadata"]["Number of steps"] == "2"
    env = GaiaRealEnv(data_dir=str(FIXTURE))
    for task in tasks:
        obs, _ = env.reset(options={"task_id": task.id})
        assert "Open the file" not in obs and "Steps" not in obs
        assert task.answer not in obs or task.answer in task.question
    env.close()


def test_test_split_and_single_split_folder(tmp_path: Path) -> None:
    assert {t.answer for t in load_gaia_split(FIXTURE, "test")} == {"?"}
    # one split folder given directly also works
    assert len(load_gaia_split(FIXTURE / "validation", "validation")) == 6


def test_loader_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="metadata.jsonl"):
        load_gaia_split(tmp_path, "validation")
    (tmp_path / "metadata.jsonl").write_text(json.dumps({"task_id": "x", "Question": "q"}) + "\n")
    with pytest.raises(EnvError, match="Level"):
        load_gaia_split(tmp_path, "validation")
    with pytest.raises(ConfigError, match="does not exist"):
        GaiaRealEnv(data_dir=str(tmp_path / "missing"))


def test_episode_reads_attachment_and_scores_with_gaia_rules() -> None:
    env = agentrl.make("agentrl/GAIA-Real-v0", data_dir=str(FIXTURE))
    tasks = env.unwrapped.tasks("validation")
    # the docx task: gold "1,615" is a two-item list under GAIA's rules
    obs, _ = env.reset(options={"task_id": tasks[4].id})
    assert "5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d.docx" in obs
    call = {"name": "read_file", "arguments": {"file_name": tasks[4].payload["file_name"]}}
    obs, reward, terminated, _, info = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
    assert "Velmora Star | Quell | 1200" in obs and not terminated and reward == 0.0
    assert info["tool_calls"][0]["ok"]
    _, reward, terminated, _, info = env.step("Quell has 1200 + 415.\nFINAL ANSWER: 1615")
    assert terminated and reward == 0.0 and info["answer"] == "1615"
    env.reset(options={"task_id": tasks[4].id})
    _, reward, terminated, _, info = env.step("FINAL ANSWER: 1,615")
    assert terminated and reward == 1.0 and info["metrics"]["correct"] == 1.0
    # an audio attachment becomes an observation that says it cannot be heard, not a crash
    env.reset(options={"task_id": tasks[5].id})
    obs, _, terminated, _, info = env.step("read_file[e1d2c3b4-a596-4877-8695-a4b3c2d1e0f9.mp3]")
    assert not terminated and "audio file" in obs and info["tool_calls"][0]["error_kind"] == "tool_error"
    env.close()
    env.close()


def test_level_filter() -> None:
    env = GaiaRealEnv(data_dir=str(FIXTURE), level=2)
    assert [t.level for t in env.tasks()] == [2, 2]
    with pytest.raises(ConfigError, match="level"):
        GaiaRealEnv(data_dir=str(FIXTURE), level=4)


def test_python_tool_is_offered_and_runs() -> None:
    env = GaiaRealEnv(data_dir=str(FIXTURE))
    env.reset(options={"task_id": load_gaia_split(FIXTURE, "validation")[0].id})
    assert {t["function"]["name"] for t in env.tools} == {"read_file", "python"}
    call = {"name": "python", "arguments": {"code": "print(17 * 3)"}}
    obs, _, _, _, info = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
    if info["tool_calls"][0]["error_kind"] == "sandbox_error":
        pytest.skip(f"no sandbox backend here: {obs}")
    assert obs.strip() == "51"
    _, reward, terminated, _, _ = env.step("FINAL ANSWER: 51")
    assert terminated and reward == 1.0
    env.close()
    assert {t["function"]["name"] for t in GaiaRealEnv(data_dir=str(FIXTURE), python=False).tools} == {
        "read_file"
    }
