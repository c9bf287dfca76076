"""``agentrl eval ... --ray ADDRESS``: the same records as in-process envs, on a two-node local cluster."""

from __future__ import annotations

import json

import pytest

from agentrl.eval.runner import evaluate, run_eval

pytestmark = pytest.mark.slow  # a cluster start on a shared 2-core machine

TIMES = ("seconds", "wall_s", "env_s", "act_s", "episode_id")


def _records(result) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMES and not k.endswith("_s")} for r in result.records]


def test_eval_with_ray_gives_the_same_records_as_local(ray_cluster):
    local = evaluate("search-qa", "oracle", limit=4, concurrency=2, seed=1)
    remote = evaluate("search-qa", "oracle", limit=4, concurrency=2, seed=1, ray=ray_cluster.address)
    assert len(local.records) >= 4 and not any(r["error"] for r in remote.records)
    assert _records(remote) == _records(local)
    assert remote.metrics["overall"] == local.metrics["overall"]
    assert remote.metrics["ray"] == ray_cluster.address and local.metrics["ray"] is None


def test_eval_with_the_default_concurrency_fits_a_small_cluster(ray_cluster, capsys):
    """Four episodes at once on a 2-CPU cluster: the env actors are sized to it before any is created
    (1 CPU each could place only two; the others would wait out env.ray_start_timeout_s)."""
    result = evaluate("search-qa", "oracle", limit=4, concurrency=4, seed=1, ray=ray_cluster.address)
    assert not any(r["error"] for r in result.records) and result.metrics["overall"]["success_rate"] == 1.0
    assert "env.num_cpus_per_env lowered to 0.5 so that all are placed at once" in capsys.readouterr().err


def test_eval_command_with_ray_writes_the_address_it_used(ray_cluster, tmp_path, capsys):
    code = run_eval(
        suite="search-qa",
        agent="oracle",
        limit=2,
        concurrency=2,
        out=tmp_path,
        as_json=True,
        ray=ray_cluster.address,
    )
    assert code == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["ray"] == ray_cluster.address and f"--ray {ray_cluster.address}" in metrics["command"]
    assert metrics["overall"]["success_rate"] == 1.0


def test_model_agent_eval_with_ray_equals_local(ray_cluster, tmp_path):
    from agentrl.rollout.model import load_tokenizer, tiny_model

    tokenizer = load_tokenizer("smollm2-135m")
    tiny_model(tokenizer, layers=1, hidden=32, seed=0).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    local = evaluate("search-qa:max_turns=2", str(tmp_path), limit=2, concurrency=2, seed=0)
    remote = evaluate(
        "search-qa:max_turns=2", str(tmp_path), limit=2, concurrency=2, seed=0, ray=ray_cluster.address
    )
    assert not any(r["error"] for r in local.records + remote.records)
    assert _records(remote) == _records(local)
    turns = [[t.output_ids for t in e.turns] for e in local.episodes]
    assert turns == [[t.output_ids for t in e.turns] for e in remote.episodes] and any(turns)
