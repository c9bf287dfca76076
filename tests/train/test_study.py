"""`agentrl study`: validation before anything runs, the mechanism metrics, and a two-arm study of the
tiny model end to end through the CLI, stopped after the first arm and resumed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from agentrl.errors import ConfigError
from agentrl.study.orchestrator import load_study, plan

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs" / "quickstart.yaml"
# the quickstart made CI-sized (as in test_train_cli.py): 1 warm-up step on 2 demos, 2 episodes a step
SMALL = {
    "train.sft_warmup_steps": 1, "train.sft_demos": 2, "train.sft_batch_size": 1, "train.micro_batch_size": 1,
    "train.minibatch_size": 2, "train.trainable_layers": 2, "train.num_threads": 1, "rollout.tasks_per_step": 1,
    "rollout.group_size": 2, "rollout.branches": 0, "rollout.branch_concurrency": None, "rollout.concurrency": 2, "rollout.max_new_tokens": 16,
    "algo.dynamic_sampling": False,
}  # fmt: skip


def write_study(tmp_path: Path, model: str = "smollm2-135m", **changes: object) -> Path:
    """The CI-sized study; a change to None removes the key."""
    study = {
        "base": str(QUICKSTART), "overrides": {"model.name": model, **SMALL},
        "methods": {"grpo": {}, "igpo": {"algo.advantage": "igpo"}},
        "seeds": [0], "episodes": 4, "eval_tasks": 3, "out_dir": str(tmp_path / "study"),
    }  # fmt: skip
    study.update(changes)
    study = {k: v for k, v in study.items() if v is not None}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def agentrl(*args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )  # fmt: skip


# --------------------------------------------------------------------------- validation
def test_plan_gives_every_arm_the_same_seed_tasks_budget_and_warm_up(tmp_path):
    study = load_study(write_study(tmp_path, seeds=[3, 4], episodes=8))
    runs = plan(study)
    assert [(r.seed, r.method, r.steps) for r in runs] == [
        (3, None, 0), (3, "grpo", 4), (3, "igpo", 4), (4, None, 0), (4, "grpo", 4), (4, "igpo", 4)
    ]  # fmt: skip
    for run in runs[1:3]:
        assert f"model.adapter={tmp_path / 'study' / 'seed-3' / 'warmup' / 'model'}" in run.overrides
        assert {"train.seed=3", "train.eval_episodes=3", "train.sft_warmup_steps=0"} <= set(run.overrides)
        # the warm-up's eval of the shared checkpoint is every arm's eval before RL
        assert f"train.eval_before_from={tmp_path / 'study' / 'seed-3' / 'warmup'}" in run.overrides
    assert "train.eval_episodes=3" in runs[0].overrides and runs[0].method is None
    assert "algo.advantage=igpo" in runs[2].overrides and "algo.advantage=igpo" not in runs[1].overrides


def test_a_generated_token_budget_gives_every_arm_the_same_tokens_in_at_most_max_steps(tmp_path):
    """Tree against chain rollouts sample different episodes per step: generated_tokens gives each arm
    the same sampling cost instead (train.token_budget), within max_steps steps."""
    chain = {"rollout.branches": 0, "rollout.group_size": 2}
    study = load_study(write_study(tmp_path, episodes=None, generated_tokens=5000, max_steps=7,
                                   methods={"tree": {"rollout.branches": 1, "rollout.group_size": 1}, "chain": chain}))  # fmt: skip
    runs = plan(study)
    assert [(r.method, r.steps) for r in runs] == [(None, 0), ("tree", 7), ("chain", 7)]
    for run in runs[1:]:
        assert "train.token_budget=5000" in run.overrides and "train.steps=7" in run.overrides
    assert not any(o.startswith("train.token_budget") for o in runs[0].overrides)  # the warm-up runs no RL
    assert study.budget == "5,000 generated tokens per arm (at most 7 steps)"
    assert load_study(write_study(tmp_path, episodes=None, generated_tokens=5000)).max_steps == 64  # the default


@pytest.mark.parametrize("warm_value", [False, True])
def test_arms_train_in_the_precision_their_warm_up_resolved_from_auto(tmp_path, warm_value):
    """bf16_autocast=auto times bf16 when a run starts (1.06x to 1.27x on one shared H200, around the
    1.10x threshold): each arm takes its warm-up's resolved value instead of probing again."""
    from agentrl.study.orchestrator import inherited_precision

    study = load_study(write_study(
        tmp_path, overrides={"model.name": "smollm2-135m", **SMALL, "train.bf16_autocast": "auto"},
        methods={"grpo": {}, "igpo": {"algo.advantage": "igpo"}, "fp32": {"train.bf16_autocast": False}},
    ))  # fmt: skip
    warm, grpo, igpo, fp32 = plan(study)
    assert inherited_precision(study, grpo) == ()  # the warm-up has not run yet: the arm would probe
    warm.out_dir.mkdir(parents=True)
    evals = "bfloat16" if warm_value else "model"
    resolved = {"train": {"bf16_autocast": warm_value, "eval_sampler_dtype": evals}}
    (warm.out_dir / "resolved_config.yaml").write_text(yaml.safe_dump(resolved))
    given = (f"train.bf16_autocast={str(warm_value).lower()}", f"train.eval_sampler_dtype={evals}")
    assert inherited_precision(study, grpo) == inherited_precision(study, igpo) == given
    assert inherited_precision(study, warm) == ()  # the warm-up resolves it
    # a method that sets it keeps its own (and evaluates as the warm-up whose eval it shares)
    assert inherited_precision(study, fp32) == given[1:]


def test_arms_evaluate_in_the_dtype_their_warm_up_resolved_from_auto(tmp_path):
    """rollout.sampler_dtype / train.eval_sampler_dtype=auto follow the warm-up's bf16 measurement:
    each arm takes the warm-up's resolved values, so its declared settings equal those of the eval it
    shares (here the rollouts sampled in bfloat16, so the evals resolved to the model's own)."""
    from agentrl.study.orchestrator import inherited_precision

    study = load_study(write_study(
        tmp_path, overrides={"model.name": "smollm2-135m", **SMALL, "train.bf16_autocast": "auto",
                             "train.eval_sampler_dtype": "auto", "rollout.sampler_dtype": "auto"},
        methods={"grpo": {}, "f32": {"train.eval_sampler_dtype": "model", "rollout.sampler_dtype": "model"}},
    ))  # fmt: skip
    warm, grpo, f32 = plan(study)
    warm.out_dir.mkdir(parents=True)
    resolved = {"train": {"bf16_autocast": True, "eval_sampler_dtype": "model"}, "rollout": {"sampler_dtype": "bfloat16"}}
    (warm.out_dir / "resolved_config.yaml").write_text(yaml.safe_dump(resolved))
    assert inherited_precision(study, grpo) == (
        "train.bf16_autocast=true", "rollout.sampler_dtype=bfloat16", "train.eval_sampler_dtype=model")
    assert inherited_precision(study, f32) == ("train.bf16_autocast=true",)  # its own dtypes stay


def test_an_arm_that_evaluates_otherwise_than_the_warm_up_evaluates_itself_before_rl(tmp_path):
    """A folding arm's eval runs in folding mode; the warm-up's eval ran ReAct: taking it as the arm's
    eval before RL would measure another thing. An arm that changes only the objective shares it."""
    folding = {"rollout.folding": "branch", "algo.advantage": "foldgrpo", "algo.loss": "foldgrpo"}
    study = load_study(write_study(tmp_path, methods={"react": {}, "folding": folding, "lr": {"train.lr": 1e-4}}))
    runs = {r.method: r for r in plan(study)}
    warm = f"train.eval_before_from={tmp_path / 'study' / 'seed-0' / 'warmup'}"
    assert warm in runs["react"].overrides and warm in runs["lr"].overrides
    assert runs["react"].own_eval == () and runs["lr"].own_eval == ()
    assert not any(o.startswith("train.eval_before_from=") for o in runs["folding"].overrides)
    assert runs["folding"].own_eval == ("rollout.folding: 'none' -> 'branch'",)


def test_eval_before_from_refuses_a_run_that_evaluated_with_other_settings(tmp_path):
    """Through `agentrl train`: a shared eval run in ReAct mode is refused for a folding run, naming
    the setting, before the model loads."""
    from agentrl.config import load_config, to_dict

    shared = tmp_path / "warmup"
    shared.mkdir()
    (shared / "summary.json").write_text(json.dumps({"eval_tasks": {"before": {}}}))
    (shared / "resolved_config.yaml").write_text(yaml.safe_dump(to_dict(load_config(QUICKSTART))))
    out = tmp_path / "arm"
    res = agentrl("train", str(QUICKSTART), f"train.eval_before_from={shared}", f"train.out_dir={out}",
                  "rollout.folding=branch", "rollout.branches=0", "rollout.branch_concurrency=null", "algo.advantage=foldgrpo", "algo.loss=foldgrpo",
                  timeout=120)  # fmt: skip
    assert res.returncode == 1, res.stderr
    message = " ".join(res.stderr.split())
    assert "train.eval_before_from" in message and "rollout.folding: 'none' -> 'branch'" in message
    assert "leave it empty" in message and not (out / "model").exists()


@pytest.mark.parametrize(
    ("changes", "field", "fix"),
    [
        ({"methods": {"grpo": {}, "igpo": {"algo.advantage": "igpoo"}}}, "study.methods.igpo: algo.advantage", "igpo"),
        ({"methods": {"grpo": {}, "x": {"algo.kl_coeff": 1}}}, "study.methods.x: algo.kl_coeff", "did you mean"),
        ({"methods": {"grpo": {}, "x": {"train.steps": 9}}}, "study.methods.x: train.steps", "episodes"),
        ({"methods": {"grpo": {}, "x": {"train.sft_lr": 1.0}}}, "study.methods.x: train.sft_lr", "warm-up is shared"),
        ({"methods": {"grpo": {}, "x": {"train.sft_fold_share": 0.5}}}, "study.methods.x: train.sft_fold_share",
         "warm-up is shared"),
        ({"episodes": 5}, "study.episodes", "multiple of 2"),
        ({"baseline": "ppo"}, "study.baseline", "grpo, igpo"),
        ({"seeds": []}, "study.seeds", "[0, 1, 2]"),
        ({"methods": {"grpo": {}}}, "study.methods", "igpo"),
        ({"sedes": [0]}, "study.sedes", "known keys"),
        ({"generated_tokens": 500}, "study.episodes", "not both"),
        ({"episodes": None}, "study.episodes", "generated_tokens: N"),
        ({"max_steps": 3}, "study.max_steps", "only bounds a generated_tokens budget"),
        ({"episodes": None, "generated_tokens": 0}, "study.generated_tokens", "positive integer"),
        ({"methods": {"grpo": {}, "x": {"train.token_budget": 9}}}, "study.methods.x: train.token_budget",
         "generated_tokens"),
    ],
)  # fmt: skip
def test_a_bad_study_fails_before_anything_runs_naming_the_field_and_fix(tmp_path, changes, field, fix):
    with pytest.raises(ConfigError) as err:
        load_study(write_study(tmp_path, **changes))
    assert err.value.field == field
    assert fix in (err.value.fix or "") + err.value.problem
    assert not (tmp_path / "study" / "seed-0").exists()


def test_the_cli_refuses_a_bad_study_with_exit_2(tmp_path):
    proc = agentrl("study", str(write_study(tmp_path, methods={"grpo": {}, "b": {"algo.loss": "nope"}})))
    assert proc.returncode == 2
    assert "study.methods.b: algo.loss" in " ".join(proc.stderr.split())


# --------------------------------------------------------------------------- mechanism metrics
def test_the_report_labels_each_estimators_diagnostics_from_the_estimator():
    from agentrl.algos.spec import ESTIMATORS
    from agentrl.study.report import mechanism_labels, table_mechanisms

    labels, table = mechanism_labels(), table_mechanisms()
    for est in ESTIMATORS:
        assert set(est.table) <= set(est.labels), est.name
        assert all(key.startswith(f"{est.name}/") for key in est.labels), est.name
        assert {k: labels[k] for k in est.labels} == dict(est.labels)
        assert set(est.table) <= set(table)
    assert labels["igpo/ig_nonzero_share"] == "IGPO: share of IG turns with non-zero gain"
    assert table[:4] == ("igpo/ig_nonzero_share", "igpo/ig_nonzero_mean", "empg/scale_p10", "empg/scale_p90")
    assert table[4:] == ("loss/clipfrac", "ctx/main_tokens", "fold/branches", "fold/process_penalty",
                         "fold/penalised_in_success")
    assert list(labels)[0] == "env/reward"


def test_igpo_diagnostics_count_the_information_gain_turns():
    from agentrl.registry import ADVANTAGES

    # two rows, 3 turns each; turn k's tokens carry turn_id k; the last turn of a row gets the outcome
    turn_id = torch.tensor([[0, 0, 1, 1, 2, 2], [0, 0, 1, 1, 2, 2]])  # [B=2, L=6]
    gt = torch.tensor(
        [[-2.0, -1.0, -1.0, -0.5], [-3.0, -3.0, -2.5, -2.0]]
    )  # [B, K+1]: gains 1,0,(.5) | 0,.5,(.5)
    batch = {"outcome": torch.tensor([1.0, 0.0]), "group_id": torch.tensor([0, 0]), "gt_logprob": gt,
             "turn_id": turn_id, "loss_mask": torch.ones(2, 6), "row_rollout": torch.tensor([0, 1])}  # fmt: skip
    d = ADVANTAGES.get("igpo").diagnostics(batch, {"info_gain_kind": "log_prob_diff"})
    assert d["igpo/ig_turns"] == 4.0  # turns 0 and 1 of each row
    assert d["igpo/ig_nonzero_share"] == 0.5
    assert d["igpo/ig_nonzero_mean"] == pytest.approx(0.75)
    assert d["igpo/ig_abs_mean"] == pytest.approx(0.375)
    assert ADVANTAGES.get("grpo").diagnostics(batch, {}) == {}
    assert set(ADVANTAGES.get("igpo").labels) <= set(d)  # the report's labels name metrics it logs


def test_empg_diagnostics_give_the_spread_of_the_scale_the_estimator_uses():
    from agentrl.algos.advantages import empg_scale
    from agentrl.registry import ADVANTAGES

    turn_id = torch.tensor([[0, 0, 1, 1], [0, 0, 1, -1]])  # [B=2, L=4]
    entropy = torch.tensor([[0.0, 0.0, 1.0, 1.0], [2.0, 2.0, 0.5, 0.0]])  # step entropies 0, 1 | 2, 0.5
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    batch = {"outcome": torch.tensor([1.0, 0.0]), "group_id": torch.tensor([0, 0]), "entropy": entropy,
             "turn_id": turn_id, "loss_mask": mask, "row_rollout": torch.tensor([0, 1])}  # fmt: skip
    d = ADVANTAGES.get("empg").diagnostics(batch, {"k": 2.0})
    h = torch.tensor([0.0, 0.5, 1.0, 0.25])  # (H - 0) / (2 - 0)
    g = torch.exp(-2.0 * h) / torch.exp(-2.0 * h).mean()
    assert d["empg/steps"] == 4.0
    assert d["empg/scale_p50"] == pytest.approx(float(torch.quantile(g, 0.5)), rel=1e-5)
    assert d["empg/scale_p10"] < d["empg/scale_p50"] < d["empg/scale_p90"]
    assert d["empg/scale_std"] == pytest.approx(float(g.std(unbiased=False)), rel=1e-5)
    assert set(ADVANTAGES.get("empg").labels) <= set(d)  # the report's labels name metrics it logs
    scale, _ = empg_scale(torch.tensor([[0.0, 1.0], [2.0, 0.5]]), torch.ones(2, 2, dtype=torch.bool), k=2.0)
    assert sorted(scale.flatten().tolist()) == pytest.approx(sorted(g.tolist()), rel=1e-5)


def test_context_metrics_measure_the_main_thread_branches_and_penalties():
    from agentrl.train.metrics import context_metrics
    from agentrl.trajectory import Episode, Segment, Turn

    def turn(n_out: int, n_obs: int, q: list[float] | None = None) -> Turn:
        return Turn(index=0, output_ids=[1] * n_out, output_logprobs=[0.0] * n_out, obs_ids=[2] * n_obs,
                    process_reward=q)  # fmt: skip

    folded = Episode("a", "e", "t", [
        Segment([0] * 10, [turn(5, 20, [0.0] * 5)]),
        Segment([0] * 30, [turn(4, 6, [-1.0, -1.0, 0.0, 0.0])], fold_id=1, kind="branch"),
        Segment([0] * 30, [turn(3, 0, [0.0, 0.0, -0.2])], fold_id=2, kind="branch"),
    ])  # fmt: skip
    react = Episode("b", "e", "t", [Segment([0] * 10, [turn(5, 20), turn(5, 40)])])
    failed_fold = Episode("c", "e", "t", [Segment([0] * 10, [turn(2, 0, [-1.0, -1.0])])])
    folded.outcome, failed_fold.outcome = 1.0, 0.0
    # FoldGRPO can act only on the successful episode's 3 penalised tokens, not the failed one's 2
    assert context_metrics([folded, failed_fold])["fold/penalised_in_success"] == pytest.approx(3 / 2)
    m = context_metrics([folded, react])
    assert m["ctx/main_tokens"] == (35 + 80) / 2
    assert m["ctx/peak_tokens"] == (40 + 80) / 2
    assert m["fold/branches"] == 1.0  # 2 and 0
    assert m["fold/process_penalty"] == pytest.approx(-2.2 / 2)
    assert m["fold/penalised_tokens"] == 1.5
    assert set(context_metrics([react])) == {"ctx/main_tokens", "ctx/peak_tokens"}
    # a folding run whose policy never branched logs 0 branches (not nothing)
    never = context_metrics([react], folding="branch")
    assert (never["fold/branches"], never["fold/summaries"]) == (0.0, 0.0)


# --------------------------------------------------------------------------- end to end, with resume
@pytest.mark.slow
def test_max_runs_0_runs_the_first_warm_up_alone_and_reports_its_eval(tiny_model_dir, tmp_path):
    """How a study's shared warm-up is checked before its arms are paid for (README: EMPG)."""
    config = write_study(tmp_path, model=str(tiny_model_dir), seeds=[0, 1])
    out = tmp_path / "study"
    proc = agentrl("study", str(config), "--max-runs", "0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "stopped after 0 run(s)" in proc.stdout
    warm = json.loads((out / "seed-0" / "warmup" / "summary.json").read_text())
    assert len(warm["eval_tasks"]["before"]) == 3  # the held-out eval every arm would take
    assert not (out / "seed-0" / "grpo").exists() and not (out / "seed-1").exists()
    partial = json.loads((out / "results.json").read_text())
    assert partial["complete"] is False and partial["runs_finished"] == 0
    # a method added later runs from the same finished warm-up (how the multi-hop study got its EMPG arm)
    more = {"grpo": {}, "igpo": {"algo.advantage": "igpo"}, "empg": {"algo.advantage": "empg"}}
    added = agentrl("study", str(write_study(tmp_path, model=str(tiny_model_dir), seeds=[0, 1], methods=more)),
                    "--max-runs", "0")  # fmt: skip
    assert added.returncode == 0, added.stderr[-3000:]
    assert "study: seed 0 warm-up: finished, skipped" in added.stdout
    # the study folder copied elsewhere (a variation that shares the warm-up): its warm-up is reused there
    shutil.copytree(out / "seed-0" / "warmup", tmp_path / "copy" / "seed-0" / "warmup")
    copied = agentrl("study", str(write_study(tmp_path, model=str(tiny_model_dir), out_dir=str(tmp_path / "copy"))),
                     "--max-runs", "0")  # fmt: skip
    assert copied.returncode == 0, copied.stderr[-3000:]
    assert "study: seed 0 warm-up: finished, skipped" in copied.stdout
    # the warm-up's settings changed in the study YAML: the finished warm-up is not silently kept
    changed = write_study(tmp_path, model=str(tiny_model_dir), seeds=[0, 1],
                          overrides={"model.name": str(tiny_model_dir), **SMALL, "train.sft_warmup_steps": 2})  # fmt: skip
    stale = agentrl("study", str(changed))
    assert stale.returncode == 2
    message = " ".join(stale.stderr.split())
    assert "seed 0 warm-up (" in message and "train.sft_warmup_steps: ran with 1, the study now sets 2" in message
    assert "delete those run folders" in message and "new out_dir" in message
    assert not (out / "seed-0" / "grpo").exists()  # nothing ran


@pytest.mark.slow
def test_a_two_arm_study_runs_end_to_end_and_resumes_without_repeating_a_run(tiny_model_dir, tmp_path):
    from agentrl.train.heldout import compare_evals

    config = write_study(tmp_path, model=str(tiny_model_dir))
    out = tmp_path / "study"
    first = agentrl("study", str(config), "--max-runs", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "stopped after 1 run(s)" in first.stdout
    grpo_summary = out / "seed-0" / "grpo" / "summary.json"
    assert grpo_summary.exists() and not (out / "seed-0" / "igpo" / "summary.json").exists()
    partial = json.loads((out / "results.json").read_text())
    assert partial["complete"] is False and partial["runs_finished"] == 1
    stamps = {p: p.stat().st_mtime_ns for p in (grpo_summary, out / "seed-0" / "warmup" / "summary.json")}

    second = agentrl("study", str(config))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "study: seed 0 warm-up: finished, skipped" in second.stdout
    assert "study: seed 0 grpo: finished, skipped" in second.stdout
    assert "study: seed 0 igpo: starting (2 RL steps)" in second.stdout
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # not run again

    results = json.loads((out / "results.json").read_text())
    assert results["complete"] is True and results["runs_finished"] == results["runs_expected"] == 2
    summaries = {m: json.loads((out / "seed-0" / m / "summary.json").read_text()) for m in ("grpo", "igpo")}
    runs = {r["method"]: r for r in results["runs"]}
    for method, s in summaries.items():
        r = runs[method]
        assert (r["success_before"], r["success_after"], r["gained"], r["lost"], r["p_value"]) == (
            s["success_before"], s["success_after"], s["gained"], s["lost"], s["p_value"]
        )  # fmt: skip
        assert r["eval_tasks"] == 3 and r["steps"] == 2 and s["steps"] == 2
        assert r["episodes"] == 4 and r["generated_tokens"] == s["generated_tokens"] > 0  # what the arm sampled
        assert len(r["eval_failed"]) == 2  # the eval before and the one after RL
        assert r["same_start_as_baseline"] is True  # greedy evals of the one warm-up checkpoint
        resolved = yaml.safe_load((out / "seed-0" / method / "resolved_config.yaml").read_text())
        assert resolved["model"]["adapter"] == str(out / "seed-0" / "warmup" / "model")
        assert resolved["train"]["sft_warmup_steps"] == 0 and resolved["train"]["seed"] == 0
        # bf16_autocast=auto is resolved once per seed, by the warm-up; each arm is given that value
        warm_precision = yaml.safe_load((out / "seed-0" / "warmup" / "resolved_config.yaml").read_text())
        value = str(warm_precision["train"]["bf16_autocast"]).lower()
        assert resolved["train"]["bf16_autocast"] == warm_precision["train"]["bf16_autocast"]
        assert f"train.bf16_autocast={value}" in (out / "seed-0" / method / "command.txt").read_text()
    assert "study: seed 0 igpo: train.bf16_autocast=" in second.stdout
    assert summaries["igpo"]["objective"]["advantage"] == "igpo"
    # one held-out eval before RL per seed: the warm-up's, taken by every arm (not run again) ...
    warm = json.loads((out / "seed-0" / "warmup" / "summary.json").read_text())
    assert summaries["grpo"]["eval_tasks"]["before"] == warm["eval_tasks"]["before"] and len(warm["eval_tasks"]["before"]) == 3
    for method in ("grpo", "igpo"):
        log = (out / "seed-0" / method / "train.log").read_text()
        assert f"eval before RL: taken from {out / 'seed-0' / 'warmup'} (train.eval_before_from): 3 tasks" in log
        assert "eval before RL:  episode" not in log
    # ... with its per-task details (partial credit beside success): the arms' "before" means are its own
    assert set(warm["held_out_means"]["before"]) >= {"outcome", "em", "f1"}
    for method in ("grpo", "igpo"):
        assert summaries[method]["held_out_means"]["before"] == warm["held_out_means"]["before"]
        assert runs[method]["held_out_means"] == summaries[method]["held_out_means"]
        # each arm's peak memory per phase, as its run saved it (its eval before RL is the warm-up's)
        assert runs[method]["peak_rss_gib"] == summaries[method]["peak_rss_gib"]
        assert {"rollout", "eval"} <= set(runs[method]["peak_rss_gib"]) and "sft" not in runs[method]["peak_rss_gib"]
    assert "held-out means before → after" in (out / "report.md").read_text()
    assert "; f1 " in (out / "report.md").read_text()
    # ... which is the eval of the model the arms load: see the export round-trip test below
    # the paired test against the baseline is the trainer's sign test on the two arms' per-task outcomes
    expected = compare_evals(
        summaries["grpo"]["eval_tasks"]["after"], summaries["igpo"]["eval_tasks"]["after"]
    )
    vs = runs["igpo"]["vs_baseline"]
    assert (vs["tasks"], vs["gained"], vs["lost"], vs["p_value"]) == (
        3, expected["gained"], expected["lost"], expected["p_value"]
    )  # fmt: skip
    assert runs["grpo"]["vs_baseline"] is None
    assert results["methods"]["igpo"]["vs_baseline_pooled"] == vs
    # each method's own gain over the warm-up (pooled over seeds: one here) and the comparison's power
    from agentrl.study.report import detectable_gain

    for method in ("grpo", "igpo"):
        own = results["methods"][method]["own_gain_pooled"]
        assert (own["tasks"], own["gained"], own["lost"], own["p_value"]) == (
            3, runs[method]["gained"], runs[method]["lost"], runs[method]["p_value"]
        )  # fmt: skip
        assert own["gain"] == (own["gained"] - own["lost"]) / 3
    assert results["methods"]["igpo"]["detectable_vs_baseline"] == detectable_gain(3, vs["gained"] + vs["lost"])
    assert "detectable_vs_baseline" not in results["methods"]["grpo"]
    # mechanism metrics: the IGPO arm logged its information gains, every arm its context size
    igpo_mech, grpo_mech = runs["igpo"]["mechanisms"], runs["grpo"]["mechanisms"]
    assert 0.0 <= igpo_mech["igpo/ig_nonzero_share"] <= 1.0
    assert not any(k.startswith("igpo/") for k in grpo_mech)
    assert grpo_mech["ctx/main_tokens"] > 0 and "loss/grad_norm_p50" in grpo_mech
    records = [json.loads(x) for x in (out / "seed-0" / "igpo" / "metrics.jsonl").read_text().splitlines()]
    shares = [r["igpo/ig_nonzero_share"] for r in records if "igpo/ig_nonzero_share" in r]
    assert igpo_mech["igpo/ig_nonzero_share"] == pytest.approx(sum(shares) / len(shares))
    # report.md: one table row per method with the numbers of results.json
    report = (out / "report.md").read_text()
    assert "(incomplete)" not in report
    assert results["eval_temperatures"] == [0.0] and "Held-out tasks: 3 (greedy, the same for every arm)" in report
    igpo_row = next(
        line for line in report.splitlines() if line.startswith("| `igpo` | `algo.advantage=igpo`")
    )
    assert f"{runs['igpo']['success_after']:.3f}" in igpo_row
    assert f"{vs['gained']} / {vs['lost']} of 3" in igpo_row
    assert any(
        line.startswith("| `grpo` | (base) | 1 |") and "baseline" in line for line in report.splitlines()
    )
    for plot in ("success.png", "reward.png", "context.png"):
        assert (out / plot).stat().st_size > 0, plot
    assert set(results["plots"]) >= {"success.png", "reward.png", "context.png"}
    # the whole study folder moved elsewhere (e.g. records gathered from several machines): every run
    # is still finished there, though each arm's model.adapter names the old folder's warm-up
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    again = agentrl("study", str(write_study(tmp_path, model=str(tiny_model_dir), out_dir=str(moved))))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "study: seed 0 igpo: finished, skipped" in again.stdout
    assert json.loads((moved / "results.json").read_text())["runs"] == [
        {**r, "out_dir": r["out_dir"].replace(str(out), str(moved))} for r in results["runs"]
    ]
    # the finished study's models evaluated again, sampled at 0.7, without training: one eval-only run
    # per model, each arm paired with its warm-up's model evaluated the same way
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    config = write_study(tmp_path, model=str(tiny_model_dir))  # the study in `out` again (not the moved copy)
    reeval = agentrl("study", str(config), "--reevaluate", "train.eval_temperature=0.7")
    assert reeval.returncode == 0, reeval.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # the study's own folder is only read
    where = out / "reevaluated" / "eval_temperature-0.7"
    assert "re-evaluating 2 arm(s) with train.eval_temperature=0.7: 3 evals (0 finished, 3 to run)" in reeval.stdout
    again = json.loads((where / "results.json").read_text())
    assert again["complete"] is True and again["eval_temperatures"] == [0.7]
    assert "sampled at temperature 0.7" in (where / "report.md").read_text()
    assert f"Re-evaluated from `{out}` with `train.eval_temperature=0.7` (no training)." in (where / "report.md").read_text()
    assert again["reevaluated"] == {"study": str(out), "settings": ["train.eval_temperature=0.7"], "left_out": []}
    evals = {m: json.loads((where / "evals" / "seed-0" / m / "summary.json").read_text()) for m in ("warmup", "grpo", "igpo")}
    for method in ("grpo", "igpo"):
        row = next(r for r in again["runs"] if r["method"] == method)
        expected = compare_evals(evals["warmup"]["eval_tasks"]["before"], evals[method]["eval_tasks"]["before"])
        assert (row["success_before"], row["success_after"], row["gained"], row["lost"]) == (
            expected["success_before"], expected["success_after"], expected["gained"], expected["lost"])
        assert row["steps"] == 2 and row["mechanisms"] == runs[method]["mechanisms"]  # the training it had
        resolved = yaml.safe_load((where / "evals" / "seed-0" / method / "resolved_config.yaml").read_text())
        assert resolved["model"]["adapter"] == str(out / "seed-0" / method / "model")
        assert resolved["train"]["steps"] == 0 and resolved["train"]["eval_temperature"] == 0.7
        assert not (where / "evals" / "seed-0" / method / "model").exists()  # the evaluated model is not copied
    # a re-run skips the finished evals
    rerun = agentrl("study", str(config), "--reevaluate", "train.eval_temperature=0.7")
    assert rerun.returncode == 0 and "3 evals (3 finished, 0 to run)" in rerun.stdout


@pytest.mark.slow
def test_tree_and_chain_arms_at_equal_generated_tokens_end_to_end(tiny_model_dir, tmp_path):
    """generated_tokens through `agentrl study`: each arm stops with the step that spends the budget
    (the tokens before that step were fewer), and the report gives each run's steps, episodes, tokens."""
    methods = {"chain": {"rollout.branches": 0, "rollout.group_size": 2},
               "tree": {"rollout.branches": 1, "rollout.group_size": 1, "rollout.branch_concurrency": 2}}  # fmt: skip
    config = write_study(tmp_path, model=str(tiny_model_dir), episodes=None, generated_tokens=40, max_steps=6,
                         methods=methods)  # fmt: skip
    proc = agentrl("study", str(config))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "40 generated tokens per arm (at most 6 steps)" in proc.stdout
    assert "study: seed 0 tree: starting (until 40 generated tokens, at most 6 RL steps)" in proc.stdout
    out = tmp_path / "study"
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] and results["generated_tokens_per_arm"] == 40
    report = (out / "report.md").read_text()
    for row in results["runs"]:
        steps = [json.loads(x) for x in (out / "seed-0" / row["method"] / "metrics.jsonl").read_text().splitlines()]
        tokens = [r["rollout/sampled_tokens"] for r in steps if "perf/step_s" in r]
        assert len(tokens) == row["steps"] <= 6 and row["generated_tokens"] == sum(tokens)
        assert sum(tokens) >= 40 > sum(tokens[:-1])  # the last step spent the budget, the one before had not
        assert f"| `{row['method']}` | 0 | {row['steps']} | {row['episodes']} / {row['generated_tokens']} |" in report


def test_the_exported_warm_up_reloads_bit_for_bit_so_its_eval_is_every_arms_eval(tiny_model_dir, tmp_path):
    """An arm takes the warm-up's eval of the in-memory model as its own eval before RL, and starts
    from the exported model: the two are the same weights, so greedy decoding gives the same tokens."""
    from types import SimpleNamespace

    from agentrl.rollout.model import load_model
    from agentrl.train.weights import export_model

    model, tokenizer = load_model(str(tiny_model_dir))
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():  # stands in for the warm-up's updates
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=noise))
    export_model(SimpleNamespace(policy=SimpleNamespace(model=model)), tokenizer, tmp_path / "model")
    loaded, _ = load_model(str(tiny_model_dir), adapter=str(tmp_path / "model"))
    mine, theirs = model.state_dict(), loaded.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    prompt = torch.tensor([[1, 5, 9, 14, 3]])
    outs = [m.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0) for m in (model, loaded)]
    assert torch.equal(outs[0], outs[1])


def test_the_report_says_how_the_held_out_evals_sampled():
    from agentrl.study.report import eval_wording

    assert eval_wording([0.0]) == eval_wording([]) == "greedy, the same for every arm"
    assert eval_wording([0.6]).startswith("sampled at temperature 0.6, one sample a task")
    assert eval_wording([0.0, 0.6]) == "evaluated at differing temperatures: 0, 0.6 (0 = greedy)"


def test_the_detectable_gain_by_hand():
    from agentrl.study.report import detectable_gain

    # no noise: 6 extra gains of 100 is the fewest whose 6 / 0 split has p = 2/64 < 0.05 (5 / 0: 0.0625)
    assert detectable_gain(100, 0) == 0.06
    # 2 noisy disagreements of 50: 10 extra gains give 12 differing tasks, each a gain with q = 11/12;
    # 10 / 2 or better has p = 2 * 79/4096 = 0.039, reached with probability 66 q^10 (1-q)^2 + 12 q^11 (1-q)
    # + q^12 = 0.928; 9 extra (q = 10/11, 10 / 1 or better) only q^10 (1 + q) = 0.736
    assert detectable_gain(50, 2) == 0.2
    # more noise needs a larger gain; nine tasks of ten already split cannot show one
    assert detectable_gain(384, 20) < detectable_gain(384, 40)
    assert detectable_gain(10, 9) is None


def test_held_out_details_and_their_means_by_hand():
    from types import SimpleNamespace

    from agentrl.train.heldout import eval_details, held_out_means

    ok = SimpleNamespace(failed=False, outcome=0.5, metrics={"em": 0.0, "f1": 0.5, "note": "x"})
    crashed = SimpleNamespace(failed=True, outcome=0.9, metrics={"em": 1.0})
    assert eval_details(ok) == {"outcome": 0.5, "em": 0.0, "f1": 0.5}  # numbers only
    assert eval_details(crashed) == {"outcome": 0.0}  # a failed episode earns nothing
    details = {"a": eval_details(ok), "b": eval_details(crashed), "c": {"outcome": 1.0, "em": 1.0, "f1": 1.0}}
    assert held_out_means(details, dict.fromkeys("abc")) == {"em": 1 / 3, "f1": 0.5, "outcome": 0.5}
    assert held_out_means(details, dict.fromkeys("ac")) == {"em": 0.5, "f1": 0.75, "outcome": 0.75}
    assert held_out_means(details, dict.fromkeys("ad")) == {}  # a task without details: no means at all


def test_eval_before_from_refuses_a_run_that_is_not_finished_or_evaluated_fewer_tasks(tmp_path):
    from agentrl.train.heldout import shared_eval

    with pytest.raises(ConfigError) as err:
        shared_eval(tmp_path, ["a"])
    assert err.value.field == "train.eval_before_from" and "no summary.json" in err.value.problem
    (tmp_path / "summary.json").write_text(json.dumps({"eval_tasks": {"before": {"a": 1.0, "b": 0.0, "c": 1.0}}}))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/success": 2 / 3, "eval/failed": 1.0}) + "\n")
    outcomes, record, details = shared_eval(tmp_path, ["c", "b"])  # a subset, in this run's order
    assert outcomes == {"c": 1.0, "b": 0.0} and record == {"eval/success": 0.5, "eval/failed": 1.0}
    assert details == {}  # a run from before per-task details were kept: no means, nothing made up
    kept = {"a": {"outcome": 1.0, "f1": 1.0}, "b": {"outcome": 0.4, "f1": 0.5}, "c": {"outcome": 1.0, "f1": 0.9}}
    (tmp_path / "summary.json").write_text(json.dumps(
        {"eval_tasks": {"before": {"a": 1.0, "b": 0.0, "c": 1.0}}, "eval_details": {"before": kept}}))  # fmt: skip
    outcomes, record, details = shared_eval(tmp_path, ["c", "b"])
    assert details == {"c": kept["c"], "b": kept["b"]}
    assert record["eval/outcome"] == pytest.approx(0.7) and record["eval/metric/f1"] == pytest.approx(0.7)
    with pytest.raises(ConfigError) as err:
        shared_eval(tmp_path, ["a", "d"])
    assert "missing e.g. 'd'" in err.value.problem and "train.eval_episodes=2" in err.value.fix


@pytest.mark.slow
def test_a_folding_arm_evaluates_itself_before_rl_in_its_own_mode(tiny_model_dir, tmp_path):
    """Through `agentrl study`: the warm-up's eval ran ReAct; the folding arm's eval before RL runs in
    folding mode (its own), and the study, results.json and report.md say why."""
    folding = {"rollout.folding": "branch", "algo.advantage": "foldgrpo", "algo.loss": "foldgrpo"}
    config = write_study(tmp_path, model=str(tiny_model_dir), methods={"folding": folding, "react": {}},
                         baseline="react")  # fmt: skip
    out = tmp_path / "study"
    proc = agentrl("study", str(config), "--max-runs", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    why = "rollout.folding: 'none' -> 'branch'"
    assert f"study: seed 0 folding: evaluates itself before RL, since it evaluates otherwise than the warm-up ({why})" in proc.stdout
    log = (out / "seed-0" / "folding" / "train.log").read_text()
    assert "eval before RL:  episode 3/3" in log and "train.eval_before_from" not in log
    resolved = yaml.safe_load((out / "seed-0" / "folding" / "resolved_config.yaml").read_text())
    assert resolved["train"]["eval_before_from"] == "" and resolved["rollout"]["folding"] == "branch"
    described = yaml.safe_load((out / "study.yaml").read_text())
    assert [r.get("own_eval_before") for r in described["runs"]] == [None, [why], None]
    row = json.loads((out / "results.json").read_text())["runs"][0]
    assert row["method"] == "folding" and row["own_eval_before"] == [why]
    assert f"(own eval: {why})" in (out / "report.md").read_text()
    # re-evaluated: the folding arm's eval before RL is the warm-up's model evaluated in folding mode; the
    # ReAct arm (not run: --max-runs 1) is left out and named
    reeval = agentrl("study", str(config), "--reevaluate", "train.eval_temperature=0.7")
    assert reeval.returncode == 0, reeval.stderr[-3000:]
    where = out / "reevaluated" / "eval_temperature-0.7"
    assert "study: seed 0 react: not finished in" in reeval.stdout
    before = yaml.safe_load((where / "evals" / "seed-0" / "folding-before" / "resolved_config.yaml").read_text())
    assert before["rollout"]["folding"] == "branch" and before["model"]["adapter"] == str(out / "seed-0" / "warmup" / "model")
    evals = {n: json.loads((where / "evals" / "seed-0" / n / "summary.json").read_text())["eval_tasks"]["before"]
             for n in ("warmup", "folding-before", "folding")}  # fmt: skip
    arm = json.loads((where / "seed-0" / "folding" / "summary.json").read_text())
    assert arm["eval_tasks"] == {"before": evals["folding-before"], "after": evals["folding"]}
    results = json.loads((where / "results.json").read_text())
    assert [r["method"] for r in results["runs"]] == ["folding"] and results["reevaluated"]["left_out"][0].startswith("seed 0 react")


@pytest.mark.slow
def test_parallel_runs_match_one_at_a_time_and_a_failed_warm_up_costs_only_its_seed(tiny_model_dir, tmp_path):
    """`agentrl study --parallel 3`: warm-ups first, arms once their seed's warm-up is done, each run's
    output in its own log; a seed whose warm-up crashes fails its arms only (exit 1, named), the
    other seed finishes, and a re-run completes it. Every run is its own seeded process, so seed 0
    gives the same evals and losses as the study run one at a time."""
    model = str(tiny_model_dir)
    (tmp_path / "seq").mkdir()
    (tmp_path / "par").mkdir()
    seq = agentrl("study", str(write_study(tmp_path / "seq", model=model)))
    assert seq.returncode == 0, seq.stderr[-3000:]
    config = write_study(tmp_path / "par", model=model, seeds=[0, 1])
    out = tmp_path / "par" / "study"
    (out / "seed-1" / "warmup" / "train.log").mkdir(parents=True)  # the seed-1 warm-up cannot open its log
    first = agentrl("study", str(config), "--parallel", "3")
    assert first.returncode == 1
    assert "study: up to 3 runs at once (--parallel); PYTORCH_CUDA_ALLOC_CONF=" in first.stdout
    starts = [line for line in first.stdout.splitlines() if ": starting (" in line]
    assert [s.split(":")[1].strip() for s in starts[:2]] == ["seed 0 warm-up", "seed 1 warm-up"]
    assert "study: seed 1 grpo: not started: its warm-up failed" in first.stdout
    message = " ".join(first.stderr.split())
    assert "'seed 1 warm-up'; 'seed 1 grpo'; 'seed 1 igpo' failed" in message and "finished runs are kept" in message
    assert "IsADirectoryError" in (out / "seed-1" / "warmup" / "study_output.log").read_text()
    for method in ("warmup", "grpo", "igpo"):
        assert (out / "seed-0" / method / "summary.json").exists()
        assert "held-out" in (out / "seed-0" / method / "study_output.log").read_text()
    (out / "seed-1" / "warmup" / "train.log").rmdir()
    second = agentrl("study", str(config), "--parallel", "3")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "study: seed 0 igpo: finished, skipped" in second.stdout
    assert json.loads((out / "results.json").read_text())["complete"] is True

    def same(run_dir: Path) -> tuple:
        summary = json.loads((run_dir / "summary.json").read_text())
        records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses = [(r["step"], r["loss/loss"], r["loss/grad_norm"], r["env/reward"]) for r in records if "loss/loss" in r]
        return summary["eval_tasks"], losses

    for method in ("warmup", "grpo", "igpo"):
        assert same(out / "seed-0" / method) == same(tmp_path / "seq" / "study" / "seed-0" / method)
    assert len(same(out / "seed-0" / "igpo")[1]) == 2  # both RL steps compared


def start_study_until_warm_ups(config: Path, tmp_path: Path, seeds: list[int], *args: str) -> subprocess.Popen:
    """`agentrl study CONFIG ARGS` started, returned once every seed's warm-up has written its train.log."""
    import time

    study = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "study", str(config), *args], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    logs = [tmp_path / "study" / f"seed-{s}" / "warmup" / "train.log" for s in seeds]
    deadline = time.time() + 120
    while not all(log.exists() for log in logs) and time.time() < deadline:
        time.sleep(0.5)
    assert all(log.exists() for log in logs), "every warm-up should have started"
    return study


def runs_going(tmp_path: Path, wait_s: float = 0.0) -> str:
    """The study's `agentrl train` processes still running (their command lines), after waiting up to
    ``wait_s`` for them to end."""
    import time

    pattern = f"train.out_dir={tmp_path / 'study'}"
    deadline = time.time() + wait_s
    while subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0 and time.time() < deadline:
        time.sleep(0.5)
    return subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout.strip()


@pytest.mark.slow
def test_a_stopped_parallel_study_leaves_no_run_going(tiny_model_dir, tmp_path):
    """`agentrl study --parallel` stopped by SIGTERM (kill, a job scheduler; Ctrl-C takes the same
    path, but a shell's background jobs ignore SIGINT): its runs stop with it, none left unwatched."""
    import signal

    config = write_study(tmp_path, model=str(tiny_model_dir), seeds=[0, 1])
    study = start_study_until_warm_ups(config, tmp_path, [0, 1], "--parallel", "2")
    study.send_signal(signal.SIGTERM)
    assert study.wait(timeout=60) == 128 + signal.SIGTERM
    running = runs_going(tmp_path)
    assert running == "", f"runs left going: {running}"
    assert not (tmp_path / "study" / "seed-0" / "warmup" / "summary.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [[], ["--parallel", "2"]], ids=["one-at-a-time", "parallel"])
def test_a_killed_study_leaves_no_run_going(parallel, tiny_model_dir, tmp_path):
    """`agentrl study` killed with SIGKILL (the OOM killer, a scheduler's hard limit: no handler runs):
    its `agentrl train` runs get SIGTERM from the kernel (`setpriv --pdeathsig`) and end with it."""
    import signal

    config = write_study(tmp_path, model=str(tiny_model_dir))
    study = start_study_until_warm_ups(config, tmp_path, [0], *parallel)
    assert runs_going(tmp_path) != "", "its run should be going"
    study.send_signal(signal.SIGKILL)
    study.wait(timeout=30)
    running = runs_going(tmp_path, wait_s=30)
    assert running == "", f"runs left going after the study was killed: {running}"
    assert not (tmp_path / "study" / "seed-0" / "warmup" / "summary.json").exists()


def test_a_sitting_with_other_seeds_names_the_finished_ones_it_leaves_out(tmp_path):
    from agentrl.study.orchestrator import other_finished_seeds, pooling_hint

    study = load_study(write_study(tmp_path), ["seeds=[1,2]"])
    out = tmp_path / "study"
    for seed, runs in ((0, ("warmup", "grpo", "igpo")), (3, ("warmup", "grpo")), (1, ("warmup", "grpo", "igpo"))):
        for run in runs:
            (out / f"seed-{seed}" / run).mkdir(parents=True)
            (out / f"seed-{seed}" / run / "summary.json").write_text(json.dumps({"eval_tasks": {"before": {}}}))
    (out / "seed-x").mkdir()  # not a seed folder
    # seed 0 is whole, seed 3 lacks its igpo arm, seed 1 is this sitting's own
    assert other_finished_seeds(study) == [0]
    hint = pooling_hint(study)
    assert hint is not None and "seed(s) 0 also finished" in hint and "seeds=[0,1,2] --max-runs 0" in hint
    assert pooling_hint(load_study(write_study(tmp_path), ["seeds=[0,1,2]"])) is None
