"""Run many episodes concurrently: the entry point for trainers and evaluation.

Episodes are asyncio tasks. Env calls (reset/step/close, env construction) run in a thread pool
so sandboxes and generation overlap; generation requests from all episodes are merged into
batched calls by a :class:`~agentrl.rollout.batcher.Batcher`. A failed episode is recorded with
its error and never takes down its siblings; finished episodes are appended to a JSONL file as
they end; a watchdog names any episode without progress for ``watchdog_s`` and cancels or
retries it (generation and an env's own start - a Ray actor coming up - are not counted: each
has its own limit). Settings come from one :class:`~agentrl.rollout.settings.RolloutConfig`.

    episodes = run_episodes("agentrl/Search-v0", tasks, generator, tokenizer, config)
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError, EpisodeError
from agentrl.rollout import process_rewards, tree
from agentrl.rollout.agent import EpisodeRun, ModelPolicy, SamplingPolicy, call_in_executor
from agentrl.rollout.batcher import Batcher, Slots
from agentrl.rollout.context import choose_context
from agentrl.rollout.generators.base import Generator, derive_seed
from agentrl.rollout.settings import RolloutConfig
from agentrl.trajectory import Episode, save, write_jsonl

log = logging.getLogger("agentrl.rollout")


@dataclass
class RunStats:
    """What a run measured (for logs and benchmarks)."""

    episodes: int = 0
    failed: int = 0
    retried: int = 0
    watchdog_fired: int = 0
    turns: int = 0
    generated_tokens: int = 0
    wall_s: float = 0.0
    generate_busy_s: float = 0.0
    generator_idle_share: float = 0.0
    env_s: float = 0.0
    generate_calls: int = 0
    lockstep_cut: int = 0  # lock-step batches that went ahead without every episode (see Batcher)
    prompt_tokens: int = 0  # prompt tokens the generator prefilled, the whole prompt of each call
    reused_prompt_tokens: int = 0  # of them, read from its prefix cache (rollout.prefix_cache_tokens)
    process: dict[str, float] = field(default_factory=dict)  # summed "process/*" episode counts

    def merge(self, other: RunStats) -> RunStats:
        """Two runs as one (e.g. a step's refill rounds): counts and seconds add up; the generator's
        idle share is recomputed over the summed wall time (weighted by wall time if not batched)."""
        wall = self.wall_s + other.wall_s
        if self.generate_calls or other.generate_calls:
            idle = max(0.0, 1.0 - (self.generate_busy_s + other.generate_busy_s) / wall) if wall > 0 else 0.0
        else:
            idle = (self.generator_idle_share * self.wall_s + other.generator_idle_share * other.wall_s) / wall if wall > 0 else 0.0  # fmt: skip
        summed = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)
                  if f.name not in ("process", "generator_idle_share")}  # fmt: skip
        process = {k: self.process.get(k, 0.0) + other.process.get(k, 0.0) for k in self.process.keys() | other.process.keys()}  # fmt: skip
        return RunStats(**summed, generator_idle_share=idle, process=process)

    def as_metrics(self) -> dict[str, float]:
        wall = max(self.wall_s, 1e-9)
        return process_rewards.share_metrics(self.process) | {
            "rollout/episodes": float(self.episodes),
            "rollout/failed": float(self.failed),
            "rollout/episodes_per_s": self.episodes / wall,
            "rollout/turns_per_s": self.turns / wall,
            "rollout/tokens_per_s": self.generated_tokens / wall,
            "rollout/generator_idle_share": self.generator_idle_share,
            "rollout/watchdog_fired": float(self.watchdog_fired),
            "rollout/lockstep_cut": float(self.lockstep_cut),
            # batched generate calls: with lock-step batches the same seed gives the same count
            "rollout/decode_batches": float(self.generate_calls),
            "perf/rollout_wall_s": self.wall_s,
        } | ({"perf/prefix_reused_share": self.reused_prompt_tokens / self.prompt_tokens} if self.prompt_tokens else {})


@dataclass
class _Job:
    index: int
    task: Any
    group_id: str
    seed: int | None
    sampling_seed: int  # the episode's own sampling stream (see Runner.arun)
    root: Episode | None = None  # tree rollouts: the episode this branch forks from
    replay: int = 0  # tree rollouts: how many of the root's turns the branch replays
    trunk: tree.Trunk | None = None  # tree rollouts with rollout.fork=env: where the branch's env comes from


def task_id(task: Any) -> str:
    """The id an episode of ``task`` records as its ``task_id``."""
    return _task_options(task)[1]


def _task_options(task: Any) -> tuple[dict[str, Any] | None, str]:
    """Reset options and a group id for one task spec (Task, dict, task id string, or None)."""
    if task is None:
        return None, ""
    if isinstance(task, str):
        return {"task_id": task}, task
    if isinstance(task, dict):
        return {"task": task}, str(task.get("id", ""))
    return {"task": task}, str(getattr(task, "id", ""))


class Runner:
    """Runs episodes concurrently over one env (id or factory) and one generator or policy factory."""

    def __init__(
        self,
        env: str | Callable[[], Any],
        tokenizer: Any,
        *,
        generator: Generator | None = None,
        policy_factory: Callable[[], SamplingPolicy] | None = None,
        config: RolloutConfig | None = None,
        policy_version: int = 0,
        judge: process_rewards.ScopeJudge | None = None,
        progress: bool | None = None,
        on_episode: Callable[[Episode], None] | None = None,
        env_kwargs: dict[str, Any] | None = None,
        lockstep: bool | None = None,
        timeout_setting: str = "rollout.episode_timeout_s",
    ):
        """``config``: the rollout settings (validated here, once). ``judge``: a custom branch-scope
        judge (folding=branch); default: the one rollout.scope_judge names. Not settings:
        ``progress`` (a rich progress line; None: when stdout is a terminal), ``on_episode`` (called as each episode ends),
        ``env_kwargs`` (for an env id), ``lockstep`` (timing-independent decode batches, see
        :func:`lockstep_mode`), ``timeout_setting`` (the name error messages give the episode
        timeout where the user is)."""
        if (generator is None) == (policy_factory is None):
            raise ConfigError("rollout", "give exactly one of generator or policy_factory")
        self.env = env
        self.env_id = (
            env if isinstance(env, str) else getattr(env, "env_id", getattr(env, "__name__", "custom"))
        )
        self.tokenizer = tokenizer
        self.generator = generator
        self.policy_factory = policy_factory
        self.config = config or RolloutConfig()
        self.config.validate()
        if self.config.branches and policy_factory is not None:
            raise ConfigError("rollout.branches", "tree rollouts fork a model policy by replaying its tokens; a text "
                              "agent's own state (an oracle's, a chat agent's) is not replayed", "set rollout.branches=0")  # fmt: skip
        self.fork_envs = self._fork_mode()
        self._trunks: list[tree.Trunk] = []
        self.show_progress = sys.stdout.isatty() if progress is None else progress
        self.on_episode = on_episode
        self.lockstep, self.lockstep_wait_s = lockstep_mode(lockstep, generator)
        self.env_kwargs = dict(env_kwargs or {})
        self.timeout_setting = timeout_setting
        self.context = choose_context(self.config, tokenizer)  # once, before any episode
        self._batcher: Batcher | None = None
        self.judge = judge or (
            process_rewards.build_judge(
                self.config,
                submit=(lambda ids, sampling: self._batcher.submit(ids, sampling)) if generator else None,  # type: ignore[union-attr]
                tokenizer=tokenizer,
            )
            if self.context.needs_judge
            else None
        )
        self.policy_version = policy_version
        self.stats = RunStats()
        self._running: dict[int, EpisodeRun] = {}
        self._tasks: dict[int, asyncio.Task] = {}
        self._stalled: dict[int, str] = {}
        self._runs: dict[int, EpisodeRun] = {}  # latest attempt per job (partial record on failure)

    def _fork_mode(self) -> bool:
        """Whether tree branches get forks of one trunk env (rollout.fork), checked once: ``env`` on an
        env that cannot fork is a ConfigError naming why; ``auto`` falls back to replay."""
        if not self.config.branches or self.config.fork == "replay":
            return False
        from agentrl.env import fork_support

        method, reason = fork_support(self.env if isinstance(self.env, str) else getattr(self.env, "env_class", self.env))
        if method is None and self.config.fork == "env":
            raise ConfigError("rollout.fork", f"{self.env_id} cannot fork: {reason}", "set rollout.fork=replay (or auto)")
        return method is not None

    # ------------------------------------------------------------------ env plumbing
    def _make_env(self) -> Any:
        if isinstance(self.env, str):
            from agentrl.env import make

            return make(self.env, **self.env_kwargs)
        return self.env()

    # ------------------------------------------------------------------ one episode
    async def _episode(self, job: _Job, executor: ThreadPoolExecutor, policy: SamplingPolicy) -> Episode:
        async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            if inspect.iscoroutinefunction(fn):  # remote envs (env.placement: ray) await their actor
                return await fn(*args, **kwargs)
            return await call_in_executor(executor, fn, *args, **kwargs)

        options, _ = _task_options(job.task)
        env = await (job.trunk.take(call, self._make_env) if job.trunk is not None else call(self._make_env))
        if job.root is not None:
            policy = tree.ReplayPolicy(job.root.turns[: job.replay], policy)
        cfg_t = self.config.branch_temperature  # a branch's own turns (rollout.branch_temperature)
        run = EpisodeRun(
            env,
            policy,
            self.tokenizer,
            self.config,
            env_id=str(self.env_id),
            call_env=call,
            group_id=job.group_id,
            seed=job.seed,
            options=options,
            policy_version=self.policy_version,
            judge=self.judge,
            sampling_seed=job.sampling_seed,
            context=self.context,
            own_temperature=None if job.root is None or cfg_t is None else (job.replay, cfg_t),
            # a replayable id: the same (seed, task, sample, policy version) gives the same id
            episode_id=f"{derive_seed(job.sampling_seed, self.policy_version):016x}"[:12],
        )
        self._running[job.index] = run
        self._runs[job.index] = run
        try:
            await run.start()  # a remote env's start has its own limit (env.ray_start_timeout_s)
            shared = bool(getattr(self.generator, "shared_batches", False))
            episode = await _within_own_time(run.run(), run.progress, self.config.episode_timeout_s, shared)
            if job.root is not None:
                tree.finish_branch(episode, job.root, job.replay)
            return episode
        except TimeoutError:
            raise EpisodeError(
                f"episode timeout after {self.config.episode_timeout_s:g}s ({self.timeout_setting}); "
                f"{run.progress.describe()}"
            ) from None
        finally:
            self._running.pop(job.index, None)
            if getattr(env, "close_never_blocks", False):
                _close_quietly(env)  # a remote env frees its actor slot now, before the next episode starts
            else:  # close() may hang in a broken env: do not wait for it, and let no run's end cancel it
                # (a close queued in the pool when the run ends would be dropped, the env left to the GC)
                threading.Thread(
                    target=_close_quietly, args=(env,), name="agentrl-env-close", daemon=True
                ).start()

    async def _job(
        self, job: _Job, executor: ThreadPoolExecutor, make_policy: Callable[[], SamplingPolicy]
    ) -> Episode:
        attempts = 1 + (self.config.max_retries if self.config.watchdog_action == "retry" else 0)
        lost_left = int(getattr(self.env, "lost_retries", 0))  # env.ray_lost_retries (remote envs)
        episode: Episode | None = None
        stalls = 0
        for _ in range(attempts + lost_left):
            task = asyncio.create_task(self._episode(job, executor, make_policy()))
            self._tasks[job.index] = task
            try:
                episode = await task
                self._runs.pop(job.index, None)
                break
            except asyncio.CancelledError:
                reason = self._stalled.pop(job.index, None)
                if reason is None:
                    raise  # the whole run was cancelled
                error = (
                    f"watchdog: no progress for {self.config.watchdog_s:.0f}s (rollout.watchdog_s): {reason}"
                )
                episode = self._failed(job, error)
                stalls += 1
                if stalls >= attempts:
                    break
                self.stats.retried += 1
                log.warning("retrying %s", reason)
            except Exception as exc:  # noqa: BLE001 - recorded on the episode; siblings go on
                detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
                loc = f" at {where[0].filename}:{where[0].lineno}" if where else ""
                episode = self._failed(job, f"{detail}{loc}")
                if getattr(exc, "env_lost", False) and lost_left > 0:  # its env actor died: run it again
                    lost_left -= 1
                    self.stats.retried += 1
                    log.warning("retrying on a new env actor: %s", detail)
                    continue
                break
            finally:
                self._tasks.pop(job.index, None)
        assert episode is not None
        return episode

    def _failed(self, job: _Job, error: str) -> Episode:
        log.warning("episode failed (%s): %s", self.env_id, error)
        run = self._runs.pop(job.index, None)
        _, task_id = _task_options(job.task)
        if run is not None:
            episode = run.episode(error=error)  # what was recorded before the failure
            episode.task_id = episode.task_id or task_id  # a crash in reset recorded none: paired evals key on it
            if job.root is not None:
                episode.parent_id = job.root.episode_id
            return episode
        return Episode(
            episode_id=f"failed-{job.index}",
            env_id=str(self.env_id),
            task_id=task_id,
            segments=[],
            group_id=job.group_id,
            seed=job.seed,
            policy_version=self.policy_version,
            error=error,
        )

    async def _watchdog(self) -> None:
        limit = self.config.watchdog_s
        while True:
            await asyncio.sleep(min(1.0, limit / 4))
            now = time.monotonic()
            for index, run in list(self._running.items()):
                progress = run.progress
                if progress.phase in ("generate", "starting", "done"):
                    continue  # generation stalls are the generator's timeouts' job, env starts the env's
                if now - progress.last_progress > limit and index not in self._stalled:
                    reason = progress.describe()
                    log.warning("watchdog: no progress for %.0fs: %s", limit, reason)
                    self.stats.watchdog_fired += 1
                    self._stalled[index] = reason
                    task = self._tasks.get(index)
                    if task is not None:
                        task.cancel()

    # ------------------------------------------------------------------ the run
    async def arun(
        self,
        tasks: Sequence[Any],
        *,
        seeds: Sequence[int | None] | None = None,
        seed: int = 0,
        out_path: str | Path | None = None,
    ) -> list[Episode]:
        """Run ``group_size`` episodes per task; returns episodes in job order (task-major).

        With ``rollout.branches`` > 0 each of them is the root of a tree (:mod:`agentrl.rollout.tree`):
        once every root has ended, each root's branches run (seeded from the root's stream;
        ``rollout.branch_concurrency`` of them at once), and the result lists each root followed by
        its branches; a tree is one group.

        Each episode samples from its own stream, seeded by (``seed`` or the task's ``seeds``
        entry, task id, occurrence of that task in ``tasks``, sample index): the same episode comes
        out whatever the concurrency, the other tasks of the call, or the order episodes finish in
        (with a generator that has per-row streams; see ``Generator.supports_row_seeds``).
        """
        cfg = self.config
        jobs = []
        seen: dict[str, int] = {}
        for t_index, task in enumerate(tasks):
            _, task_id = _task_options(task)
            group = f"{task_id or 'task'}:{t_index}"
            key = task_id or f"#{t_index}"
            occurrence = seen[key] = seen.get(key, -1) + 1
            for sample in range(cfg.group_size):
                index = len(jobs)
                job_seed = seeds[t_index] if seeds is not None else seed + index
                base = seeds[t_index] if seeds is not None and seeds[t_index] is not None else seed
                stream = derive_seed(base, key, occurrence, sample)
                tree_group = f"{group}/tree{sample}" if cfg.branches else group
                jobs.append(_Job(index=index, task=task, group_id=tree_group, seed=job_seed, sampling_seed=stream))
        results: list[Episode | None] = [None] * (len(jobs) * (1 + cfg.branches))
        stream = _Stream(out_path)
        batcher = self._batcher = (
            Batcher(self.generator, lockstep=self.lockstep, lockstep_wait_s=self.lockstep_wait_s)
            if self.generator is not None
            else None
        )
        if self.generator is not None:
            # the learner may have changed the weights in place since the last run
            self.generator.reset_cache()
        asked0, reused0 = self.generator.prefix_reuse() if self.generator is not None else (0, 0)
        make_policy = self.policy_factory or (lambda: ModelPolicy(batcher.submit))  # type: ignore[union-attr]
        in_flight = max(cfg.concurrency, cfg.branch_concurrency or 0)
        executor = ThreadPoolExecutor(max_workers=in_flight + 4, thread_name_prefix="agentrl-env")
        slots = Slots(cfg.concurrency, batcher)
        branch_slots = Slots(cfg.branch_concurrency or cfg.concurrency, batcher)  # after the roots
        t0 = time.perf_counter()
        display = _Display(len(results), self, enabled=self.show_progress)

        async def one(job: _Job) -> None:
            async with (slots if job.root is None else branch_slots).admit():
                episode = await self._job(job, executor, make_policy)
            results[job.index] = episode
            if not (cfg.branches and job.root is None):  # a root is written once its shared turns are marked
                stream.write(episode)
                if self.generator is not None:  # nothing continues it (a root's branches read its trunk)
                    for segment in episode.segments:
                        self.generator.release(segment.token_ids())
            self._account(episode)
            display.advance()
            if self.on_episode is not None:
                self.on_episode(episode)

        watchdog = asyncio.create_task(self._watchdog())
        try:
            with display:
                await asyncio.gather(*(one(job) for job in jobs))
                if cfg.branches:  # every root has ended: its branches fork from it (tree.py)
                    branches = self._branch_jobs(jobs, results)
                    for root in results:
                        if root is not None:
                            stream.write(root)
                    await asyncio.gather(*(one(job) for job in branches))
        finally:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
            trunks, self._trunks = self._trunks, []
            for trunk in trunks:  # a trunk no branch took (a cancelled run, failed branches) is closed
                _close_quietly(trunk)
            if batcher is not None:
                await batcher.stop()
                asked, reused = self.generator.prefix_reuse()  # type: ignore[union-attr]
                self.stats.prompt_tokens += asked - asked0
                self.stats.reused_prompt_tokens += reused - reused0
                self.generator.reset_cache()  # type: ignore[union-attr]  (frees the K/V memory)
            executor.shutdown(wait=False, cancel_futures=True)
        self.stats.wall_s = time.perf_counter() - t0
        if batcher is not None:
            self.stats.generate_busy_s = batcher.busy_s
            self.stats.generate_calls = batcher.calls
            self.stats.lockstep_cut = batcher.cut
            self.stats.generator_idle_share = batcher.idle_share(self.stats.wall_s)
        episodes = [e for e in results if e is not None]
        stream.finish(episodes)
        return episodes

    def _branch_jobs(self, roots: list[_Job], results: list[Episode | None]) -> list[_Job]:
        """Tree rollouts: the branches of every root that ended with at least one turn, each placed
        right after its root in ``results`` (the root's job index, times 1 + branches)."""
        cfg, jobs = self.config, []
        per_tree = 1 + cfg.branches
        ended = [results[job.index] for job in roots]
        results[:] = [None] * len(results)
        for job, root in zip(roots, ended, strict=True):
            job_slot = job.index * per_tree
            results[job_slot] = root
            if root is None or root.failed or not root.turns:
                continue
            replay = tree.branch_turn(root, cfg.branch_at, job.sampling_seed)
            tree.mark_shared(root, replay)
            trunk = None
            if self.fork_envs:
                trunk = tree.Trunk(root, replay, cfg.branches, job.seed, _task_options(job.task)[0])
                self._trunks.append(trunk)
            for b in range(1, per_tree):
                jobs.append(replace(job, index=job_slot + b, sampling_seed=derive_seed(job.sampling_seed, "branch", b),
                                    root=root, replay=replay, trunk=trunk))  # fmt: skip
        return jobs

    def _account(self, episode: Episode) -> None:
        self.stats.episodes += 1
        self.stats.failed += int(episode.failed)
        self.stats.turns += len(episode.turns)
        # a branch's replayed turns were generated once, by its root
        replayed = episode.parent_id is not None
        self.stats.generated_tokens += sum(len(t.output_ids) for t in episode.turns if not (replayed and t.shared))
        self.stats.env_s += episode.timings.get("env_s", 0.0)
        for key, value in episode.metrics.items():
            if key.startswith("process/"):
                self.stats.process[key] = self.stats.process.get(key, 0.0) + value

    def run(self, tasks: Sequence[Any], **kwargs: Any) -> list[Episode]:
        """Synchronous wrapper over :meth:`arun`."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.arun(tasks, **kwargs))
        raise RuntimeError("Runner.run() was called inside a running event loop; await Runner.arun() instead")


#: Auto lockstep waits at most this long for an episode's env call before a decode batch goes ahead
#: without it (counted as ``rollout/lockstep_cut``): a hung call delays the wave by this much.
LOCKSTEP_WAIT_S = 60.0


#: the Runner's keyword arguments that :func:`run_episodes` passes on (its other keywords are rollout settings)
RUNNER_OPTIONS = tuple(
    p.name
    for p in inspect.signature(Runner.__init__).parameters.values()
    if p.kind is p.KEYWORD_ONLY and p.name not in ("generator", "config")
)


def lockstep_mode(lockstep: bool | None, generator: Any) -> tuple[bool, float | None]:
    """``(lockstep, wait limit)`` for a run. A row's floats depend on which prompts share its decode
    batch (~1e-5 in a log-prob; enough to flip a near-tie sample), so with an in-process generator
    that decodes the whole wave together (``shared_batches``: hf, vllm) batches are lock-step by
    default (None): each waits until every active episode has asked, ordered by seed, and the same
    seed gives the same run; the wait for a slow env call is capped at :data:`LOCKSTEP_WAIT_S`.
    ``True`` (``train.deterministic``): lock-step without a cap. ``False``: a batch takes what
    arrives within 2 ms (timing decides the batches). Remote servers are never lock-step: each
    request is its own (and the server batches them with others anyway)."""
    if lockstep is None:
        return bool(getattr(generator, "shared_batches", False)), LOCKSTEP_WAIT_S
    return lockstep, None


async def _within_own_time(coro: Any, progress: Any, budget_s: float, shared_generator: bool) -> Any:
    """Await ``coro``; TimeoutError once the episode's own time passes ``budget_s``.

    With a ``shared_generator`` (an in-process engine that decodes the whole wave together, e.g.
    ``hf``), own time is wall-clock time less the waits for it: on a loaded machine they stretch
    every episode of the wave alike, and counting them timed out whole waves of healthy episodes.
    Env and tool calls, the judge and the episode's own work always count, so a slow env still costs
    only its own episode. With a remote server every request is the episode's own: wall-clock."""
    task = asyncio.ensure_future(coro)
    start = time.monotonic()
    try:
        while True:
            now = time.monotonic()
            left = budget_s - (now - start - (progress.waiting_s(now) if shared_generator else 0.0))
            if left <= 0:
                raise TimeoutError
            done, _ = await asyncio.wait({task}, timeout=left)
            if done:
                return task.result()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _close_quietly(env: Any) -> None:
    try:
        env.close()
    except Exception as exc:  # noqa: BLE001 - a failing close must not fail the finished episode
        log.warning("env.close() failed: %s: %s", type(exc).__name__, exc)


class _Stream:
    """Appends finished episodes to JSONL as they end (``.parquet``: a JSONL sidecar, then Parquet)."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None
        self.jsonl: Path | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.jsonl = (
                self.path.with_suffix(self.path.suffix + ".partial.jsonl")
                if self.path.suffix == ".parquet"
                else self.path
            )
            self.jsonl.write_text("")

    def write(self, episode: Episode) -> None:
        if self.jsonl is not None:
            write_jsonl([episode], self.jsonl, append=True)

    def finish(self, episodes: list[Episode]) -> None:
        if self.path is not None and self.path.suffix == ".parquet" and episodes:
            save(episodes, self.path)
            assert self.jsonl is not None
            self.jsonl.unlink(missing_ok=True)


class _Display:
    """Rich progress line: episodes, turns/s, tokens/s, env vs generation time, failures."""

    def __init__(self, total: int, runner: Runner, enabled: bool):
        self.total = total
        self.runner = runner
        self.enabled = enabled
        self.progress: Any = None
        self.task_id: Any = None
        self.t0 = time.perf_counter()

    def __enter__(self) -> _Display:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                TextColumn("rollout"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[info]}"),
            )
            self.progress.start()
            self.task_id = self.progress.add_task("episodes", total=self.total, info="")
        return self

    def advance(self) -> None:
        if self.progress is None:
            return
        s = self.runner.stats
        wall = max(time.perf_counter() - self.t0, 1e-9)
        running = list(self.runner._running.values())
        gen_s = sum(r.progress.generate_s for r in running)
        env_s = s.env_s + sum(r.progress.env_s for r in running)
        info = (
            f"{s.turns / wall:.1f} turns/s  {s.generated_tokens / wall:.0f} tok/s  "
            f"env {env_s:.0f}s / gen-wait {gen_s:.0f}s  failed {s.failed}"
        )
        self.progress.update(self.task_id, advance=1, info=info)

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.stop()


def run_episodes(
    env: str | Callable[[], Any],
    tasks: Sequence[Any],
    generator: Generator | None,
    tokenizer: Any,
    config: RolloutConfig | None = None,
    *,
    seeds: Sequence[int | None] | None = None,
    seed: int = 0,
    out_path: str | Path | None = None,
    stats: RunStats | None = None,
    **options: Any,
) -> list[Episode]:
    """Run episodes for ``tasks`` (Task, dict, task id, or None for a seeded random task).

    Args:
        env: registered env id (``agentrl/Search-v0``) or a zero-argument factory returning an env.
        tasks: one entry per task; each runs ``group_size`` times (same group id).
        generator: the generation backend (or ``None`` with ``policy_factory``, e.g. oracles).
        tokenizer: the model's tokenizer (chat template, bridge ids).
        config: the rollout settings (:class:`~agentrl.rollout.settings.RolloutConfig`; None: its
            defaults, as a YAML file without a ``rollout:`` section: group_size 4).
        seeds: per-task reset seeds (default ``seed + job index``).
        out_path: stream finished episodes to this ``.jsonl`` (or ``.parquet`` at the end).
        stats: a :class:`RunStats` to fill (throughput, generator idle share, failures).
        **options: the :class:`Runner`'s keyword arguments (:data:`RUNNER_OPTIONS`: policy_factory,
            e.g. ``lambda: OraclePolicy(MyOracle(), tok)``, policy_version, judge, progress,
            on_episode, env_kwargs, lockstep, timeout_setting; defined there once), and rollout
            settings to change for this call (``group_size=``, ``temperature=`` ...).

    Returns:
        Episodes in task-major order; failed ones have ``error`` set and no segments.
    """
    runner_options = {name: options.pop(name) for name in RUNNER_OPTIONS if name in options}
    settings = config or RolloutConfig()
    if options:  # what is left: rollout settings
        settings = replace(settings, **options)
    runner = Runner(env, tokenizer, generator=generator, config=settings, **runner_options)
    episodes = runner.run(tasks, seeds=seeds, seed=seed, out_path=out_path)
    if stats is not None:
        stats.__dict__.update(runner.stats.__dict__)
    return episodes


def run_oracle_episodes(
    env: str | Callable[[], Any],
    tasks: Sequence[Any],
    oracle_factory: Callable[[], Any],
    tokenizer: Any,
    config: RolloutConfig | None = None,
    **kwargs: Any,
) -> list[Episode]:
    """Demonstration episodes: a scripted oracle acts; its text becomes model-turn ids (log-prob 0)."""
    from agentrl.rollout.oracle_agent import OraclePolicy

    return run_episodes(
        env,
        tasks,
        None,
        tokenizer,
        config,
        policy_factory=lambda: OraclePolicy(oracle_factory(), tokenizer),
        **kwargs,
    )
