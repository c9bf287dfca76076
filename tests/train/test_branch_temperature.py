"""rollout.branch_temperature through `agentrl train`, as a user sets it on the quickstart's trees."""

from __future__ import annotations

import json

import pytest

from agentrl.trajectory import load

from test_train_cli import QUICKSTART, SHORT, agentrl_train


@pytest.mark.parametrize(
    ("overrides", "fix"),
    [
        # the learner's log-probs are at rollout.temperature, so the sampler's (at the branches'
        # temperature) cannot be the PPO ratio's denominator
        (["algo.old_logprobs=sampler"], "algo.old_logprobs=recompute"),
        # chains have no branches to sample hotter: the setting would be ignored
        (["algo.old_logprobs=recompute", "rollout.branches=0"], "set rollout.branches"),
    ],
)
def test_a_branch_temperature_that_cannot_apply_fails_before_anything_runs(tmp_path, overrides, fix):
    out = tmp_path / "run"
    proc = agentrl_train(str(QUICKSTART), *SHORT, "rollout.branch_temperature=1.0", *overrides,
                         f"train.out_dir={out}", timeout=300)  # fmt: skip
    assert proc.returncode != 0
    assert "rollout.branch_temperature" in proc.stderr and fix in proc.stderr
    assert not (out / "metrics.jsonl").exists()  # nothing ran


@pytest.mark.slow
def test_branches_sample_hotter_and_train_through_agentrl_train(tiny_model_dir, tmp_path):
    """Trees of 1 root + 3 branches at rollout.temperature 0.6, the branches' answers at 1.3: the
    saved episodes say which turns were sampled hotter, the behaviour log-probs are recomputed and
    the step trains (an optimizer step on the branches' rows)."""
    out = tmp_path / "run"
    proc = agentrl_train(str(QUICKSTART), f"model.name={tiny_model_dir}", *SHORT, "train.num_threads=1",
                         "rollout.tasks_per_step=2", "rollout.branches=3", "rollout.max_new_tokens=24",
                         "rollout.branch_temperature=1.3", "algo.old_logprobs=recompute", "train.save_episodes=true",
                         f"train.out_dir={out}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "branch_temperature: 1.3" in (out / "resolved_config.yaml").read_text()
    episodes = load(out / "episodes" / "step-000001.jsonl")
    roots = [e for e in episodes if e.parent_id is None]
    assert len(roots) == 2 and len(episodes) == 8
    for root in roots:
        assert all(t.temperature is None for t in root.turns)  # rollout.temperature (0.6)
        for branch in (e for e in episodes if e.parent_id == root.episode_id):
            k = branch.branch_turn
            assert all(t.temperature is None for t in branch.turns[:k])  # the root's, replayed
            assert [t.temperature for t in branch.turns[k:]] == [1.3] * (len(branch.turns) - k)
    step = {}
    for record in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()):
        if record["step"] == 1:
            step.update(record)
    # recomputed behaviour log-probs: the mismatch against the hotter sampler is logged (and large)
    assert step["mismatch/abs_mean"] > 1e-3
    assert "loss/grad_norm" in step and step["loss/skipped_rows"] < 1


def test_branches_in_flight_without_branches_fail_before_anything_runs(tmp_path):
    out = tmp_path / "run"
    proc = agentrl_train(str(QUICKSTART), *SHORT, "rollout.branches=0", "rollout.branch_concurrency=64",
                         f"train.out_dir={out}", timeout=300)  # fmt: skip
    assert proc.returncode != 0
    assert "rollout.branch_concurrency" in proc.stderr and "set rollout.branches" in proc.stderr
    assert not (out / "metrics.jsonl").exists()  # nothing ran
