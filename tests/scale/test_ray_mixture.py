"""A mixture of env families trained with ``env.placement=ray`` (issue #43): ``agentrl train`` of
search + SQL on a two-node local cluster, each family pinned to its own node by its entry's
``ray_resources``, gives the run local placement gives (same seed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

pytestmark = pytest.mark.slow  # a cluster start and two tiny training runs on a shared 2-core machine

REPO = Path(__file__).resolve().parents[2]

# search (weight 2) and SQL (weight 1), CI-sized: a one-block random model, a warm-up on one oracle
# demonstration per env (the tools run: retrieval, SQL queries in the node's sandbox pool), 2 RL steps of
# 3 tasks (2 search, 1 sql) x 2 samples, 2 held-out tasks per env before and after
CI_MIXTURE = {
    "env": {
        "mixture": [
            {"id": "agentrl/Search-v0", "name": "search", "weight": 2, "max_turns": 3, "kwargs": {"hops": "single"},
             "train_tasks": 4, "eval_episodes": 2, "oracle": "agentrl.envs.search.oracle:SearchOracle"},
            {"id": "agentrl/SQLShop-v0", "name": "sql", "weight": 1, "max_turns": 4, "train_tasks": 2,
             "eval_episodes": 2, "oracle": "agentrl.envs.sql.oracle:SQLOracle"},
        ],
        "filter_window": 1, "filter_cooldown": 2,
    },
    "rollout": {"group_size": 2, "tasks_per_step": 3, "concurrency": 6, "max_new_tokens": 16,
                "max_context_tokens": 1536, "tool_schemas": False},
    "algo": {"dynamic_sampling": False},
    "train": {"steps": 2, "sft_warmup_steps": 1, "sft_demos": 2, "sft_batch_size": 1, "micro_batch_size": 2,
              "minibatch_size": 6, "resume": False, "trainable_layers": 1, "num_threads": 1, "bf16_autocast": False,
              "save_episodes": True, "eval_episodes": 5, "seed": 3},
}  # fmt: skip

# every env actor 0.02 CPU (2 episodes), so the 2-CPU cluster holds them all; each family needs its node's label
RAY = ["env.placement=ray", "env.num_cpus_per_env=0.01", "env.envs_per_actor=2",
       "env.0.ray_resources={searchnode: 0.1}", "env.1.ray_resources={sqlnode: 0.1}"]  # fmt: skip


@pytest.fixture(scope="module")
def family_nodes(cluster_of_two):
    """Two nodes, one per family: the head (1 CPU) labelled ``searchnode``, the other (1 CPU) ``sqlnode``.
    Only the processes this fixture started are stopped (never ``ray stop``)."""
    with cluster_of_two({"searchnode": 1}, {"sqlnode": 1}) as cluster:
        yield cluster


def _train(out: Path, config: Path, model: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """``agentrl train`` in a subprocess (as tests/train/test_train_cli.py's ``agentrl_train``)."""
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", str(config), f"model.name={model}",
         f"train.out_dir={out}", *overrides],
        capture_output=True, text=True, timeout=900, cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _env_actors(ray) -> list[tuple[dict[str, float], str]]:
    """Every env actor another job (the ``agentrl train`` subprocess) made on the cluster, alive or
    dead: the resources it was created with and its node. From the GCS actor table (the public state
    API needs the dashboard, which these clusters leave out)."""
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    me = ray.get_runtime_context().get_job_id()
    actors = [
        gcs_pb2.ActorTableData.FromString(raw)
        for raw in state._connect_and_get_accessor().get_actor_table(None, None)
    ]
    return [(dict(a.required_resources), a.address.node_id.hex())
            for a in actors if a.class_name == "EnvHost" and a.job_id.hex() != me]  # fmt: skip


def _node_with(ray, label: str) -> str:
    (node,) = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and label in n["Resources"]]
    return node


def _records(out: Path) -> list[dict]:
    """metrics.jsonl without what measures time or memory (seconds, rates, RSS)."""
    timed = ("perf/", "rollout/episodes_per_s", "rollout/tokens_per_s", "rollout/turns_per_s",
             "rollout/generator_idle_share")  # fmt: skip
    return [{k: v for k, v in json.loads(x).items() if not k.startswith(timed) and not k.endswith("env_s")}
            for x in (out / "metrics.jsonl").read_text().splitlines()]  # fmt: skip


def _episodes(path: Path) -> list[tuple]:
    """Each episode's task, group, outcome and every token the policy sampled."""
    episodes = [json.loads(x) for x in path.read_text().splitlines()]
    return [(e["task_id"], e["group_id"], e["outcome"], [t["output_ids"] for s in e["segments"] for t in s["turns"]])
            for e in episodes]  # fmt: skip


def _weights(out: Path) -> dict:
    (step,) = sorted((out / "checkpoints").glob("step-*"))
    return torch.load(step / "engine.pt", weights_only=False)["policy"]


def test_a_mixture_trains_on_ray_with_each_family_on_its_node_as_it_does_locally(
    family_nodes, tiny_model_dir, tmp_path
):
    import ray

    config = tmp_path / "ci-mixture.yaml"
    config.write_text(yaml.safe_dump(CI_MIXTURE))
    local = tmp_path / "local"
    _train(local, config, tiny_model_dir)
    remote = tmp_path / "ray"
    proc = _train(remote, config, tiny_model_dir, *RAY, f"env.ray_address={family_nodes.address}")

    # the episodes ran in env actors on the cluster, each family's on the node its ray_resources names
    actors = _env_actors(ray)
    search_node, sql_node = _node_with(ray, "searchnode"), _node_with(ray, "sqlnode")
    assert search_node != sql_node
    search = [node for resources, node in actors if resources.get("searchnode") == 0.1]
    sql = [node for resources, node in actors if resources.get("sqlnode") == 0.1]
    assert search and sql and len(search) + len(sql) == len(actors), actors
    assert set(search) == {search_node} and set(sql) == {sql_node}, actors
    assert all(resources["CPU"] == pytest.approx(0.02) for resources, _ in actors), actors  # 0.01 x 2 envs
    resolved = yaml.safe_load((remote / "resolved_config.yaml").read_text())["env"]
    assert (resolved["placement"], resolved["ray_address"]) == ("ray", family_nodes.address)
    assert [e["ray_resources"] for e in resolved["mixture"]] == [{"searchnode": 0.1}, {"sqlnode": 0.1}]

    # the placement is sized to the cluster before any actor is made, and said (one line per actor pool)
    placed = [x for x in proc.stderr.splitlines() if x.startswith("[ray] ") and "episode(s) at once" in x]
    assert placed and all("they fit" in x for x in placed), proc.stderr[-3000:]
    # both oracles solved their task in the remote envs (retrieval; SQL queries in the sql node's pool)
    assert "warm-up demonstrations:  episode 2/2  success=1" in proc.stdout, proc.stdout
    # per-env metrics for each family every RL step; held-out eval per env before and after
    records = _records(remote)
    steps = {r["step"]: r for r in records if "mix/search/tasks" in r}
    assert sorted(steps) == [1, 2]
    for record in steps.values():
        assert (record["mix/search/tasks"], record["mix/sql/tasks"]) == (2.0, 1.0)
        for name in ("search", "sql"):
            for key in ("reward", "success", "turns", "tokens", "tool_errors", "episodes", "failed"):
                assert f"env/{name}/{key}" in record, (name, key)
            assert record[f"env/{name}/failed"] == 0.0
    evals = {r["step"]: r for r in records if "eval/success" in r}
    assert sorted(evals) == [0, 2]
    assert all(r["eval/search/failed"] == r["eval/sql/failed"] == 0.0 for r in evals.values())

    # Ray placement gives local placement's run: held-out before/after per env, every metric but
    # times, every sampled token, the final weights
    summaries = [json.loads((out / "summary.json").read_text()) for out in (local, remote)]
    assert set(summaries[1]["per_env"]) == {"search", "sql"}
    assert summaries[1]["per_env"] == summaries[0]["per_env"]
    assert summaries[1]["eval_tasks"] == summaries[0]["eval_tasks"]
    assert _records(remote) == _records(local)
    for part in ("episodes/step-000001.jsonl", "episodes/step-000002.jsonl", "eval/step-000000.jsonl",
                 "eval/step-000002.jsonl"):  # fmt: skip
        assert _episodes(remote / part) == _episodes(local / part), part
    left, right = _weights(local), _weights(remote)
    assert left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)
