"""Eval records: what one evaluation episode is (:class:`Job`), what a run returns
(:class:`EvalResult`), and the flat per-episode record the report is built from.

Plain data and pure functions: the runner and the model agents both import this module, and it
imports neither of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrl.env import Task, solved, success_metric
from agentrl.eval.report import failure_bucket
from agentrl.eval.suites import Part, Suite
from agentrl.outcome import EpisodeMetrics
from agentrl.trajectory import Episode


@dataclass(frozen=True)
class Job:
    """One episode to run: a task of a part, the sample index (for pass@k) and its seed."""

    part: Part
    task: Task
    sample: int
    seed: int


@dataclass
class EvalResult:
    """What :func:`evaluate` returns."""

    records: list[dict[str, Any]]
    metrics: dict[str, Any]
    episodes: list[Episode] = field(default_factory=list)
    #: chat agents: each episode's messages as sent and received (written to transcripts.jsonl)
    transcripts: list[dict[str, Any]] = field(default_factory=list)


def subset_label(suite: Suite, part: Part, task: Task) -> str:
    return " ".join(filter(None, [part.name, suite.subset(task)])) or "all"


def episode_record(suite: Suite, job: Job, episode: Episode, seconds: float) -> dict[str, Any]:
    """The flat per-episode record the report is built from."""
    metrics = dict(episode.metrics)
    success = solved(metrics, episode.outcome, suite.success or success_metric(job.part.env_id))
    # the env's typed metrics (a failed episode has none)
    m = EpisodeMetrics.from_flat(metrics) if metrics else None
    record = {
        "episode_id": episode.episode_id,
        "env_id": job.part.env_id,
        "part": job.part.name,
        "task_id": job.task.id,
        "sample": job.sample,
        "seed": job.seed,
        "level": job.task.level,
        "subset": subset_label(suite, job.part, job.task),
        "reward": float(episode.outcome),
        "success": success,
        "answer": episode.answer,
        "ground_truth": episode.ground_truth if episode.ground_truth is not None else job.task.answer,
        "turns": int(m.turns) if m else episode.num_turns,
        "terminated": episode.terminated,
        "truncated": episode.truncated,
        "answered": bool(m.answered) if m else episode.answer is not None,
        "tool_calls": int(m.tool_calls) if m else 0,
        "tool_errors": int(m.tool_errors) if m else 0,
        "format_errors": int(m.format_errors) if m else 0,
        "void_turns": int(m.void_turns) if m else 0,
        "metrics": metrics,
        "error": episode.error,
        "seconds": seconds,
    }
    record["bucket"] = failure_bucket(record)
    return record


def failed_episode(job: Job, error: str) -> Episode:
    return Episode(
        episode_id=f"{job.task.id}#{job.sample}",
        env_id=job.part.env_id,
        task_id=job.task.id,
        segments=[],
        group_id=job.task.id,
        seed=job.seed,
        ground_truth=job.task.answer,
        error=error,
    )
