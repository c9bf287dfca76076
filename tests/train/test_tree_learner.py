"""Tree rollouts in the learner: a tree's rows (which share every token up to the branch point) go
through one micro-batch, so its shared prefix is forwarded once."""

from __future__ import annotations

import torch
from train_helpers import config, episodes, tiny_lm

from agentrl.train.engines import TorchEngine
from agentrl.train.learner import build_policy
from agentrl.train.update import group_order, row_chunks, score_tokens, tree_of_rows
from agentrl.trajectory import build_batch


def _trees(n_trees: int, size: int):
    eps = episodes(n_groups=n_trees, group_size=size, seed=3)
    for i, ep in enumerate(eps):
        ep.group_id = f"task{i // size}/tree0"
    return eps


def test_rows_of_a_tree_stay_in_one_micro_batch():
    eps = _trees(3, 4)
    trees = tree_of_rows(config("rollout.branches=3", "rollout.group_size=1"), eps, build_batch(eps))
    assert trees.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    order = group_order(torch.randperm(12, generator=torch.Generator().manual_seed(0)), trees)
    for size in (2, 4, 8):  # a tree larger than the micro-batch is a micro-batch of its own
        micros = [set(trees[m].tolist()) for m in row_chunks(order, size, trees)]
        seen = [tree for micro in micros for tree in micro]
        assert sorted(seen) == [0, 1, 2]  # each tree in exactly one micro-batch
        assert all(len(micro) == 1 for micro in micros) if size < 8 else len(micros) == 3 // 2 + 1


def test_chains_keep_the_shuffled_order():
    eps = _trees(2, 2)
    assert tree_of_rows(config(), eps, build_batch(eps)) is None


def test_the_behaviour_pass_scores_a_tree_in_one_micro_batch():
    """score_tokens(groups=trees), as the learner's behaviour and reference passes call it: one forward
    per tree whatever micro_batch_size says, and the log-probs of the plain pass."""
    cfg = config("rollout.branches=3", "rollout.group_size=1")
    eps = _trees(3, 4)
    tokens = build_batch(eps)
    engine = TorchEngine(build_policy(tiny_lm(seed=2), cfg), lr=1e-2, max_grad_norm=0.0)
    rows: list[int] = []
    forward = engine.forward
    engine.forward = lambda ids, *a, **k: rows.append(ids.shape[0]) or forward(ids, *a, **k)
    with torch.no_grad():
        plain = score_tokens(engine, tokens, 2)
        assert rows == [2] * 6
        rows.clear()
        grouped = score_tokens(engine, tokens, 2, groups=tree_of_rows(cfg, eps, tokens))
    assert rows == [4, 4, 4]
    torch.testing.assert_close(grouped["logp"], plain["logp"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grouped["entropy"], plain["entropy"], rtol=1e-5, atol=1e-5)
