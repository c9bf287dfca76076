"""Tree-GRPO's intra-tree and inter-tree advantages (arXiv 2509.21240), by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from agentrl.algos import tree_grpo
from agentrl.registry import ADVANTAGES

# one task, two trees of four leaves: tree A = [1, 0, 0, 0], tree B = [1, 1, 1, 0]
OUTCOME = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
TREE = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
TASK = torch.zeros(8, dtype=torch.long)


def test_intra_inter_and_their_sum_without_std():
    # intra: A's mean 0.25, B's 0.75; inter: the task's mean 0.5
    intra = [0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75]
    inter = [0.5, -0.5, -0.5, -0.5, 0.5, 0.5, 0.5, -0.5]
    both = [1.25, -0.75, -0.75, -0.75, 0.75, 0.75, 0.75, -1.25]
    got = {name: tree_grpo(OUTCOME, TREE, TASK, std_normalize=False, **kw).tolist()
           for name, kw in (("intra", {"inter": 0.0}), ("inter", {"intra": 0.0}), ("both", {}))}  # fmt: skip
    assert got["intra"] == pytest.approx(intra)
    assert got["inter"] == pytest.approx(inter)
    assert got["both"] == pytest.approx(both)


def test_with_the_sample_std():
    # tree A: sample std of [1, 0, 0, 0] = 0.5 -> [1.5, -0.5, -0.5, -0.5]; B mirrors it.
    # task: sample std of the 8 leaves = sqrt(2/7) -> +-0.5 / sqrt(2/7) = +-0.935414
    s = 0.5 / (2 / 7) ** 0.5
    want = [1.5 + s, -0.5 - s, -0.5 - s, -0.5 - s, 0.5 + s, 0.5 + s, 0.5 + s, -1.5 - s]
    assert tree_grpo(OUTCOME, TREE, TASK, eps=0.0).tolist() == pytest.approx(want, abs=1e-5)


def test_a_tree_of_one_leaf_or_a_uniform_task_contributes_zero():
    outcome = torch.tensor([1.0, 1.0, 0.0, 1.0])
    tree = torch.tensor([0, 1, 1, 2])  # tree 0 and tree 2 are single leaves; task 1 (tree 2) alone
    task = torch.tensor([0, 0, 0, 1])
    adv = tree_grpo(outcome, tree, task, std_normalize=False)
    # leaf 0: intra 0, inter 1 - 2/3; leaves 1, 2: intra +-0.5, inter 1/3, -2/3; leaf 3: all zero
    assert adv.tolist() == pytest.approx([1 / 3, 0.5 + 1 / 3, -0.5 - 2 / 3, 0.0])


def test_registered_estimators_read_the_task_group_through_the_contract():
    rows = 8
    batch = {"outcome": OUTCOME, "group_id": TREE, "task_group": TASK, "row_rollout": torch.arange(rows),
             "loss_mask": torch.ones(rows, 3)}  # fmt: skip
    for name, kw in (("tree_grpo", {}), ("tree_intra", {"inter": 0.0}), ("tree_inter", {"intra": 0.0})):
        entry = ADVANTAGES.get(name)
        assert "task_group" in entry.needs
        adv, _ = entry.from_batch(batch)
        assert torch.allclose(adv, tree_grpo(OUTCOME, TREE, TASK, **kw)[:, None].expand(rows, 3))
    with pytest.raises(KeyError, match="task_group"):
        ADVANTAGES.get("tree_grpo").from_batch({k: v for k, v in batch.items() if k != "task_group"})


def test_task_group_field_joins_the_trees_of_one_task():
    from agentrl.train.fields import BATCH_FIELDS

    episodes = [SimpleNamespace(group_id=g, episode_id=f"e{i}") for i, g in enumerate(
        ["t1:0/tree0", "t1:0/tree0", "t1:0/tree1", "t2:1/tree0", "t2:1", ""])]  # fmt: skip
    producer = BATCH_FIELDS.get("task_group")
    assert producer.build(SimpleNamespace(episodes=episodes)).tolist() == [0, 0, 0, 1, 1, 2]
