"""``agentrl eval``: run an agent over a suite's tasks and write records, metrics and a report.

Every agent plays through the one episode loop of training (:class:`agentrl.rollout.agent.EpisodeRun`).
Text agents (oracle, random, chat) use the text context strategy, one env per worker thread; model
agents go through the rollout runner, the same Env + Agent + Generator path as training, with an
HF generator (a model name / path) or the OpenAI-compatible HTTP client.
Whatever the agent, a crashed episode is recorded with its error and the run goes on.
"""

from __future__ import annotations

import functools
import random
import re
import shlex
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import agentrl
from agentrl.env import Task
from agentrl.errors import AgentRLError, ConfigError, EnvError
from agentrl.eval.agents import AgentSpec, OracleAdapter, RandomAgent, ScriptedAgent, load_oracle, parse_agent
from agentrl.eval.crashes import replay_crashed
from agentrl.eval.model_agent import SETTING_SOURCES, ModelEvalConfig
from agentrl.eval.records import EvalResult, Job, episode_record, failed_episode, subset_label
from agentrl.eval.report import aggregate, error_lines, table_lines, write_report
from agentrl.eval.suites import Part, Suite, parse_suite
from agentrl.rollout.agent import play_text
from agentrl.trajectory import Episode, write_jsonl


def make_part_env(part: Part, split: str) -> Any:
    """The wrapped env of one suite part (with the suite's split as its default)."""
    kwargs = {k: v for k, v in part.kwargs.items() if v is not None}
    return agentrl.make(part.env_id, split=split, **kwargs)


def stratified_sample(
    tasks: Sequence[Task], limit: int, label: Callable[[Task], str], seed: str
) -> list[Task]:
    """``limit`` tasks drawn round-robin over subsets (each shuffled with ``seed``), in original order,
    so a small limit still covers every level / source."""
    rng = random.Random(seed)
    groups: dict[str, list[int]] = {}
    for index, task in enumerate(tasks):
        groups.setdefault(label(task), []).append(index)
    queues = [rng.sample(indices, len(indices)) for _, indices in sorted(groups.items())]
    rng.shuffle(queues)  # which subsets get the remainder is seeded too, not alphabetical
    keep: list[int] = []
    while len(keep) < limit:
        for queue in queues:
            if queue and len(keep) < limit:
                keep.append(queue.pop())
    return [tasks[i] for i in sorted(keep)]


def select_tasks(suite: Suite, limit: int | None, seed: int) -> list[tuple[Part, Task]]:
    """Tasks of every part; with ``limit``, a seeded sample of at most ``limit`` tasks *per part*,
    spread evenly over the suite's subsets (levels, sources)."""
    selected = []
    for part in suite.parts:
        try:
            env = make_part_env(part, suite.split)
        except EnvError as exc:
            raise ConfigError(
                "suite", f"suite {suite.name!r} needs env {part.env_id}: {exc}", "see `agentrl envs`"
            ) from exc
        try:
            tasks = list(env.unwrapped.tasks(suite.split))
        finally:
            env.close()
        if limit is not None and limit < len(tasks):
            tasks = stratified_sample(
                tasks, limit, functools.partial(subset_label, suite, part), f"{seed}/{part.env_id}"
            )
        selected += [(part, t) for t in tasks]
    if any(p.env_id == "agentrl/GAIA-Real-v0" and str(t.answer) == "?" for p, t in selected):
        raise ConfigError(
            "suite", "GAIA test answers are hidden ('?'), so they cannot be scored", "use split=validation"
        )
    return selected


# --------------------------------------------------------------------------- scripted agents
def play_scripted(env: Any, agent: ScriptedAgent, job: Job, split: str) -> Episode:
    """One episode of a text agent through the one episode loop (context strategy
    :class:`~agentrl.rollout.context.Text`): the trajectory keeps texts (there are no tokens)."""
    return play_text(
        env, agent, env_id=job.part.env_id, seed=job.seed, options={"task_id": job.task.id, "split": split},
        episode_id=f"{job.task.id}#{job.sample}", group_id=job.task.id,
    )  # fmt: skip


def run_scripted(
    suite: Suite,
    jobs: Sequence[Job],
    make_agent: Callable[[Any, Job], ScriptedAgent],
    concurrency: int,
    remote: dict[str, Any] | None = None,
) -> list[tuple[Episode, float]]:
    """Run ``jobs`` on ``concurrency`` threads, each with its own env per part (in Ray actors with ``remote``)."""
    local = threading.local()
    made: list[Any] = []  # local envs, closed at the end so their sandboxes go back to the pool now

    def run(job: Job) -> tuple[Episode, float]:
        envs = local.__dict__.setdefault("envs", {})
        start = time.perf_counter()
        try:
            if job.part.env_id not in envs:
                if remote is None:
                    envs[job.part.env_id] = make_part_env(job.part, suite.split)
                    made.append(envs[job.part.env_id])
                else:
                    envs[job.part.env_id] = remote[job.part.env_id]()
            env = envs[job.part.env_id]
            episode = play_scripted(env, make_agent(env, job), job, suite.split)
        except Exception as exc:  # noqa: BLE001 - recorded on the episode and reported, never silenced
            envs.pop(job.part.env_id, None)  # a crashed env is replaced for the next job
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            print(f"[eval] episode {job.task.id}#{job.sample} failed: {detail}", file=sys.stderr)
            episode = failed_episode(job, detail)
        return episode, time.perf_counter() - start

    try:
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            results = list(pool.map(run, jobs))
    finally:
        for env in made:  # not left to the garbage collector: a later eval may wait for these boxes
            env.close()
    return results


def scripted_factory(spec: AgentSpec, suite: Suite) -> Callable[[Any, Job], ScriptedAgent]:
    if spec.kind == "random":
        return lambda env, job: RandomAgent(lambda: env.unwrapped.tools, seed=job.seed)
    oracle_cls = load_oracle(suite.oracle, suite.name)
    return lambda env, job: OracleAdapter(oracle_cls())


# --------------------------------------------------------------------------- model agents
def ray_envs(suite: Suite, address: str, concurrency: int) -> dict[str, Any]:
    """``--ray ADDRESS``: one pool of Ray env actors per part (``agentrl.cluster.remote_env``), sized
    to the cluster for ``concurrency`` episodes at once before any actor is created (fitted, or
    refused at once: never a wait for actors that cannot be placed)."""
    from agentrl.cluster.remote_env import RayEnvs, RaySettings

    return {
        part.env_id: RayEnvs(
            part.env_id,
            {"split": suite.split, **{k: v for k, v in part.kwargs.items() if v is not None}},
            RaySettings(address=None if address == "local" else address),
            # each part keeps its own actors (threads hold one env per part): they share the cluster
            concurrency=max(1, concurrency) * len(suite.parts),
        )
        for part in suite.parts
    }


def run_model(
    suite: Suite,
    jobs: Sequence[Job],
    spec: AgentSpec,
    concurrency: int,
    seed: int,
    settings: ModelEvalConfig,
    transcripts: list[dict[str, Any]],
    remote: dict[str, Any] | None = None,
    loaded: dict | None = None,
    requested: dict[str, Any] | None = None,
) -> tuple[list[tuple[Episode, float]], float]:
    """Model agents: chat servers through the scripted-agent path (:mod:`.chat_agent`), token-level
    ones through the rollout engine (HF generator or completions client); also returns the seconds
    spent loading the model, which episodes/min leaves out. ``requested``: filled with what a chat
    agent's requests were (:func:`~agentrl.eval.chat_agent.chat_requests`)."""
    if spec.kind == "chat":
        from agentrl.eval.chat_agent import build_chat_client, chat_factory, chat_requests

        start = time.perf_counter()
        client = build_chat_client(spec, settings, concurrency=concurrency, k=suite.k)
        setup_s = time.perf_counter() - start
        if requested is not None:
            requested.update(chat_requests(client, settings))
        try:
            return run_scripted(
                suite, jobs, chat_factory(client, settings, transcripts), concurrency, remote
            ), setup_s
        finally:
            client.close()
    from agentrl.eval.model_agent import run_model_jobs

    return run_model_jobs(
        suite, jobs, spec, concurrency=concurrency, seed=seed, settings=settings, remote=remote, loaded=loaded
    )


# --------------------------------------------------------------------------- entry points
CONCURRENCY = 4  # agentrl eval's episodes at once (evaluate's and run_eval's default; --concurrency)


def evaluate(
    suite: str | Suite,
    agent: str | AgentSpec,
    *,
    limit: int | None = None,
    concurrency: int = CONCURRENCY,
    seed: int = 0,
    settings: ModelEvalConfig | None = None,
    ray: str | None = None,
    replays: int = 2,
) -> EvalResult:
    """Run ``agent`` on ``suite`` and return the records, the aggregate metrics and the episodes.

    ``settings``: budgets and request settings of model agents (default: ``AGENTRL_EVAL_*`` variables).
    ``replays``: rounds of re-running crashed episodes (see :func:`agentrl.eval.crashes.replay_crashed`).
    """
    import agentrl.eval.suites  # noqa: F401  (registers the suites)

    settings = settings or ModelEvalConfig.from_env()
    suite_obj = parse_suite(suite) if isinstance(suite, str) else suite
    spec = parse_agent(agent) if isinstance(agent, str) else agent
    if limit is not None and limit < 1:
        raise ConfigError("limit", f"limit must be >= 1, got {limit}", "pass --limit 10, or leave it out")
    selected = select_tasks(suite_obj, limit, seed)
    jobs = [
        Job(part, task, sample, seed + i * suite_obj.k + sample)
        for i, (part, task) in enumerate(selected)
        for sample in range(suite_obj.k)
    ]
    if replays < 0:
        raise ConfigError("replays", f"must be >= 0, got {replays}", "pass --replays 2 (0 = no replays)")
    remote = ray_envs(suite_obj, ray, concurrency) if ray else None  # envs in Ray actors (--ray)
    start = time.perf_counter()
    setup_s = 0.0
    transcripts: list[dict[str, Any]] = []
    loaded: dict = {}  # a local model, loaded once: replays of crashed episodes reuse it
    requested: dict[str, Any] = {}  # a chat agent's requests as resolved (metrics["chat"])

    def run(part_jobs: Sequence[Job]) -> tuple[list[tuple[Episode, float]], float]:
        if spec.kind in ("oracle", "random"):
            return run_scripted(
                suite_obj, part_jobs, scripted_factory(spec, suite_obj), concurrency, remote
            ), 0.0
        return run_model(
            suite_obj, part_jobs, spec, concurrency, seed, settings, transcripts, remote, loaded, requested
        )

    def rerun(positions: list[int]) -> list[tuple[Episode, float]]:
        nonlocal setup_s
        again, seconds = run([jobs[i] for i in positions])
        setup_s += seconds
        return again

    def whole_groups(crashed: list[int]) -> list[int]:
        """The rollout engine runs a task's samples as one group: a crashed sample re-runs its group."""
        tasks = {(jobs[i].part.env_id, jobs[i].task.id) for i in crashed}
        return [i for i, job in enumerate(jobs) if (job.part.env_id, job.task.id) in tasks]

    def say(attempt: int, crashed: list[Episode], hangs: int) -> None:
        if hangs and attempt == 1:
            print(f"[eval] {hangs} episode(s) hung (no answer within the request or episode timeout): not "
                  "replayed, a replay would wait as long again", file=sys.stderr)  # fmt: skip
        if crashed:
            print(f"[eval] {len(crashed)} of {len(jobs)} episodes crashed (first: {crashed[0].error}); "
                  f"replaying them ({attempt}/{replays}, --replays)", file=sys.stderr)  # fmt: skip

    try:
        results, setup_s = run(jobs)
        results, replay_errors = replay_crashed(  # a hang is not replayed, nor a run where every episode crashed
            results, rerun, replays, episode=lambda result: result[0], on_round=say, replay_hangs=False,
            replay_all_failed=False, groups=whole_groups if spec.kind in ("model", "openai") else None,
        )  # fmt: skip
    finally:
        loaded.clear()
        for pool in (remote or {}).values():
            pool.shutdown()
    wall = time.perf_counter() - start - setup_s
    records = [episode_record(suite_obj, job, ep, s) for job, (ep, s) in zip(jobs, results, strict=True)]
    for record, errors in zip(records, replay_errors, strict=True):
        record["replayed_errors"] = errors
    metrics = {
        "suite": suite if isinstance(suite, str) else suite_obj.name,
        "agent": spec.label,
        "k": suite_obj.k,
        "seed": seed,
        "limit": limit,
        "concurrency": concurrency,
        "ray": ray,
        "metric_names": list(suite_obj.metrics),
        "wall_s": wall,
        "setup_s": setup_s,
        "episodes_per_minute": 60.0 * len(records) / wall if wall > 0 else 0.0,
        "notes": suite_obj.notes,
        "attachment_problems": [
            {
                "task_id": t.id,
                "file_name": t.payload.get("file_name", ""),
                "problem": t.payload["attachment_problem"],
            }
            for _, t in selected
            if t.payload.get("attachment_problem")
        ],
        "settings": settings.as_dict() if spec.kind not in ("oracle", "random") else {},
        **({"chat": requested} if requested else {}),
        "replays": replays,
        "replayed_episodes": sum(1 for errors in replay_errors if errors),
        **aggregate(records, suite_obj.metrics, suite_obj.k),
    }
    return EvalResult(records, metrics, [ep for ep, _ in results], transcripts)


def _default_out(suite: str, agent: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{suite}_{agent}")[:80]
    return Path("runs") / "eval" / f"{slug}_{datetime.now():%Y%m%d-%H%M%S}"


def run_eval(
    *,
    suite: str,
    agent: str,
    limit: int | None = None,
    concurrency: int = CONCURRENCY,
    seed: int = 0,
    out: Path | str | None = None,
    as_json: bool = False,
    suite_options: Sequence[str] = (),
    settings: dict[str, Any] | None = None,
    ray: str | None = None,
    max_failed: float = 0.05,
    replays: int = 2,
) -> int:
    """The ``agentrl eval`` command: evaluate, write the outputs, print the table. Returns the exit code:
    0, 2 for bad input, 1 when more than ``max_failed`` of the episodes crashed (they are scored as
    unsolved and listed either way; the outputs are written first).

    ``suite_options``: ``key=value`` items added to the suite (values may hold commas);
    ``settings``: CLI values of :class:`ModelEvalConfig` fields (``None``: not given).
    """
    import json

    if not 0.0 <= max_failed <= 1.0:
        print(f"error: --max-failed must be a share in [0, 1], got {max_failed} "
              "(fix: e.g. 0.05 lets 5% of the episodes crash)", file=sys.stderr)  # fmt: skip
        return 2
    settings = {k: v for k, v in (settings or {}).items() if v is not None}
    command = ["agentrl", "eval", "--suite", suite, "--agent", agent]
    for item in suite_options:
        command += ["--suite-option", item]
    command += ["--limit", str(limit)] if limit is not None else []
    command += ["--concurrency", str(concurrency), "--seed", str(seed)] + (["--ray", ray] if ray else [])
    command += ["--max-failed", str(max_failed), "--replays", str(replays)]
    for name, value in settings.items():
        option = SETTING_SOURCES[name][0]
        if isinstance(value, bool):
            command.append(option if value else option.replace("--", "--no-", 1))
        elif isinstance(value, list | tuple):
            for item in value:
                command += [option, str(item)]
        else:
            command += [option, str(value)]
    try:
        suite_obj = parse_suite(suite, suite_options)
        resolved = ModelEvalConfig.resolve(**settings)
        kind = parse_agent(agent).kind
        print(f"[eval] max_failed = {max_failed:g}  (--max-failed, default 0.05); replays = {replays}  "
              "(--replays, default 2)", file=sys.stderr)  # fmt: skip
        if kind not in ("oracle", "random"):
            print(f"[eval] model agent settings:\n{resolved.describe(kind)}", file=sys.stderr)
        elif settings:
            print(
                f"[eval] warning: {', '.join(settings)} unused: {agent} is a scripted agent", file=sys.stderr
            )
        result = evaluate(
            suite_obj, agent, limit=limit, concurrency=concurrency, seed=seed, settings=resolved, ray=ray,
            replays=replays,
        )  # fmt: skip
    except AgentRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    errors = sum(1 for r in result.records if r["error"])
    result.metrics["suite"] = suite
    result.metrics["command"] = shlex.join(command)
    result.metrics["max_failed"] = max_failed
    result.metrics["episode_errors"] = errors
    out_dir = Path(out) if out is not None else _default_out(suite, agent)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(result.episodes, out_dir / "episodes.jsonl")
    if result.transcripts:
        with (out_dir / "transcripts.jsonl").open("w", encoding="utf-8") as handle:
            for transcript in result.transcripts:
                handle.write(json.dumps(transcript, ensure_ascii=False, default=str) + "\n")
    report = write_report(result.records, result.metrics, out_dir)
    if as_json:
        print(json.dumps(result.metrics, indent=2, default=str))
    else:
        overall = result.metrics["overall"]
        print(
            f"{result.metrics['suite']} / {result.metrics['agent']}: success {100 * overall['success_rate']:.1f}%"
        )
        print("\n".join(table_lines(result.metrics)))
        unavailable = result.metrics["attachment_problems"]
        if unavailable:
            print(f"{len(unavailable)} task(s) with an unavailable attachment (listed in the report)")
        for line in error_lines(result.records):
            print(line)
        print(f"report: {report}")
    if result.records and (errors == len(result.records) or errors > max_failed * len(result.records)):
        print(f"eval failed: {errors} of {len(result.records)} episodes crashed, more than --max-failed "
              f"{max_failed:g} allows; they count as unsolved in {report} (fix the cause above, or raise "
              "--max-failed)", file=sys.stderr)  # fmt: skip
        return 1
    return 0
