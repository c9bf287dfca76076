"""Held-out evaluation in training: the same first ``train.eval_episodes`` held-out tasks before RL,
every ``train.eval_every`` steps and after RL, scored by the env's own success metric (as
``agentrl eval``); crashed episodes replayed, too many still crashed stop the run; a study arm may
take its warm-up's eval before RL (``train.eval_before_from``); :func:`compare_evals` pairs two
evals of the same tasks (sign test)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agentrl.config import RunConfig, eval_differences, load_config
from agentrl.errors import ConfigError
from agentrl.eval.crashes import replay_crashed
from agentrl.train.memory import PhasePeaks, gpu_memory
from agentrl.train.metrics import MetricsLogger
from agentrl.train.progress import RunProgress
from agentrl.trajectory import Episode, write_jsonl

if TYPE_CHECKING:
    from agentrl.train.rollouts import Rollouts


EVAL_SEED = 10_000_019  # held-out evals sample (at eval_temperature > 0) from streams of this seed


def make_evaluator(config: RunConfig, rollouts: Rollouts, policy: Any, logger: MetricsLogger,
               progress: RunProgress, out_dir: Path | None = None, peaks: PhasePeaks | None = None):  # fmt: skip
    """``evaluate(step) -> ({task_id: solved}, {task_id: details})`` on the first ``eval_episodes``
    held-out tasks (same ones every time); logs their mean as ``eval/success``: the share solved by
    the env's own success metric (:attr:`agentrl.env.TextEnv.success_metric`, exact match for search),
    the same definition as ``agentrl eval``'s success; failed episodes count as unsolved. A task's
    details are its outcome (the reward: partial credit) and the env's numeric metrics (search: em
    and f1; WebShop: score); their means are logged as ``eval/outcome`` and ``eval/metric/<name>``.
    Failed (crashed) episodes are replayed up to twice; more than ``train.eval_max_failed`` of them
    still failed raises :class:`EvalError`. With ``out_dir`` the episodes go to
    ``out_dir/eval/step-NNNNNN.jsonl``; with ``peaks`` the eval's peak RSS is logged
    (``perf/rss_peak_eval_gib``)."""
    from agentrl.env import solved
    from agentrl.rollout.runner import task_id

    tasks = rollouts.held_out(config.train.eval_episodes)
    names = getattr(rollouts, "names", None)  # a mixture: per-env means too

    def evaluate(step: int) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        if step == 0 and config.train.eval_before_from:
            outcomes, record, details = shared_eval(
                config.train.eval_before_from, [task_id(t) for t in tasks]
            )
            logger.log(0, record, echo=("eval/success",))
            progress.line(f"eval before RL: taken from {config.train.eval_before_from} (train.eval_before_from): "
                          f"{len(outcomes)} tasks, success={record['eval/success']:.3g}")  # fmt: skip
            return outcomes, details
        policy.eval()
        if peaks is not None:
            peaks.start()
        name = "eval before RL" if step == 0 else f"eval after step {step}"
        with eval_sampling(getattr(rollouts, "generator", None), config):  # replays included
            with progress.phase(name, len(tasks), unit="episode", per_step=False, key="eval") as phase:
                episodes, _ = rollouts.run(tasks, seed=EVAL_SEED, version=step, group_size=1,
                                           temperature=config.train.eval_temperature,
                                           on_episode=phase.on_episode(  # success, as logged below
                                               "success", lambda ep: solved(ep.metrics, ep.outcome, rollouts.success_metric(ep))))  # fmt: skip
            episodes, replayed = replay_failed(episodes, tasks, rollouts, name, step, config, progress)
        if out_dir is not None:  # saved before the check below, so crashed episodes can be read too
            (out_dir / "eval").mkdir(parents=True, exist_ok=True)
            write_jsonl(episodes, out_dir / "eval" / f"step-{step:06d}.jsonl")
        check_failed(episodes, name, config, progress)
        outcomes = {ep.task_id: 0.0 if ep.failed else solved(ep.metrics, ep.outcome, rollouts.success_metric(ep))
                    for ep in episodes}  # fmt: skip
        details = {ep.task_id: eval_details(ep) for ep in episodes}
        means = held_out_means(details, outcomes)
        per_env = {}
        for env in names or ():  # eval/<env>/success, eval/<env>/outcome, eval/<env>/failed
            mine = {t: v for t, v in outcomes.items() if t.startswith(f"{env}/")}
            per_env |= {f"eval/{env}/success": float(np.mean(list(mine.values()))) if mine else 0.0,
                        f"eval/{env}/failed": float(sum(ep.failed for ep in episodes if ep.task_id.startswith(f"{env}/")))}  # fmt: skip
            per_env |= {(f"eval/{env}/outcome" if k == "outcome" else f"eval/{env}/metric/{k}"): v
                        for k, v in held_out_means(details, mine).items()}  # fmt: skip
        logger.log(step, {"eval/success": float(np.mean(list(outcomes.values()))) if outcomes else 0.0,
                          "eval/failed": float(sum(ep.failed for ep in episodes)), "eval/replayed": float(replayed),
                          **_means_record(means), **per_env, **gpu_memory(), **(peaks.end("eval") if peaks else {})},
                   echo=("eval/success",))  # fmt: skip
        if names:
            progress.line(
                f"{name} per env: "
                + ", ".join(f"{n} success={per_env[f'eval/{n}/success']:.3g}" for n in names)
            )
        return outcomes, details

    return evaluate


def eval_sampling(generator: Any, config: RunConfig) -> contextlib.AbstractContextManager:
    """``train.eval_sampler_dtype`` (resolved) around an eval: the in-process generator samples from a
    bfloat16 copy of the weights (:meth:`HFGenerator.sampling_in`); else nothing changes."""
    if config.train.eval_sampler_dtype == "bfloat16" and hasattr(generator, "sampling_in"):
        import torch

        return generator.sampling_in(torch.bfloat16)
    return contextlib.nullcontext()


def replay_failed(episodes: list[Episode], tasks: list[Any], rollouts: Rollouts, name: str, step: int,
                  config: RunConfig, progress: RunProgress, rounds: int = 2) -> tuple[list[Episode], int]:  # fmt: skip
    """Replay a held-out eval's failed (crashed) episodes up to ``rounds`` times, each from the start
    of its own task (its sampling stream is keyed by the task, so a greedy replay is the episode the
    crash interrupted; the env's reset seed follows the position in the replayed list), through
    ``agentrl eval``'s loop (:func:`agentrl.eval.crashes.replay_crashed`) with the trainer's policy:
    every failed episode is replayed, hangs too, even when all of them failed. Returns the episodes
    in task order and how many replays ran."""

    def rerun(positions: list[int]) -> list[Episode]:
        again, _ = rollouts.run([tasks[i] for i in positions], seed=EVAL_SEED, version=step, group_size=1,
                                temperature=config.train.eval_temperature)  # fmt: skip
        return again

    def say(attempt: int, failed: list[Episode], hangs: int) -> None:
        progress.line(f"{name}: {len(failed)} of {len(tasks)} episodes failed ({failed[0].error}); "
                      "replaying them")  # fmt: skip

    episodes, errors = replay_crashed(episodes, rerun, rounds, episode=lambda ep: ep, on_round=say,
                                      replay_hangs=True, replay_all_failed=True)  # fmt: skip
    return episodes, sum(len(e) for e in errors)


def check_failed(episodes: list[Episode], name: str, config: RunConfig, progress: RunProgress) -> None:
    """Raise :class:`EvalError` when more than ``train.eval_max_failed`` of a held-out eval's episodes
    failed even when replayed; fewer are said and count as unsolved."""
    from agentrl.errors import EvalError

    failed = [ep for ep in episodes if ep.failed]
    limit = config.train.eval_max_failed
    if len(failed) > limit * len(episodes):
        raise EvalError(
            f"{name}: {len(failed)} of {len(episodes)} held-out episodes failed even after replays "
            f"(first: {failed[0].error}); a success figure over them would measure the crash. Fix the cause "
            f"(the log above names it), or allow more with train.eval_max_failed (now {limit:g})"
        )  # fmt: skip
    if failed:
        progress.line(f"{name}: {len(failed)} of {len(episodes)} episodes still failed after replays; they count "
                      f"as unsolved (train.eval_max_failed={limit:g})")  # fmt: skip


def eval_details(episode: Episode) -> dict[str, float]:
    """A held-out episode's outcome and numeric metrics (a failed episode: outcome 0, nothing else)."""
    if episode.failed:
        return {"outcome": 0.0}
    numeric = {k: float(v) for k, v in (episode.metrics or {}).items() if isinstance(v, int | float)}
    return {"outcome": float(episode.outcome), **numeric}


def held_out_means(details: dict[str, dict[str, float]], tasks: dict[str, Any]) -> dict[str, float]:
    """Mean of each detail over ``tasks`` (a task without it, e.g. a failed episode, counts 0);
    empty when ``details`` lacks any of the tasks (a run from before details were kept)."""
    ids = sorted(tasks)
    if not ids or any(t not in details for t in ids):
        return {}
    keys = sorted({k for t in ids for k in details[t]})
    return {k: float(np.mean([details[t].get(k, 0.0) for t in ids])) for k in keys}


def _means_record(means: dict[str, float]) -> dict[str, float]:
    """Held-out means as metrics.jsonl keys: ``eval/outcome`` and ``eval/metric/<name>``."""
    return {("eval/outcome" if k == "outcome" else f"eval/metric/{k}"): v for k, v in means.items()}


def _shared_summary(run_dir: str | Path) -> Path:
    """``train.eval_before_from``'s ``summary.json``; a ConfigError if that run did not finish."""
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        raise ConfigError("train.eval_before_from", f"{run_dir} has no summary.json (not a finished run)",
                          "point it at a finished run's out_dir, or leave it empty to evaluate")  # fmt: skip
    return path


def check_shared_eval(run_dir: str | Path, config: RunConfig) -> None:
    """``train.eval_before_from`` checked before the model loads: a finished run that evaluated as
    this run would (a ConfigError naming the field otherwise)."""
    _shared_summary(run_dir)
    _check_same_eval(run_dir, config)


def _check_same_eval(run_dir: str | Path, config: RunConfig) -> None:
    """A ConfigError unless ``run_dir`` ran its held-out eval as this run would (``EVAL_SETTINGS``):
    another prompt, context limit or folding mode measures another thing."""
    shared = load_config(Path(run_dir) / "resolved_config.yaml", validate=False)
    differences = eval_differences(shared, config)
    if differences:
        raise ConfigError("train.eval_before_from", f"{run_dir} evaluated with other settings than this run "
                          f"({'; '.join(differences)})",
                          "leave it empty so this run evaluates itself before RL")  # fmt: skip


def shared_eval(
    run_dir: str | Path, task_ids: list[str]
) -> tuple[dict[str, float], dict[str, float], dict[str, dict[str, float]]]:
    """``(per-task outcomes, eval record, per-task details)`` of a finished run's held-out eval
    before RL, for ``train.eval_before_from``: restricted to ``task_ids`` (all of them must be there),
    with the record's ``eval/success`` and means recomputed on those tasks and its ``eval/failed`` as
    logged. Details are empty for a run from before they were kept."""
    field = "train.eval_before_from"
    run_dir = Path(run_dir)
    summary = json.loads(_shared_summary(run_dir).read_text())
    before = summary["eval_tasks"]["before"]
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    failed = next((r["eval/failed"] for r in records if r["step"] == 0 and "eval/failed" in r), float("nan"))
    missing = [t for t in task_ids if t not in before]
    if missing:
        raise ConfigError(field, f"{run_dir} evaluated {len(before)} held-out tasks, not this run's "
                          f"{len(task_ids)} (missing e.g. {missing[0]!r})",
                          f"evaluate at least train.eval_episodes={len(task_ids)} tasks there, or leave it empty")  # fmt: skip
    outcomes = {t: float(before[t]) for t in task_ids}
    kept = summary.get("eval_details", {}).get("before", {})
    details = {t: kept[t] for t in task_ids} if all(t in kept for t in task_ids) else {}
    means = held_out_means(details, outcomes)
    # eval/failed is the shared eval's own count (over its tasks): a failed episode is an unsolved one here too
    return outcomes, {"eval/success": float(np.mean(list(outcomes.values()))) if outcomes else 0.0,
                      "eval/failed": failed,
                      **_means_record(means)}, details  # fmt: skip


def compare_evals(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Paired comparison of two evals of the same tasks: success before/after, tasks gained (failed
    before, solved after) and lost, and the two-sided exact sign-test p-value of gained vs lost
    (McNemar's exact test; 1.0 when no task changed)."""
    tasks = sorted(before.keys() & after.keys())
    solved = lambda table, t: table[t] >= 1.0  # noqa: E731
    gained = sum(solved(after, t) and not solved(before, t) for t in tasks)
    lost = sum(solved(before, t) and not solved(after, t) for t in tasks)
    return {
        "success_before": float(np.mean([before[t] for t in tasks])) if tasks else 0.0,
        "success_after": float(np.mean([after[t] for t in tasks])) if tasks else 0.0,
        "eval_episodes": len(tasks),
        "gained": gained,
        "lost": lost,
        "p_value": sign_test_p(gained, lost),
    }


def sign_test_p(gained: int, lost: int) -> float:
    """Two-sided exact sign-test p-value of ``gained`` against ``lost`` (1.0 when both are 0)."""
    from math import comb

    n = gained + lost
    tail = sum(comb(n, k) for k in range(min(gained, lost) + 1)) / 2**n if n else 0.5
    return min(1.0, 2 * tail)
