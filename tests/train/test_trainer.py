"""The training loop end to end: a tiny random model (fast, exact resume) and SmolLM2 (slow)."""

from __future__ import annotations

import json

import pytest
import torch

from agentrl.cli import train_main as main
from agentrl.train.trainer import TaskSampler, compare_evals

TINY_RUN = [
    "env.id=agentrl/Search-v0", "env.max_turns=2", "env.max_obs_chars=300", "env.kwargs={hops: single}",
    "rollout.group_size=2", "rollout.tasks_per_step=1", "rollout.max_new_tokens=8", "rollout.concurrency=1",
    "rollout.max_context_tokens=1024",
    "algo.entropy_coef=0.05", "algo.kl_coef=0.01", "train.lr=1e-3", "train.minibatch_size=2", "train.micro_batch_size=1",
    "train.eval_episodes=1", "train.num_threads=1", "train.seed=3",
    "train.bf16_autocast=false",  # not auto: runs compared for exact equality need one precision
]  # fmt: skip


def _weights(out_dir):
    state = torch.load(out_dir / "checkpoints" / "step-000003" / "engine.pt", weights_only=False)
    return state["policy"]


@pytest.mark.slow
def test_resume_after_kill_equals_uninterrupted_run(tiny_model_dir, tmp_path):
    common = [f"model.name={tiny_model_dir}", *TINY_RUN]
    assert main(None, [*common, "train.steps=3", f"train.out_dir={tmp_path / 'a'}"]) == 0
    # "killed" after step 2: a run that stopped there, then the same command with steps=3 resumes
    assert main(None, [*common, "train.steps=2", f"train.out_dir={tmp_path / 'b'}"]) == 0
    assert main(None, [*common, "train.steps=3", f"train.out_dir={tmp_path / 'b'}"]) == 0
    straight, resumed = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert straight.keys() == resumed.keys()
    initial = _initial(tiny_model_dir)
    assert any(not torch.equal(straight[k], initial[k]) for k in straight if k in initial), "nothing trained"
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key
    records = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in records if "perf/step_s" in r}) == [1, 2, 3]


@pytest.mark.slow
def test_igpo_with_bf16_autocast_trains_through_the_loop(tiny_model_dir, tmp_path):
    """IGPO reads gold-answer confidences (one cached pass per episode) and the update runs in bf16."""
    out = tmp_path / "igpo"
    args = [f"model.name={tiny_model_dir}", *TINY_RUN, "algo.advantage=igpo", "algo.dynamic_sampling=false",
            "train.bf16_autocast=true", "train.steps=1", f"train.out_dir={out}"]  # fmt: skip
    assert main(None, args) == 0
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in records if "perf/step_s" in r)
    assert step["rollout/advantage_abs"] > 0 and step["perf/scoring_s"] > 0
    assert torch.isfinite(torch.tensor(step["loss/loss"]))


def _initial(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return {f"model.{k}": v for k, v in model.state_dict().items()}


def test_task_sampler_walks_permutations_and_resumes():
    sampler = TaskSampler(5, seed=1)
    first = sampler.next(3) + sampler.next(3)
    assert sorted(first[:5]) == [0, 1, 2, 3, 4]  # one full epoch before any repeat
    state = sampler.state()
    again = TaskSampler(5, seed=1, **state)
    assert again.next(4) == sampler.next(4)


def test_bad_config_returns_2(capsys):
    assert main(None, ["algo.advantage=nope"]) == 2
    assert "algo.advantage" in capsys.readouterr().err


@pytest.mark.slow
def test_quickstart_smollm2_trains_end_to_end(tmp_path):
    """A few real steps of the quickstart recipe (SmolLM2-135M, search env, warm-up then RL)."""
    out = tmp_path / "run"
    overrides = [
        "train.steps=2", "train.sft_warmup_steps=1", "train.sft_demos=4", "train.sft_batch_size=2",
        "train.eval_episodes=2", "rollout.tasks_per_step=1", "rollout.group_size=2", "rollout.branches=1",
        "rollout.max_new_tokens=40",
        "env.max_turns=4", "train.minibatch_size=2", "train.micro_batch_size=2", "train.trainable_layers=2",
        "algo.dynamic_sampling=false",  # an all-zero group must still go through the learner here
        f"train.out_dir={out}",
    ]  # fmt: skip
    assert main("configs/quickstart.yaml", overrides) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert 0.0 <= summary["success_before"] <= 1.0 and 0.0 <= summary["success_after"] <= 1.0
    assert summary["eval_episodes"] == 2 and summary["gained"] + summary["lost"] <= 2
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "perf/step_s" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all("loss/loss" in r and r["perf/learner_s"] > 0 for r in steps)
    assert (out / "curve.png").stat().st_size > 1000
    assert (out / "checkpoints" / "latest").read_text() == "step-000002"


def test_filters_drop_void_turn_trajectories_and_equal_groups():
    from train_helpers import config, episodes

    from agentrl.train.step import filter_episodes

    eps = episodes(n_groups=3, group_size=3, seed=1)
    for ep, outcome in zip(eps, [1, 1, 1, 1, 0, 0, 1, 0, 1], strict=True):
        ep.outcome = float(outcome)
        for turn in ep.turns:
            turn.void = False
    eps[5].turns[0].void = True  # g1 keeps [1, 0] after the void trajectory goes (SimpleTIR)
    eps[7].error = "boom"  # g2 keeps [1, 1] after the failed one goes: all equal -> dropped (DAPO)
    cfg = config("algo.dynamic_sampling=true", "algo.drop_void_turns=true", "rollout.group_size=3")
    kept, stats = filter_episodes(eps, cfg)
    assert [ep.episode_id for ep in kept] == [eps[3].episode_id, eps[4].episode_id]
    assert stats["rollout/failed"] == 1 and stats["rollout/void_dropped"] == 1
    kept, _ = filter_episodes(eps, config())  # filters off: only the failed episode goes
    assert len(kept) == 8


def test_compare_evals_counts_flips_and_gives_the_exact_sign_test():
    before = {"a": 1.0, "b": 0.0, "c": 0.0, "d": 1.0, "e": 0.0, "f": 0.0}
    after = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0, "e": 1.0, "f": 0.0, "extra": 1.0}  # extra: not paired
    out = compare_evals(before, after)
    # b, c, e gained; d lost: P(X <= 1 | n=4, 1/2) = 5/16, two-sided 10/16
    assert out == {"success_before": 2 / 6, "success_after": 4 / 6, "eval_episodes": 6, "gained": 3, "lost": 1,
                   "p_value": 0.625}  # fmt: skip
    six = compare_evals({str(i): 0.0 for i in range(6)}, {str(i): 1.0 for i in range(6)})
    assert (six["gained"], six["lost"], six["p_value"]) == (6, 0, 2 / 64)
    assert compare_evals(before, before)["p_value"] == 1.0
    partial = compare_evals({"a": 0.0}, {"a": 0.5})  # partial credit (F1 rewards) is not a solved task
    assert (partial["gained"], partial["success_after"]) == (0, 0.5)


def test_the_trainer_can_be_walked_step_by_step(tiny_model_dir, tmp_path):
    """``Trainer``: setup (the config resolved once: nothing auto or unset left), step(i) -> the
    step's metrics with the state moved on, finish -> the summary ``agentrl train`` writes."""
    from agentrl.config import load_config
    from agentrl.train.trainer import Trainer

    out = tmp_path / "run"
    given = load_config(None, [f"model.name={tiny_model_dir}", *TINY_RUN, "train.steps=1", f"train.out_dir={out}"])
    trainer = Trainer(given)
    trainer.setup()
    config = trainer.config
    assert config.train.sft_temperature == config.rollout.temperature  # unset: the sampler's
    assert isinstance(config.train.bf16_autocast, bool) and config.rollout.prefix_cache_tokens is not None
    assert trainer.state.step == 0 and trainer.state.eval_before is not None  # evaluated before RL
    metrics = trainer.step(0)
    assert "perf/step_s" in metrics and "loss/loss" in metrics and trainer.state.step == 1
    summary = trainer.finish()
    assert summary["steps"] == 1 and (out / "summary.json").exists() and (out / "checkpoints").exists()
