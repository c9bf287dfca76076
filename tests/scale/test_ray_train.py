"""The user path: ``agentrl train ... env.placement=ray`` on a two-node local cluster equals local."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from agentrl.train.trainer import main

pytestmark = pytest.mark.slow  # two tiny training runs plus a cluster start on a shared 2-core machine

TINY_RUN = [
    "env.id=agentrl/Search-v0", "env.max_turns=2", "env.max_obs_chars=300", "env.kwargs={hops: single}",
    "rollout.group_size=2", "rollout.tasks_per_step=2", "rollout.max_new_tokens=8", "rollout.concurrency=2",
    "rollout.max_context_tokens=1024", "algo.dynamic_sampling=false",
    "train.lr=1e-3", "train.minibatch_size=2", "train.micro_batch_size=1",
    "train.eval_episodes=2", "train.num_threads=1", "train.seed=3", "train.steps=1",
]  # fmt: skip


def _weights(out_dir):
    (step,) = sorted((out_dir / "checkpoints").glob("step-*"))
    return torch.load(step / "engine.pt", weights_only=False)["policy"]


def _rewards(out_dir):
    records = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r.get("step"), r.get("env/reward"), r.get("eval/success")) for r in records]


def test_train_with_ray_placement_equals_local(ray_cluster, tiny_model_dir, tmp_path, caplog):
    common = [f"model.name={tiny_model_dir}", *TINY_RUN]
    assert main(None, [*common, f"train.out_dir={tmp_path / 'local'}"]) == 0
    ray_args = ["env.placement=ray", "env.num_cpus_per_env=0.25", "env.envs_per_actor=2"]
    with caplog.at_level(logging.INFO, logger="agentrl.rollout"):
        assert main(None, [*common, *ray_args, f"train.out_dir={tmp_path / 'ray'}"]) == 0
    placed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("env placement ray")]
    assert placed and "on 2 node(s)" in placed[0] and "2 env(s)/actor" in placed[0], placed
    local, remote = _weights(tmp_path / "local"), _weights(tmp_path / "ray")
    assert local.keys() == remote.keys()
    for key in local:
        assert torch.equal(local[key], remote[key]), key
    assert _rewards(tmp_path / "local") == _rewards(tmp_path / "ray")
