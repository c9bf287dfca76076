"""Sampler-learner mismatch metrics and corrections (agentrl.algos.mismatch), by hand.

The batch below has two rows; ``delta = learner - sampler`` on the generated tokens is
row 0: [0.2, -1.0, 0.0], row 1: [0.0, 0.5]; padding holds NaN in the sampler's log-probs.
"""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algos.losses import ppo_clip
from agentrl.algos.mismatch import (
    correction_keep,
    log_ratio,
    mismatch_metrics,
    sequence_keep,
    tis_weight,
    token_keep,
)

NAN = float("nan")
LEARNER = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.1, -3.0, 0.0, 0.0]])
SAMPLER = torch.tensor([[-1.2, -1.0, -0.5, NAN], [-0.1, -3.5, NAN, NAN]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])


def test_log_ratio_is_learner_minus_sampler_and_zero_off_the_mask():
    expected = torch.tensor([[0.2, -1.0, 0.0, 0.0], [0.0, 0.5, 0.0, 0.0]])
    torch.testing.assert_close(log_ratio(LEARNER, SAMPLER, MASK), expected)


def test_metrics_by_hand():
    m = mismatch_metrics(LEARNER, SAMPLER, MASK, cap=2.0)
    assert m["mismatch/abs_mean"] == pytest.approx((0.2 + 1.0 + 0.0 + 0.0 + 0.5) / 5)  # 0.34
    assert m["mismatch/abs_max"] == pytest.approx(1.0)
    assert m["mismatch/over_cap"] == pytest.approx(1 / 5)  # only |-1.0| > log 2 = 0.693
    assert m["mismatch/mean"] == pytest.approx((0.2 - 1.0 + 0.5) / 5)  # -0.06
    k3 = (math.exp(0.2) - 1.2) + (math.exp(-1.0) - 1 + 1.0) + (math.exp(0.5) - 1.5)  # zeros add 0
    assert m["mismatch/kl_k3"] == pytest.approx(k3 / 5)  # 0.1076
    assert m["mismatch/seq_over_cap"] == 0.0  # row means -0.267 and 0.25 are within log 2
    # cap 1.3: log 1.3 = 0.262 < |-0.8 / 3| = 0.267 (row 0 out), > 0.25 (row 1 in)
    assert mismatch_metrics(LEARNER, SAMPLER, MASK, cap=1.3)["mismatch/seq_over_cap"] == 0.5


def test_metrics_on_an_empty_mask_are_zero_and_identical_samplers_read_zero():
    empty = mismatch_metrics(LEARNER, SAMPLER, torch.zeros_like(MASK))
    assert set(empty.values()) == {0.0}
    same = mismatch_metrics(LEARNER, LEARNER, MASK)
    assert same["mismatch/abs_max"] == 0.0 and same["mismatch/kl_k3"] == 0.0


def test_tis_weight_truncates_the_ratio_at_the_cap():
    w = tis_weight(LEARNER, SAMPLER, MASK, cap=1.5)
    expected = torch.tensor(
        [[math.exp(0.2), math.exp(-1.0), 1.0, 1.0], [1.0, 1.5, 1.0, 1.0]]
    )  # e^0.5 = 1.65 -> 1.5
    torch.testing.assert_close(w, expected)
    assert not w.requires_grad


def test_token_and_sequence_masks():
    keep = token_keep(LEARNER, SAMPLER, MASK, cap=2.0)
    assert keep.tolist() == [[True, False, True, False], [True, True, False, False]]
    assert sequence_keep(LEARNER, SAMPLER, MASK, cap=1.3).tolist() == [False, True]
    seq = correction_keep("seq_mask", LEARNER, SAMPLER, MASK, cap=1.3)
    assert seq.tolist() == [[False] * 4, [True, True, False, False]]
    assert correction_keep("tis", LEARNER, SAMPLER, MASK) is None
    assert correction_keep("none", LEARNER, SAMPLER, MASK) is None
    with pytest.raises(ValueError, match="one of"):
        correction_keep("mask", LEARNER, SAMPLER, MASK)
    with pytest.raises(ValueError, match="> 1"):
        token_keep(LEARNER, SAMPLER, MASK, cap=1.0)


def test_ppo_clip_weighs_each_token_by_is_weight_without_a_gradient_through_it():
    # on-policy (ratio 1), advantages +1 and -1, weights 0.5 and 2: per-token losses -0.5 and +2
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = logp.detach().clone()
    adv = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2)
    weight = torch.tensor([[0.5, 2.0]], requires_grad=True)
    loss, metrics = ppo_clip(logp, old, adv, mask, is_weight=weight)
    assert float(loss.detach()) == pytest.approx((-0.5 + 2.0) / 2)
    loss.backward()
    # d/dlogp of -A w r / n at r = 1: [-0.25, 1.0]; nothing flows into the weight
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.25, 1.0]]))
    assert weight.grad is None
    assert metrics["is_weight_mean"] == pytest.approx(1.25) and metrics["is_weight_min"] == pytest.approx(0.5)
    unweighted, _ = ppo_clip(logp, old, adv, mask)
    assert float(unweighted.detach()) == pytest.approx(0.0)
