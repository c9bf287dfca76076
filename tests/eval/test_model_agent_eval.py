"""`agentrl eval --agent MODEL_DIR`: a local model evaluated through the rollout runner, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CLI = str(Path(sys.executable).parent / "agentrl")


def test_a_local_model_is_evaluated_with_a_prefix_cache_for_every_episode_that_can_be_in_flight(tiny_model_dir, tmp_path):
    out = tmp_path / "eval"
    done = subprocess.run(
        [CLI, "eval", "--suite", "gaia-fixture:python=false,max_turns=3", "--agent", str(tiny_model_dir),
         "--limit", "3", "--concurrency", "40", "--max-new-tokens", "12", "--max-context-tokens", "2048",
         "--out", str(out)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # 40 episodes x 2,048 tokens in flight (above the 65,536 default); the tiny model's K/V fits
    lines = [x for x in done.stderr.splitlines() if x.startswith("[eval] prefix cache: ")]
    assert len(lines) == 1 and lines[0].startswith("[eval] prefix cache: 81920 tokens ("), done.stderr[-2000:]
    assert lines[0].endswith("): every episode in flight")
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    # a tiny random model answers nonsense: this checks the path (every episode ran), not the score
    assert len(records) == 3 and all(r["error"] is None and r["turns"] >= 1 for r in records)


def test_every_option_an_eval_message_names_exists():
    """Errors and the printed settings name ``--option or VARIABLE``: each option is a real one."""
    import typer

    from agentrl.cli import app
    from agentrl.eval.model_agent import SETTING_SOURCES

    command = typer.main.get_command(app).commands["eval"]  # type: ignore[attr-defined]
    options = {opt for param in command.params for opt in param.opts}
    assert {option for option, _ in SETTING_SOURCES.values()} <= options
