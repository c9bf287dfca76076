"""Learner: log-probs match a plain forward, loss goes down, accumulation is exact, LoRA, critic."""

from __future__ import annotations

import pytest
import torch
from train_helpers import VOCAB, GradCapture, config, episodes, step_data, tiny_lm

from agentrl.train.engines import TorchEngine
from agentrl.train.learner import Policy, build_policy
from agentrl.train.update import compute_advantages, ppo_update, score_tokens
from agentrl.trajectory import build_batch


@pytest.mark.parametrize("impl", ["naive", "chunked"])
def test_policy_logprobs_match_full_forward(impl):
    model = tiny_lm()
    policy = Policy(model, logprob_impl=impl, critic=True)
    tokens = build_batch(episodes())
    with torch.no_grad():
        out = policy(tokens.input_ids, tokens.attention_mask, tokens.loss_mask)
        logits = model(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask).logits.float()
    ref = torch.log_softmax(logits[:, :-1], -1).gather(-1, tokens.input_ids[:, 1:, None]).squeeze(-1)
    ref = torch.nn.functional.pad(ref, (1, 0)) * tokens.loss_mask
    probs = torch.softmax(logits[:, :-1], -1)
    ref_ent = torch.nn.functional.pad(-(probs * probs.log()).sum(-1), (1, 0)) * tokens.loss_mask
    torch.testing.assert_close(out.logp, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.entropy, ref_ent, rtol=1e-5, atol=1e-5)
    assert out.values is not None and out.values.shape == tokens.input_ids.shape
    assert (out.logp[tokens.loss_mask == 0] == 0).all()


def _engine(policy, lr=1e-2):
    return TorchEngine(policy, lr=lr, max_grad_norm=0.0)


def test_loss_goes_down_on_fixed_batch():
    from agentrl.registry import LOSSES

    cfg = config("train.minibatch_size=6", "train.micro_batch_size=3", "train.logprob_impl=chunked")
    policy = Policy(tiny_lm())
    engine = _engine(policy, lr=1e-3)
    step = step_data(engine, episodes(), cfg)
    adv, returns, batch = compute_advantages(step)
    assert adv.abs().sum() > 0

    def full_batch_loss() -> float:
        with torch.no_grad():
            out = policy(step.tokens.input_ids, step.tokens.attention_mask, step.tokens.loss_mask)
        fields = {"logp": out.logp, "old_logp": batch["old_logp"], "loss_mask": step.tokens.loss_mask}
        return float(LOSSES.get("ppo_clip").from_batch(fields, adv)[0])

    losses = [full_batch_loss()]
    for i in range(6):
        ppo_update(engine, step, batch, adv, returns, None, rng=torch.Generator().manual_seed(i))
        losses.append(full_batch_loss())
    mask = step.tokens.loss_mask
    assert losses[0] == pytest.approx(-float((adv * mask).sum() / mask.sum()), abs=1e-5)  # ratio 1 at start
    assert losses[-1] < losses[0] - 0.05, losses
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "constant"])
def test_gradient_accumulation_equals_one_big_batch(agg):
    """One update's accumulated gradient is the big batch's, up to float32 summation order.

    Micro-batching only reorders float32 sums: each parameter's gradient is a sum over the batch's
    tokens, and a reordered sum of n terms moves by about sqrt(n) float32 epsilons of its size (the
    norm of the error, relative to the gradient's). The tolerance is that, with a factor of 8; a real
    accumulation bug (a weight off by one micro-batch) is off by percents. One update only: a second
    one would pass the round-off through Adam's step, which divides by |g| and amplifies it.
    """
    eps = episodes(n_groups=2, group_size=4)
    grads = []
    for micro in (8, 2, 1):
        cfg = config("train.minibatch_size=8", f"train.micro_batch_size={micro}", f"algo.agg={agg}",
                     "algo.kl_coef=0.1", "algo.entropy_coef=0.01")  # fmt: skip
        policy = Policy(tiny_lm(seed=3))
        policy.prepare_reference()
        noise = torch.Generator().manual_seed(7)
        with torch.no_grad():  # move the policy off the reference so the KL term has a gradient
            for p in policy.trainable_parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=noise))
        engine = GradCapture(policy, lr=1e-2)
        step = step_data(engine, eps, cfg)
        adv, returns, batch = compute_advantages(step)
        ref = score_tokens(engine, step.tokens, 4, reference=True)["logp"]
        ppo_update(engine, step, batch, adv, returns, ref, rng=torch.Generator().manual_seed(0))
        grads.append(engine.grads.double())  # [P]
    n_tokens = int(step.tokens.loss_mask.sum())
    tolerance = 8 * n_tokens**0.5 * torch.finfo(torch.float32).eps  # relative, in norm
    assert grads[0].abs().max() > 1e-3 and tolerance < 1e-4
    for other in grads[1:]:
        error = float((other - grads[0]).norm() / grads[0].norm())
        assert error <= tolerance, (error, tolerance)


def test_lora_updates_only_adapters_and_reference_is_base():
    cfg = config(
        "model.lora_rank=4", "train.minibatch_size=6", "train.micro_batch_size=6", "algo.kl_coef=0.05"
    )
    base = tiny_lm(seed=1)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    policy = build_policy(base, cfg)
    engine = _engine(policy, lr=5e-2)
    step = step_data(engine, episodes(), cfg)
    adv, returns, batch = compute_advantages(step)
    ref = score_tokens(engine, step.tokens, 6, reference=True)["logp"]
    ppo_update(engine, step, batch, adv, returns, ref, rng=torch.Generator().manual_seed(0))
    changed = {n for n, p in policy.named_parameters() if "lora_" in n and p.requires_grad}
    assert changed, "no LoRA parameters"
    for name, p in policy.lm.named_parameters():
        key = name.replace("base_layer.", "")
        if "lora_" in name:
            continue
        torch.testing.assert_close(p.detach(), before[key], rtol=0, atol=0, msg=name)
    lora_moved = [n for n, p in policy.lm.named_parameters() if "lora_B" in n and p.abs().sum() > 0]
    assert lora_moved, "LoRA B matrices stayed zero"
    # reference = adapters off = the untouched base model
    fresh = Policy(tiny_lm(seed=1))
    with torch.no_grad():
        want = fresh(step.tokens.input_ids, step.tokens.attention_mask, step.tokens.loss_mask).logp
    got = score_tokens(engine, step.tokens, 6, reference=True)["logp"]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    now = score_tokens(engine, step.tokens, 6)["logp"]
    assert (now - want).abs().max() > 1e-4, "adapters changed nothing"


def test_critic_gae_trains_value_head():
    cfg = config(
        "algo.advantage=gae", "algo.critic=true", "train.minibatch_size=6", "train.micro_batch_size=3"
    )
    policy = build_policy(tiny_lm(), cfg)
    assert policy.value_head is not None
    engine = _engine(policy)
    head_before = policy.value_head.weight.detach().clone()
    step = step_data(engine, episodes(), cfg)
    adv, returns, batch = compute_advantages(step)
    assert returns is not None and returns.abs().sum() > 0
    metrics = ppo_update(engine, step, batch, adv, returns, None, rng=torch.Generator().manual_seed(0))
    assert "vf_loss" in metrics
    assert not torch.equal(policy.value_head.weight, head_before)


def test_gae_without_critic_names_the_fix():
    from agentrl.errors import ConfigError

    cfg = config("algo.advantage=gae")
    engine = _engine(Policy(tiny_lm()))
    with pytest.raises(ConfigError, match="algo.critic"):  # resolving the step's objective plan refuses it
        compute_advantages(step_data(engine, episodes(), cfg))


class _Vocab:
    """What :func:`agentrl.rollout.model.tiny_model` reads of a tokenizer."""

    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

    def __len__(self) -> int:
        return VOCAB


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_shared_prefix_pass_equals_plain_pass(arch, monkeypatch):
    """Rows with a common system prompt: the prefix-once paths (the prefix's K/V attended once, or
    copied per row) give the plain pass's values and gradients, grouped-query heads included."""
    from agentrl.kernels import prefix_attention
    from agentrl.rollout.model import tiny_model
    from agentrl.train.learner import shared_prefix_length

    eps = episodes(n_groups=2, group_size=3, seed=4)
    common = list(range(1, 41))  # a 40-token "system prompt" shared by every row
    for ep in eps:
        ep.segments[0].prompt_ids = common + ep.segments[0].prompt_ids
    tokens = build_batch(eps)
    assert shared_prefix_length(tokens.input_ids, tokens.attention_mask) >= 40
    assert tokens.attention_mask.sum(1).unique().numel() > 1  # rows of different lengths: padded tails
    calls = []
    attend = prefix_attention.attend
    monkeypatch.setattr(prefix_attention, "attend", lambda *a, **k: calls.append(1) or attend(*a, **k))
    monkeypatch.setattr(prefix_attention, "_registered", False)  # re-register the counting function
    results = []
    # (min prefix, attended once, training mode: the tails' layers recomputed in the backward pass)
    for min_prefix, shared, training in ((10**9, True, False), (32, False, False), (32, True, False), (32, True, True)):
        torch.manual_seed(0)  # the value head is initialised from the global RNG
        lm = tiny_lm(seed=2) if arch == "llama" else tiny_model(_Vocab(), hidden=64, seed=2, arch="qwen2")
        config = lm.config
        assert config.num_attention_heads > config.num_key_value_heads  # grouped queries
        policy = Policy(lm, critic=True)
        policy.train(training)
        policy.min_shared_prefix, policy.prefix_attention = min_prefix, shared
        out = policy(tokens.input_ids, tokens.attention_mask, tokens.loss_mask)
        (out.logp.sum() + out.entropy.sum() + out.values.sum()).backward()
        results.append(
            (out.logp.detach(), out.entropy.detach(), [p.grad.clone() for p in policy.parameters()])
        )
        assert lm.config._attn_implementation != prefix_attention.NAME  # restored after the pass
        assert not any(layer.gradient_checkpointing for layer in lm.get_decoder().layers)  # restored too
    # the last two passes attended to the prefix held once; the last one again in its backward pass
    assert len(calls) == 3 * config.num_hidden_layers
    lp_a, ent_a, g_a = results[0]
    for lp_b, ent_b, g_b in results[1:]:
        torch.testing.assert_close(lp_b, lp_a, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ent_b, ent_a, rtol=1e-5, atol=1e-5)
        for a, b in zip(g_a, g_b, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_bf16_autocast_runs_the_blocks_in_bf16_and_keeps_float32_outputs_and_grads():
    tokens = build_batch(episodes())
    outs = []
    for autocast in (False, True):
        policy = Policy(tiny_lm(seed=3), autocast=autocast)
        out = policy(tokens.input_ids, tokens.attention_mask, tokens.loss_mask)
        out.logp.sum().backward()
        grads = [p.grad for p in policy.parameters() if p.requires_grad]
        assert out.logp.dtype == torch.float32 and all(g is not None and g.dtype == torch.float32 for g in grads)
        outs.append(out.logp.detach())
    mask = tokens.loss_mask > 0
    diff = (outs[1] - outs[0])[mask].abs()
    assert diff.max() > 0  # the blocks really ran in bfloat16 ...
    assert diff.mean() < 0.02 and diff.max() < 0.1  # ... to bfloat16 accuracy (8 mantissa bits)


def test_shared_prefix_pass_with_the_model_checkpointing_its_layers():
    """``model.gradient_checkpointing``: transformers drops caches in checkpointed layers, so the prefix
    pass runs with checkpointing off (its cache filled) and the tails with it on; same values and
    gradients as the plain pass, and the model's setting is left as it was."""
    eps = episodes(n_groups=2, group_size=3, seed=5)
    for ep in eps:
        ep.segments[0].prompt_ids = list(range(1, 41)) + ep.segments[0].prompt_ids
    tokens = build_batch(eps)
    results = []
    for min_prefix in (10**9, 32):
        lm = tiny_lm(seed=4)
        if hasattr(lm, "activation_checkpointing_enable"):  # transformers 5.x's name
            lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        policy = Policy(lm)
        policy.train()
        policy.min_shared_prefix = min_prefix
        out = policy(tokens.input_ids, tokens.attention_mask, tokens.loss_mask)
        out.logp.sum().backward()
        results.append((out.logp.detach(), [p.grad.clone() for p in policy.parameters() if p.grad is not None]))
        assert all(layer.gradient_checkpointing for layer in lm.get_decoder().layers)
    (lp_a, g_a), (lp_b, g_b) = results
    torch.testing.assert_close(lp_b, lp_a, rtol=1e-5, atol=1e-5)
    assert len(g_a) == len(g_b) > 0
    for a, b in zip(g_a, g_b, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
