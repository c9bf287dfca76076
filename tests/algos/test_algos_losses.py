"""Losses: hand-computed values, ST-PPO / GSPO / FoldAct / SUPO properties, masking and gradchecks."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algos import losses as Lo

F64 = torch.float64


# FoldAct's own kind numbers (think 0, search 1, answer 2, observation 3, summaries 4, 5) as the
# agentrl.trajectory.Source codes the library uses (MODEL 1, TOOL 2, SUMMARY 3)
_FOLDACT_TO_SOURCE = torch.tensor([1, 1, 1, 2, 3, 3])


def src(kinds):
    return _FOLDACT_TO_SOURCE[kinds]


def t(values, dtype=F64, grad=False):
    return torch.tensor(values, dtype=dtype, requires_grad=grad)


def close(actual, expected, tol=1e-12):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=0, atol=tol)


def grad_of(loss_fn, logp):
    logp = logp.detach().clone().requires_grad_(True)
    loss, _ = loss_fn(logp)
    (g,) = torch.autograd.grad(loss, logp)
    return g


# ----------------------------------------------------------------------------- aggregation


def test_agg_modes_hand_values():
    # rows: [1, 2, 3, pad], [4, pad, pad, pad]
    values = t([[1.0, 2.0, 3.0, 100.0], [4.0, float("nan"), 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    close(Lo.agg_loss(values, mask, "token-mean"), 10 / 4)  # (1+2+3+4) / 4 tokens
    close(Lo.agg_loss(values, mask, "seq-mean-token-mean"), (2.0 + 4.0) / 2)  # row means 2, 4
    close(Lo.agg_loss(values, mask, "seq-mean-token-sum"), (6.0 + 4.0) / 2)  # row sums 6, 4
    close(Lo.agg_loss(values, mask, "constant"), 10 / (2 * 4))  # sum / (rows * L)
    close(Lo.agg_loss(values, mask, "constant", norm_constant=10), 10 / (2 * 10))
    # both rows are segments of one rollout: one sequence
    one = torch.tensor([0, 0])
    close(Lo.agg_loss(values, mask, "seq-mean-token-mean", seq_id=one), 10 / 4)
    close(Lo.agg_loss(values, mask, "seq-mean-token-sum", seq_id=one), 10.0)
    # an empty row is left out of seq-means
    empty = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0]])
    close(Lo.agg_loss(values, empty, "seq-mean-token-mean"), 2.0)
    with pytest.raises(ValueError, match="agg"):
        Lo.agg_loss(values, mask, "sum")


# ----------------------------------------------------------------------------- PPO clip


def test_ppo_clip_hand_values_and_metrics():
    # token ratios r = [1.5, 0.5, 1.1, (masked)], A = [1, 1, -1, 5], eps 0.2
    # t0: -min(1.5*1, 1.2*1) = -1.2 (clipped); t1: -min(0.5, 0.8) = -0.5; t2: -min(-1.1, -1.1) = 1.1
    # token-mean = (-1.2 - 0.5 + 1.1) / 3 = -0.2; clipfrac 1/3
    old = t([[0.0, 0.0, 0.0, 0.0]])
    logp = t([[math.log(1.5), math.log(0.5), math.log(1.1), 3.0]])
    adv = t([[1.0, 1.0, -1.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, metrics = Lo.ppo_clip(logp, old, adv, mask)
    close(loss, -0.2)
    assert metrics["clipfrac"] == pytest.approx(1 / 3)
    assert metrics["ratio_max"] == pytest.approx(1.5)
    assert metrics["ratio_min"] == pytest.approx(0.5)
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1) / 3)
    # approx_kl = mean(r - 1 - log r)
    kl = sum(r - 1 - math.log(r) for r in (1.5, 0.5, 1.1)) / 3
    assert metrics["approx_kl"] == pytest.approx(kl)
    # clip-higher (DAPO): eps_high 0.6 lets t0 through: (-1.5 - 0.5 + 1.1) / 3 = -0.3
    close(Lo.ppo_clip(logp, old, adv, mask, clip_high=0.6)[0], -0.3)


def test_ppo_dual_clip_caps_negative_advantage_loss():
    # r = 5, A = -1: -min(-5, -1.2) = 5, capped at -A*c = 3 (c = 3); r = 2, A = -1: loss 2 < 3 stays
    logp = t([[math.log(5.0), math.log(2.0)]])
    adv = t([[-1.0, -1.0]])
    loss, metrics = Lo.ppo_clip(logp, torch.zeros(1, 2, dtype=F64), adv, torch.ones(1, 2), dual_clip=3.0)
    close(loss, (3.0 + 2.0) / 2)
    assert metrics["clipfrac_dual"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="dual_clip"):
        Lo.ppo_clip(logp, logp, adv, torch.ones(1, 2), dual_clip=0.5)


def test_sequence_ratio_is_geometric_mean_gspo():
    # log ratios [0.1, 0.3] -> s = exp(0.2) for both tokens; A = 1, clip range large -> loss -exp(0.2)
    logp = t([[0.1, 0.3, 7.0]])
    mask = torch.tensor([[1, 1, 0]])
    zeros, ones = torch.zeros(1, 3, dtype=F64), torch.ones(1, 3, dtype=F64)
    loss, m = Lo.ppo_clip(logp, zeros, ones, mask, ratio="sequence", clip_high=0.5)
    close(loss, -math.exp(0.2))
    # GSPO's tiny clip range binds: -min(1.2214, 1 + 4e-4) = -1.0004
    close(Lo.ppo_clip(logp, zeros, ones, mask, ratio="sequence", clip_low=3e-4, clip_high=4e-4)[0], -1.0004)
    assert m["ratio_min"] == pytest.approx(math.exp(0.2)) and m["ratio_max"] == pytest.approx(math.exp(0.2))


# ----------------------------------------------------------------------------- turn ratio (ST-PPO)


def test_turn_ratio_hand_values():
    # turn 0: log ratios [0.2, 0.4] -> w = exp(0.3); turn 1: [-0.1] -> exp(-0.1); obs token -> 1
    logp = t([[0.2, 0.4, 5.0, -0.1]])
    mask = torch.tensor([[1, 1, 0, 1]])
    turn_id = torch.tensor([[0, 0, -1, 1]])
    expected = [[math.exp(0.3), math.exp(0.3), 1.0, math.exp(-0.1)]]
    close(Lo.turn_ratio(logp, torch.zeros_like(logp), mask, turn_id), expected)
    # turn_id=None: turns are the runs of the mask -> the same here
    close(Lo.turn_ratio(logp, torch.zeros_like(logp), mask, None), expected)


def test_turn_ratio_equals_token_ratio_with_one_token_turns():
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 6, generator=gen, dtype=F64) * 0.3
    old = torch.randn(3, 6, generator=gen, dtype=F64) * 0.3
    adv = torch.randn(3, 6, generator=gen, dtype=F64)
    mask = torch.rand(3, 6, generator=gen) < 0.8
    turn_id = torch.where(mask, torch.arange(6).expand(3, 6), -1)  # every token its own turn
    close(
        Lo.turn_ratio(logp, old, mask, turn_id), torch.where(mask, (logp - old).exp(), torch.ones_like(logp))
    )
    token_loss = lambda lp: Lo.ppo_clip(lp, old, adv, mask)  # noqa: E731
    turn_loss = lambda lp: Lo.ppo_clip(lp, old, adv, mask, ratio="turn", turn_id=turn_id)  # noqa: E731
    close(token_loss(logp)[0], turn_loss(logp)[0])
    close(grad_of(token_loss, logp), grad_of(turn_loss, logp))


def test_turn_ratio_length_invariant_under_constant_drift():
    # turns of 1, 3 and 7 tokens, every token log-ratio = c -> w = exp(c) for each turn
    c = 0.37
    lengths = [1, 3, 7]
    turn_id = torch.tensor([[k for k, n in enumerate(lengths) for _ in range(n)]])
    old = torch.randn(1, 11, generator=torch.Generator().manual_seed(1), dtype=F64)
    w = Lo.turn_ratio(old + c, old, torch.ones(1, 11), turn_id)
    close(w, torch.full((1, 11), math.exp(c), dtype=F64))


# ----------------------------------------------------------------------------- at logp == old_logp


@pytest.mark.parametrize("ratio", ["token", "turn", "sequence"])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_all_variants_give_plain_pg_at_old_policy(ratio, dual_clip):
    # at r = 1 nothing is clipped; with an advantage constant within each turn (and row, for the
    # sequence ratio) every variant's gradient is -A / N_tokens (token-mean)
    gen = torch.Generator().manual_seed(2)
    old = torch.randn(2, 8, generator=gen, dtype=F64)
    mask = torch.tensor([[1, 1, 0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 1, 1, 0]])
    turn_id = torch.tensor([[0, 0, -1, 1, 1, 1, -1, -1], [0, 0, 0, 0, -1, 1, 1, -1]])
    adv_row = torch.tensor([[0.7], [-1.3]], dtype=F64)
    adv_turn = torch.tensor([[0.7, 0.7, 0.0, -0.2, -0.2, -0.2, 0, 0], [1.1, 1.1, 1.1, 1.1, 0, -2.0, -2.0, 0]])
    adv = adv_row.expand(2, 8).clone() if ratio == "sequence" else adv_turn.to(F64)
    kwargs = {"ratio": ratio, "turn_id": turn_id, "dual_clip": dual_clip}
    loss, metrics = Lo.ppo_clip(old.clone().requires_grad_(True), old, adv, mask, **kwargs)
    assert metrics["clipfrac"] == 0.0 and metrics["ratio_min"] == metrics["ratio_max"] == 1.0
    g = grad_of(lambda lp: Lo.ppo_clip(lp, old, adv, mask, **kwargs), old)
    n = mask.sum()
    close(g, torch.where(mask.bool(), -adv / n, torch.zeros_like(adv)))
    # and the clipping-bias term is zero: surrogate gradient 0, scale 1
    s_c, cb = Lo.clip_bias_norm(old.clone().requires_grad_(True), old, adv, mask, **kwargs)
    assert cb["clip_bias_frac"] == 0.0
    close(grad_of(lambda lp: Lo.clip_bias_norm(lp, old, adv, mask, **kwargs), old), torch.zeros_like(old))


def test_turn_ppo_gradient_spreads_turn_mean_advantage():
    # one turn of 3 tokens, A = [3, 0, -6], at r = 1: grad_j = -(sum A / |turn|) / N = -(-3/3)/3 = 1/3
    old = torch.zeros(1, 3, dtype=F64)
    adv = t([[3.0, 0.0, -6.0]])
    mask = torch.ones(1, 3)
    g = grad_of(lambda lp: Lo.ppo_clip(lp, old, adv, mask, ratio="turn"), old)
    close(g, [[1 / 3, 1 / 3, 1 / 3]])


# ----------------------------------------------------------------------------- SUPO segments


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "seq-mean-token-sum"])
def test_segments_with_seq_id_equal_the_concatenated_rollout(agg):
    # a rollout split into 2 segment rows (SUPO) with seq_id = rollout gives the same loss and
    # gradient as its concatenated row; a second rollout is one row
    gen = torch.Generator().manual_seed(3)
    logp = torch.randn(1, 10, generator=gen, dtype=F64) * 0.2
    old = torch.randn(1, 10, generator=gen, dtype=F64) * 0.2
    adv = torch.full((1, 10), 0.8, dtype=F64)
    other = torch.randn(1, 10, generator=gen, dtype=F64) * 0.2

    def split(x, fill):
        seg = torch.full((2, 10), fill, dtype=x.dtype)
        seg[0, :6], seg[1, :4] = x[0, :6], x[0, 6:]
        return seg

    seg_mask = split(torch.ones(1, 10), 0.0)
    logp_rows = torch.cat([split(logp, 0.0), other]).requires_grad_(True)
    loss_seg, _ = Lo.ppo_clip(
        logp_rows,
        torch.cat([split(old, 0.0), other]),
        torch.cat([split(adv, 0.0), adv]),
        torch.cat([seg_mask, torch.ones(1, 10)]),
        agg=agg,
        seq_id=torch.tensor([0, 0, 1]),
    )
    logp_cat = torch.cat([logp, other]).requires_grad_(True)
    loss_cat, _ = Lo.ppo_clip(
        logp_cat, torch.cat([old, other]), torch.cat([adv, adv]), torch.ones(2, 10), agg=agg
    )
    close(loss_seg, loss_cat)
    (g_seg,) = torch.autograd.grad(loss_seg, logp_rows)
    (g_cat,) = torch.autograd.grad(loss_cat, logp_cat)
    close(torch.cat([g_seg[0, :6], g_seg[1, :4]]), g_cat[0])
    close(g_seg[2], g_cat[1])


# ----------------------------------------------------------------------------- clipping bias (S-PPO)


def test_clip_bias_surrogate_gradient_is_the_discarded_part():
    # for token ratios: grad S_c = grad L_clip - grad L_unclipped (L_unclipped = agg(-r A))
    gen = torch.Generator().manual_seed(4)
    old = torch.randn(3, 7, generator=gen, dtype=F64)
    logp = old + torch.randn(3, 7, generator=gen, dtype=F64) * 0.5  # many tokens out of the trust region
    adv = torch.randn(3, 7, generator=gen, dtype=F64)
    mask = torch.rand(3, 7, generator=gen) < 0.8
    s_c, metrics = Lo.clip_bias_norm(logp.clone().requires_grad_(True), old, adv, mask)
    assert 0.1 < metrics["clip_bias_frac"] < 0.9
    g_c = grad_of(lambda lp: Lo.clip_bias_norm(lp, old, adv, mask), logp)
    g_clip = grad_of(lambda lp: Lo.ppo_clip(lp, old, adv, mask), logp)
    g_plain = grad_of(lambda lp: Lo.ppo_clip(lp, old, adv, mask, clip_low=1e9, clip_high=1e9), logp)
    close(g_c, g_clip - g_plain)


def test_clip_bias_norm_never_increases_gradient_norm():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 6).double()
    params = list(model.parameters())
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 5, 4, generator=gen, dtype=F64)
    tokens = torch.randint(0, 6, (2, 5), generator=gen)
    mask = torch.tensor([[1, 1, 1, 0, 1], [1, 1, 1, 1, 1]])
    with torch.no_grad():
        old = torch.log_softmax(model(x), -1).gather(-1, tokens[..., None])[..., 0] - 0.8  # ratios ~ e^0.8
    for adv_scale, expect_shrink in [(50.0, True), (0.01, False)]:
        # A > 0 tokens (r > 1.2) are clipped, A < 0 tokens are not, so both gradients are nonzero
        adv = adv_scale * torch.tensor([[1.0, -1.0, 1.0, 1.0, -1.0], [1.0, 1.0, -1.0, -1.0, 1.0]], dtype=F64)
        logp = torch.log_softmax(model(x), -1).gather(-1, tokens[..., None])[..., 0]
        loss, _ = Lo.ppo_clip(logp, old, adv, mask, ratio="turn")
        s_c, _ = Lo.clip_bias_norm(logp, old, adv, mask, ratio="turn")
        scale, c_norm = Lo.clip_bias_scale(s_c, params)
        model.zero_grad()
        loss.backward()
        g_ppo = torch.cat([p.grad.flatten() for p in params]).norm()
        Lo.scale_grads_(params, scale)
        g_s = torch.cat([p.grad.flatten() for p in params]).norm()
        assert c_norm > 0
        assert scale == pytest.approx(1.0 / max(1.0, c_norm))
        assert g_s <= g_ppo + 1e-15
        assert (g_s < g_ppo) == expect_shrink


# ----------------------------------------------------------------------------- value loss


def test_value_loss_hand_values():
    # t0: (1-2)^2 = 1; clipped V = 0.5 + clip(0.5, +-0.2) = 0.7 -> (0.7-2)^2 = 1.69; max 1.69
    # t1: (2-1)^2 = 1; clipped V = 2 -> 1; max 1. loss = 0.5 * (1.69 + 1) / 2 = 0.6725; clipfrac 1/2
    values, old, returns = t([[1.0, 2.0, 9.0]]), t([[0.5, 2.0, 0.0]]), t([[2.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, metrics = Lo.value_loss(values, old, returns, mask, clip=0.2)
    close(loss, 0.6725)
    assert metrics["vf_clipfrac"] == pytest.approx(0.5)
    close(Lo.value_loss(values, old, returns, mask, clip=None)[0], 0.5 * (1 + 1) / 2)


# ----------------------------------------------------------------------------- FoldAct


def _foldact_batch(seed, with_summary=True):
    gen = torch.Generator().manual_seed(seed)
    old = torch.randn(2, 9, generator=gen, dtype=F64) * 0.3
    logp = old + torch.randn(2, 9, generator=gen, dtype=F64) * 0.1
    adv = torch.randn(2, 9, generator=gen, dtype=F64)
    kinds = torch.tensor([[0, 0, 1, 3, 3, 4, 4, 2, 2], [5, 5, 0, 0, 3, 1, 1, 2, 3]])
    if not with_summary:
        kinds = torch.where(kinds >= 4, torch.zeros_like(kinds), kinds)
    mask = kinds != 3
    kinds = src(kinds)
    full = logp.detach() + torch.randn(2, 9, generator=gen, dtype=F64) * 0.2
    return logp, old, adv, mask, kinds, full


def test_foldact_without_summary_tokens_is_w_action_times_ppo():
    logp, old, adv, mask, kinds, full = _foldact_batch(6, with_summary=False)
    fold = lambda lp: Lo.foldact(lp, old, adv, mask, kinds, full, w_consistency=0.0)  # noqa: E731
    ppo = lambda lp: Lo.ppo_clip(lp, old, adv, mask)  # noqa: E731
    close(fold(logp)[0], 0.7 * ppo(logp)[0])
    close(grad_of(fold, logp), 0.7 * grad_of(ppo, logp))
    # consistency term value is 0 when the folded context equals the full one
    loss, metrics = Lo.foldact(
        logp, old, adv, mask, kinds, logp.detach(), w_summary=1, w_action=1, w_consistency=1
    )
    assert metrics["loss_consistency"] == 0.0
    close(loss, ppo(logp)[0])


def test_foldact_separated_means_hand_values():
    # summary tokens (kind 4) r = [2, 1], A = [1, -1]; action tokens (kind 0) r = [1], A = [3]; eps 0.2
    # L_sum = mean(-min(2, 1.2), -min(-1, -1)) = (-1.2 + 1) / 2 = -0.1  (not diluted by the action token)
    # L_act = -3;  L_cons = mean(logp - full) over the 3 tokens = (0.5 + 0 + 0.1) / 3 = 0.2
    # L = 0.3 * -0.1 + 0.7 * -3 + 0.1 * 0.2 = -2.11
    logp = t([[math.log(2.0), 0.0, 0.0, 4.0]])
    old = torch.zeros(1, 4, dtype=F64)
    adv = t([[1.0, -1.0, 3.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    kinds = src(torch.tensor([[4, 4, 0, 3]]))
    full = t([[math.log(2.0) - 0.5, 0.0, -0.1, 0.0]])
    loss, m = Lo.foldact(logp, old, adv, mask, kinds, full)
    assert m["loss_summary"] == pytest.approx(-0.1) and m["loss_action"] == pytest.approx(-3.0)
    assert m["loss_consistency"] == pytest.approx(0.2)
    close(loss, 0.3 * -0.1 + 0.7 * -3.0 + 0.1 * 0.2)


def test_foldact_ratio_clamped_to_ten():
    # r = e^5 = 148 on a negative-advantage token: clamp to 10 -> loss 10 (not 148), no gradient
    logp = t([[5.0]], grad=True)
    loss, _ = Lo.foldact(logp, torch.zeros(1, 1, dtype=F64), t([[-1.0]]), torch.ones(1, 1), src(torch.tensor([[0]])),
                         logp.detach(), w_summary=0, w_action=1, w_consistency=0)  # fmt: skip
    close(loss, 10.0)
    (g,) = torch.autograd.grad(loss, logp)
    close(g, [[0.0]])


# ----------------------------------------------------------------------------- masking and gradcheck


def _garbage_batch():
    gen = torch.Generator().manual_seed(7)
    old = torch.randn(2, 6, generator=gen, dtype=F64) * 0.3
    logp = old + torch.randn(2, 6, generator=gen, dtype=F64) * 0.3
    adv = torch.randn(2, 6, generator=gen, dtype=F64)
    mask = torch.tensor([[1, 1, 0, 1, 0, 0], [0, 1, 1, 1, 1, 0]]).bool()
    # padding/observation positions hold garbage: -inf / NaN log-probs and advantages
    logp = torch.where(mask, logp, torch.full_like(logp, float("nan")))
    old = torch.where(mask, old, torch.full_like(old, float("-inf")))
    adv = torch.where(mask, adv, torch.full_like(adv, float("nan")))
    turn_id = torch.tensor([[0, 0, -1, 1, -1, -1], [-1, 0, 0, 0, 0, -1]])
    return logp, old, adv, mask, turn_id


@pytest.mark.parametrize(
    "name",
    ["token", "turn", "sequence", "dual", "constant", "bias", "foldact", "value"],
)
def test_masked_positions_never_receive_gradient(name):
    logp, old, adv, mask, turn_id = _garbage_batch()
    kinds = src(torch.where(mask, torch.tensor([[4, 0, 3, 1, 3, 3], [3, 5, 2, 2, 0, 3]]), 3))
    fns = {
        "token": lambda lp: Lo.ppo_clip(lp, old, adv, mask),
        "turn": lambda lp: Lo.ppo_clip(lp, old, adv, mask, ratio="turn", turn_id=turn_id),
        "sequence": lambda lp: Lo.ppo_clip(lp, old, adv, mask, ratio="sequence", agg="seq-mean-token-mean"),
        "dual": lambda lp: Lo.ppo_clip(lp, old, adv, mask, dual_clip=3.0, agg="seq-mean-token-sum"),
        "constant": lambda lp: Lo.ppo_clip(lp, old, adv, mask, agg="constant"),
        "bias": lambda lp: Lo.clip_bias_norm(lp, old, adv, mask, clip_low=0.01, clip_high=0.01),
        "foldact": lambda lp: Lo.foldact(lp, old, adv, mask, kinds, old),
        "value": lambda lp: Lo.value_loss(lp, old, adv, mask),
    }
    logp = logp.clone().requires_grad_(True)
    loss, metrics = fns[name](logp)
    assert torch.isfinite(loss)
    assert all(math.isfinite(v) for v in metrics.values())
    (g,) = torch.autograd.grad(loss, logp)
    assert (g[~mask] == 0).all()
    assert torch.isfinite(g).all() and (g[mask] != 0).any()


def test_gradcheck_losses_float64():
    gen = torch.Generator().manual_seed(8)
    old = torch.randn(2, 5, generator=gen, dtype=F64) * 0.3
    logp = (old + torch.randn(2, 5, generator=gen, dtype=F64) * 0.3).requires_grad_(True)
    adv = torch.randn(2, 5, generator=gen, dtype=F64)
    mask = torch.tensor([[1, 1, 0, 1, 1], [1, 0, 1, 1, 1]])
    turn_id = torch.tensor([[0, 0, -1, 1, 1], [0, -1, 1, 1, 1]])
    kinds = src(torch.tensor([[4, 4, 3, 0, 1], [5, 3, 0, 2, 2]]))
    checks = [
        lambda lp: Lo.ppo_clip(lp, old, adv, mask)[0],
        lambda lp: Lo.ppo_clip(lp, old, adv, mask, ratio="turn", turn_id=turn_id, agg="seq-mean-token-sum")[
            0
        ],
        lambda lp: Lo.ppo_clip(lp, old, adv, mask, ratio="sequence", dual_clip=2.0)[0],
        lambda lp: Lo.foldact(lp, old, adv, mask, kinds, old)[0],
        lambda lp: Lo.value_loss(lp, old, adv, mask, clip=0.1)[0],
        lambda lp: Lo.turn_ratio(lp, old, mask, turn_id),
    ]
    for fn in checks:
        assert torch.autograd.gradcheck(fn, (logp,), eps=1e-6, atol=1e-7)
