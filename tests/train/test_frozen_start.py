"""train.reuse_sampler_hidden: the learner starts at the lowest trained block from the sampler's kept
states. Invariance: log-probs and gradients equal the full forward's; through `agentrl train`, the
same step as a run that recomputes the frozen blocks."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from test_train_cli import QUICKSTART, SHORT, agentrl_train

from agentrl.config import RunConfig
from agentrl.errors import ConfigError
from agentrl.train import frozen
from agentrl.train.learner import Policy, freeze_below
from tests.rollout.test_hidden import block_input


@pytest.fixture(scope="module")
def four_blocks(tokenizer):
    from agentrl.rollout.model import tiny_model

    return tiny_model(tokenizer, layers=4, hidden=64, seed=0)


@pytest.fixture(scope="module")
def tokenizer():
    from agentrl.rollout.model import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.mark.parametrize(
    ("rows", "prefix", "tail"),
    [(6, 60, 20), (2, 40, 50), (1, 30, 10), (5, 10, 40)],
    ids=[
        "tree: shared-prefix attention",
        "pair: the prefix's cache copied",
        "one row",
        "short prefix: plain pass",
    ],
)
def test_starting_at_the_lowest_trained_block_gives_the_full_forwards_logprobs_and_gradients(
    four_blocks, rows, prefix, tail
):
    freeze_below(four_blocks, 2)
    policy = Policy(four_blocks, temperature=0.7)
    policy.start_layer = 2
    policy.train()
    g = torch.Generator().manual_seed(rows)
    shared = torch.randint(100, 1000, (prefix,), generator=g)
    ids = torch.stack(
        [torch.cat([shared, torch.randint(100, 1000, (tail,), generator=g)]) for _ in range(rows)]
    )
    attention = torch.ones_like(ids)
    attention[-1, -5:] = 0  # a shorter row, right-padded
    loss_mask = torch.zeros(ids.shape)
    loss_mask[:, prefix:] = 1
    loss_mask[-1, -5:] = 0
    start = block_input(four_blocks, ids, layer=2, attention=attention)
    results = []
    for given in (None, start):
        four_blocks.zero_grad(set_to_none=True)
        out = policy(ids, attention, loss_mask, start=given)
        (out.logp * loss_mask).sum().backward()
        grads = [p.grad.clone() for p in four_blocks.parameters() if p.requires_grad]
        results.append((out.logp.detach(), out.entropy.detach(), grads))
    (logp, ent, grads), (logp2, ent2, grads2) = results
    assert logp.abs().sum() > 0 and all(g.abs().sum() > 0 for g in grads)
    torch.testing.assert_close(logp2, logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent2, ent, atol=1e-5, rtol=1e-5)
    for a, b in zip(grads2, grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def config_with(**train):
    config = RunConfig()
    config = dataclasses.replace(
        config, rollout=dataclasses.replace(config.rollout, prefix_cache_tokens=4096)
    )
    return dataclasses.replace(config, train=dataclasses.replace(config.train, **train))


def test_auto_resolves_on_where_it_holds_and_says_why_not_elsewhere(four_blocks):
    on, line = frozen.resolve(config_with(trainable_layers=2), four_blocks, lora=False, sampler_dtype="model")
    assert on and line.startswith("learner: starts at block 3 of 4") and "auto" in line
    cases = [
        (config_with(trainable_layers=0), {}, "every block trains"),
        (config_with(trainable_layers=4), {}, "every block trains"),
        (config_with(trainable_layers=2), {"lora": True}, "LoRA"),
        (config_with(trainable_layers=2), {"sampler_dtype": "bfloat16"}, "rollout.sampler_dtype"),
        (config_with(trainable_layers=2, engine="deepspeed"), {}, "train.engine=torch"),
    ]
    for config, given, why in cases:
        options = {"lora": False, "sampler_dtype": "model", **given}
        on, line = frozen.resolve(config, four_blocks, **options)
        assert not on and why in line and "auto" in line
        forced = dataclasses.replace(
            config, train=dataclasses.replace(config.train, reuse_sampler_hidden=True)
        )
        with pytest.raises(ConfigError, match="train.reuse_sampler_hidden") as err:
            frozen.resolve(forced, four_blocks, **options)
        assert why in str(err.value)
    off = dataclasses.replace(config_with(trainable_layers=2).train, reuse_sampler_hidden=False)
    assert frozen.resolve(dataclasses.replace(RunConfig(), train=off), four_blocks, lora=False,
                          sampler_dtype="model") == (False, "learner: runs every block (train.reuse_sampler_hidden=false, as set)")  # fmt: skip


def test_a_misspelt_setting_fails_naming_it():
    with pytest.raises(ConfigError, match="train.reuse_sampler_hidden"):
        config_with(reuse_sampler_hidden="yes").validate()


@pytest.fixture(scope="module")
def four_block_dir(tmp_path_factory, tokenizer):
    from agentrl.rollout.model import tiny_model

    path = tmp_path_factory.mktemp("four-blocks")
    tiny_model(tokenizer, layers=4, hidden=32, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_through_agentrl_train_the_step_equals_one_that_runs_every_block(four_block_dir, tmp_path):
    """The quickstart's recipe CI-sized, trees of 4 and the top 2 of 4 blocks trained: with the
    sampler's states the learner started every micro-batch from them, and the step's rollout and
    update are the run's that recomputes the frozen blocks (same samples; loss and gradient norm to
    float rounding)."""
    steps = {}
    for reuse in ("auto", "false"):
        out = tmp_path / reuse
        proc = agentrl_train(str(QUICKSTART), f"model.name={four_block_dir}", *SHORT, "train.num_threads=1",
                             "rollout.tasks_per_step=2", "rollout.branches=3", "rollout.max_new_tokens=24",
                             "algo.entropy_coef=0.01",  # a gradient whatever the random model's rewards
                             f"train.reuse_sampler_hidden={reuse}", f"train.out_dir={out}")  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        said = [x for x in proc.stdout.splitlines() if x.startswith("learner: ")]
        step = {}
        for record in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()):
            if record["step"] == 1:
                step.update(record)
        steps[reuse] = (said, step, (out / "resolved_config.yaml").read_text())
    said, step, resolved = steps["auto"]
    assert any(
        x.startswith("learner: starts at block 3 of 4 from the states the sampler computed") for x in said
    )
    assert "reuse_sampler_hidden: true" in resolved
    assert step["perf/learner_from_sampler"] == 1.0
    said_off, base, resolved_off = steps["false"]
    assert "learner: runs every block (train.reuse_sampler_hidden=false, as set)" in said_off
    assert "reuse_sampler_hidden: false" in resolved_off and "perf/learner_from_sampler" not in base
    assert (
        step["env/reward"] == base["env/reward"]
        and step["rollout/sampled_tokens"] == base["rollout/sampled_tokens"]
    )
    assert step["loss/grad_norm"] > 0
    for key in ("loss/pg_loss", "loss/grad_norm", "loss/entropy", "loss/ratio_max"):
        assert step[key] == pytest.approx(base[key], rel=1e-4, abs=1e-6), key
