"""Episode schema round-trips and batch building with hand-checked masks."""

from __future__ import annotations

import json

import pytest
import torch

from agentrl.trajectory import (
    SCHEMA_VERSION,
    Episode,
    Segment,
    Source,
    Turn,
    build_batch,
    load,
    save,
    turn_table,
)


def _episode(error: str | None = None) -> Episode:
    t0 = Turn(
        index=0,
        output_ids=[5, 6],
        output_logprobs=[-0.1, -0.2],
        obs_ids=[7, 8, 9],
        obs_source=[Source.TEMPLATE, Source.TOOL, Source.TEMPLATE],
        action_text="a",
        observation="ö ✓",
        reward_parts={"info_gain": 0.25},
        tool_calls=[{"name": "search", "arguments": {"q": 1}}],
        timings={"generate_s": 0.5},
        sandbox_usage={"wall_s": 0.1},
    )
    t1 = Turn(index=1, output_ids=[10], output_logprobs=[-0.3], kind="summary", output_entropy=[1.5])
    branch = Turn(
        index=2,
        output_ids=[11, 12],
        output_logprobs=[-1.0, -2.0],
        process_reward=[-1.0, -0.2],
        reward_parts={"process/failure": -1.0, "process/out_of_scope": -0.2},
    )
    return Episode(
        episode_id="e1",
        env_id="agentrl/Search-v0",
        task_id="t1",
        group_id="g",
        segments=[Segment([1, 2, 3], [t0, t1]), Segment([1, 2], [branch], fold_id=1, kind="branch")],
        outcome=1.0,
        terminated=True,
        answer="Paris",
        ground_truth=["Paris", "paris"],
        metrics={"em": 1.0},
        error=error,
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_round_trip(tmp_path, suffix):
    episodes = [_episode(), _episode(error="EnvError: boom")]
    save(episodes, tmp_path / f"eps{suffix}")
    assert load(tmp_path / f"eps{suffix}") == episodes


def test_newer_schema_version_is_refused_with_a_fix(tmp_path):
    record = _episode().to_dict()
    record["schema_version"] = SCHEMA_VERSION + 1
    (tmp_path / "x.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(ValueError, match="schema_version.*upgrade agentrl"):
        load(tmp_path / "x.jsonl")


def test_version_1_records_still_load(tmp_path):
    """A v1 record (no Turn.process_reward; a per-turn reward_parts["process"]; no tree fields)
    loads as the current version."""
    current = _episode()
    v1 = _without_tree_fields(current.to_dict())
    v1["schema_version"] = 1
    for seg in v1["segments"]:
        for turn in seg["turns"]:
            del turn["process_reward"]
    v1["segments"][1]["turns"][0]["reward_parts"] = {"process": -1.0}
    (tmp_path / "v1.jsonl").write_text(json.dumps(v1) + "\n")
    (old,) = load(tmp_path / "v1.jsonl")
    assert SCHEMA_VERSION == 4 and old.schema_version == 4
    assert [t.process_reward for t in old.turns] == [None, None, [-1.0, -1.0]]
    assert old.segments[0] == current.segments[0]  # nothing else changed
    # Parquet stores the same record (free-form fields as JSON text): v1 rows load there too
    from agentrl.trajectory import _from_parquet_record, _to_parquet_record

    record = _to_parquet_record(current)
    record["schema_version"] = 1
    for seg in record["segments"]:
        for turn in seg["turns"]:
            del turn["process_reward"]
    assert [t.process_reward for t in _from_parquet_record(record).turns] == [None, None, None]


def _without_tree_fields(record: dict) -> dict:
    """A record as schema version 2 wrote it: no Turn.shared, Episode.parent_id or branch_turn (nor
    version 4's Turn.temperature)."""
    record = _as_v3(record)
    record = {k: v for k, v in record.items() if k not in ("parent_id", "branch_turn")}
    record["segments"] = [{**s, "turns": [{k: v for k, v in t.items() if k != "shared"} for t in s["turns"]]}
                          for s in record["segments"]]  # fmt: skip
    return record


def _as_v3(record: dict) -> dict:
    """A record as schema version 3 wrote it: no Turn.temperature."""
    record = {**record, "schema_version": 3}
    record["segments"] = [{**s, "turns": [{k: v for k, v in t.items() if k != "temperature"} for t in s["turns"]]}
                          for s in record["segments"]]  # fmt: skip
    return record


def test_version_3_records_load_at_the_runs_temperature(tmp_path):
    """A v3 record (before rollout.branch_temperature) loads with Turn.temperature None: every turn
    was sampled at the run's rollout.temperature."""
    current = _episode()
    (tmp_path / "v3.jsonl").write_text(json.dumps(_as_v3(current.to_dict())) + "\n")
    (old,) = load(tmp_path / "v3.jsonl")
    assert old.schema_version == 4 and all(t.temperature is None for t in old.turns)
    assert old.segments == current.segments


def test_version_2_records_load_as_chain_episodes(tmp_path):
    """A v2 record (before tree rollouts) loads with the tree fields' defaults: nothing shared, no parent."""
    current = _episode()
    v2 = _without_tree_fields(current.to_dict())
    v2["schema_version"] = 2
    (tmp_path / "v2.jsonl").write_text(json.dumps(v2) + "\n")
    (old,) = load(tmp_path / "v2.jsonl")
    assert old.schema_version == 4 and old.parent_id is None and old.branch_turn is None
    assert not any(t.shared for t in old.turns)
    assert old.segments == current.segments


def test_turn_validates_process_reward():
    with pytest.raises(ValueError, match="process_reward has 1 values for 2 output ids"):
        Turn(index=0, output_ids=[1, 2], output_logprobs=[0.0, 0.0], process_reward=[-1.0])
    for bad in ([0.0, 0.5], [0.0, float("nan")], [float("-inf"), 0.0]):
        with pytest.raises(ValueError, match="finite and <= 0"):
            Turn(index=0, output_ids=[1, 2], output_logprobs=[0.0, 0.0], process_reward=bad)


def test_turn_validates_lengths():
    with pytest.raises(ValueError, match="logprobs"):
        Turn(index=0, output_ids=[1, 2], output_logprobs=[0.0])


def test_build_batch_hand_checked():
    batch = build_batch([_episode()], pad_id=0)
    # row 0 = prompt [1,2,3] + out [5,6] + obs [7,8,9] + summary out [10]; row 1 = [1,2] + out [11,12], padded
    assert batch.input_ids.tolist() == [[1, 2, 3, 5, 6, 7, 8, 9, 10], [1, 2, 11, 12, 0, 0, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1] * 9, [1, 1, 1, 1, 0, 0, 0, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 0, 0, 1, 1, 0, 0, 0, 1], [0, 0, 1, 1, 0, 0, 0, 0, 0]]
    assert batch.turn_id.tolist() == [[-1, -1, -1, 0, 0, -1, -1, -1, 1], [-1, -1, 2, 2, -1, -1, -1, -1, -1]]
    assert batch.source.tolist() == [[0, 0, 0, 1, 1, 4, 2, 4, 3], [0, 0, 1, 1, -1, -1, -1, -1, -1]]
    assert torch.allclose(batch.old_logprobs[0], torch.tensor([0, 0, 0, -0.1, -0.2, 0, 0, 0, -0.3]))
    assert torch.equal(batch.process_reward[1], torch.tensor([0, 0, -1, -0.2, 0, 0, 0, 0, 0]))
    assert batch.fold_id.tolist() == [0, 1] and batch.row_episode.tolist() == [0, 0]
    assert batch.entropy is None  # turn 0 had no sampler entropy


def test_failed_episodes_give_no_rows_and_max_len_is_enforced():
    batch = build_batch([_episode(error="boom"), _episode()])
    assert batch.row_episode.tolist() == [1, 1]
    with pytest.raises(ValueError, match="max_len"):
        build_batch([_episode()], max_len=4)


def test_turn_table_orders_and_dedups():
    table, k = turn_table([_episode()])
    assert k == 3 and [t.index for t in table[0]] == [0, 1, 2]
