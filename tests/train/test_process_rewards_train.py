"""`agentrl train` with FoldGRPO on branch/return rollouts: process penalties show up in the run's metrics."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agentrl.cli import app


@pytest.mark.slow
def test_foldgrpo_run_reports_process_penalties(tiny_model_dir, tmp_path):
    """A tiny random model never branches nor succeeds, so the rule that must fire is the unfolded one:
    with the threshold at 5% of the context every main-thread token it generates is past it (share 1),
    while no call failed and no branch was judged (shares 0)."""
    out = tmp_path / "run"
    config = tmp_path / "foldgrpo.yaml"
    config.write_text(
        f"model: {{name: {tiny_model_dir}}}\n"
        "env: {id: agentrl/Search-v0, max_turns: 2, max_obs_chars: 300, kwargs: {hops: single}}\n"
        "rollout: {group_size: 2, tasks_per_step: 1, max_new_tokens: 8, concurrency: 1, max_context_tokens: 2048,\n"
        "          folding: branch, unfolded_threshold: 0.05}\n"
        "algo: {advantage: foldgrpo, loss: foldgrpo}\n"
        "train: {lr: 1.0e-3, minibatch_size: 2, micro_batch_size: 1, eval_episodes: 1, num_threads: 1, seed: 3,\n"
        f"        steps: 2, out_dir: {out}}}\n"
    )
    result = CliRunner().invoke(app, ["train", str(config)])
    assert result.exit_code == 0, result.output
    assert "process rewards (FoldGRPO): unfolded -1 past 0.05 x 2048 main-context tokens" in result.output
    steps = [
        r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "perf/step_s" in r
    ]
    assert len(steps) == 2
    for step in steps:
        assert step["rollout/process_share/unfolded"] == 1.0 and step["rollout/process_share/any"] == 1.0
        assert (
            step["rollout/process_share/failure"] == 0.0 and step["rollout/process_share/out_of_scope"] == 0.0
        )
        # every episode failed (reward 0): the penalties are there, but none in a success, which is where
        # FoldGRPO's clip(R + Q, 0, 1) could act, and the run says so
        assert step["env/reward"] == 0.0 and step["fold/penalised_tokens"] > 0
        assert step["fold/penalised_in_success"] == 0.0
