"""Exact resume: a run killed after step k and resumed ends with the same weights as one never stopped."""

from __future__ import annotations

import random

import torch
from train_helpers import config, episodes, step_data, tiny_lm

from agentrl.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from agentrl.train.engines import TorchEngine
from agentrl.train.learner import Policy
from agentrl.train.metrics import MetricsLogger
from agentrl.train.update import compute_advantages, ppo_update

CFG = config("train.minibatch_size=4", "train.micro_batch_size=2", "train.warmup_steps=3")


def _run(out_dir, steps: int, *, stop_after: int | None = None) -> dict[str, torch.Tensor]:
    """A miniature training loop whose data come from the global RNGs (like task sampling)."""
    random.seed(0)
    torch.manual_seed(0)
    policy = Policy(tiny_lm(seed=5))
    engine = TorchEngine(policy, lr=1e-2, warmup_steps=3)
    start, state = 0, {"seen": []}
    found = latest_checkpoint(out_dir)
    if found is not None:
        start, state = load_checkpoint(found, engine)
    for step in range(start, steps):
        eps = episodes(seed=random.randrange(10**6))  # "data position" lives in the RNG state
        noise = torch.rand(1).item()  # any torch draw must also line up after resume
        state["seen"].append(eps[0].segments[0].prompt_ids[0] + noise)
        sd = step_data(engine, eps, CFG)
        adv, returns, batch = compute_advantages(sd)
        ppo_update(engine, sd, batch, adv, returns, None, rng=torch.Generator().manual_seed(step))
        save_checkpoint(out_dir, step + 1, engine, state)
        if stop_after is not None and step + 1 == stop_after:
            return {}
    return {**{k: v.clone() for k, v in policy.state_dict().items()}, "seen": torch.tensor(state["seen"])}


def test_resume_after_kill_matches_uninterrupted(tmp_path):
    straight = _run(tmp_path / "a", 4)
    _run(tmp_path / "b", 4, stop_after=2)
    assert latest_checkpoint(tmp_path / "b").name == "step-000002"
    resumed = _run(tmp_path / "b", 4)
    assert straight.keys() == resumed.keys()
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key


def test_half_written_checkpoint_is_ignored(tmp_path):
    policy = Policy(tiny_lm())
    engine = TorchEngine(policy, lr=1e-3)
    save_checkpoint(tmp_path, 1, engine, {})
    (tmp_path / "checkpoints" / ".tmp-step-000002").mkdir()  # a save killed midway
    assert latest_checkpoint(tmp_path).name == "step-000001"


def test_metrics_logger_writes_jsonl_tensorboard_and_png(tmp_path):
    logger = MetricsLogger(tmp_path)
    for step in range(3):
        logger.log(step, {"env/reward": 0.1 * step, "loss/policy": 1.0 - step})
    png = logger.plot()
    logger.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3 and '"env/reward": 0.2' in lines[2]
    assert png is not None and png.stat().st_size > 1000
    assert list((tmp_path / "tb").glob("events.*"))
    resumed = MetricsLogger(tmp_path, resume=True, tensorboard=False)
    resumed.truncate(1)
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
