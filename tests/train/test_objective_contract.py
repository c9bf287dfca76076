"""The objective contract: declared needs, one producer each, presets vs explicit options, SUPO's
row mask, ST-PPO's per-minibatch scale, FoldAct's full-context pass."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from train_helpers import VOCAB, config, episodes, step_data, tiny_lm

import agentrl.algos  # noqa: F401
from agentrl.errors import ConfigError
from agentrl.registry import ADVANTAGES, LOSSES
from agentrl.train.engines import TorchEngine
from agentrl.train.fields import BATCH_FIELDS, KINDS
from agentrl.train.fullctx import full_context_logprobs, unfolded_prefixes
from agentrl.train.learner import Policy
from agentrl.train.plan import objective_plan
from agentrl.train.update import compute_advantages, ppo_update
from agentrl.trajectory import Episode, Segment, Source, Turn, build_batch


def test_every_declared_need_has_exactly_one_producer_with_its_setting():
    needs = {n for name in ADVANTAGES.names() for n in ADVANTAGES.get(name).needs}
    for name in LOSSES.names():
        loss = LOSSES.get(name)
        needs |= set(loss.head) | set(loss.keywords)
    assert needs <= set(BATCH_FIELDS.names()), needs - set(BATCH_FIELDS.names())
    for name in needs:
        made = BATCH_FIELDS.get(name)
        assert made.name == name and made.kind in KINDS and re.fullmatch(r"\[[BRLK+1, ]+\]", made.shape)
        assert made.doc and (made.available(config()) or made.setting), name
    # no alias table: TokenBatch names are not objective names
    assert not {"old_logprobs", "row_episode", "source"} & needs


@pytest.mark.parametrize(
    ("overrides", "option", "value"),
    [
        (["algo.loss=dapo", "algo.clip_high=0.2"], "clip_high", 0.2),
        (["algo.loss=dapo"], "clip_high", 0.28),
        (["algo.loss=gspo", "algo.ratio=token"], "ratio", "token"),
        (["algo.loss=grpo", "algo.agg=token-mean"], "agg", "token-mean"),
        (["algo.loss=grpo"], "agg", "seq-mean-token-mean"),
        (["algo.loss=turn_ppo"], "ratio", "turn"),
        (["algo.loss=foldgrpo", "algo.clip_high=0.2"], "clip_high", 0.2),
        (["algo.loss=ppo_clip", "algo.loss_options={dual_clip: 3.0}"], "dual_clip", 3.0),
        (["algo.agg_unit=rollout"], "agg_unit", "rollout"),
    ],
)
def test_explicit_loss_options_win_and_presets_fill_only_unset(overrides, option, value):
    assert objective_plan(config(*overrides)).loss_options[option] == value


@pytest.mark.parametrize(
    ("overrides", "option", "value"),
    [
        (["algo.advantage=gigpo", "algo.gamma=1.0"], "gamma", 1.0),
        (["algo.advantage=gigpo"], "gamma", 0.95),
        (["algo.advantage=gae", "algo.critic=true", "algo.gamma=0.9", "algo.lam=0.95"], "lam", 0.95),
        (["algo.advantage=drgrpo"], "std_normalize", False),
        (["algo.advantage=drgrpo", "algo.options={std_normalize: true}"], "std_normalize", True),
        (["algo.advantage=igpo"], "info_gain_kind", "log_prob_diff"),
        (["algo.advantage=empg", "algo.options={zeta: 0.05}"], "zeta", 0.05),
    ],
)
def test_explicit_estimator_options_win(overrides, option, value):
    assert objective_plan(config(*overrides)).advantage_options[option] == value


@pytest.mark.parametrize(
    ("overrides", "field", "text"),
    [
        (["algo.advantage=grpo", "algo.gamma=0.9"], "algo.gamma", "takes no 'gamma'"),
        (["algo.loss=foldact", "rollout.folding=summary", "algo.ratio=turn"], "algo.ratio", "takes no 'ratio'"),
        (["algo.loss=dapo", "algo.loss_options={clip: 0.1}"], "algo.loss_options.clip", "no option 'clip'"),
        (["algo.advantage=gae"], "algo.critic", "set algo.critic=true"),
        (["algo.advantage=foldgrpo"], "rollout.folding", "set rollout.folding=branch"),
        (["algo.loss=foldact"], "rollout.folding", "set rollout.folding=summary"),
        (["algo.advantage=empg", "algo.loss=gspo"], "algo.loss", "cannot train with loss 'gspo'"),
        (["algo.loss=clip_bias_norm"], "algo.loss", "not a policy loss"),
        (["algo.loss=foldact", "rollout.folding=summary", "algo.clip_bias_correction=true"],
         "algo.clip_bias_correction", "PPO-clip loss"),
    ],
)  # fmt: skip
def test_objectives_that_cannot_run_are_refused_naming_the_field(overrides, field, text):
    with pytest.raises(ConfigError) as info:
        objective_plan(config(*overrides))
    assert info.value.field == field and text in str(info.value)


def test_the_update_hands_the_loss_exactly_its_declared_needs():
    needs = LOSSES.get("turn_ppo").needs()
    assert needs == ("logp", "old_logp", "loss_mask", "turn_id")
    assert LOSSES.get("ppo_clip").needs({"agg_unit": "rollout"}) == (
        "logp",
        "old_logp",
        "loss_mask",
        "seq_id",
    )
    assert LOSSES.get("foldact").needs() == ("logp", "old_logp", "loss_mask", "token_kind", "full_ctx_logp")


class _Capture(TorchEngine):
    def step(self):
        self.grads = torch.cat([p.grad.flatten() for p in self.params])
        return super().step()


def _grads(eps, *overrides, seed=5, warm=False):
    cfg = config("train.minibatch_size=8", "train.micro_batch_size=2", "algo.kl_coef=0.1",
                 "algo.entropy_coef=0.01", "train.logprob_impl=chunked", *overrides)  # fmt: skip
    policy = Policy(tiny_lm(seed=seed))
    policy.prepare_reference()
    engine = _Capture(policy, lr=5e-2, max_grad_norm=0.0)
    step = step_data(engine, eps, cfg)
    adv, returns, batch = compute_advantages(step)
    from agentrl.train.update import score_tokens

    ref = score_tokens(engine, step.tokens, 4, reference=True)["logp"]
    if warm:  # move the policy off the behaviour policy so ratios leave the clip range
        ppo_update(engine, step, batch, adv, returns, ref, rng=torch.Generator().manual_seed(1))
    metrics = ppo_update(engine, step, batch, adv, returns, ref, rng=torch.Generator().manual_seed(0))
    return engine.grads, metrics


def test_supo_unfinished_rollouts_add_exactly_nothing():
    eps = episodes(n_groups=2, group_size=4, seed=2)
    for i, ep in enumerate(eps):
        ep.truncated = i % 3 == 1  # unfinished: cut by a budget
    mutated = copy.deepcopy(eps)  # unfinished rollouts get other tokens and lengths
    rng = torch.Generator().manual_seed(9)
    for ep in mutated:
        if ep.truncated:
            turn = ep.segments[0].turns[0]
            turn.output_ids = torch.randint(1, VOCAB, (len(turn.output_ids) + 5,), generator=rng).tolist()
            turn.output_logprobs = [-1.0] * len(turn.output_ids)
    on = ["algo.advantage=supo", "algo.old_logprobs=sampler"]
    base, metrics = _grads(eps, *on)
    assert base.abs().sum() > 0 and metrics["kl"] >= 0 and metrics["entropy"] > 0
    # loss, denominators, KL and entropy all ignore them (up to float round-off of differently
    # padded no-grad passes over the whole batch)
    torch.testing.assert_close(_grads(mutated, *on)[0], base, rtol=1e-5, atol=1e-8)
    # with the mask off, the same change does reach the update
    off = [*on, "algo.options={mask_unfinished: false}"]
    assert (_grads(mutated, *off)[0] - _grads(eps, *off)[0]).abs().max() > 1e-4


@pytest.mark.slow
def test_supo_per_rollout_normaliser_is_selectable():
    eps = episodes(n_groups=2, group_size=3, seed=3)
    for ep in eps:  # two rows per rollout: a summary restart
        ep.segments.append(Segment(list(ep.segments[0].prompt_ids), [ep.segments[0].turns[-1]], 1, "summary"))
    by_row, _ = _grads(eps, "algo.advantage=supo", "algo.agg=seq-mean-token-mean")
    by_rollout, _ = _grads(
        eps, "algo.advantage=supo", "algo.agg=seq-mean-token-mean", "algo.agg_unit=rollout"
    )
    assert not torch.allclose(by_row, by_rollout)
    # a rollout's rows stay in one micro-batch, so accumulation is exact for the per-rollout mean too
    micro, _ = _grads(eps, "algo.advantage=supo", "algo.agg=seq-mean-token-mean", "algo.agg_unit=rollout",
                      "train.micro_batch_size=8")  # fmt: skip
    # equal up to float32 summation order, which depends on the CPU's kernels: an AMD EPYC differed by
    # 1.3e-7 on entries up to 0.26 (5e-7 of the scale); a wrong normaliser moves them by whole fractions
    scale = by_rollout.abs().max().item()
    torch.testing.assert_close(micro, by_rollout, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.slow
def test_stppo_scale_is_one_per_minibatch_with_the_losss_ratio():
    eps = episodes(n_groups=2, group_size=4, seed=4, max_turns=3)
    opts = [
        "algo.loss=turn_ppo",
        "algo.clip_bias_correction=true",
        "algo.clip_low=0.02",
        "algo.clip_high=0.02",
    ]
    grads = {}
    for micro in (8, 2, 1):
        grads[micro], metrics = _grads(eps, *opts, f"train.micro_batch_size={micro}", warm=True)
        assert 0 < metrics["clip_bias_scale"] < 1 and metrics["clip_bias_frac"] > 0
    # one scale for the whole minibatch: accumulating over micro-batches changes nothing
    torch.testing.assert_close(grads[2], grads[8], rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(grads[1], grads[8], rtol=1e-4, atol=1e-7)
    assert objective_plan(config(*opts)).loss_options["ratio"] == "turn"  # the correction's ratio too


@pytest.mark.slow
def test_stppo_skips_the_correction_backward_where_nothing_is_clipped(monkeypatch):
    """Micro-batches with no token in the clipped set (here: a group whose rollouts all scored
    the same, so every advantage is 0) add exactly nothing to C: their backward is skipped, and the
    update equals the one of a single micro-batch, where nothing is skipped."""
    eps = episodes(n_groups=2, group_size=4, seed=4, max_turns=3)
    for ep in eps[:4]:
        ep.outcome = 1.0  # group 0: all equal, advantage 0 on every token
    opts = ["algo.loss=turn_ppo", "algo.clip_bias_correction=true", "algo.clip_low=0.02", "algo.clip_high=0.02",
            "algo.kl_coef=0", "algo.entropy_coef=0"]  # fmt: skip
    calls = []
    real_grad = torch.autograd.grad

    def counting_grad(*args, **kwargs):
        calls.append(1)
        return real_grad(*args, **kwargs)

    whole, metrics = _grads(eps, *opts, "train.micro_batch_size=8", warm=True)
    assert 0 < metrics["clip_bias_scale"] < 1
    monkeypatch.setattr(torch.autograd, "grad", counting_grad)
    per_row, metrics = _grads(eps, *opts, "train.micro_batch_size=1", warm=True)
    assert 0 < metrics["clip_bias_scale"] < 1
    # 2 updates (warm + measured) x 8 rows, minus at least group 0's 4 rows in each
    assert 0 < len(calls) <= 2 * (8 - 4)
    torch.testing.assert_close(per_row, whole, rtol=1e-4, atol=1e-7)


@pytest.mark.slow
def test_stppo_floor_sets_where_the_correction_starts_scaling():
    """scale = 1 / max(floor, ||C||): with no KL or entropy term the whole update is the policy
    gradient times the scale, so updates under two floors differ by exactly the ratio of scales."""
    eps = episodes(n_groups=2, group_size=4, seed=4, max_turns=3)
    opts = ["algo.loss=turn_ppo", "algo.clip_bias_correction=true", "algo.kl_coef=0", "algo.entropy_coef=0",
            "algo.old_logprobs=sampler"]  # the scripted sampler log-probs put ratios outside the clip range
    high, m_high = _grads(eps, *opts, "algo.clip_bias_floor=100")
    low, m_low = _grads(eps, *opts, "algo.clip_bias_floor=1e-9")
    norm = m_low["clip_bias_norm"]
    assert 0 < norm < 100 and m_high["clip_bias_norm"] == pytest.approx(norm)
    assert m_high["clip_bias_scale"] == pytest.approx(1 / 100) and m_low["clip_bias_scale"] == pytest.approx(1 / norm)
    torch.testing.assert_close(high * 100, low * norm, rtol=1e-4, atol=1e-7)


def test_clip_bias_floor_is_checked():
    with pytest.raises(ConfigError, match="algo.clip_bias_floor") as err:
        config("algo.clip_bias_correction=true", "algo.clip_bias_floor=0").validate()
    assert "must be > 0" in str(err.value)
    with pytest.raises(ConfigError, match="algo.clip_bias_floor") as err:
        config("algo.clip_bias_floor=0.01").validate()  # the correction is off: the floor would do nothing
    assert "clip_bias_correction=true" in str(err.value)


def _summary_episode(rng: torch.Generator, eid: str) -> Episode:
    def turn(index, kind="action", n=4):
        ids = torch.randint(1, VOCAB, (n,), generator=rng).tolist()
        return Turn(index, ids, [-0.5] * n, obs_ids=[] if kind == "summary" else [7, 8, 9], kind=kind)

    first = Segment([1, 2, 3, 4], [turn(0), turn(1, "summary")], 0, "main")
    second = Segment([1, 2, 5, 6], [turn(2), turn(3, "summary", 3)], 1, "summary")
    third = Segment([1, 2, 10], [turn(4)], 2, "summary")
    return Episode(eid, "test", "t", [first, second, third], group_id="g", outcome=1.0, terminated=True)


def test_full_context_pass_scores_each_row_under_its_unfolded_history():
    rng = torch.Generator().manual_seed(0)
    eps = [_summary_episode(rng, "a"), _summary_episode(rng, "b")]
    eps[1].outcome = 0.0
    tokens = build_batch(eps)
    prefixes = unfolded_prefixes(eps)
    seg = eps[0].segments
    assert prefixes[0] == [] and prefixes[1] == seg[0].token_ids()
    assert prefixes[2] == seg[0].token_ids() + seg[1].token_ids()
    assert tokens.source.eq(int(Source.SUMMARY)).sum() == 2 * (4 + 3)
    cfg = config("algo.loss=foldact", "rollout.folding=summary", "train.logprob_impl=chunked")
    policy = Policy(tiny_lm(seed=1))
    engine = TorchEngine(policy, lr=1e-3)
    step = step_data(engine, eps, cfg)
    full = full_context_logprobs(step)
    mask = tokens.loss_mask.bool()
    assert torch.isfinite(full[mask]).all()
    for b in range(tokens.input_ids.shape[0]):  # one row at a time, by hand
        n = int(tokens.attention_mask[b].sum())
        seq = torch.tensor(prefixes[b] + tokens.input_ids[b, :n].tolist())[None]
        with torch.no_grad():
            logits = policy.lm(input_ids=seq).logits[0, :-1].float()
        by_position = torch.cat(
            [torch.zeros(1), torch.log_softmax(logits, -1).gather(1, seq[0, 1:, None])[:, 0]]
        )
        want = by_position[len(prefixes[b]) :]
        torch.testing.assert_close(full[b, :n][mask[b, :n]], want[mask[b, :n]], rtol=1e-4, atol=1e-5)
    # the first row has no earlier history: its full context is its folded context
    torch.testing.assert_close(full[0][mask[0]], step.old["logp"][0][mask[0]], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(full[1][mask[1]], step.old["logp"][1][mask[1]])  # later rows differ
    # selective segment training: dropped turns come back NaN, everything else is unchanged
    dropped_cfg = config("algo.loss=foldact", "rollout.folding=summary", "algo.full_ctx_dropout=0.5",
                         "train.logprob_impl=chunked")  # fmt: skip
    dropped = full_context_logprobs(step_data(engine, eps, dropped_cfg))
    nan = torch.isnan(dropped)
    assert nan.any() and (nan & ~mask).sum() == 0 and (~nan & mask).any()
    torch.testing.assert_close(dropped[~nan & mask], full[~nan & mask])
    for b in range(nan.shape[0]):  # whole turns at a time
        for k in tokens.turn_id[b][mask[b]].unique():
            in_turn = tokens.turn_id[b] == k
            assert nan[b][in_turn].all() or not nan[b][in_turn].any()
