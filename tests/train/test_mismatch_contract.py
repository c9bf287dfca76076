"""Sampler-learner mismatch corrections through the objective contract (agentrl.algos.mismatch):
declared as loss options, produced by agentrl.train.fields, refused where they cannot apply."""

from __future__ import annotations

import pytest
import torch
from train_helpers import config, episodes, step_data, tiny_lm

from agentrl.algos.mismatch import tis_weight, token_keep
from agentrl.errors import ConfigError
from agentrl.train.engines import TorchEngine
from agentrl.train.fields import LazyBatch
from agentrl.train.learner import Policy
from agentrl.train.plan import objective_plan
from agentrl.train.update import compute_advantages, ppo_update


def test_tis_is_a_declared_need_only_when_asked():
    assert "is_weight" not in objective_plan(config()).loss_needs
    plan = objective_plan(config("algo.mismatch_correction=tis", "algo.mismatch_cap=3.0"))
    assert "is_weight" in plan.loss_needs
    assert plan.loss_options["mismatch_correction"] == "tis" and plan.loss_options["mismatch_cap"] == 3.0
    assert plan.summary()["loss_options"]["mismatch_correction"] == "tis"  # printed and saved resolved
    # the masks act through loss_mask: the loss reads no extra tensor
    assert "is_weight" not in objective_plan(config("algo.mismatch_correction=token_mask")).loss_needs
    assert objective_plan(config()).loss_options["mismatch_cap"] == 2.0


@pytest.mark.parametrize(
    ("overrides", "field", "text"),
    [
        (["algo.mismatch_correction=tis", "algo.old_logprobs=sampler"], "algo.mismatch_correction",
         "set algo.old_logprobs=recompute"),
        (["algo.loss=foldact", "rollout.folding=summary", "algo.mismatch_correction=tis"],
         "algo.mismatch_correction", "takes no 'mismatch_correction'"),
    ],
)  # fmt: skip
def test_corrections_that_cannot_apply_are_refused(overrides, field, text):
    with pytest.raises(ConfigError) as info:
        objective_plan(config(*overrides))
    assert info.value.field == field and text in str(info.value)


def test_cap_and_kind_are_validated_with_the_config():
    with pytest.raises(ConfigError, match="mismatch_cap"):
        config("algo.mismatch_cap=1.0").validate()
    with pytest.raises(ConfigError, match="mismatch_correction"):
        config("algo.mismatch_correction=clip").validate()


def _step(*overrides, near=False):
    policy = Policy(tiny_lm(seed=3))
    engine = TorchEngine(policy, lr=1e-2, max_grad_norm=0.0)
    cfg = config("train.minibatch_size=8", "train.micro_batch_size=4", *overrides)
    eps = episodes(n_groups=2, group_size=3, seed=4)
    if near:  # every other sampler reports about the tiny model's log-probs (~ -log 96 = -4.6), the rest -0.5
        for i, ep in enumerate(eps):
            for turn in ep.turns:
                turn.output_logprobs = [-4.6 if i % 2 else -0.5] * len(turn.output_ids)
    return engine, step_data(engine, eps, cfg)


def test_token_mask_removes_exactly_the_tokens_past_the_cap():
    # the episodes' made-up sampler log-probs (-3..0) are far from the random tiny model's (~ -4.6),
    # so some tokens fall past a cap of 8 and some do not
    _, step = _step("algo.mismatch_correction=token_mask", "algo.mismatch_cap=8.0")
    raw = step.tokens.loss_mask
    keep = token_keep(step.old["logp"], step.tokens.old_logprobs, raw, cap=8.0)
    mask = LazyBatch(step)["loss_mask"]
    torch.testing.assert_close(mask, raw * keep.to(raw.dtype))
    assert 0 < int(mask.sum()) < int(raw.sum())


def test_seq_mask_drops_whole_rows():
    _, step = _step("algo.mismatch_correction=seq_mask", "algo.mismatch_cap=8.0", near=True)
    raw, mask = step.tokens.loss_mask, LazyBatch(step)["loss_mask"]
    rows_kept = mask.bool().any(dim=1)
    assert torch.equal(mask[rows_kept], raw[rows_kept])  # a kept row keeps every token
    near = torch.tensor([i % 2 == 1 for i in step.tokens.row_episode.tolist()])
    assert torch.equal(rows_kept, near)  # |mean delta| ~ 0 kept; ~ 4 > log 8 dropped


def test_tis_weight_reaches_the_loss_and_the_update_runs():
    engine, step = _step("algo.mismatch_correction=tis", "algo.mismatch_cap=2.0")
    adv, returns, batch = compute_advantages(step)
    expected = tis_weight(step.old["logp"], step.tokens.old_logprobs, step.tokens.loss_mask, cap=2.0)
    torch.testing.assert_close(batch["is_weight"], expected)
    metrics = ppo_update(engine, step, batch, adv, returns, None, rng=torch.Generator().manual_seed(0))
    assert 0 < metrics["is_weight_min"] <= metrics["is_weight_mean"] <= 2.0


def test_the_trainer_logs_the_mismatch_every_step_and_trains_with_a_correction(tiny_model_dir, tmp_path):
    import json

    from agentrl.cli import train_main as main

    out = tmp_path / "run"
    run = [f"model.name={tiny_model_dir}", "env.id=agentrl/Search-v0", "env.max_turns=2", "env.kwargs={hops: single}",
           "rollout.group_size=2", "rollout.tasks_per_step=1", "rollout.max_new_tokens=8", "rollout.concurrency=2",
           "rollout.max_context_tokens=1024", "train.minibatch_size=2", "train.micro_batch_size=2",
           "train.eval_episodes=1", "train.num_threads=1", "train.bf16_autocast=false", "train.steps=2",
           "algo.mismatch_correction=tis", f"train.out_dir={out}"]  # fmt: skip
    assert main(None, run) == 0
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "perf/step_s" in r]
    assert len(steps) == 2 and all("mismatch/abs_mean" in r for r in steps)
    # the HF generator samples from the learner's own module: only batching round-off separates them
    assert all(r["mismatch/abs_max"] < 1e-3 and r["mismatch/over_cap"] == 0.0 for r in steps)
    assert all(abs(r["loss/is_weight_mean"] - 1.0) < 1e-3 for r in steps)
