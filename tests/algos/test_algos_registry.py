"""Registry entries and the uniform ``from_batch`` calling convention; shaping helpers; import cost."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import agentrl.algos as algos
from agentrl.algos import advantages as A
from agentrl.algos import losses as Lo
from agentrl.algos import shaping
from agentrl.errors import ConfigError
from agentrl.registry import ADVANTAGES, KL_ESTIMATORS, LOSSES

F64 = torch.float64


def test_every_entry_is_registered():
    assert set(ADVANTAGES.names()) >= {"grpo", "drgrpo", "gae", "igpo", "empg", "gigpo", "foldgrpo", "supo"}
    assert set(LOSSES.names()) >= {
        "ppo_clip", "grpo", "drgrpo", "dapo", "gspo", "turn_ppo", "foldgrpo", "foldact", "clip_bias_norm", "value",
    }  # fmt: skip
    assert set(KL_ESTIMATORS.names()) >= {"k1", "k2", "k3", "low_var_kl"}
    with pytest.raises(ConfigError, match="igpoo"):
        ADVANTAGES.get("igpoo", field="advantage")


def _batch(seed=0):
    """Two prompt groups of 2 rollouts, one row each; 2 assistant turns per row with an observation between."""
    gen = torch.Generator().manual_seed(seed)
    b, length = 4, 8
    turn_id = torch.tensor([[-1, 0, 0, -1, -1, 1, 1, -1]] * 3 + [[-1, 0, 0, 0, -1, -1, -1, -1]])
    loss_mask = turn_id >= 0
    old = torch.randn(b, length, generator=gen, dtype=F64) * 0.3
    return {
        "loss_mask": loss_mask,
        "turn_id": turn_id,
        "logp": (old + 0.1 * torch.randn(b, length, generator=gen, dtype=F64)).requires_grad_(True),
        "old_logp": old,
        "ref_logp": old + 0.05,
        "entropy": torch.rand(b, length, generator=gen, dtype=F64),
        "values": torch.randn(b, length, generator=gen, dtype=F64).requires_grad_(True),
        "old_values": torch.randn(b, length, generator=gen, dtype=F64),
        "token_rewards": torch.zeros(b, length, dtype=F64).index_put_((torch.arange(b), torch.tensor([6, 6, 6, 3])),
                                                                  torch.tensor([1.0, 0.0, 1.0, 0.5], dtype=F64)),
        "process_reward": -0.2 * (torch.rand(b, length, generator=gen) < 0.3).to(F64),
        "outcome": torch.tensor([1.0, 0.0, 1.0, 0.5], dtype=F64),
        "group_id": torch.tensor([0, 0, 1, 1]),
        "task_group": torch.tensor([0, 0, 0, 0]),  # both groups one task's trees (tree_grpo's inter-tree term)
        "row_rollout": torch.arange(b),
        "finished": torch.tensor([True, True, False, True]),
        "gt_logprob": torch.randn(b, 3, generator=gen, dtype=F64).requires_grad_(True),
        "step_reward": torch.rand(b, 2, generator=gen, dtype=F64),
        "anchor_id": torch.tensor([[1, 2], [1, 3], [1, 2], [1, 4]]),
    }  # fmt: skip


def test_estimators_from_batch_match_raw_functions():
    batch = _batch()
    mask, tid = batch["loss_mask"], batch["turn_id"]
    turn_mask = torch.tensor([[True, True]] * 3 + [[True, False]])
    outcome, group = batch["outcome"], batch["group_id"]
    expected = {
        "grpo": A.grpo(outcome, group)[:, None].expand(4, 8),
        "drgrpo": A.grpo(outcome, group, std_normalize=False)[:, None].expand(4, 8),
        "gae": A.gae(batch["token_rewards"], batch["values"], mask)[0],
        "igpo": A.to_tokens(
            A.igpo(outcome, A.info_gain(batch["gt_logprob"], turn_mask), turn_mask, group), tid
        ),
        "empg": A.to_tokens(A.empg_grpo(outcome, group, batch["entropy"], tid, mask), tid),
        "gigpo": A.to_tokens(
            A.gigpo(outcome, group, batch["step_reward"], batch["anchor_id"], turn_mask), tid
        ),
        "foldgrpo": A.foldgrpo(outcome, torch.arange(4), batch["process_reward"], group),
        "supo": A.supo(outcome, group, batch["finished"])[:, None].expand(4, 8),
    }
    for name, want in expected.items():
        adv, returns = ADVANTAGES.get(name).from_batch(batch)
        assert adv.shape == (4, 8) and not adv.requires_grad  # no graph even from inputs with grad
        torch.testing.assert_close(adv, torch.where(mask, want, torch.zeros_like(want)), rtol=0, atol=1e-12)
        assert (adv[~mask] == 0).all()
        assert (returns is not None) == (name == "gae")
    # options flow through, and the entry is callable like the raw function with its presets
    adv_g1, _ = ADVANTAGES.get("gae").from_batch(batch, gamma=0.9, lam=0.5)
    torch.testing.assert_close(
        adv_g1, A.gae(batch["token_rewards"], batch["values"], mask, gamma=0.9, lam=0.5)[0]
    )
    torch.testing.assert_close(
        ADVANTAGES.get("drgrpo")(outcome, group), A.grpo(outcome, group, std_normalize=False)
    )
    with pytest.raises(KeyError, match="process_reward"):
        ADVANTAGES.get("foldgrpo").from_batch({k: v for k, v in batch.items() if k != "process_reward"})


def test_estimator_rollout_level_broadcasts_to_rows_of_a_rollout():
    # rows 0, 1 belong to rollout 0 (main + branch); rows 2, 3 to rollouts 1, 2
    batch = _batch()
    batch["row_rollout"] = torch.tensor([0, 0, 1, 2])
    batch["outcome"] = torch.tensor([1.0, 0.0, 0.0], dtype=F64)
    batch["group_id"] = torch.tensor([0, 0, 0])
    adv, _ = ADVANTAGES.get("grpo").from_batch(batch)
    per_rollout = A.grpo(batch["outcome"], batch["group_id"])
    assert torch.equal(adv[0][batch["loss_mask"][0]], per_rollout[0].expand(4))
    assert torch.equal(adv[1][batch["loss_mask"][1]], per_rollout[0].expand(4))
    assert torch.equal(adv[3][batch["loss_mask"][3]], per_rollout[2].expand(3))


def test_losses_from_batch_match_raw_functions():
    batch = _batch()
    adv, returns = ADVANTAGES.get("gae").from_batch(batch)
    args = (batch["logp"], batch["old_logp"], adv, batch["loss_mask"])
    cases = {
        "ppo_clip": Lo.ppo_clip(*args),
        "dapo": Lo.ppo_clip(*args, clip_high=0.28),
        "grpo": Lo.ppo_clip(*args, agg="seq-mean-token-mean"),
        "drgrpo": Lo.ppo_clip(*args, agg="constant"),
        "gspo": Lo.ppo_clip(
            *args, ratio="sequence", clip_low=3e-4, clip_high=4e-4, agg="seq-mean-token-mean"
        ),
        "turn_ppo": Lo.ppo_clip(*args, ratio="turn", turn_id=batch["turn_id"]),
        "clip_bias_norm": Lo.clip_bias_norm(*args),
    }
    for name, (want, _) in cases.items():
        got, metrics = LOSSES.get(name).from_batch(batch, adv)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        assert all(isinstance(v, float) for v in metrics.values())
    with pytest.raises(KeyError, match="token_kind"):
        LOSSES.get("foldact").from_batch(batch, adv)
    # token kinds are Source codes (MODEL 1 action, SUMMARY 3, TOOL 2) in the raw function too
    source = torch.where(batch["loss_mask"], 1, 2)
    source[0, 1:3] = 3  # a summary turn
    fa_batch = batch | {"token_kind": source, "full_ctx_logp": batch["old_logp"]}
    loss_fa, metrics_fa = LOSSES.get("foldact").from_batch(fa_batch, adv)
    torch.testing.assert_close(loss_fa, Lo.foldact(*args, source, batch["old_logp"])[0])
    assert metrics_fa["summary_tokens"] == 2 and metrics_fa["action_tokens"] == batch["loss_mask"].sum() - 2
    # TokenBatch names are not objective names: only the producers in agentrl.train.fields rename
    tb_batch = {k: v for k, v in fa_batch.items() if k != "old_logp"} | {"old_logprobs": batch["old_logp"]}
    with pytest.raises(KeyError, match="'old_logp'"):
        LOSSES.get("foldact").from_batch(tb_batch, adv)
    vloss, _ = LOSSES.get("value").from_batch(batch, returns, clip=0.2)
    torch.testing.assert_close(
        vloss, Lo.value_loss(batch["values"], batch["old_values"], returns, batch["loss_mask"], clip=0.2)[0]
    )
    k3 = KL_ESTIMATORS.get("low_var_kl")(batch["logp"], batch["ref_logp"], mask=batch["loss_mask"])
    torch.testing.assert_close(
        k3, algos.kl.kl(batch["logp"], batch["ref_logp"], "k3", mask=batch["loss_mask"])
    )


def test_import_is_torch_only():
    code = "import sys, agentrl.algos; print(any(m in sys.modules for m in ('transformers', 'peft', 'deepspeed')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_shaping_helpers():
    # DAPO soft overlong: max 20, cache 4 -> soft band starts at 16: len 18 -> (16 - 18)/4 = -0.5; 20 -> -1
    pen = shaping.overlong_penalty(torch.tensor([10, 16, 18, 20, 21]), max_len=20, cache_len=4)
    assert pen.tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]
    with pytest.raises(ValueError, match="cache_len"):
        shaping.overlong_penalty(torch.tensor([1]), max_len=4, cache_len=8)
    # dynamic sampling keeps groups with 0 < #correct < G
    keep = shaping.dynamic_sampling_keep(
        torch.tensor([1.0, 1, 1, 0, 1, 0, 0, 0]), torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    )
    assert keep.tolist() == [False, False, False, True, True, True, False, False]
    rows = shaping.rollout_row_mask(torch.tensor([True, False]), torch.tensor([0, 1, 1]), torch.ones(3, 2))
    assert rows.tolist() == [[True, True], [False, False], [False, False]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_every_entry_runs_on_cuda_and_matches_cpu():
    batch = _batch()
    cuda = {k: (v.detach().cuda().requires_grad_(v.requires_grad) if v.is_floating_point() else v.cuda())
            for k, v in batch.items()}  # fmt: skip
    for name in ADVANTAGES.names():
        cpu_adv, _ = ADVANTAGES.get(name).from_batch(batch)
        gpu_adv, _ = ADVANTAGES.get(name).from_batch(cuda)
        torch.testing.assert_close(gpu_adv.cpu(), cpu_adv, rtol=0, atol=1e-9)
    adv_cpu, ret_cpu = ADVANTAGES.get("gae").from_batch(batch)
    adv_gpu, ret_gpu = ADVANTAGES.get("gae").from_batch(cuda)
    for name in ("ppo_clip", "turn_ppo", "gspo", "drgrpo", "clip_bias_norm"):
        want, _ = LOSSES.get(name).from_batch(batch, adv_cpu)
        got, _ = LOSSES.get(name).from_batch(cuda, adv_gpu)
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=1e-9)
    got, _ = LOSSES.get("value").from_batch(cuda, ret_gpu)
    torch.testing.assert_close(
        got.cpu(), LOSSES.get("value").from_batch(batch, ret_cpu)[0], rtol=0, atol=1e-9
    )


def test_supo_unfinished_rollout_rows_contribute_exactly_zero():
    # rollout 1 (rows 1, 2: two summary segments) hit the limit unfinished: its rows leave the loss
    # mask, so neither the policy loss nor the KL term sends it any gradient
    batch = _batch(3)
    row_rollout = torch.tensor([0, 1, 1, 2])
    finished = torch.tensor([True, False, True])
    outcome, group = torch.tensor([1.0, 0.0, 0.5], dtype=F64), torch.tensor([0, 0, 0])
    adv = A.supo(outcome, group, finished)[row_rollout][:, None].expand(4, 8)
    mask = shaping.rollout_row_mask(finished, row_rollout, batch["loss_mask"])
    logp = batch["logp"]
    loss, _ = Lo.ppo_clip(logp, batch["old_logp"], adv, mask, agg="seq-mean-token-mean", seq_id=row_rollout)
    loss = loss + 0.1 * Lo.agg_loss(algos.kl.kl(logp, batch["ref_logp"], "k3", mask=mask), mask)
    (g,) = torch.autograd.grad(loss, logp)
    assert (g[1:3] == 0).all()
    assert (g[0][batch["loss_mask"][0]] != 0).all() and (g[3][batch["loss_mask"][3]] != 0).all()
