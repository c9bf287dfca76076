"""Tree rollouts through `agentrl train`, as a user runs them: the quickstart with rollout.branches."""

from __future__ import annotations

import json

import pytest

from agentrl.trajectory import load

from test_train_cli import QUICKSTART, SHORT, agentrl_train


@pytest.mark.slow
def test_a_tree_run_trains_through_agentrl_train(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = agentrl_train(str(QUICKSTART), f"model.name={tiny_model_dir}", *SHORT, "train.num_threads=1",
                         "train.steps=2", "rollout.tasks_per_step=2", "rollout.group_size=1", "rollout.branches=3",
                         "rollout.max_new_tokens=24", "train.save_episodes=true",
                         f"train.out_dir={out}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    records: dict[int, dict] = {}
    for record in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()):
        records.setdefault(record["step"], {}).update(record)
    for step in (1, 2):
        # 2 tasks x 1 root x (1 + 3 branches); each tree is one group
        assert records[step]["rollout/episodes"] == 8
        assert records[step]["rollout/groups_trained"] == 2
        assert records[step]["rollout/groups_per_1k_tokens"] > 0
    episodes = load(out / "episodes" / "step-000001.jsonl")
    roots = [e for e in episodes if e.parent_id is None]
    assert len(roots) == 2 and len(episodes) == 8
    for root in roots:
        branches = [e for e in episodes if e.parent_id == root.episode_id]
        assert len(branches) == 3 and {e.group_id for e in branches} == {root.group_id}
        k = root.branch_turn
        assert k == len(root.turns) - 1 and all(b.branch_turn == k for b in branches)
        assert all(t.shared for b in [root, *branches] for t in b.turns[:k])
    resolved = (out / "resolved_config.yaml").read_text()
    assert "branches: 3" in resolved and "branch_at: last" in resolved


@pytest.mark.slow
@pytest.mark.parametrize("advantage", ["tree_grpo", "tree_intra", "tree_inter"])
def test_the_tree_grpo_estimators_train_through_agentrl_train(tiny_model_dir, tmp_path, advantage):
    """Each Tree-GRPO estimator takes a real update: 2 tasks x 2 roots x (1 + 1 branch), so every task
    has two trees (the inter-tree group) and every tree two leaves (the intra-tree group)."""
    out = tmp_path / "run"
    proc = agentrl_train(str(QUICKSTART), f"model.name={tiny_model_dir}", *SHORT, "train.num_threads=1",
                         "train.steps=1", "rollout.tasks_per_step=2", "rollout.group_size=2", "rollout.branches=1",
                         "rollout.max_new_tokens=24", "algo.dynamic_sampling=false", f"algo.advantage={advantage}",
                         f"train.out_dir={out}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    step = {}
    for record in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()):
        if record["step"] == 1:
            step.update(record)
    assert step["rollout/episodes"] == 8
    assert "loss/grad_norm" in step and step["loss/skipped_rows"] < 1  # the optimizer stepped on these rows
    assert f"advantage: {advantage}" in (out / "resolved_config.yaml").read_text()
