"""train.sft_temperature: the warm-up's NLL is of logits / T, T chosen explicitly or resolved from
rollout.temperature; the policy's (sampler's) temperature is untouched by the warm-up."""

from __future__ import annotations

import json

import pytest
import torch
from train_helpers import episodes, tiny_lm

from agentrl.errors import ConfigError
from agentrl.train.learner import Policy
from agentrl.train.sft import sft_warmup
from agentrl.trajectory import build_batch


def _reference_nll(model, demos, temperature: float) -> float:
    """Token-mean NLL of the demonstrations' action tokens under softmax(logits / T), by hand."""
    batch = build_batch(demos, pad_id=0)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits  # [B, L, V]
    logp = torch.log_softmax(logits[:, :-1].double() / temperature, dim=-1)  # [B, L-1, V]
    token_logp = logp.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)  # [B, L-1]
    mask = batch.loss_mask[:, 1:].double()
    return float(-(token_logp * mask).sum() / mask.sum())


@pytest.mark.parametrize("temperature", [None, 1.0, 2.0])
def test_warmup_nll_is_at_the_chosen_temperature_and_the_policy_keeps_its_own(temperature):
    demos = [ep for ep in episodes(n_groups=2, group_size=3, seed=3) if ep.outcome > 0]
    batch_size = len(demos)  # one step sees every demonstration: its loss is the full-batch NLL
    model = tiny_lm(seed=1)
    policy = Policy(model, temperature=0.5, logprob_impl="naive")
    expected = _reference_nll(model, demos, 0.5 if temperature is None else temperature)
    losses = sft_warmup(policy, demos, steps=1, lr=1e-3, batch_size=batch_size, micro_batch_size=batch_size,
                        temperature=temperature)  # fmt: skip
    assert losses[0] == pytest.approx(expected, rel=1e-5)
    assert policy.temperature == 0.5  # RL ratios still compare at the sampler's temperature


def test_sft_temperature_must_be_positive():
    from train_helpers import config

    cfg = config("train.sft_temperature=0")
    with pytest.raises(ConfigError, match="train.sft_temperature"):
        cfg.train.validate("train")


def test_resolved_sft_temperature_is_printed_and_saved(tiny_model_dir, tmp_path, capsys):
    """Through `agentrl train`: unset resolves to rollout.temperature; an explicit value wins."""
    import yaml

    from agentrl.cli import train_main as main

    base = [
        f"model.name={tiny_model_dir}", "train.steps=0", "train.sft_warmup_steps=1", "train.sft_demos=2",
        "train.sft_batch_size=2", "train.micro_batch_size=2", "train.minibatch_size=2", "train.eval_episodes=1",
        "rollout.max_new_tokens=8", "rollout.temperature=0.6", "train.bf16_autocast=false",
    ]  # fmt: skip
    for extra, want in (([], 0.6), (["train.sft_temperature=1.0"], 1.0)):
        out = tmp_path / f"run{len(extra)}"
        assert main("configs/quickstart.yaml", [*base, *extra, f"train.out_dir={out}"]) == 0
        resolved = yaml.safe_load((out / "resolved_config.yaml").read_text())
        assert resolved["train"]["sft_temperature"] == want
        assert resolved["rollout"]["temperature"] == 0.6
        assert f"NLL at temperature {want:g} (train.sft_temperature)" in capsys.readouterr().out
        summary = json.loads((out / "summary.json").read_text())
        assert summary["steps"] == 0 and summary["eval_tasks"]["after"] == summary["eval_tasks"]["before"]
        # with no RL step the held-out eval runs once (its result is also the "after")
        evals = [
            r
            for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
            if "eval/success" in r
        ]
        assert len(evals) == 1 and evals[0]["step"] == 0
