"""Advantage estimators: hand-computed values (arithmetic in comments) and ALGORITHMS.md properties."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algos import advantages as A

F64 = torch.float64


def t(values, dtype=F64):
    return torch.tensor(values, dtype=dtype)


def close(actual, expected, tol=1e-9):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=0, atol=tol)


# ----------------------------------------------------------------------------- GRPO


def test_grpo_hand_values():
    # group 0: [1, 0, 1], mean 2/3, sample var ((1/3)^2 * 2 + (2/3)^2) / 2 = 1/3, std 0.5773503
    # group 1: [3, 1], mean 2, sample var (1 + 1) / 1 = 2, std sqrt(2)
    outcome = t([1.0, 0.0, 1.0, 3.0, 1.0])
    group = torch.tensor([5, 5, 5, 9, 9])
    s3 = math.sqrt(1 / 3)
    close(
        A.grpo(outcome, group, eps=0.0),
        [(1 / 3) / s3, (-2 / 3) / s3, (1 / 3) / s3, 1 / math.sqrt(2), -1 / math.sqrt(2)],
    )
    # Dr. GRPO: no std division -> R - mean
    close(A.grpo(outcome, group, std_normalize=False), [1 / 3, -2 / 3, 1 / 3, 1.0, -1.0])
    # population std for group 1: sqrt(((1)^2 + (1)^2) / 2) = 1 -> +-1
    close(A.grpo(outcome, group, eps=0.0, unbiased=False)[3:], [1.0, -1.0])


def test_grpo_singleton_and_constant_groups_get_zero():
    # a group of one and a group whose rewards are all equal carry no signal -> exactly 0, no NaN
    adv = A.grpo(t([0.7, 1.0, 1.0]), torch.tensor([0, 1, 1]))
    close(adv, [0.0, 0.0, 0.0])


# ----------------------------------------------------------------------------- GAE


def gae_reference(rewards, values, mask, gamma, lam):
    """Plain per-row loop, the textbook recursion over generated tokens only."""
    adv = torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        valid = [i for i in range(rewards.shape[1]) if mask[b, i]]
        # rewards on masked positions go to the last valid token before them
        credit = {i: 0.0 for i in valid}
        last = None
        for i in range(rewards.shape[1]):
            if mask[b, i]:
                last = i
            if last is not None:
                credit[last] += float(rewards[b, i])
        running = 0.0
        for j in reversed(range(len(valid))):
            i = valid[j]
            next_v = float(values[b, valid[j + 1]]) if j + 1 < len(valid) else 0.0
            delta = credit[i] + gamma * next_v - float(values[b, i])
            running = delta + gamma * lam * running
            adv[b, i] = running
    return adv


def test_gae_hand_values_skip_observation():
    # tokens t0 t1 [obs t2] t3; obs reward 0.3 is credited to t1, obs value 9 is never used.
    # packed r = [0, 0.3, 1.0], v = [0.5, 1.0, 2.0], gamma 0.9, lam 0.8 (gamma*lam = 0.72)
    # delta3 = 1.0 + 0.9*0 - 2.0 = -1.0;  delta1 = 0.3 + 0.9*2.0 - 1.0 = 1.1;  delta0 = 0.9*1.0 - 0.5 = 0.4
    # A3 = -1.0;  A1 = 1.1 + 0.72*(-1.0) = 0.38;  A0 = 0.4 + 0.72*0.38 = 0.6736
    rewards = t([[0.0, 0.0, 0.3, 1.0]])
    values = t([[0.5, 1.0, 9.0, 2.0]])
    mask = torch.tensor([[1, 1, 0, 1]])
    adv, ret = A.gae(rewards, values, mask, gamma=0.9, lam=0.8)
    close(adv, [[0.6736, 0.38, 0.0, -1.0]])
    close(ret, [[0.6736 + 0.5, 0.38 + 1.0, 0.0, -1.0 + 2.0]])  # returns = A + V, 0 on obs


def test_gae_matches_reference_loop_long_rows():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(3, 300, generator=gen, dtype=F64)
    values = torch.randn(3, 300, generator=gen, dtype=F64)
    mask = torch.rand(3, 300, generator=gen) < 0.7
    mask[2] = False  # a row with no generated token
    for gamma, lam in [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.0, 0.5)]:
        adv, ret = A.gae(rewards, values, mask, gamma=gamma, lam=lam)
        close(adv, gae_reference(rewards, values, mask, gamma, lam), tol=1e-10)
        close(ret, torch.where(mask, adv + values, torch.zeros_like(adv)), tol=1e-12)


def test_gae_gradcheck_through_blocked_scan():
    # the blocked reverse scan is differentiable (one matmul per block plus a carry)
    gen = torch.Generator().manual_seed(9)
    # 150 tokens = 2 blocks of 128, so the carry across blocks is exercised
    rewards = torch.randn(1, 150, generator=gen, dtype=F64)
    values = torch.randn(1, 150, generator=gen, dtype=F64).requires_grad_(True)
    mask = torch.rand(1, 150, generator=gen) < 0.95  # > 128 valid tokens
    fn = lambda v: A.gae(rewards, v, mask, gamma=0.97, lam=0.9)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (values,), fast_mode=True)


# ----------------------------------------------------------------------------- IGPO


def test_info_gain_hand_values():
    # s = [-2.0, -1.5, -1.0, -1.2] before any turn and after turns 0, 1, 2
    s = t([[-2.0, -1.5, -1.0, -1.2], [-0.5, -0.25, float("nan"), float("nan")]])
    turn_mask = torch.tensor([[True, True, True], [True, False, False]])
    # log diff: [-1.5 - -2.0, -1.0 - -1.5, -1.2 - -1.0] = [0.5, 0.5, -0.2]; row 1: [0.25, 0, 0]
    close(A.info_gain(s, turn_mask), [[0.5, 0.5, -0.2], [0.25, 0.0, 0.0]], tol=1e-12)
    # prob diff: exp(s[k+1]) - exp(s[k])
    e = math.exp
    close(
        A.info_gain(s, turn_mask, kind="prob_diff"),
        [[e(-1.5) - e(-2.0), e(-1.0) - e(-1.5), e(-1.2) - e(-1.0)], [e(-0.25) - e(-0.5), 0.0, 0.0]],
        tol=1e-12,
    )
    with pytest.raises(ValueError, match="kind"):
        A.info_gain(s, turn_mask, kind="ratio")


def test_igpo_separate_hand_values():
    # one group, rollout a: 3 turns, IG [0.2, 0.4, (unused)], F1 1.0; rollout b: 2 turns, IG [0.0, (unused)], F1 0.
    # IG pool {0.2, 0.4, 0.0}: mean 0.2, pop var (0 + 0.04 + 0.04)/3 = 0.08/3, sigma 0.1632993
    #   z = [0, 1.2247449, -1.2247449];  outcome pool {1, 0}: mean 0.5, sigma 0.5 -> z = [1, -1]
    # rewards a = [0, 1.2247, 1], b = [-1.2247, -1]; gamma 0.5:
    #   a: A2 = 1, A1 = 1.2247 + 0.5*1 = 1.7247, A0 = 0 + 0.5*1.7247 = 0.86237
    #   b: A1 = -1, A0 = -1.2247 + 0.5*(-1) = -1.7247
    z = 0.2 / math.sqrt(0.08 / 3)
    ig = t([[0.2, 0.4, 99.0], [0.0, float("nan"), 0.0]])
    turn_mask = torch.tensor([[True, True, True], [True, True, False]])
    adv = A.igpo(t([1.0, 0.0]), ig, turn_mask, torch.tensor([0, 0]), gamma=0.5, eps=0.0, var_eps=0.0)
    close(adv, [[0.5 * (z + 0.5), z + 0.5, 1.0], [-z - 0.5, -1.0, 0.0]], tol=1e-12)


def test_igpo_joint_hand_values():
    # joint pool {0.2, 0.4, 1.0 (F1 a), 0.0, 0.0 (F1 b)}: mean 0.32
    # deviations -0.12, 0.08, 0.68, -0.32, -0.32; squares sum 0.688; pop var 0.1376
    sigma = math.sqrt(0.1376)
    za = [(-0.12) / sigma, 0.08 / sigma, 0.68 / sigma]
    zb = [-0.32 / sigma, -0.32 / sigma]
    ig = t([[0.2, 0.4, 0.0], [0.0, 0.0, 0.0]])
    turn_mask = torch.tensor([[True, True, True], [True, True, False]])
    adv = A.igpo(t([1.0, 0.0]), ig, turn_mask, torch.tensor([3, 3]), pool="joint", eps=0.0, var_eps=0.0)
    # gamma 1: reward-to-go = suffix sums
    close(adv, [[sum(za), za[1] + za[2], za[2]], [sum(zb), zb[1], 0.0]], tol=1e-12)


def test_igpo_zero_ig_equals_grpo_population_std_broadcast():
    gen = torch.Generator().manual_seed(1)
    n, k = 12, 5
    outcome = torch.rand(n, generator=gen, dtype=F64)
    group = torch.arange(n) // 4
    turn_mask = torch.arange(k)[None, :] < torch.randint(1, k + 1, (n,), generator=gen)[:, None]
    adv = A.igpo(outcome, torch.zeros(n, k, dtype=F64), turn_mask, group, gamma=1.0, var_eps=0.0)
    expected = A.grpo(outcome, group, unbiased=False, eps=1e-6)[:, None].expand(n, k)
    close(adv, torch.where(turn_mask, expected, torch.zeros_like(expected)), tol=1e-12)
    # IGPO's default var_eps=1e-8 inside the sqrt changes sigma by a factor ~ 1 + var_eps / (2 var):
    # relative error ~1e-6 for these groups (var >= 0.005)
    adv_default = A.igpo(outcome, torch.zeros(n, k, dtype=F64), turn_mask, group)
    expected = torch.where(turn_mask, expected, torch.zeros_like(expected))
    torch.testing.assert_close(adv_default, expected, rtol=1e-5, atol=1e-12)


def test_igpo_telescoping_identity_raw_log_gains():
    # pool="none", log gains, gamma 1: A[i,k] = s[i, T-1] - s[i, k] + r_O (columns: s[0] before any turn)
    gen = torch.Generator().manual_seed(2)
    n, k = 6, 4
    s = torch.randn(n, k + 1, generator=gen, dtype=F64)
    lengths = torch.tensor([1, 2, 3, 4, 4, 2])
    turn_mask = torch.arange(k)[None, :] < lengths[:, None]
    outcome = torch.randn(n, generator=gen, dtype=F64)
    gains = A.info_gain(s, turn_mask)
    adv = A.igpo(outcome, gains, turn_mask, torch.zeros(n, dtype=torch.long), pool="none")
    for i in range(n):
        last = int(lengths[i]) - 1
        for j in range(k):
            expected = float(s[i, last] - s[i, j] + outcome[i]) if j <= last else 0.0
            assert abs(float(adv[i, j]) - expected) < 1e-12


def test_igpo_pools_have_zero_mean_per_group_and_nan_last_turn_is_ignored():
    gen = torch.Generator().manual_seed(3)
    n, k = 10, 4
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    lengths = torch.randint(1, k + 1, (n,), generator=gen)
    turn_mask = torch.arange(k)[None, :] < lengths[:, None]
    ig = torch.randn(n, k, generator=gen, dtype=F64)
    ig[torch.arange(n), lengths - 1] = float("nan")  # the last turn's IG is never used
    outcome = torch.randn(n, generator=gen, dtype=F64)
    rewards = A.igpo(outcome, ig, turn_mask, group, gamma=0.0)  # gamma 0: A = per-turn z-score
    assert torch.isfinite(rewards).all()
    is_last = turn_mask & (torch.arange(k)[None, :] == (lengths - 1)[:, None])
    is_ig = turn_mask & ~is_last
    for g in range(3):
        rows = group == g
        z_ig = rewards[rows][is_ig[rows]]
        z_out = rewards[rows][is_last[rows]]
        if z_ig.numel():
            assert abs(float(z_ig.mean())) < 1e-12
        assert abs(float(z_out.mean())) < 1e-12


def test_igpo_advantage_constant_within_turn_after_to_tokens():
    turn_adv = t([[0.5, -1.0], [2.0, 0.0]])
    turn_id = torch.tensor([[-1, 0, 0, -1, 1, 1], [0, 0, -1, -1, -1, -1]])
    close(A.to_tokens(turn_adv, turn_id), [[0.0, 0.5, 0.5, 0.0, -1.0, -1.0], [2.0, 2.0, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match="turn"):
        A.to_tokens(turn_adv, torch.tensor([[0, 2]]))


# ----------------------------------------------------------------------------- EMPG


def test_empg_hand_values():
    # entropies row 0: [1.0, 3.0], row 1: [2.0] -> Ht = [0, 1], [0.5] (min 1, max 3, eps 0)
    # exp(-Ht) = [1, e^-1], [e^-0.5]; mean m = (1 + 0.3678794 + 0.6065307) / 3 = 0.6581367
    # g = exp(-Ht)/m; f = exp(-Ht). base = [1, -1], zeta 0.1:
    #   A[0,0] = g00 * 1 + 0.1 * f01;  A[0,1] = g01 * 1 (last step);  A[1,0] = g10 * -1 (last step)
    e1, e5 = math.exp(-1), math.exp(-0.5)
    m = (1 + e1 + e5) / 3
    entropy = t([[1.0, 3.0], [2.0, 0.0]])
    turn_mask = torch.tensor([[True, True], [True, False]])
    adv = A.empg(t([1.0, -1.0]), entropy, turn_mask, zeta=0.1, center=False, eps=0.0)
    expected = [[1 / m + 0.1 * e1, e1 / m], [-e5 / m, 0.0]]
    close(adv, expected, tol=1e-12)
    centred = A.empg(t([1.0, -1.0]), entropy, turn_mask, zeta=0.1, center=True, eps=0.0)
    mean = (expected[0][0] + expected[0][1] + expected[1][0]) / 3
    close(centred, [[expected[0][0] - mean, expected[0][1] - mean], [expected[1][0] - mean, 0.0]], tol=1e-12)


def _empg_batch(seed):
    gen = torch.Generator().manual_seed(seed)
    n, k = 8, 5
    lengths = torch.randint(1, k + 1, (n,), generator=gen)
    turn_mask = torch.arange(k)[None, :] < lengths[:, None]
    entropy = torch.rand(n, k, generator=gen, dtype=F64) * 3
    base = torch.randn(n, generator=gen, dtype=F64)
    return base, entropy, turn_mask


def test_empg_scaling_mean_one_and_monotone():
    base, entropy, turn_mask = _empg_batch(4)
    g = A.empg(torch.ones_like(base), entropy, turn_mask, k=1.5, zeta=0.0, center=False)
    assert abs(float(g[turn_mask].mean()) - 1.0) < 1e-12
    order = torch.argsort(entropy[turn_mask])
    assert (g[turn_mask][order].diff() <= 1e-15).all()  # g falls as step entropy rises
    adv = A.empg(base, entropy, turn_mask, zeta=0.0, center=False)
    nonzero = turn_mask & (base[:, None] != 0)
    assert torch.equal(torch.sign(adv[nonzero]), torch.sign(base[:, None].expand_as(adv)[nonzero]))


def test_empg_centred_output_has_zero_mean():
    base, entropy, turn_mask = _empg_batch(5)
    adv = A.empg(base, entropy, turn_mask)
    assert abs(float(adv[turn_mask].mean())) < 1e-12
    assert (adv[~turn_mask] == 0).all()


def test_empg_reduces_to_base_with_k0_zeta0_no_centring():
    base, entropy, turn_mask = _empg_batch(6)
    adv = A.empg(base, entropy, turn_mask, k=0.0, zeta=0.0, center=False)
    expected = torch.where(turn_mask, base[:, None].expand_as(adv), torch.zeros_like(adv))
    close(adv, expected, tol=1e-12)


def test_empg_equal_entropies_add_zeta_on_non_final_steps():
    base, _, turn_mask = _empg_batch(7)
    entropy = torch.full(turn_mask.shape, 1.3, dtype=F64)
    adv = A.empg(base, entropy, turn_mask, zeta=0.25, center=False)
    lengths = turn_mask.sum(1)
    for i in range(turn_mask.shape[0]):
        for j in range(int(lengths[i])):
            bonus = 0.25 if j < int(lengths[i]) - 1 else 0.0
            assert abs(float(adv[i, j]) - (float(base[i]) + bonus)) < 1e-12


def test_turn_mean_and_empg_grpo():
    # row 0: turn 0 tokens entropies [1, 3] -> 2; turn 1 [4] -> 4; row 1: turn 0 [0.5]
    entropy = t([[1.0, 3.0, 9.0, 4.0], [0.5, 7.0, 7.0, 7.0]])
    turn_id = torch.tensor([[0, 0, -1, 1], [0, -1, -1, -1]])
    mask = turn_id >= 0
    means, turn_mask = A.turn_mean(entropy, turn_id, mask)
    close(means, [[2.0, 4.0], [0.5, 0.0]])
    assert turn_mask.tolist() == [[True, True], [True, False]]
    outcome, group = t([1.0, 0.0]), torch.tensor([0, 0])
    one_call = A.empg_grpo(outcome, group, entropy, turn_id, mask, zeta=0.1)
    close(one_call, A.empg(A.grpo(outcome, group), means, turn_mask, zeta=0.1), tol=1e-12)


# ----------------------------------------------------------------------------- GiGPO


def test_gigpo_hand_values():
    # one prompt group, 2 rollouts x 2 steps; step 0 shares anchor 7, step 1 anchors 8 / 9 (singletons)
    # step rewards a = [0, 1], b = [0, 0]; gamma 0.5 -> returns a = [0.5, 1], b = [0, 0]
    # A^E: outcomes [1, 0], mean 0.5, sample std sqrt(0.5) -> +-0.7071068
    # anchor 7: returns {0.5, 0}, mean 0.25, sample std sqrt(2 * 0.25^2 / 1) = 0.3535534 -> +-0.7071068
    r = 1 / math.sqrt(2)
    step_reward = t([[0.0, 1.0], [0.0, 0.0]])
    anchor = torch.tensor([[7, 8], [7, 9]])
    turn_mask = torch.ones(2, 2, dtype=torch.bool)
    args = (t([1.0, 0.0]), torch.tensor([0, 0]), step_reward, anchor, turn_mask)
    adv = A.gigpo(*args, gamma=0.5, eps=0.0)
    close(adv, [[r + r, r], [-r - r, -r]], tol=1e-12)
    # verl-agent convention for singleton step groups: A^S = R_t (raw)
    raw = A.gigpo(*args, gamma=0.5, eps=0.0, singleton="raw")
    close(raw, [[r + r, r + 1.0], [-r - r, -r + 0.0]], tol=1e-12)


def test_gigpo_anchor_groups_do_not_cross_prompt_groups():
    # same anchor id 7 in two prompt groups: each step group is a singleton -> A^S = 0, A = A^E
    step_reward = t([[1.0], [0.0], [5.0], [2.0]])
    anchor = torch.tensor([[7], [8], [7], [8]])
    args = (
        t([1.0, 0.0, 1.0, 0.0]),
        torch.tensor([0, 0, 1, 1]),
        step_reward,
        anchor,
        torch.ones(4, 1, dtype=bool),
    )
    adv = A.gigpo(*args, eps=0.0)
    close(adv[:, 0], A.grpo(args[0], args[1], eps=0.0), tol=1e-12)


# ----------------------------------------------------------------------------- FoldGRPO, SUPO


def test_foldgrpo_hand_values():
    # group outcomes [1, 0, 1, 0]: mean 0.5, sample std sqrt(1/3) = 0.5773503
    # rollout 0 (success) has 2 rows (main + branch); rollout 1 (failure) 1 row; rollouts 2, 3 one row each
    # success token Q=-1: clip(0) -> (0 - 0.5)/0.57735 = -0.8660, same as a failed rollout's token
    # success token Q=-0.2: clip(0.8) -> 0.3/0.57735 = 0.5196; failure token Q=-0.2: clip(-0.2) = 0 -> -0.8660
    sd = math.sqrt(1 / 3)
    outcome = t([1.0, 0.0, 1.0, 0.0])
    row_rollout = torch.tensor([0, 0, 1, 2, 3])
    q = t([[0.0, -1.0], [-0.2, 0.0], [-0.2, -1.0], [0.0, 0.0], [0.0, 0.0]])
    adv = A.foldgrpo(outcome, row_rollout, q, torch.zeros(4, dtype=torch.long), eps=0.0)
    hi, lo = 0.5 / sd, -0.5 / sd
    close(adv, [[hi, lo], [0.3 / sd, hi], [lo, lo], [hi, hi], [lo, lo]], tol=1e-12)


def test_foldgrpo_q0_equals_grpo_per_rollout_and_failures_ignore_negative_q():
    gen = torch.Generator().manual_seed(8)
    outcome = (torch.rand(8, generator=gen) < 0.5).to(F64)
    outcome[:2] = t([1.0, 0.0])  # both kinds present
    groups = torch.arange(8) // 4
    row_rollout = torch.tensor([0, 0, 1, 2, 3, 3, 3, 4, 5, 6, 7])
    zeros = torch.zeros(11, 6, dtype=F64)
    adv = A.foldgrpo(outcome, row_rollout, zeros, groups)
    grpo_rows = A.grpo(outcome, groups)[row_rollout][:, None].expand(11, 6)
    close(adv, grpo_rows, tol=1e-12)
    negative_q = -torch.rand(11, 6, generator=gen, dtype=F64)
    adv_q = A.foldgrpo(outcome, row_rollout, negative_q, groups)
    failed_rows = outcome[row_rollout] == 0
    close(adv_q[failed_rows], grpo_rows[failed_rows], tol=1e-12)


def test_supo_equals_grpo_without_summaries_and_zeroes_unfinished():
    outcome = t([1.0, 0.0, 0.5, 1.0])
    group = torch.tensor([0, 0, 0, 0])
    done = torch.tensor([True, True, True, True])
    close(A.supo(outcome, group, done), A.grpo(outcome, group), tol=1e-12)
    done = torch.tensor([True, True, False, True])
    adv = A.supo(outcome, group, done)
    close(adv[2], 0.0)
    close(adv[[0, 1, 3]], A.grpo(outcome, group)[[0, 1, 3]], tol=1e-12)
    # baseline over finished rollouts only: {1, 0, 1}: mean 2/3, sample std sqrt(1/3)
    adv_fin = A.supo(outcome, group, done, baseline_includes_unfinished=False, eps=0.0)
    s3 = math.sqrt(1 / 3)
    close(adv_fin, [(1 / 3) / s3, (-2 / 3) / s3, 0.0, (1 / 3) / s3], tol=1e-12)
