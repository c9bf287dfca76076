"""Tree rollouts in the learner: a tree's rows (which share every token up to the branch point) go
through one micro-batch, so its shared prefix is forwarded once."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from train_helpers import config, episodes

from agentrl.train.update import group_order, row_chunks, tree_of_rows
from agentrl.trajectory import build_batch


def _trees(n_trees: int, size: int):
    eps = episodes(n_groups=n_trees, group_size=size, seed=3)
    for i, ep in enumerate(eps):
        ep.group_id = f"task{i // size}/tree0"
    return eps


def test_rows_of_a_tree_stay_in_one_micro_batch():
    eps = _trees(3, 4)
    step = SimpleNamespace(config=config("rollout.branches=3", "rollout.group_size=1"), episodes=eps,
                           tokens=build_batch(eps))  # fmt: skip
    trees = tree_of_rows(step)
    assert trees.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    order = group_order(torch.randperm(12, generator=torch.Generator().manual_seed(0)), trees)
    for size in (2, 4, 8):  # a tree larger than the micro-batch is a micro-batch of its own
        micros = [set(trees[m].tolist()) for m in row_chunks(order, size, trees)]
        seen = [tree for micro in micros for tree in micro]
        assert sorted(seen) == [0, 1, 2]  # each tree in exactly one micro-batch
        assert all(len(micro) == 1 for micro in micros) if size < 8 else len(micros) == 3 // 2 + 1


def test_chains_keep_the_shuffled_order():
    eps = _trees(2, 2)
    step = SimpleNamespace(config=config(), episodes=eps, tokens=build_batch(eps))
    assert tree_of_rows(step) is None
