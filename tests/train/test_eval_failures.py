"""A held-out eval whose episodes crash: replayed, saved, and refused when the crash would be the result."""

from __future__ import annotations

import json

import pytest
import toy_envs  # noqa: F401  (registers test/Flaky-v0)
from toy_envs import FlakyEnv

from agentrl.cli import train_main as main

RUN = [
    "env.id=test/Flaky-v0", "env.max_turns=2", "rollout.group_size=2", "rollout.tasks_per_step=1",
    "rollout.max_new_tokens=8", "rollout.concurrency=2", "rollout.max_context_tokens=512",
    "train.steps=1", "train.minibatch_size=2", "train.micro_batch_size=1", "train.eval_episodes=4",
    "train.num_threads=1", "train.bf16_autocast=false",
]  # fmt: skip


def _evals(out_dir):
    records = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "eval/success" in r]


@pytest.fixture
def crashes():
    FlakyEnv.crashes.clear()
    yield FlakyEnv.crashes
    FlakyEnv.crashes.clear()


def test_crashed_eval_episodes_are_replayed_and_saved(tiny_model_dir, tmp_path, crashes):
    crashes.update({"test-0": 1, "test-2": 2})  # test-2 crashes in the eval and in its first replay
    out = tmp_path / "run"
    assert main(None, [f"model.name={tiny_model_dir}", *RUN, f"train.out_dir={out}"]) == 0
    before, after = _evals(out)
    assert (before["eval/replayed"], before["eval/failed"]) == (3.0, 0.0)  # 2 in round one, test-2 again
    assert (after["eval/replayed"], after["eval/failed"]) == (0.0, 0.0)
    saved = [json.loads(x) for x in (out / "eval" / "step-000000.jsonl").read_text().splitlines()]
    assert [e["task_id"] for e in saved] == ["test-0", "test-1", "test-2", "test-3"]  # task order, replays in place
    assert all(e["error"] is None and e["segments"] for e in saved)
    assert (out / "eval" / "step-000001.jsonl").exists()
    log = (out / "train.log").read_text()
    assert "eval before RL: 2 of 4 episodes failed (" in log and "replaying them" in log


def test_an_eval_of_crashes_stops_the_run_instead_of_reporting_zero(tiny_model_dir, tmp_path, crashes):
    crashes.update({f"test-{i}": -1 for i in range(4)})
    out = tmp_path / "run"
    assert main(None, [f"model.name={tiny_model_dir}", *RUN, f"train.out_dir={out}"]) == 1
    log = (out / "train.log").read_text()
    assert "training failed: eval before RL: 4 of 4 held-out episodes failed even after replays" in log
    assert "(first: RuntimeError: simulated crash on test-0" in log and "train.eval_max_failed (now 0.05)" in log
    assert not (out / "summary.json").exists()  # no success figure was written
    crashed = [json.loads(x) for x in (out / "eval" / "step-000000.jsonl").read_text().splitlines()]
    assert [e["error"].split(" at ")[0] for e in crashed] == [f"RuntimeError: simulated crash on test-{i}" for i in range(4)]


def test_a_few_crashes_within_the_allowance_count_as_unsolved(tiny_model_dir, tmp_path, crashes):
    crashes.update({"test-3": -1})
    out = tmp_path / "run"
    args = [f"model.name={tiny_model_dir}", *RUN, "train.eval_max_failed=0.25", f"train.out_dir={out}"]
    assert main(None, args) == 0
    before, after = _evals(out)
    assert before["eval/failed"] == after["eval/failed"] == 1.0
    assert before["eval/replayed"] == 2.0  # test-3 twice
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["eval_tasks"]["before"]) == ["test-0", "test-1", "test-2", "test-3"]  # still paired
    assert summary["eval_tasks"]["before"]["test-3"] == summary["eval_tasks"]["after"]["test-3"] == 0.0
    saved = [json.loads(x) for x in (out / "eval" / "step-000001.jsonl").read_text().splitlines()]
    assert [e["error"] is not None for e in saved] == [False, False, False, True]
    assert "eval after step 1: 1 of 4 episodes still failed after replays; they count as unsolved" in (
        out / "train.log").read_text()  # fmt: skip


def test_eval_max_failed_is_validated(capsys):
    assert main(None, ["train.eval_max_failed=1.5"]) == 2
    assert "train.eval_max_failed': must be in [0, 1], got 1.5" in capsys.readouterr().err
