"""train.skip_zero_advantage: rows with zero advantage skip the learner pass, and the update is the same."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from test_train_cli import QUICKSTART, SHORT, agentrl_train
from train_helpers import GradCapture, config, episodes, step_data, tiny_lm

from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.train.engines import TorchEngine
from agentrl.train.learner import Policy
from agentrl.train.update import compute_advantages, ppo_update, zero_advantage_rows


def test_zero_advantage_rows_hand_computed():
    adv = torch.tensor([[0.0, 0.5, 0.0], [0.0, 0.0, 0.0], [0.3, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 0, 1], [1, 1, 1], [1, 1, 0], [0, 0, 0]])
    # row 0: its non-zero advantage sits off the mask; row 2 has one on a trained token
    assert zero_advantage_rows(adv, mask).tolist() == [True, True, False, True]
    # per rollout: rows 1 and 2 share rollout 1, so row 1 (zero itself) is forwarded with row 2
    seq = torch.tensor([0, 1, 1, 2])
    assert zero_advantage_rows(adv, mask, seq).tolist() == [True, False, False, True]


def _tied_groups(n_groups: int = 4, group_size: int = 4):
    """Episodes where groups 1 and 3 scored the same on every sample (zero GRPO advantage)."""
    eps = episodes(n_groups=n_groups, group_size=group_size, seed=5)
    for e in eps:
        if e.group_id in ("g1", "g3"):
            e.outcome = 1.0 if e.group_id == "g1" else 0.0
    return eps


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "constant"])
def test_skipped_rows_leave_the_gradient_unchanged(agg):
    """One optimizer step over the whole batch: the gradient with the skip equals the full pass's,
    up to float32 summation order (the live rows are regrouped into other micro-batches)."""
    eps = _tied_groups()
    grads, metrics = [], []
    for skip in (False, True):
        cfg = config("train.minibatch_size=16", "train.micro_batch_size=2", f"algo.agg={agg}",
                     f"train.skip_zero_advantage={str(skip).lower()}")  # fmt: skip
        engine = GradCapture(Policy(tiny_lm(seed=3)), lr=1e-2, max_grad_norm=0.0)
        step = step_data(engine, eps, cfg)
        adv, returns, batch = compute_advantages(step)
        metrics.append(ppo_update(engine, step, batch, adv, returns, None, rng=torch.Generator().manual_seed(0)))
        grads.append(engine.grads.double())
    zero = int(zero_advantage_rows(adv, step.tokens.loss_mask).sum())
    assert zero == 8  # the two tied groups of 4, one row per episode
    assert metrics[0]["skipped_rows"] == 0.0 and metrics[1]["skipped_rows"] == pytest.approx(8 / 16)
    # only the live rows' tokens were forwarded
    live = ~zero_advantage_rows(adv, step.tokens.loss_mask)
    assert metrics[1]["forwarded_loss_tokens"] == float(step.tokens.loss_mask[live].sum())
    assert metrics[0]["forwarded_loss_tokens"] == float(step.tokens.loss_mask.sum())
    n_tokens = int(step.tokens.loss_mask.sum())
    tolerance = 8 * n_tokens**0.5 * torch.finfo(torch.float32).eps  # as in test_learner's accumulation test
    assert grads[0].abs().max() > 1e-3
    error = float((grads[1] - grads[0]).norm() / grads[0].norm())
    assert error <= tolerance, (error, tolerance)


def test_a_minibatch_with_every_row_skipped_still_steps_the_optimizer():
    """Adam moves the weights on a zero gradient through its momentum; a skipped minibatch must too.

    Update 1 has signal on every row (nothing to skip), update 2 none at all (every group tied): with
    the skip no row is forwarded in update 2, and the weights after it equal the full pass's bit for bit.
    """
    signal = episodes(n_groups=2, group_size=4, seed=1)  # every group has both outcomes
    tied = _tied_groups()
    for e in tied:
        e.outcome = 1.0
    after = []
    for skip in (False, True):
        cfg = config("train.minibatch_size=4", "train.micro_batch_size=2", f"train.skip_zero_advantage={str(skip).lower()}")
        policy = Policy(tiny_lm(seed=4))
        engine = TorchEngine(policy, lr=1e-2, max_grad_norm=1.0)
        for eps in (signal, tied):
            step = step_data(engine, eps, cfg)
            adv, returns, batch = compute_advantages(step)
            before = [p.detach().clone() for p in engine.params]
            m = ppo_update(engine, step, batch, adv, returns, None, rng=torch.Generator().manual_seed(0))
        assert m["skipped_rows"] == (1.0 if skip else 0.0) and m["forwarded_loss_tokens"] == (0.0 if skip else float(step.tokens.loss_mask.sum()))
        assert any(not torch.equal(a, b) for a, b in zip(before, engine.params, strict=True))  # momentum moved them
        after.append([p.detach().clone() for p in engine.params])
    assert all(torch.equal(a, b) for a, b in zip(*after, strict=True))


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["algo.kl_coef=0.05"], "algo.kl_coef"),
        (["algo.entropy_coef=0.01"], "algo.entropy_coef"),
        (["algo.critic=true", "algo.advantage=gae"], "algo.critic"),
        (["train.engine=deepspeed"], "train.skip_zero_advantage"),
    ],
)
def test_skip_is_refused_where_zero_advantage_rows_still_act(overrides, field):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["train.skip_zero_advantage=true", *overrides])
    assert err.value.field == field
    assert "train.skip_zero_advantage=false" in err.value.fix


def test_foldact_loss_is_refused():
    from agentrl.registry import LOSSES
    from agentrl.train.plan import _check_skip_zero_advantage

    cfg = load_config(None, ["train.skip_zero_advantage=true"])
    with pytest.raises(ConfigError) as err:
        _check_skip_zero_advantage(cfg, LOSSES.get("foldact"))
    assert err.value.field == "train.skip_zero_advantage" and "foldact" in err.value.problem


@pytest.mark.slow
def test_agentrl_train_skips_exactly_the_tied_groups(tiny_model_dir, tmp_path):
    """Through ``agentrl train``: the logged skipped share is the share of saved episodes whose group
    all scored the same (one row per episode here), and the setting is saved resolved."""
    out = tmp_path / "run"
    proc = agentrl_train(str(QUICKSTART), f"model.name={tiny_model_dir}", *SHORT, "train.steps=2",
                         "rollout.group_size=2", "rollout.tasks_per_step=2", "train.minibatch_size=4",
                         "train.skip_zero_advantage=true", "train.save_episodes=true", "train.num_threads=1",
                         f"train.out_dir={out}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert yaml.safe_load((out / "resolved_config.yaml").read_text())["train"]["skip_zero_advantage"] is True
    records: dict[int, dict] = {}  # a step may log more than one record (its eval, ...)
    for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()):
        records.setdefault(r["step"], {}).update(r)
    for step in (1, 2):
        eps = [json.loads(x) for x in (out / "episodes" / f"step-{step:06d}.jsonl").read_text().splitlines()]
        eps = [e for e in eps if e.get("error") is None]  # the trainer drops failed episodes before the update
        groups: dict[str, set[float]] = {}
        for e in eps:
            groups.setdefault(e["group_id"], set()).add(e["outcome"])
        tied = sum(len([e for e in eps if e["group_id"] == g]) for g, o in groups.items() if len(o) == 1)
        assert records[step]["loss/skipped_rows"] == pytest.approx(tied / len(eps)), (step, groups)
    assert any(records[step]["loss/skipped_rows"] > 0 for step in (1, 2))  # the tiny model ties its groups
    for step in (1, 2):  # the learner line shows the loss, or the share skipped when no row was forwarded
        line = next(x for x in proc.stdout.splitlines() if x.startswith(f"step {step}/2 learner:  ") and "done in" in x)
        shown = "loss=" if "loss/loss" in records[step] else "skipped_rows=1 "
        assert shown in line and "nan" not in line, line
