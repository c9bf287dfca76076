"""Your own advantage estimator, as a user adds one: one file, one decorator, a new batch field with
its producer, selected by ``algo.advantage: module:name`` through ``agentrl train``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_train_cli import SHORT as CLI_SHORT

from agentrl.algos.spec import Estimator, estimator
from agentrl.registry import ADVANTAGES

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs" / "quickstart.yaml"
SHORT = [*CLI_SHORT, "train.num_threads=1"]  # the quickstart made CI-sized, as tests/train/test_train_cli.py

# what a user writes: the function's parameters are the batch fields it reads (``rollout_turns`` is
# new, so the estimator brings its producer) and its options
MODULE = '''
import torch

from agentrl.algos.spec import estimator
from agentrl.train.fields import Producer


def _turns(step):
    """Turns each rollout took."""
    return torch.tensor([float(ep.num_turns) for ep in step.episodes])


def _diagnose(rollout_turns, **options):
    return {"short_wins/mean_turns": float(rollout_turns.mean())}


@estimator(
    "short_wins", "rollout",
    producers=(Producer("rollout_turns", "rollout record", "[R]", "turns each rollout took", _turns),),
    diagnose=_diagnose, labels={"short_wins/mean_turns": "short wins: turns / episode"},
)
def short_wins(outcome, group_id, rollout_turns, *, penalty=0.1):
    """The outcome less ``penalty`` per turn, centred on its group's mean."""
    score = outcome - penalty * rollout_turns
    means = torch.zeros(int(group_id.max()) + 1).index_reduce_(0, group_id, score, "mean", include_self=False)
    return score - means[group_id]
'''


def agentrl_train(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "train", *args], capture_output=True, text=True,
                          timeout=900, cwd=REPO, env=env)  # fmt: skip


def test_the_function_declares_needs_and_options():
    def mine(outcome, group_id, *, scale=2.0):
        return scale * outcome

    entry = Estimator("mine", mine, "rollout")
    assert entry.needs == ("outcome", "group_id", "row_rollout", "loss_mask")  # its own, then the level's
    assert entry.option_defaults() == {"scale": 2.0}
    # the batch hands it exactly its tensors, and the rollout-level output reaches each row's tokens
    batch = {"outcome": torch.tensor([1.0, 0.0]), "group_id": torch.tensor([0, 0]),
             "row_rollout": torch.tensor([1, 0, 0]), "loss_mask": torch.tensor([[1, 1], [1, 0], [0, 1]])}  # fmt: skip
    adv, returns = entry.from_batch(batch, scale=3.0)
    assert returns is None
    assert adv.tolist() == [[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]]
    with pytest.raises(ValueError, match="diagnose reads answer_len, which its function does not take"):
        Estimator("bad", mine, "rollout", diagnose=lambda answer_len: {})
    with pytest.raises(ValueError, match="level must be one of rollout, turn, token"):
        Estimator("bad", mine, "episode")


def test_the_decorator_registers_it_by_name():
    @estimator("test_only_scaled", "rollout", presets={"scale": 0.5})
    def scaled(outcome, group_id, *, scale=1.0):
        return scale * outcome

    try:
        assert ADVANTAGES.get("test_only_scaled") is scaled and isinstance(scaled, Estimator)
        assert scaled.resolve({}) == {"scale": 0.5} and scaled.resolve({"scale": 2.0}) == {"scale": 2.0}
        assert scaled(torch.tensor([2.0]), torch.tensor([0])).tolist() == [1.0]  # callable like its function
    finally:
        ADVANTAGES._entries.pop("test_only_scaled")


@pytest.mark.slow
def test_your_estimator_trains_through_agentrl_train(tiny_model_dir, tmp_path):
    (tmp_path / "my_objective.py").write_text(textwrap.dedent(MODULE))
    out = tmp_path / "run"
    proc = agentrl_train(tmp_path, str(QUICKSTART), f"model.name={tiny_model_dir}", *SHORT,
                         "algo.advantage=my_objective:short_wins", "algo.options={penalty: 0.25}",
                         f"train.out_dir={out}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    objective = json.loads((out / "summary.json").read_text())["objective"]
    assert objective["advantage"] == "short_wins"
    assert objective["advantage_options"] == {"penalty": 0.25}
    assert objective["advantage_needs"] == ["outcome", "group_id", "rollout_turns", "row_rollout", "loss_mask"]
    # the new field's producer ran on the step's episodes: its diagnostic is their mean turn count
    step = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"env/reward"' in x]
    assert len(step) == 1
    assert step[0]["short_wins/mean_turns"] == pytest.approx(step[0]["env/turns"], abs=1e-9)
    assert step[0]["rollout/episodes"] == 2.0


def test_a_bad_option_of_your_estimator_is_refused_before_anything_runs(tmp_path):
    (tmp_path / "my_objective.py").write_text(textwrap.dedent(MODULE))
    proc = agentrl_train(tmp_path, str(QUICKSTART), *SHORT, "algo.advantage=my_objective:short_wins",
                         "algo.options={penalti: 0.25}", f"train.out_dir={tmp_path / 'run'}")  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    said = " ".join(proc.stderr.split())
    assert "algo.options.penalti" in said and "use one of: penalty" in said
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_plain_function_is_refused_naming_the_decorator(tmp_path):
    (tmp_path / "plain_objective.py").write_text("def mine(outcome, group_id):\n    return outcome\n")
    proc = agentrl_train(tmp_path, str(QUICKSTART), *SHORT, "algo.advantage=plain_objective:mine",
                         f"train.out_dir={tmp_path / 'run'}")  # fmt: skip
    assert proc.returncode == 2
    said = " ".join(proc.stderr.split())
    assert "algo.advantage" in said and "not an estimator" in said and "@agentrl.algos.spec.estimator" in said
