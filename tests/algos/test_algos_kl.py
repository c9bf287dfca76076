"""KL estimators: hand values, exact expected gradients and Monte-Carlo gradients on a toy categorical."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algos.kl import kl

F64 = torch.float64


def test_kl_hand_values():
    # l = log 2: k1 = 0.6931472; k2 = l^2 / 2 = 0.2402265; k3 = e^-l - 1 + l = 0.5 - 1 + 0.6931472 = 0.1931472
    logp = torch.tensor([[math.log(2.0), 0.0]], dtype=F64)
    ref = torch.zeros(1, 2, dtype=F64)
    l2 = math.log(2.0)
    assert kl(logp, ref, "k1")[0].tolist() == pytest.approx([l2, 0.0], abs=1e-15)
    assert kl(logp, ref, "k2")[0].tolist() == pytest.approx([0.5 * l2 * l2, 0.0], abs=1e-15)
    assert kl(logp, ref, "k3")[0].tolist() == pytest.approx([0.5 - 1 + l2, 0.0], abs=1e-15)
    # clamp bounds |l| first: l = 30 -> 5
    assert kl(torch.tensor([[30.0]]), torch.zeros(1, 1), "k1", clamp=5.0).item() == 5.0
    with pytest.raises(ValueError, match="kind"):
        kl(logp, ref, "k4")


def test_kl_mask_blocks_garbage_and_gradient():
    logp = torch.tensor([[0.3, float("nan")]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[0.1, float("-inf")]], dtype=F64)
    mask = torch.tensor([[1, 0]])
    for kind in ("k1", "k2", "k3"):
        out = kl(logp, ref, kind, mask=mask)
        assert out[0, 1] == 0.0
        (g,) = torch.autograd.grad(out.sum(), logp)
        assert g[0, 1] == 0.0 and torch.isfinite(g).all()


def _toy(seed=0, vocab=5):
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn(vocab, generator=gen, dtype=F64).requires_grad_(True)
    ref_logits = torch.randn(vocab, generator=gen, dtype=F64)
    return theta, torch.log_softmax(ref_logits, 0), gen


def _analytic_grads(theta, ref_logp):
    """Gradients of the true divergences w.r.t. theta: reverse KL(pi||ref), zero, forward KL(ref||pi)."""
    logp = torch.log_softmax(theta, 0)
    reverse = (logp.exp() * (logp - ref_logp)).sum()
    forward = (ref_logp.exp() * (ref_logp - logp)).sum()
    (g_rev,) = torch.autograd.grad(reverse, theta, retain_graph=True)
    (g_fwd,) = torch.autograd.grad(forward, theta)
    return {"k1": torch.zeros_like(g_rev), "k2": g_rev, "k3": g_fwd}


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_expected_gradient_matches_divergence_exactly(kind):
    # E_{y~pi}[grad k(y)] = sum_y sg(pi(y)) grad k(y): exact, no sampling noise
    theta, ref_logp, _ = _toy(1)
    logp = torch.log_softmax(theta, 0)
    expected_loss = (logp.exp().detach() * kl(logp, ref_logp, kind)).sum()
    (g,) = torch.autograd.grad(expected_loss, theta)
    torch.testing.assert_close(g, _analytic_grads(theta, ref_logp)[kind], rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_monte_carlo_gradient_matches_divergence(kind):
    # sample y ~ pi_theta, differentiate mean_s k(log pi(y_s) - log ref(y_s)) with autograd
    theta, ref_logp, gen = _toy(2)
    n = 200_000
    probs = torch.softmax(theta.detach(), 0)
    samples = torch.multinomial(probs, n, replacement=True, generator=gen)
    logp = torch.log_softmax(theta, 0)[samples]  # [n]
    (g_mc,) = torch.autograd.grad(kl(logp, ref_logp[samples], kind).mean(), theta)
    # per-sample gradient in closed form: c(y) * (onehot(y) - pi), c = 1 | l | 1 - e^-l
    log_ratio = (logp - ref_logp[samples]).detach()
    coef = {"k1": torch.ones_like(log_ratio), "k2": log_ratio, "k3": 1 - torch.exp(-log_ratio)}[kind]
    per_sample = coef[:, None] * (torch.nn.functional.one_hot(samples, 5).to(F64) - probs)  # [n, V]
    torch.testing.assert_close(per_sample.mean(0), g_mc, rtol=0, atol=1e-12)  # autograd == closed form
    stderr = per_sample.std(0) / math.sqrt(n)
    assert stderr.max() < 5e-3  # the check below is not vacuous
    analytic = _analytic_grads(theta, ref_logp)
    assert ((g_mc - analytic[kind]).abs() <= 5 * stderr + 1e-12).all()
    # and it is distinguishable from the other divergences' gradients
    for other, g_other in analytic.items():
        if other != kind:
            assert ((g_mc - g_other).abs() > 5 * stderr).any()


def test_gradcheck_kl_float64():
    gen = torch.Generator().manual_seed(3)
    logp = torch.randn(2, 4, generator=gen, dtype=F64).requires_grad_(True)
    ref = torch.randn(2, 4, generator=gen, dtype=F64)
    mask = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1]])
    for kind in ("k1", "k2", "k3"):
        assert torch.autograd.gradcheck(lambda lp, k=kind: kl(lp, ref, k, mask=mask), (logp,))
