"""One RL step, top to bottom: :func:`rl_step`.

    draw tasks -> rollouts (groups) -> filters (failed, void turns, dynamic sampling; DAPO refills)
    -> behaviour/reference passes -> advantages (IGPO's gold scoring only when its estimator asks)
    -> PPO epochs over minibatches -> weights to the generator

:class:`Run` is what :meth:`agentrl.train.trainer.Trainer.setup` built, fixed for the run;
:class:`StepState` is what carries from one step to the next and into checkpoints; :class:`Draw` is
a step's episodes (all, kept, filter counts, the runner's stats) and :class:`Sampling` draws them.
Nothing here branches on an algorithm's name: estimators, losses and KL come from
``agentrl.registry`` and their inputs from ``agentrl.train.fields``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from agentrl.algos.mismatch import mismatch_metrics
from agentrl.config import RunConfig
from agentrl.rollout.generators.base import derive_seed
from agentrl.rollout.generators.hidden import returned
from agentrl.train.engines import world
from agentrl.train.fields import LazyScores, StepData
from agentrl.train.memory import PhasePeaks, gpu_memory
from agentrl.train.metrics import context_metrics
from agentrl.train.progress import RunProgress
from agentrl.train.update import compute_advantages, ppo_update, score_tokens, tree_of_rows
from agentrl.train.weights import generating, generator_rng_state, shares_model, sync_generator
from agentrl.trajectory import Episode, build_batch, write_jsonl

if TYPE_CHECKING:
    from agentrl.rollout.runner import RunStats


class TaskSampler:
    """Walks seeded permutations of the training tasks; its position is the data position."""

    def __init__(self, num_tasks: int, seed: int, epoch: int = 0, cursor: int = 0):
        self.num_tasks, self.seed, self.epoch, self.cursor = num_tasks, seed, epoch, cursor

    def _order(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.num_tasks)

    def next(self, count: int) -> list[int]:
        picked: list[int] = []
        while len(picked) < count:
            order = self._order()
            take = min(count - len(picked), self.num_tasks - self.cursor)
            picked += order[self.cursor : self.cursor + take].tolist()
            self.cursor += take
            if self.cursor == self.num_tasks:
                self.epoch, self.cursor = self.epoch + 1, 0
        return picked

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}


def make_sampler(config: RunConfig, rollouts: Any, state: dict[str, Any] | None = None) -> Any:
    """The training task sampler: :class:`TaskSampler` over one env, a mixture's
    :class:`agentrl.train.mixture.MixtureSampler` (weights, difficulty filter); ``state`` resumes it."""
    if not config.env.mixture:
        return TaskSampler(len(rollouts.train_tasks), config.train.seed, **(state or {}))
    from agentrl.train.mixture import MixtureSampler

    env = config.env
    return MixtureSampler(rollouts.sizes, [e.weight for e in env.mixture], rollouts.names, config.train.seed,
                          window=env.filter_window, solved=env.filter_solved, failed=env.filter_failed,
                          cooldown=env.filter_cooldown, state=state)  # fmt: skip


def filter_episodes(episodes: list[Episode], config: RunConfig) -> tuple[list[Episode], dict[str, float]]:
    """Drop failed episodes, SimpleTIR void-turn trajectories and (DAPO) all-equal groups."""
    kept = [ep for ep in episodes if not ep.failed]
    stats = {"rollout/failed": float(len(episodes) - len(kept))}
    if config.algo.drop_void_turns:
        before = len(kept)
        kept = [ep for ep in kept if not any(t.void for t in ep.turns)]
        stats["rollout/void_dropped"] = float(before - len(kept))
    if config.algo.dynamic_sampling and kept:
        from agentrl.algos.shaping import dynamic_sampling_keep

        groups = {g: i for i, g in enumerate(dict.fromkeys(ep.group_id for ep in kept))}
        keep = dynamic_sampling_keep(
            torch.tensor([ep.outcome for ep in kept]), torch.tensor([groups[ep.group_id] for ep in kept])
        )
        dropped = {ep.group_id for ep, k in zip(kept, keep.tolist(), strict=True) if not k}
        stats["rollout/equal_groups_dropped"] = float(len(dropped))
        kept = [ep for ep, k in zip(kept, keep.tolist(), strict=True) if k]
    return kept, stats


def informative_groups(kept: list[Episode], generated_tokens: int) -> dict[str, float]:
    """The groups a step trains on (after the filters) and how many per 1,000 generated tokens: the
    sampling efficiency tree and chain rollouts are compared by."""
    groups = len({ep.group_id for ep in kept})
    return {"rollout/groups_trained": float(groups),
            "rollout/groups_per_1k_tokens": 1000.0 * groups / max(generated_tokens, 1)}  # fmt: skip


def episode_metrics(episodes: list[Episode]) -> dict[str, float]:
    """A step's episode means (env/*), generation and env time, generated tokens (failed ones left out)."""
    done = [ep for ep in episodes if not ep.failed]
    if not done:
        return {}
    return {
        "env/reward": float(np.mean([ep.outcome for ep in done])),
        "env/turns": float(np.mean([ep.num_turns for ep in done])),
        "env/truncated": float(np.mean([ep.truncated for ep in done])),
        "env/void_turns": float(np.mean([sum(t.void for t in ep.turns) for ep in done])),
        "perf/generate_s_sum": float(sum(ep.timings.get("generate_s", 0.0) for ep in done)),
        "perf/env_s_sum": float(sum(ep.timings.get("env_s", 0.0) for ep in done)),
        "rollout/generated_tokens": float(sum(ep.timings.get("generated_tokens", 0.0) for ep in done)),
    }


def _all_ranks(engine: Any, count: int) -> float:
    """``count`` summed over the data-parallel ranks (every rank then stops at the same step)."""
    value = torch.tensor([float(count)], device="cuda" if torch.cuda.is_available() else "cpu")
    return float(engine.all_reduce_sum(value).item())


def _any_rank(engine: Any, flag: bool) -> bool:
    """``flag`` on any data-parallel rank (each rank's task sampler must draw the same rounds)."""
    return _all_ranks(engine, int(flag)) > 0


@dataclass
class Draw:
    """A step's sampled episodes: every one (metrics, saved episodes), the ones the filters kept
    (trained on), the filter counts and what the runner measured."""

    episodes: list[Episode]
    kept: list[Episode]
    stats: dict[str, float]
    run: RunStats

    @classmethod
    def filtered(cls, episodes: list[Episode], run: RunStats, config: RunConfig) -> Draw:
        kept, stats = filter_episodes(episodes, config)
        return cls(episodes, kept, stats, run)

    def groups(self) -> list[str]:
        """The kept groups, in order."""
        return list(dict.fromkeys(ep.group_id for ep in self.kept))

    def merged(self, more: Draw) -> Draw:
        """Both draws' episodes, the filter counts summed, the runner's stats merged."""
        stats = {
            k: self.stats.get(k, 0.0) + more.stats.get(k, 0.0) for k in self.stats.keys() | more.stats.keys()
        }
        return Draw(self.episodes + more.episodes, self.kept + more.kept, stats, self.run.merge(more.run))


@dataclass
class Sampling:
    """Draws a step's tasks (this rank's share) and runs their groups."""

    config: RunConfig
    rollouts: Any  # agentrl.train.rollouts.Rollouts, or a mixture's
    sampler: Any  # TaskSampler, or a mixture's MixtureSampler
    engine: Any
    progress: RunProgress

    def _run(self, picked: list[int], seed: int, step: int, name: str) -> Draw:
        rollout = self.config.rollout
        with self.progress.phase(name, len(picked) * rollout.episodes_per_task, unit="episode", per_step=False,
                                 key="rollout") as phase, returned(getattr(self.rollouts, "generator", None)), \
                generating(self.engine, getattr(self.rollouts, "generator", None)):  # fmt: skip
            episodes, run = self.rollouts.run(
                [self.rollouts.train_tasks[i] for i in picked], seed=seed, version=step, group_size=rollout.group_size,
                on_episode=phase.on_episode(), branches=rollout.branches,
                **({"horizon_step": step} if self.config.env.mixture else {}),  # a mixture's curriculum budget
            )  # fmt: skip
        return Draw(episodes, [], {}, run)

    def _pick(self) -> list[int]:
        rank, world_size = world()
        return self.sampler.next(self.config.rollout.tasks_per_step * world_size)[rank::world_size]

    def first(self, step: int, tag: str) -> tuple[list[int], Draw]:
        """The step's tasks (``tasks_per_step`` x ``group_size`` samples) and their filtered groups."""
        picked = self._pick()
        draw = self._run(picked, derive_seed(self.config.train.seed, "rollout", step), step, f"{tag} rollout")
        return picked, Draw.filtered(draw.episodes, draw.run, self.config)

    def refill(self, draw: Draw, *, step: int, tag: str) -> Draw:
        """``algo.refill_rounds``: DAPO's dynamic sampling over-samples. While fewer than
        ``tasks_per_step`` groups survived the filters (on any rank: ranks draw tasks in step), sample
        ``tasks_per_step`` more tasks (the sampler moves on: new tasks) and filter them, at most
        ``refill_rounds`` times; train on the first ``tasks_per_step`` surviving groups. Returns every
        sampled episode, the kept ones, the filter counts summed over rounds plus
        ``rollout/refill_rounds`` and ``rollout/groups_kept``, and the runner's stats over every round."""
        want, most = self.config.rollout.tasks_per_step, self.config.algo.refill_rounds
        rounds = 0
        while rounds < most and _any_rank(self.engine, len(draw.groups()) < want):
            rounds += 1
            seed = derive_seed(self.config.train.seed, "rollout", step, "refill", rounds)
            more = self._run(self._pick(), seed, step, f"{tag} refill {rounds}/{most}")
            for (
                ep
            ) in more.episodes:  # a task drawn again in a later round must not join an earlier round's group
                ep.group_id = f"refill{rounds}/{ep.group_id}"
            draw = draw.merged(Draw.filtered(more.episodes, more.run, self.config))
        trained = set(draw.groups()[:want])
        kept = [ep for ep in draw.kept if ep.group_id in trained]
        stats = draw.stats | {
            "rollout/refill_rounds": float(rounds),
            "rollout/groups_kept": float(len(trained)),
        }
        return Draw(draw.episodes, kept, stats, draw.run)


@dataclass
class Run:
    """What :meth:`agentrl.train.trainer.Trainer.setup` built: every part a step reads, fixed for the run."""

    config: RunConfig  # resolved (auto settings decided, printed and saved)
    tokenizer: Any
    policy: Any
    engine: Any
    generator: Any
    rollouts: Any
    sampling: Sampling
    plan: Any  # agentrl.train.plan.ObjectivePlan, built once
    ig_scorer: Any
    logger: Any  # agentrl.train.metrics.MetricsLogger
    progress: RunProgress
    peaks: PhasePeaks
    out_dir: Path
    rank0: bool
    pad_id: int


@dataclass
class StepState:
    """What carries from one RL step to the next, and into checkpoints: the steps done, the eval
    before RL (per task: the summary's paired test) and what a checkpoint carries besides."""

    step: int = 0  # RL steps done
    generated_tokens: float = 0.0  # by those steps' training rollouts, all ranks (train.token_budget)
    eval_before: dict[str, float] | None = None
    eval_before_details: dict[str, dict[str, float]] | None = None
    saved: dict[str, Any] = field(default_factory=lambda: {"history": {}})  # a checkpoint's other keys

    @classmethod
    def from_checkpoint(cls, step: int, saved: dict[str, Any]) -> StepState:
        own = ("eval_before", "eval_before_details", "generated_tokens")
        rest = {k: v for k, v in saved.items() if k not in own}
        return cls(step, float(saved.get("generated_tokens", 0.0)), saved.get("eval_before"),
                   saved.get("eval_before_details"), rest)  # fmt: skip

    def checkpoint(self, run: Run) -> dict[str, Any]:
        """The trainer state a checkpoint saves: the task sampler's position and the generator's stream too."""
        before = {"eval_before": self.eval_before, "eval_before_details": self.eval_before_details,
                  "generated_tokens": self.generated_tokens}  # fmt: skip
        return {**self.saved, **before, "sampler": run.sampling.sampler.state(),
                "generator_rng": generator_rng_state(run.generator)}  # fmt: skip


def rl_step(run: Run, step: int) -> dict[str, float]:
    """RL step ``step`` (0-based) of the run; returns its metrics (logged at ``step + 1``)."""
    config, train = run.config, run.config.train
    t_step = time.perf_counter()
    tag = f"step {step + 1}/{train.steps}"
    # 1. rollouts: tasks_per_step tasks x group_size samples (this rank's share), filtered
    run.policy.eval()
    t0 = time.perf_counter()
    run.peaks.start()
    picked, draw = run.sampling.first(step, tag)
    first_wave = draw.episodes  # the groups of the tasks picked (the difficulty filter's evidence)
    if config.algo.refill_rounds:  # DAPO over-sampling: more tasks until the step's groups are informative
        draw = run.sampling.refill(draw, step=step, tag=tag)
    if train.save_episodes and run.rank0:
        (run.out_dir / "episodes").mkdir(parents=True, exist_ok=True)
        write_jsonl(draw.episodes, run.out_dir / "episodes" / f"step-{step + 1:06d}.jsonl")
    rollout_s = time.perf_counter() - t0
    metrics = {**episode_metrics(draw.episodes), **context_metrics(draw.episodes, config.rollout.folding),
               **draw.run.as_metrics(), "perf/rollout_s": rollout_s}  # fmt: skip
    metrics |= (
        draw.stats | run.peaks.end("rollout") | informative_groups(draw.kept, draw.run.generated_tokens)
    )
    # every token generated this step, a tree's shared turns once, all ranks: what train.token_budget counts
    metrics["rollout/sampled_tokens"] = _all_ranks(run.engine, draw.run.generated_tokens)
    if (
        config.env.mixture
    ):  # per env: the step's episodes, the sampler and its filter, the curriculum's budget
        metrics |= mixture_metrics(run, step, picked, first_wave, draw)
    check_failed_rollouts(run, draw.episodes, tag)
    if draw.kept:
        metrics |= learn(run, draw.kept, step, tag)  # 2. log-probs, advantages; 3. PPO epochs; 4. weights out
    metrics["perf/step_s"] = time.perf_counter() - t_step
    return metrics | gpu_memory()


def check_failed_rollouts(run: Run, episodes: list[Episode], tag: str) -> None:
    """Raise :class:`RolloutError` when more than ``train.rollout_max_failed`` of the step's episodes
    (summed over the ranks, so every rank stops) failed; the first error is named."""
    from agentrl.errors import RolloutError

    failed = [ep for ep in episodes if ep.failed]
    total, bad = _all_ranks(run.engine, len(episodes)), _all_ranks(run.engine, len(failed))
    limit = run.config.train.rollout_max_failed
    if total and bad > limit * total:
        first = failed[0].error if failed else "on another rank"
        raise RolloutError(f"{tag}: {bad:.0f} of {total:.0f} sampled episodes failed (first: {first}); training on "
                           f"the rest would measure the crash. Fix the cause (the log above names it), or allow "
                           f"more with train.rollout_max_failed (now {limit:g})")  # fmt: skip


def mixture_metrics(
    run: Run, step: int, picked: list[int], first_wave: list[Episode], draw: Draw
) -> dict[str, float]:
    """A mixture's per-env step metrics, the sampler's filter fed the first wave's pass rates, the
    curriculum's turn budgets; rewards normalised per env (``env.normalize_rewards``) in place."""
    from agentrl.env import solved
    from agentrl.train.mixture import env_metrics, normalize_rewards, pass_rates

    rollouts = run.rollouts
    solved_ep = lambda ep: solved(ep.metrics, ep.outcome, rollouts.success_metric(ep))  # noqa: E731
    metrics = env_metrics(draw.episodes, rollouts.name_of, solved_ep, rollouts.names)
    metrics |= run.sampling.sampler.observe(step, picked, pass_rates(picked, first_wave, solved_ep))
    metrics |= {f"mix/{n}/max_turns": float(e.turn_budget(step)) for n, e in zip(rollouts.names, rollouts.entries, strict=True)}  # fmt: skip
    if run.config.env.normalize_rewards == "env_std":
        metrics |= normalize_rewards(draw.kept, rollouts.name_of)
    return metrics


def learn(run: Run, kept: list[Episode], step: int, tag: str) -> dict[str, float]:
    """Behaviour (+ reference) log-probs and advantages of the kept groups, PPO epochs over them,
    then the new weights to the generator; returns the learner's metrics."""
    train, algo, plan, engine = run.config.train, run.config.algo, run.plan, run.engine
    run.policy.train()
    t0 = time.perf_counter()
    tokens = build_batch(kept, pad_id=run.pad_id)
    trees = tree_of_rows(run.config, kept, tokens)  # a tree's rows in one micro-batch, as in the update
    old = LazyScores(lambda tokens=tokens: score_tokens(engine, tokens, train.micro_batch_size, groups=trees))
    ref = (
        score_tokens(engine, tokens, train.micro_batch_size, reference=True, groups=trees)["logp"]
        if algo.kl_coef > 0
        else None
    )
    data = StepData(episodes=kept, tokens=tokens, old=old, config=run.config, plan=plan, ig_scorer=run.ig_scorer,
                    engine=engine)  # fmt: skip
    with run.progress.phase(f"{tag} scoring", per_step=False, key="scoring"):
        adv, returns, batch = compute_advantages(data)  # the behaviour pass runs here (lazy)
        metrics = dict(plan.estimator.diagnostics(batch, plan.advantage_options))  # e.g. IGPO's gains
        if not shares_model(engine, run.generator):
            old["logp"]  # a separate sampler is always measured: the behaviour pass runs before the update
    scoring_s = time.perf_counter() - t0
    metrics |= run.peaks.end("scoring")
    t0 = time.perf_counter()
    with run.progress.phase(f"{tag} learner", per_step=False, key="learner") as phase:
        rng = torch.Generator().manual_seed(train.seed * 7919 + step)
        update = ppo_update(engine, data, batch, adv, returns, ref, rng=rng)
        # every row skipped (train.skip_zero_advantage): no loss was computed
        phase.update(
            **({"loss": update["loss"]} if "loss" in update else {"skipped_rows": update["skipped_rows"]})
        )
    learner_s = time.perf_counter() - t0
    metrics |= run.peaks.end("learner")
    if old.computed:  # the sampler's log-probs against the learner's pre-update pass (cached before any step)
        metrics |= mismatch_metrics(old["logp"], tokens.old_logprobs, tokens.loss_mask,
                                    cap=plan.loss_options.get("mismatch_cap", 2.0))  # fmt: skip
    trained_tokens = update.pop("forwarded_loss_tokens")  # tokens with a loss, all epochs
    seq_tokens = update.pop("forwarded_tokens")  # tokens forwarded (train.skip_zero_advantage skips some)
    from_sampler = update.pop("from_sampler_share", None)  # train.reuse_sampler_hidden
    metrics |= {f"loss/{k}": v for k, v in update.items()}
    if from_sampler is not None:
        metrics["perf/learner_from_sampler"] = from_sampler
    metrics |= {"perf/scoring_s": scoring_s, "perf/learner_s": learner_s,
                "perf/train_tokens_per_s": trained_tokens / max(learner_s, 1e-9),
                "perf/seq_tokens_per_s": seq_tokens / max(learner_s, 1e-9),
                "rollout/advantage_abs": float(adv.abs().sum() / tokens.loss_mask.sum().clamp_min(1))}  # fmt: skip
    sync_generator(engine, run.generator)  # 4. weights to the generator
    return metrics
