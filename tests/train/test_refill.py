"""algo.refill_rounds: DAPO's over-sampling refills the groups dynamic sampling drops."""

from __future__ import annotations

import json

import pytest
import torch
from train_helpers import config, episodes

from agentrl.cli import train_main as main
from agentrl.errors import ConfigError
from agentrl.rollout.runner import RunStats
from agentrl.train.engines import _EngineBase
from agentrl.train.progress import RunProgress
from agentrl.train.step import Draw, Sampling, TaskSampler


class ScriptedRollouts:
    """Stands in for the env + generator: each ``run`` returns the next scripted round, one group
    per task, with the given outcomes; records what it was asked for."""

    def __init__(self, rounds: list[list[list[int]]]):
        self.rounds, self.calls = list(rounds), []
        self.train_tasks = [{"id": f"task{i}"} for i in range(100)]

    def run(self, tasks, *, seed, version, group_size, on_episode=None, branches=0):
        outcomes = self.rounds.pop(0)
        assert len(outcomes) == len(tasks)
        self.calls.append({"tasks": [t["id"] for t in tasks], "seed": seed, "version": version})
        eps = episodes(n_groups=len(tasks), group_size=group_size, seed=len(self.calls))
        for g, group in enumerate(outcomes):
            for i, outcome in enumerate(group):
                ep = eps[g * group_size + i]
                ep.outcome, ep.group_id, ep.task_id = float(outcome), f"{tasks[g]['id']}:{g}", tasks[g]["id"]
                for turn in ep.turns:
                    turn.void = False
        # a round of 10 s, 4 of them generating (40 % busy), one failure per round
        return eps, RunStats(episodes=len(eps), failed=1, wall_s=10.0, generate_busy_s=4.0, generate_calls=2)


def _refill(script, first, *overrides):
    cfg = config("algo.dynamic_sampling=true", "rollout.tasks_per_step=2", "rollout.group_size=2", *overrides)
    rollouts, sampler = ScriptedRollouts(script), TaskSampler(100, seed=0)
    sampler.next(2)  # the step's first draw, as the trainer makes it
    first_eps, first_run = ScriptedRollouts([first]).run([{"id": "a"}, {"id": "b"}], seed=0, version=0, group_size=2)
    sampling = Sampling(cfg, rollouts, sampler, _EngineBase(), RunProgress(None, enabled=False))
    out = sampling.refill(Draw.filtered(first_eps, first_run, cfg), step=4, tag="step 5/6")
    return out.episodes, out.kept, out.stats, out.run, rollouts, sampler


def test_refill_stops_when_the_step_is_full_and_trains_on_the_first_groups():
    # first draw: one informative group of 2; round 1: none; round 2: two (only one is needed)
    episodes_, kept, stats, run_stats, rollouts, sampler = _refill(
        [[[0, 0], [1, 1]], [[1, 0], [0, 1]], [[1, 0], [0, 1]]], [[1, 0], [0, 0]], "algo.refill_rounds=5"
    )
    assert len(rollouts.calls) == 2  # stopped as soon as 2 groups were informative; round 3 never ran
    assert len(rollouts.rounds) == 1
    assert len(episodes_) == 3 * 2 * 2  # every sampled episode is returned (metrics, saved episodes)
    groups = list(dict.fromkeys(ep.group_id for ep in kept))
    assert len(groups) == 2 and groups[0] == "a:0" and groups[1].startswith("refill2/")
    assert stats["rollout/refill_rounds"] == 2 and stats["rollout/groups_kept"] == 2
    assert stats["rollout/equal_groups_dropped"] == 1 + 2 + 0  # summed over the rounds
    # the runner's stats cover every round too (the first draw and two refills: 3 x 4 episodes)
    run = run_stats.as_metrics()
    assert run["rollout/episodes"] == 12 and run["rollout/failed"] == 3 and run["perf/rollout_wall_s"] == 30.0
    assert run["rollout/episodes_per_s"] == pytest.approx(12 / 30) and run["rollout/generator_idle_share"] == pytest.approx(0.6)
    # each round draws new tasks from the sampler, with its own rollout seed
    assert sampler.cursor == 2 + 2 * 2
    assert rollouts.calls[0]["tasks"] != rollouts.calls[1]["tasks"]
    assert rollouts.calls[0]["seed"] != rollouts.calls[1]["seed"] and rollouts.calls[0]["version"] == 4


def test_refill_gives_up_after_refill_rounds():
    episodes_, kept, stats, run_stats, rollouts, sampler = _refill(
        [[[0, 0], [0, 0]]] * 2, [[0, 0], [1, 1]], "algo.refill_rounds=2"
    )
    assert kept == [] and len(episodes_) == 12 and len(rollouts.calls) == 2
    assert stats["rollout/refill_rounds"] == 2 and stats["rollout/groups_kept"] == 0
    assert run_stats.episodes == 12 and run_stats.wall_s == 30.0


def test_refill_needs_dynamic_sampling_and_a_non_negative_count():
    with pytest.raises(ConfigError, match="algo.refill_rounds") as err:
        config("algo.refill_rounds=2").validate()
    assert "dynamic_sampling=true" in str(err.value)
    with pytest.raises(ConfigError, match="algo.refill_rounds"):
        config("algo.dynamic_sampling=true", "algo.refill_rounds=-1").validate()


@pytest.mark.slow
def test_refill_through_agentrl_train(tiny_model_dir, tmp_path):
    """The tiny random model fails every task, so every group is dropped and every refill round runs:
    the step samples (1 + refill_rounds) x tasks_per_step tasks, saves them all and trains on none."""
    from test_trainer import TINY_RUN

    out = tmp_path / "run"
    args = [f"model.name={tiny_model_dir}", *TINY_RUN, "algo.kl_coef=0", "algo.dynamic_sampling=true",
            "algo.refill_rounds=2", "train.steps=1", "train.save_episodes=true", f"train.out_dir={out}"]  # fmt: skip
    assert main(None, args) == 0
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in records if "perf/step_s" in r)
    assert step["rollout/refill_rounds"] == 2 and step["rollout/groups_kept"] == 0
    assert step["rollout/equal_groups_dropped"] == 3  # one group of 2 per round, all failed
    assert step["rollout/episodes"] == 3 * 2  # the runner's counts cover every round, not the first only
    assert "loss/loss" not in step  # nothing informative: no update
    saved = (out / "episodes" / "step-000001.jsonl").read_text().splitlines()
    assert len(saved) == 3 * 2
    assert len({json.loads(x)["group_id"] for x in saved}) == 3
    state = torch.load(out / "checkpoints" / "step-000001" / "trainer-rank0.pt", weights_only=False)
    assert state["trainer"]["sampler"]["cursor"] == 3  # the task sampler moved on by every round's task
    assert "refill_rounds: 2" in (out / "resolved_config.yaml").read_text()


def _any_rank_worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from agentrl.train.step import _any_rank

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        # only rank 1 is short of groups: both ranks must refill, so their task samplers stay in step
        engine = _EngineBase()  # the engines' all-reduce, without a policy
        torch.save([_any_rank(engine, rank == 1), _any_rank(engine, False)], f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_every_rank_refills_while_any_rank_is_short(tmp_path):
    import os

    import torch.multiprocessing as mp

    port = 29700 + os.getpid() % 200
    mp.spawn(_any_rank_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    assert [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)] == [[True, False], [True, False]]
