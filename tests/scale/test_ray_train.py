"""The user path: ``agentrl train ... env.placement=ray`` on a two-node local cluster equals local."""

from __future__ import annotations

import json
import logging
import os
import signal

import pytest
import torch

from agentrl.cli import train_main as main

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


@pytest.fixture(scope="module")
def local_run(tiny_model_dir, tmp_path_factory):
    """The tiny run with envs in this process: the reference for the Ray runs."""
    out = tmp_path_factory.mktemp("local")
    assert main(None, [f"model.name={tiny_model_dir}", *TINY_RUN, f"train.out_dir={out}"]) == 0
    return out


def test_train_with_ray_placement_equals_local(ray_cluster, tiny_model_dir, local_run, tmp_path, caplog):
    common = [f"model.name={tiny_model_dir}", *TINY_RUN]
    ray_args = ["env.placement=ray", "env.num_cpus_per_env=0.25", "env.envs_per_actor=2"]
    with caplog.at_level(logging.INFO, logger="agentrl.rollout"):
        assert main(None, [*common, *ray_args, f"train.out_dir={tmp_path / 'ray'}"]) == 0
    placed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("env placement ray")]
    assert placed and "on 2 node(s)" in placed[0] and "2 env(s)/actor" in placed[0], placed
    _assert_same_run(local_run, tmp_path / "ray")


def _assert_same_run(a, b) -> None:
    local, remote = _weights(a), _weights(b)
    assert local.keys() == remote.keys()
    for key in local:
        assert torch.equal(local[key], remote[key]), key
    assert _rewards(a) == _rewards(b)


@pytest.fixture
def kill_first_step_actor(monkeypatch):
    """Fault injection on the real path: the first remote ``step`` of a training episode (not the
    held-out eval's) SIGKILLs the env actor hosting it, then makes the call (which finds it dead)."""
    from agentrl.cluster.remote_env import RemoteEnv

    real_step = RemoteEnv.step
    killed: list[int] = []

    async def step(self, action):
        if not killed and self.task.split == "train":
            pid = self.pool.ray.get(self.handle.where.remote())["pid"]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        return await real_step(self, action)

    monkeypatch.setattr(RemoteEnv, "step", step)
    return killed


def _step_metrics(out_dir) -> dict:
    records = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    (record,) = [r for r in records if r.get("step") == 1 and "rollout/failed" in r]
    return record


def test_a_train_step_survives_an_env_actor_killed_mid_episode(
    ray_cluster, tiny_model_dir, local_run, tmp_path, caplog, kill_first_step_actor
):
    """With env.ray_lost_retries=1 the lost episode is rerun on a new actor: the run equals local."""
    ray_args = ["env.placement=ray", "env.num_cpus_per_env=0.25", "env.ray_lost_retries=1"]
    with caplog.at_level(logging.WARNING, logger="agentrl.rollout"):
        code = main(None, [f"model.name={tiny_model_dir}", *TINY_RUN, *ray_args, f"train.out_dir={tmp_path}"])
    assert code == 0 and len(kill_first_step_actor) == 1
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("retrying on a new env actor") and "EnvActorLost" in m for m in messages), (
        messages
    )
    assert _step_metrics(tmp_path)["rollout/failed"] == 0.0
    _assert_same_run(local_run, tmp_path)


def test_a_train_step_goes_on_without_an_episode_lost_with_its_actor(
    ray_cluster, tiny_model_dir, tmp_path, caplog, kill_first_step_actor
):
    """Without reruns the lost episode is recorded failed (with the cause) and the step trains on the rest."""
    ray_args = ["env.placement=ray", "env.num_cpus_per_env=0.25"]
    with caplog.at_level(logging.WARNING, logger="agentrl.rollout"):
        code = main(None, [f"model.name={tiny_model_dir}", *TINY_RUN, *ray_args, f"train.out_dir={tmp_path}"])
    assert code == 0 and len(kill_first_step_actor) == 1
    messages = [r.getMessage() for r in caplog.records]
    assert any("episode failed" in m and "EnvActorLost: env actor" in m for m in messages), messages
    assert _step_metrics(tmp_path)["rollout/failed"] == 1.0
    assert _weights(tmp_path)  # the update ran on the other episodes and was saved
