"""The `agentrl` command: envs listing and scripted play, in process and as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import toy_envs  # noqa: F401  (registers test/Counter-v0)
from typer.testing import CliRunner

from agentrl.cli import app

runner = CliRunner()


def test_envs_json_lists_ids_with_descriptions():
    result = runner.invoke(app, ["envs", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["id"]: row["description"] for row in json.loads(result.output)}
    assert rows["test/Counter-v0"] == "toy counter"


def test_play_replays_a_script_as_json(tmp_path):
    script = tmp_path / "actions.txt"
    script.write_text("add[10]\n\n<answer>10</answer>\n")
    result = runner.invoke(app, ["play", "test/Counter-v0", "--task-id", "train-1", "--script", str(script), "--json"])
    assert result.exit_code == 0, result.output
    steps = json.loads(result.output)
    assert [s.get("observation") for s in steps] == ["Reach 10.", "counter = 10", ""]
    assert steps[-1]["reward"] == 1.0 and steps[-1]["terminated"] is True
    assert steps[-1]["info"]["metrics"]["em"] == 1.0


def test_play_human_readable_transcript(tmp_path):
    script = tmp_path / "actions.txt"
    script.write_text("nonsense\n")
    result = runner.invoke(app, ["play", "test/Counter-v0", "--seed", "2", "--script", str(script)])
    assert result.exit_code == 0, result.output
    assert "[tools] add" in result.output and "No tool call or answer found" in result.output


def test_console_script_runs_and_reports_bad_input():
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "play", "agentrl/Nope-v0", "--script", "/dev/null"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "unknown env id 'agentrl/Nope-v0'" in out.stderr
