"""`agentrl study CONFIG --reevaluate KEY=VALUE`: the eval-only runs a re-evaluation plans from a study's
finished runs, its settings checked before anything runs, and an arm composed from two evals by hand.
The end-to-end path (a tiny-model study re-evaluated through the CLI) is in test_study.py."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from test_study import agentrl, write_study

from agentrl.config import to_dict
from agentrl.errors import ConfigError
from agentrl.study.orchestrator import _run_config, load_study, plan
from agentrl.study.reevaluate import check_settings, compose, folder_name, plan_reevaluation
from agentrl.study.report import write_results


def finish(study, run, *, bf16: bool = False, tasks: dict[str, float] | None = None) -> None:
    """Mark a study run finished as the trainer would leave it: its resolved config and summary."""
    run.out_dir.mkdir(parents=True, exist_ok=True)
    resolved = to_dict(_run_config(study, run, "test"))
    resolved["train"]["bf16_autocast"] = bf16
    resolved["train"]["eval_sampler_dtype"] = "bfloat16" if bf16 else "model"
    (run.out_dir / "resolved_config.yaml").write_text(yaml.safe_dump(resolved))
    (run.out_dir / "model").mkdir(exist_ok=True)  # its exported model (its contents are not read here)
    tasks = tasks or {"t0": 1.0, "t1": 0.0}
    summary = {"steps": run.steps, "objective": {"advantage": "x"}, "eval_tasks": {"before": tasks, "after": tasks}}
    (run.out_dir / "summary.json").write_text(json.dumps(summary))


def key_values(overrides) -> dict[str, str]:
    """The last value each key is given (later overrides win, as agentrl train applies them)."""
    return {o.partition("=")[0]: o.partition("=")[2] for o in overrides}


def test_settings_must_be_held_out_eval_settings():
    assert check_settings(["train.eval_temperature=0.6"]) == ("train.eval_temperature=0.6",)
    assert folder_name(("train.eval_temperature=0.6", "env.max_turns=4")) == "eval_temperature-0.6+max_turns-4"
    for bad, field in ((["train.lr=1e-5"], "--reevaluate train.lr"), (["model.name=x"], "--reevaluate model.name"),
                       (["train.eval_temperature"], "--reevaluate"), ([], "--reevaluate")):  # fmt: skip
        with pytest.raises(ConfigError) as info:
            check_settings(bad)
        assert info.value.field == field
    with pytest.raises(ConfigError) as info:
        check_settings(["train.lr=1e-5"])
    assert "train.eval_temperature" in info.value.fix  # the ones it may change are listed


def test_every_finished_run_gets_an_eval_of_its_own_model_in_its_own_way(tmp_path):
    folding = {"rollout.folding": "branch", "algo.advantage": "foldgrpo", "algo.loss": "foldgrpo"}
    study = load_study(write_study(tmp_path, seeds=[0, 1], methods={"grpo": {}, "igpo": {"algo.advantage": "igpo"},
                                                                    "folding": folding}))  # fmt: skip
    runs = {(r.seed, r.method): r for r in plan(study)}
    for key in ((0, None), (0, "grpo"), (0, "folding"), (1, None), (1, "igpo")):  # the others did not finish
        finish(study, runs[key], bf16=key[1] == "grpo")
    (runs[(1, "igpo")].out_dir / "model").rmdir()  # finished, but its model was not kept
    p = plan_reevaluation(study, ["train.eval_temperature=0.6"])
    evals = tmp_path / "study" / "reevaluated" / "eval_temperature-0.6" / "evals"
    assert p.out_dir == evals.parent
    assert [r.out_dir for r in p.evals] == [evals / "seed-0" / "warmup", evals / "seed-0" / "grpo",
                                            evals / "seed-0" / "folding-before", evals / "seed-0" / "folding",
                                            evals / "seed-1" / "warmup"]  # fmt: skip
    why = {r.label: why for r, why in p.left_out}
    assert set(why) == {"seed 0 igpo", "seed 1 grpo", "seed 1 igpo", "seed 1 folding"}
    assert why["seed 0 igpo"].startswith("not finished") and "exported model" in why["seed 1 igpo"]
    by_dir = {r.out_dir.name: key_values(r.overrides) for r in p.evals if r.seed == 0}
    model = {name: str(runs[(0, m)].out_dir / "model") for name, m in
             (("warmup", None), ("grpo", "grpo"), ("folding-before", None), ("folding", "folding"))}  # fmt: skip
    for name, values in by_dir.items():
        # the eval alone: no RL step, no warm-up, the source run's exported model, no shared eval
        assert values["train.steps"] == "0" and values["train.sft_warmup_steps"] == "0"
        assert values["model.adapter"] == model[name] and "train.eval_before_from" not in values
        assert values["train.eval_temperature"] == "0.6" and values["train.out_dir"] == str(evals / "seed-0" / name)
        assert values["train.eval_episodes"] == "3" and values["train.seed"] == "0"
    # each in the precision its source run resolved (grpo: bf16 here), the setting given last
    assert by_dir["grpo"]["train.eval_sampler_dtype"] == "bfloat16"
    assert by_dir["warmup"]["train.eval_sampler_dtype"] == "model"
    # the folding arm evaluates in its own mode: its model, and the warm-up's model its way
    assert by_dir["folding"]["rollout.folding"] == by_dir["folding-before"]["rollout.folding"] == "branch"
    assert "rollout.folding" not in by_dir["warmup"] and "rollout.folding" not in by_dir["grpo"]
    assert [(arm.method, before.out_dir.name, after.out_dir.name) for arm, before, after in p.arms] == [
        ("grpo", "warmup", "grpo"), ("folding", "folding-before", "folding")]
    # more held-out tasks than the study evaluated: the first 5, for every model
    more = plan_reevaluation(study, ["train.eval_episodes=5"])
    assert more.out_dir.name == "eval_episodes-5"
    assert {key_values(r.overrides)["train.eval_episodes"] for r in more.evals} == {"5"}
    assert more.view(study).eval_tasks == 5 and p.view(study).eval_tasks == 3  # what the report says
    # an eval that finished before its model's run ran again stops the re-evaluation, naming it
    finish(study, p.evals[1])  # seed 0 grpo's eval
    os.utime(p.evals[1].out_dir / "summary.json", (1, 1))
    with pytest.raises(ConfigError) as info:
        plan_reevaluation(study, ["train.eval_temperature=0.6"])
    assert str(p.evals[1].out_dir) in info.value.problem and "delete those eval folders" in info.value.fix
    os.utime(p.evals[1].out_dir / "summary.json")  # now newer than the run: kept
    assert plan_reevaluation(study, ["train.eval_temperature=0.6"]).evals[1].finished
    # a setting that makes a run's config invalid fails here, naming the run
    with pytest.raises(ConfigError) as info:
        plan_reevaluation(study, ["train.eval_temperature=-1"])
    assert "--reevaluate (seed 0 warm-up)" in info.value.field


def test_an_arm_is_composed_from_the_two_evals_by_hand(tmp_path):
    study = load_study(write_study(tmp_path))
    runs = {r.method: r for r in plan(study)}
    for run in runs.values():
        finish(study, run)
    (runs["grpo"].out_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"step": 0, "eval/success": 0.5, "eval/failed": 0.0},
        {"step": 1, "env/reward": 0.25, "eval/success": 0.9}, {"step": 2, "env/reward": 0.75})))  # fmt: skip
    p = plan_reevaluation(study, ["train.eval_temperature=0.6"])
    evals = {r.out_dir.name: r for r in p.evals}
    before = {"a": 0.0, "b": 0.0, "c": 1.0, "d": 1.0}  # the warm-up's model at 0.6
    after = {"a": 1.0, "b": 1.0, "c": 0.0, "d": 1.0}  # grpo's model at 0.6: 2 gained, 1 lost
    for name, tasks, failed in (("warmup", before, 1.0), ("grpo", after, 0.0)):
        finish(study, evals[name], tasks=tasks)
        summary = json.loads((evals[name].out_dir / "summary.json").read_text())
        summary["held_out_means"] = {"before": {"outcome": sum(tasks.values()) / 4}}
        (evals[name].out_dir / "summary.json").write_text(json.dumps(summary))
        (evals[name].out_dir / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/failed": failed}) + "\n")
    arm, b, a = p.arms[0]
    view = compose(arm, b, a, p.out_dir / "seed-0" / "grpo")
    s = json.loads((view.out_dir / "summary.json").read_text())
    assert (s["success_before"], s["success_after"], s["gained"], s["lost"], s["p_value"]) == (0.5, 0.75, 2, 1, 1.0)
    assert s["eval_tasks"] == {"before": before, "after": after} and s["steps"] == 2
    assert s["held_out_means"] == {"before": {"outcome": 0.5}, "after": {"outcome": 0.75}}
    records = [json.loads(x) for x in (view.out_dir / "metrics.jsonl").read_text().splitlines()]
    # the RL steps stay (their own evals dropped); the evals' failures are the re-evaluation's
    assert records == [{"step": 1, "env/reward": 0.25}, {"step": 2, "env/reward": 0.75},
                       {"step": 0, "eval/failed": 1.0}, {"step": 2, "eval/failed": 0.0}]  # fmt: skip
    results = write_results(p.view(study), [view])
    row = results["runs"][0]
    assert (row["gained"], row["lost"], row["eval_failed"]) == (2, 1, [1.0, 0.0])
    assert row["mechanisms"]["env/reward"] == 0.5
    assert results["study"].endswith("re-evaluated with train.eval_temperature=0.6")


def test_the_cli_refuses_a_setting_that_is_not_an_eval_setting_with_exit_2(tmp_path):
    proc = agentrl("study", str(write_study(tmp_path)), "--reevaluate", "train.lr=1e-5")
    said = " ".join(proc.stderr.split())  # the console wraps long lines
    assert proc.returncode == 2 and "--reevaluate train.lr" in said and "train.eval_temperature" in said
    proc = agentrl("study", str(write_study(tmp_path)), "--reevaluate", "train.eval_temperature=0.6")
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "no arm of the study has finished" in said and "run the study first" in said
