"""``agentrl study CONFIG --reevaluate KEY=VALUE``: a finished study's models evaluated again under other
held-out eval settings, without training anything.

A study's verdict depends on how its held-out evals ran (greedy, or sampled at
``train.eval_temperature``; the sampler's precision; the turn budget ...). Re-evaluating asks the same
question of the same models under another setting: each finished run's exported model (the warm-up's
and every arm's) is evaluated on the study's held-out tasks by an eval-only ``agentrl train``
(``train.steps=0 train.sft_warmup_steps=0 model.adapter=<run>/model``), with the run's own overrides,
the precision it resolved, and the ``--reevaluate`` settings last. An arm's eval before RL is its
seed's warm-up model evaluated the same way (the warm-up's eval; an arm that evaluates otherwise than
the warm-up, e.g. in folding mode, gets its own eval of the warm-up model, ``<method>-before``).

Everything goes to ``out_dir/reevaluated/<settings>/``: the eval-only runs under ``evals/seed-S/``,
and per arm ``seed-S/<method>/`` the arm as re-evaluated (``summary.json``: the two evals paired with
the trainer's sign test, plus the run's steps and objective; ``metrics.jsonl``: the run's RL steps and
the two evals' failed counts; the eval's ``resolved_config.yaml``), from which the study's report is
written as for the study itself (results.json, report.md, plots). An eval-only run's exported model
(the evaluated one, unchanged) is removed. The study's own folder is read, never changed. Finished
evals are skipped on a re-run (one older than the run whose model it evaluated, since re-run, stops the
re-evaluation before anything runs); runs of the study that did not finish, or whose exported model is
gone, are left out and named."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from agentrl.config import EVAL_SETTINGS, parse_overrides
from agentrl.errors import ConfigError
from agentrl.study.orchestrator import (
    Run,
    StudyConfig,
    _run_config,
    check_finished,
    plan,
    resolved_precision,
    run_one,
    run_parallel,
    this_sitting,
)

# what a re-evaluation may change: how the held-out eval runs (not which model is evaluated), and how
# many held-out tasks it runs (the first N: more tasks, more power to tell the arms apart)
ALLOWED = (*(k for k in EVAL_SETTINGS if k != "model.name"), "train.eval_episodes")
# keys of a study run's own overrides an eval-only run sets itself
REPLACED = {"train.out_dir", "train.steps", "train.token_budget", "train.eval_before_from", "model.adapter",
            "train.sft_warmup_steps"}  # fmt: skip


def check_settings(settings: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``--reevaluate`` values: each ``key=value`` of a held-out eval setting (a ConfigError otherwise)."""
    if not settings:
        raise ConfigError(
            "--reevaluate", "needs at least one KEY=VALUE", "e.g. --reevaluate train.eval_temperature=0.6"
        )
    for item in settings:
        key, eq, _ = item.partition("=")
        if not eq:
            raise ConfigError("--reevaluate", f"{item!r} has no '='", "write e.g. train.eval_temperature=0.6")
        if key.strip() not in ALLOWED:
            raise ConfigError(f"--reevaluate {key.strip()}", "is not a held-out eval setting a re-evaluation may change",
                              f"use one of: {', '.join(ALLOWED)}")  # fmt: skip
    parse_overrides(list(settings))
    return tuple(s.strip() for s in settings)


def folder_name(settings: tuple[str, ...]) -> str:
    """``train.eval_temperature=0.6`` -> ``eval_temperature-0.6`` (several joined by ``+``)."""
    parts = []
    for item in settings:
        key, _, value = item.partition("=")
        name = key.split(".", 1)[-1]
        parts.append(f"{name}-{value}".replace("/", "_").replace(" ", ""))
    return "+".join(parts)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A re-evaluation: where it goes, its eval-only runs, the arms it reports and the runs it leaves out."""

    out_dir: Path
    evals: list[Run]  # eval-only runs in order (per seed: the warm-up's model first)
    arms: list[tuple[Run, Run, Run]]  # (the study's arm, its eval before RL, its eval after RL)
    left_out: list[tuple[Run, str]]  # the study's runs it cannot evaluate, and why
    settings: tuple[str, ...]

    def view(self, study: StudyConfig) -> StudyConfig:
        """The study as re-evaluated: its report goes to this plan's folder."""
        tasks = [int(s.partition("=")[2]) for s in self.settings if s.startswith("train.eval_episodes=")]
        return dataclasses.replace(study, name=f"{study.name}, re-evaluated with {' '.join(self.settings)}",
                                   out_dir=self.out_dir, eval_tasks=tasks[-1] if tasks else study.eval_tasks)  # fmt: skip

    def evals_study(self, study: StudyConfig) -> StudyConfig:
        """The study with its run folders under ``evals/``: the eval-only runs' layout (a seed's
        warm-up eval runs before its arms' when several run at once)."""
        return dataclasses.replace(study, out_dir=self.out_dir / "evals")


def eval_run(
    source: Run, model_from: Run, out_dir: Path, method: str | None, settings: tuple[str, ...]
) -> Run:
    """An eval-only run of ``model_from``'s exported model with ``source``'s overrides, the precision
    ``source`` resolved, then ``settings``."""
    own = tuple(o for o in source.overrides if o.partition("=")[0].strip() not in REPLACED)
    forced = (f"train.out_dir={out_dir}", "train.steps=0", "train.sft_warmup_steps=0",
              f"model.adapter={model_from.out_dir / 'model'}")  # fmt: skip
    return Run(source.seed, method, out_dir, (*own, *resolved_precision(source.out_dir), *settings, *forced))


def _unusable(run: Run) -> str:
    """Why a study run's model cannot be re-evaluated ("" when it can)."""
    if not run.finished:
        return f"not finished in {run.out_dir}"
    if not (run.out_dir / "model").is_dir():
        return f"its exported model {run.out_dir / 'model'} is gone (records kept without the model?)"
    return ""


def plan_reevaluation(study: StudyConfig, settings: list[str] | tuple[str, ...]) -> Plan:
    """The eval-only runs for every finished run of the study (each config validated)."""
    settings = check_settings(settings)
    runs = plan(study)
    check_finished(study, runs)  # the models are the ones the study describes
    out = study.out_dir / "reevaluated" / folder_name(settings)
    evals_dir = out / "evals"
    evals: list[Run] = []
    arms: list[tuple[Run, Run, Run]] = []
    left_out = [(r, why) for r in runs if (why := _unusable(r))]
    for seed in study.seeds:
        warm = study.warmup(seed)
        if _unusable(warm):
            continue
        warm_eval = eval_run(warm, warm, evals_dir / f"seed-{seed}" / "warmup", None, settings)
        evals.append(warm_eval)
        for method in study.methods:
            arm = next(r for r in runs if r.seed == seed and r.method == method.name)
            if _unusable(arm):
                continue
            after = eval_run(arm, arm, evals_dir / f"seed-{seed}" / method.name, method.name, settings)
            before = warm_eval
            if arm.own_eval:  # it evaluates otherwise than the warm-up: the warm-up model its way
                before = eval_run(
                    arm, warm, evals_dir / f"seed-{seed}" / f"{method.name}-before", method.name, settings
                )
                evals.append(before)
            evals.append(after)
            arms.append((arm, before, after))
    for run in evals:
        _run_config(study, run, f"--reevaluate ({run.label})")
    stale = [str(r.out_dir) for r in evals if r.finished and _older_than_its_model(r)]
    if stale:
        raise ConfigError("--reevaluate", f"finished evals older than the runs whose models they evaluated "
                          f"(those runs ran again since): {', '.join(stale)}",
                          "delete those eval folders to evaluate the new models")  # fmt: skip
    return Plan(out, evals, arms, left_out, settings)


def _older_than_its_model(run: Run) -> bool:
    """An eval-only run that finished before the run whose model it evaluated finished."""
    source = Path(_model(run)).parent / "summary.json"
    return source.exists() and source.stat().st_mtime > (run.out_dir / "summary.json").stat().st_mtime


def compose(arm: Run, before: Run, after: Run, out_dir: Path) -> Run:
    """Write the arm as re-evaluated into ``out_dir`` (see the module doc); returns it as a study run."""
    from agentrl.study.report import eval_failed, rl_records
    from agentrl.train.heldout import compare_evals

    source = json.loads((arm.out_dir / "summary.json").read_text())
    b, a = (json.loads((r.out_dir / "summary.json").read_text()) for r in (before, after))
    b_tasks, a_tasks = b["eval_tasks"]["before"], a["eval_tasks"]["before"]
    paired = compare_evals(b_tasks, a_tasks)
    summary = {
        **{k: source[k] for k in ("steps", "objective", "generated_tokens") if k in source},
        **paired, "eval_tasks": {"before": b_tasks, "after": a_tasks},
        "eval_details": {"before": b.get("eval_details", {}).get("before", {}),
                         "after": a.get("eval_details", {}).get("before", {})},
        "held_out_means": {"before": b.get("held_out_means", {}).get("before", {}),
                           "after": a.get("held_out_means", {}).get("before", {})},
        "peak_rss_gib": a.get("peak_rss_gib", {}),
        "reevaluated": {"run": str(arm.out_dir), "eval_before": str(before.out_dir), "eval_after": str(after.out_dir)},
    }  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    # the RL steps (mechanisms, curves); their evals are replaced by the re-evaluation's
    records = [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in rl_records(arm.out_dir)]
    failed = [*eval_failed(before.out_dir)[:1], *eval_failed(after.out_dir)[:1]]
    records += [
        {"step": 0 if i == 0 else summary.get("steps", 0), "eval/failed": f} for i, f in enumerate(failed)
    ]
    (out_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    shutil.copyfile(after.out_dir / "resolved_config.yaml", out_dir / "resolved_config.yaml")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))  # last: marks it finished
    return dataclasses.replace(arm, out_dir=out_dir)


def run_reevaluation(study: StudyConfig, settings: list[str] | tuple[str, ...], *, max_runs: int | None = None,
                     parallel: int = 1) -> dict[str, Any]:  # fmt: skip
    """Run the eval-only runs not finished yet (``max_runs``: at most that many arms' evals this
    sitting), then write the re-evaluated study's results into the plan's folder."""
    from agentrl.study.report import write_results
    from agentrl.train.progress import RunProgress

    if parallel < 1:
        raise ConfigError("--parallel", f"must be >= 1, got {parallel}", "use 1 to run one run at a time")
    p = plan_reevaluation(study, settings)
    if not p.arms:
        raise ConfigError("--reevaluate", f"no arm of the study has finished in {study.out_dir}",
                          "run the study first: `agentrl study CONFIG`")  # fmt: skip
    p.out_dir.mkdir(parents=True, exist_ok=True)
    described = {"study": str(study.out_dir), "settings": list(p.settings),
                 "evals": [{"seed": r.seed, "method": r.method or "warmup", "out_dir": str(r.out_dir),
                            "overrides": list(r.overrides)} for r in p.evals],
                 "left_out": [f"{r.label}: {why}" for r, why in p.left_out]}  # fmt: skip
    (p.out_dir / "reevaluation.yaml").write_text(yaml.safe_dump(described, sort_keys=False))
    progress = RunProgress(p.out_dir, append=True)
    todo = [r for r in p.evals if not r.finished]
    chosen, cut = this_sitting(todo, max_runs)
    progress.print(f"study {study.name}: re-evaluating {len(p.arms)} arm(s) with {' '.join(p.settings)}: "
                   f"{len(p.evals)} evals ({len(p.evals) - len(todo)} finished, {len(todo)} to run) -> {p.out_dir}")  # fmt: skip
    for run, why in p.left_out:
        progress.line(f"study: {run.label}: {why}, left out of the re-evaluation")
    evals_study, view = p.evals_study(study), p.view(study)
    arm_views: list[Run] = []

    def report() -> dict[str, Any]:
        arm_views.clear()
        for arm, before, after in p.arms:
            target = view.run_dir(arm.seed, arm.method or "warmup")
            if before.finished and after.finished:
                arm_views.append(compose(arm, before, after, target))
            else:
                arm_views.append(dataclasses.replace(arm, out_dir=target))
        where = {"study": str(study.out_dir), "settings": list(p.settings),
                 "left_out": [f"{r.label}: {why}" for r, why in p.left_out]}  # fmt: skip
        lines = [f"Re-evaluated from `{study.out_dir}` with `{' '.join(p.settings)}` (no training)."]
        lines += [f"Left out: {r.label} ({why})." for r, why in p.left_out]
        return write_results(view, arm_views, extra={"reevaluated": where}, notes=lines)

    if chosen:
        with progress.phase("re-evaluation", len(chosen), unit="eval") as phase:

            def finished(run: Run) -> None:
                # the evaluated model, unchanged: not kept twice
                shutil.rmtree(run.out_dir / "model", ignore_errors=True)
                summary = json.loads((run.out_dir / "summary.json").read_text())
                phase.advance(
                    run=f"seed{run.seed}/{run.out_dir.name}", success=float(summary["success_before"])
                )
                report()

            if parallel == 1:
                for run in chosen:
                    progress.line(f"study: {run.label}: evaluating {_model(run)} -> {run.out_dir}")
                    run_one(evals_study, run, progress)
                    finished(run)
            else:
                run_parallel(evals_study, chosen, parallel, progress, finished)
    if cut:
        progress.line("study: stopped (--max-runs); re-run to continue")
    results = report()
    progress.line(f"study: re-evaluation results {'complete' if results['complete'] else 'partial'}: "
                  f"{p.out_dir / 'results.json'}, {p.out_dir / 'report.md'}")  # fmt: skip
    progress.close()
    return {**results, "out_dir": str(p.out_dir)}


def _model(run: Run) -> str:
    return next((o.partition("=")[2] for o in reversed(run.overrides) if o.startswith("model.adapter=")), "?")


__all__ = [
    "ALLOWED",
    "Plan",
    "check_settings",
    "compose",
    "folder_name",
    "plan_reevaluation",
    "run_reevaluation",
]
