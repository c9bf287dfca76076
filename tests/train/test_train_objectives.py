"""``agentrl train`` with each multi-turn objective: trains on CPU (tiny model) or is refused at validation.

Advantages igpo | empg | gigpo | foldgrpo | supo and losses ppo_clip | turn_ppo | foldact | gspo | dapo
each appear in at least one run that trains and in the refusals; every pair is also trained one
step in ``test_every_combination.py``. Resolved objective options are printed and saved.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from test_trainer import TINY_RUN

from agentrl.cli import train_main as main

REFUSED = [
    (["algo.advantage=gigpo", "algo.loss=gspo"], "algo.loss", "sequence-level ratio"),
    (["algo.advantage=igpo", "algo.loss=gspo"], "algo.loss", "turn-level advantages"),
    (["algo.advantage=foldgrpo", "algo.loss=dapo"], "rollout.folding", "set rollout.folding=branch"),
    (["algo.advantage=foldgrpo", "algo.loss=foldact", "rollout.folding=summary"], "rollout.folding",
     "set rollout.folding=branch"),
    (["algo.advantage=empg", "algo.loss=foldact"], "rollout.folding", "set rollout.folding=summary"),
    (["algo.advantage=supo", "algo.loss=foldact", "rollout.folding=summary", "algo.clip_high=0.3"],
     "algo.clip_high", "takes no 'clip_high'"),
    (["algo.advantage=gigpo", "algo.options={lam: 0.9}"], "algo.options.lam", "use one of"),
    (["algo.loss=value"], "algo.loss", "not a policy loss"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "field", "reason"), REFUSED, ids=lambda v: str(v)[:40])
def test_unrunnable_objectives_are_refused_before_anything_runs(overrides, field, reason, capsys):
    assert main(None, ["env.id=agentrl/Search-v0", *overrides]) == 2
    err = capsys.readouterr().err
    assert f"'{field}'" in err and reason in " ".join(err.split()), err


def test_the_cli_refuses_with_the_reason():
    out = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", "configs/quickstart.yaml", "algo.advantage=foldgrpo"],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    err = " ".join(out.stderr.split())
    assert out.returncode == 2, out
    assert "needs 'process_reward'" in err and "(fix: set rollout.folding=branch)" in err, err


def _run(tiny_model_dir, tmp_path, name, *overrides):
    out = tmp_path / name
    args = [f"model.name={tiny_model_dir}", *TINY_RUN, "train.steps=1", "train.logprob_impl=chunked",
            f"train.out_dir={out}", *overrides]  # fmt: skip
    assert main(None, args) == 0
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in records if "perf/step_s" in r)
    return step, json.loads((out / "summary.json").read_text())["objective"]


ADVANTAGES = ("igpo", "empg", "gigpo", "foldgrpo", "supo")
LOSSES = ("ppo_clip", "turn_ppo", "foldact", "gspo", "dapo")
GRID_REFUSED = {
    **{(a, "gspo"): "sequence-level ratio" for a in ("igpo", "empg", "gigpo", "foldgrpo")},
    ("foldgrpo", "foldact"): "set rollout.folding=",
}


@pytest.mark.slow
@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("advantage", ADVANTAGES)
def test_objective_trains_through_the_cli_or_is_refused(tiny_model_dir, tmp_path, advantage, loss, capsys):
    folding = "summary" if loss == "foldact" else "branch" if advantage == "foldgrpo" else "none"
    overrides = [f"algo.advantage={advantage}", f"algo.loss={loss}", f"rollout.folding={folding}",
                 "rollout.summary_threshold=60", "rollout.max_summaries=2"]  # fmt: skip
    if (advantage, loss) in GRID_REFUSED:
        assert main(None, [f"model.name={tiny_model_dir}", *TINY_RUN, *overrides]) == 2
        assert GRID_REFUSED[advantage, loss] in " ".join(capsys.readouterr().err.split())
        return
    step, objective = _run(tiny_model_dir, tmp_path, "run", *overrides)
    printed = capsys.readouterr()
    assert f'"advantage": "{advantage}"' in printed.out + printed.err  # resolved options printed at start
    assert (objective["advantage"], objective["loss"]) == (advantage, loss)
    if advantage == "supo" and step["env/truncated"] == 1.0:
        # every rollout was cut by a budget: SUPO gives them exactly nothing to train on
        assert "loss/loss" not in step and step["rollout/advantage_abs"] == 0.0
    else:
        assert math.isfinite(step["loss/loss"]) and step["loss/grad_norm"] > 0


@pytest.mark.slow
def test_explicit_options_beat_presets_and_are_saved(tiny_model_dir, tmp_path):
    """``loss: dapo, clip_high: 0.2`` trains with 0.2; ``advantage: gigpo, gamma: 1.0`` with 1.0."""
    _, objective = _run(tiny_model_dir, tmp_path, "explicit", "algo.advantage=gigpo", "algo.gamma=1.0",
                        "algo.loss=dapo", "algo.clip_high=0.2")  # fmt: skip
    assert objective["loss_options"]["clip_high"] == 0.2 and objective["advantage_options"]["gamma"] == 1.0
    assert objective["loss_options"]["agg"] == "token-mean"  # dapo's preset still fills what was unset


@pytest.mark.slow
def test_foldact_trains_end_to_end_on_a_summarizing_env(tiny_model_dir, tmp_path):
    step, objective = _run(tiny_model_dir, tmp_path, "foldact", "algo.advantage=empg", "algo.loss=foldact",
                           "rollout.folding=summary", "rollout.summary_threshold=60", "rollout.max_summaries=2",
                           "algo.full_ctx_dropout=0.5")  # fmt: skip
    assert objective["loss_needs"] == ["logp", "old_logp", "loss_mask", "token_kind", "full_ctx_logp"]
    assert step["loss/summary_tokens"] > 0 and step["loss/action_tokens"] > 0
    assert step["loss/consistency_tokens"] > 0 and math.isfinite(step["loss/loss_consistency"])
    assert step["loss/grad_norm"] > 0
