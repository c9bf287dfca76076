"""The loop a user closes: `agentrl train` writes a servable model folder, `agentrl serve --adapter`
serves it over HTTP, and `agentrl eval --agent chat:URL` evaluates it through the chat agent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train_cli import QUICKSTART, SHORT, agentrl_train

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the rollout test package's root
from processes import dies_with_tests
from rollout.test_serve_engines import CLI, _free_port, _wait  # noqa: E402


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    (path,) = folder.glob("*.safetensors")
    return load_file(path)


@pytest.mark.slow
def test_trained_model_is_served_and_evaluated_through_the_chat_agent(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = agentrl_train(str(QUICKSTART), f"model.name={tiny_model_dir}", *SHORT, f"train.out_dir={out}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    model_dir = Path(summary["model_dir"])
    assert model_dir == out / "model" and (model_dir / "config.json").exists()
    trained, initial = _weights(model_dir), _weights(Path(tiny_model_dir))
    assert trained.keys() == initial.keys()
    assert any(not torch.equal(trained[k], initial[k]) for k in trained)  # it is the trained model

    port = _free_port()
    server = subprocess.Popen(
        dies_with_tests([CLI, "serve", "--model", str(tiny_model_dir), "--adapter", str(model_dir), "--port", str(port)]),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        _wait(server, port, timeout=300)
        evaluation = tmp_path / "eval"
        result = subprocess.run(
            [CLI, "eval", "--suite", "gaia-fixture:python=false,max_turns=2", "--agent",
             f"chat:http://127.0.0.1:{port}/v1#model", "--limit", "2", "--concurrency", "2",
             "--max-new-tokens", "12", "--out", str(evaluation)],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        records = [json.loads(line) for line in (evaluation / "records.jsonl").read_text().splitlines()]
        # a tiny random model answers nonsense: this checks the path (every episode ran), not the score
        assert len(records) == 2 and all(r["error"] is None and r["turns"] >= 1 for r in records)
        metrics = json.loads((evaluation / "metrics.json").read_text())
        assert metrics["agent"] == f"chat:http://127.0.0.1:{port}/v1#model"
    finally:
        server.terminate()
        server.wait(timeout=30)
