"""IGPO gold-answer scoring: the one-pass (cached) scorer equals scoring every turn prefix alone."""

from __future__ import annotations

import pytest
import torch
from train_helpers import episodes, tiny_lm

from agentrl.train.engines import TorchEngine
from agentrl.train.igscore import GoldAnswerScorer, learner_continuation_scorer, learner_score_mean
from agentrl.train.learner import Policy


class CharTokenizer:
    """Maps each character to one id (enough for the scorer's template and answers)."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1 + ord(c) % 60 for c in text]}


def test_continuation_logprobs_equal_one_row_per_prefix():
    policy = Policy(tiny_lm(seed=5))
    sequence = torch.randint(1, 60, (23,), generator=torch.Generator().manual_seed(0))
    continuation = torch.tensor([7, 3, 9, 11])
    bounds = [1, 5, 12, 23]
    got = policy.continuation_logprobs(sequence, bounds, continuation)  # [4, 4]
    for row, b in enumerate(bounds):
        ids = torch.cat([sequence[:b], continuation])[None]
        mask = torch.zeros_like(ids, dtype=torch.float)
        mask[0, b:] = 1
        with torch.no_grad():
            ref = policy(ids, torch.ones_like(ids), mask).logp[0, b:]
        torch.testing.assert_close(got[row], ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="boundaries"):
        policy.continuation_logprobs(sequence, [0], continuation)


def test_gold_scorer_one_pass_equals_per_turn_rows():
    eps = episodes(n_groups=2, group_size=2, seed=3, max_turns=3)
    for i, ep in enumerate(eps):
        ep.ground_truth = ["ab" if i % 2 else "xyz"]
    engine = TorchEngine(Policy(tiny_lm(seed=6)), lr=1e-3)
    template = "A:{answer}"
    per_row = GoldAnswerScorer(learner_score_mean(engine, 2, 0), CharTokenizer(), template)(eps)
    one_pass = GoldAnswerScorer(None, CharTokenizer(), template, continuation=learner_continuation_scorer(engine))(eps)
    assert per_row.shape == one_pass.shape and (per_row != 0).any()
    torch.testing.assert_close(one_pass, per_row, rtol=1e-5, atol=1e-5)
