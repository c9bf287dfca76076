"""The RL training loop, top to bottom.

    sample tasks -> rollouts (groups) -> filters (failed, void turns, dynamic sampling)
    -> behaviour/reference passes -> advantages (IGPO's gold scoring only when its estimator asks)
    -> PPO epochs over minibatches -> weights to the generator -> eval every N steps -> checkpoint

``agentrl train CONFIG [section.field=value ...]`` calls :func:`main`. Nothing here branches on an
algorithm's name: estimators, losses and KL come from ``agentrl.registry`` and their inputs from
``agentrl.train.fields``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import yaml

from agentrl.algos.mismatch import mismatch_metrics
from agentrl.config import RunConfig, eval_differences, load_config, resolve_env_budgets, to_dict
from agentrl.errors import AgentRLError, ConfigError
from agentrl.rollout.generators.base import derive_seed
from agentrl.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, seed_everything
from agentrl.train.engines import make_engine, world
from agentrl.train.fields import LazyScores, StepData
from agentrl.train.igscore import GoldAnswerScorer, learner_continuation_scorer
from agentrl.train.learner import build_policy, is_peft
from agentrl.train.memory import PhasePeaks
from agentrl.train.metrics import MetricsLogger, context_metrics
from agentrl.train.plan import objective_plan
from agentrl.train.precision import resolve_bf16
from agentrl.train.progress import RunProgress
from agentrl.train.update import compute_advantages, ppo_update, score_tokens
from agentrl.trajectory import Episode, build_batch, write_jsonl

if TYPE_CHECKING:
    from agentrl.rollout.runner import RunStats


# --------------------------------------------------------------------------- pieces of the loop
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


def refill_groups(episodes: list[Episode], kept: list[Episode], stats: dict[str, float], run_stats: RunStats,
                  config: RunConfig, rollouts: Rollouts, sampler: TaskSampler, engine: Any, *, step: int, tag: str,
                  progress: RunProgress) -> tuple[list[Episode], list[Episode], dict[str, float], RunStats]:  # fmt: skip
    """``algo.refill_rounds``: DAPO's dynamic sampling over-samples. While fewer than
    ``tasks_per_step`` groups survived the filters (on any rank: ranks draw tasks in step), sample
    ``tasks_per_step`` more tasks (the sampler moves on: new tasks) and filter them, at most
    ``refill_rounds`` times; train on the first ``tasks_per_step`` surviving groups. Returns (all
    sampled episodes, the kept ones, the filter counts summed over rounds plus
    ``rollout/refill_rounds`` and ``rollout/groups_kept``, the runner's stats over every round)."""
    want, group_size = config.rollout.tasks_per_step, config.rollout.group_size
    rank, world_size = world()
    seed = config.train.seed
    groups = lambda eps: list(dict.fromkeys(ep.group_id for ep in eps))  # noqa: E731
    rounds = 0
    while rounds < config.algo.refill_rounds and _any_rank(engine, len(groups(kept)) < want):
        rounds += 1
        picked = sampler.next(want * world_size)[rank::world_size]
        with progress.phase(f"{tag} refill {rounds}/{config.algo.refill_rounds}", len(picked) * config.rollout.episodes_per_task,
                            unit="episode", per_step=False, key="rollout") as phase:  # fmt: skip
            more, more_run = rollouts.run(
                [rollouts.train_tasks[i] for i in picked], seed=derive_seed(seed, "rollout", step, "refill", rounds),
                version=step, group_size=group_size, on_episode=phase.on_episode(), branches=config.rollout.branches,
                **({"horizon_step": step} if config.env.mixture else {}),  # a mixture's curriculum budget
            )  # fmt: skip
        for ep in more:  # a task drawn again in a later round must not join an earlier round's group
            ep.group_id = f"refill{rounds}/{ep.group_id}"
        more_kept, more_stats = filter_episodes(more, config)
        episodes, kept, run_stats = episodes + more, kept + more_kept, run_stats.merge(more_run)
        stats = {k: stats.get(k, 0.0) + more_stats.get(k, 0.0) for k in stats.keys() | more_stats.keys()}
    trained = set(groups(kept)[:want])
    kept = [ep for ep in kept if ep.group_id in trained]
    stats |= {"rollout/refill_rounds": float(rounds), "rollout/groups_kept": float(len(trained))}
    return episodes, kept, stats, run_stats


def _any_rank(engine: Any, flag: bool) -> bool:
    """``flag`` on any data-parallel rank (each rank's task sampler must draw the same rounds)."""
    value = torch.tensor([float(flag)], device="cuda" if torch.cuda.is_available() else "cpu")
    return bool(engine.all_reduce_sum(value).item() > 0)


def export_weights(policy: Any) -> list[tuple[str, torch.Tensor]]:
    """Full-model weights under Hugging Face names (LoRA merged in) for an external generator."""
    model = policy.model
    if is_peft(model):
        model.merge_adapter()
        try:
            return [
                (name.replace(".base_layer.", "."), p.detach().clone())
                for name, p in policy.lm.named_parameters()
                if "lora_" not in name
            ]
        finally:
            model.unmerge_adapter()
    return [(name, p.detach()) for name, p in policy.lm.named_parameters()]


def shares_model(engine: Any, generator: Any) -> bool:
    """Whether the generator samples from the very module being trained (the HF generator)."""
    return getattr(generator, "model", None) is engine.policy.model


def sync_generator(engine: Any, generator: Any) -> None:
    """New weights to the generator: nothing when it shares the live model, else a copy (vLLM)."""
    if shares_model(engine, generator):
        return
    gather = getattr(engine, "gathered_parameters", None)
    if gather is not None:
        with gather():
            generator.update_weights(export_weights(engine.policy))
    else:
        generator.update_weights(export_weights(engine.policy))


def export_model(engine: Any, tokenizer: Any, directory: Path, *, write: bool = True) -> Path:
    """The trained policy as a folder ``agentrl serve --adapter DIR`` and ``model.adapter`` load:
    the PEFT adapter under LoRA, else the full model (``save_pretrained``), plus the tokenizer.
    Every rank calls it (ZeRO-3 gathers the weights collectively); only ``write`` ranks save."""
    gather = getattr(engine, "gathered_parameters", None)
    with gather() if gather is not None else contextlib.nullcontext():
        if write:
            engine.policy.model.save_pretrained(directory)
            tokenizer.save_pretrained(directory)
    return directory


class Rollouts:
    """Runs episodes of the configured env with the generator (train and eval)."""

    def __init__(self, config: RunConfig, generator: Any, tokenizer: Any):
        import agentrl
        from agentrl.rollout.remote_env import episode_envs

        env_cfg = config.env
        budgets = {"max_turns": env_cfg.max_turns, "max_obs_chars": env_cfg.max_obs_chars}
        # an unset budget is the env's registration's (agentrl.config.resolve_env_budgets)
        self.env_kwargs = {**{k: v for k, v in budgets.items() if v is not None}, **env_cfg.kwargs}
        self.make_env = lambda: agentrl.make(env_cfg.id, **self.env_kwargs)
        self.episode_env = episode_envs(env_cfg, self.env_kwargs, self.make_env)  # local or Ray actors
        self._budget_envs: dict[int | None, Any] = {env_cfg.max_turns: self.episode_env}  # horizon curriculum
        probe = self.make_env()
        self.train_tasks = list(probe.unwrapped.load_tasks(env_cfg.split))
        self.eval_tasks = list(probe.unwrapped.load_tasks(env_cfg.eval_split))
        probe.close()
        self.config, self.generator, self.tokenizer = config, generator, tokenizer
        # not rollout settings: how this trainer runs them (quiet; decode batches lock-step with an
        # in-process generator, without a wait limit under train.deterministic: runner.lockstep_mode)
        self.run_options = {"progress": False, "lockstep": True if config.train.deterministic else None}

    def demo_count(self, count: int) -> int:
        """How many demonstrations :meth:`demonstrations` plays for ``count`` asked."""
        return min(count, len(self.train_tasks))

    def held_out(self, count: int) -> list[Any]:
        """The first ``count`` held-out tasks (the same ones every eval)."""
        return self.eval_tasks[:count]

    def success_metric(self, episode: Episode) -> str:
        """The success metric of the env ``episode`` ran in (:attr:`agentrl.env.TextEnv.success_metric`)."""
        from agentrl.env import success_metric

        return success_metric(self.config.env.id)

    def _envs_for(self, max_turns: int | None) -> Any:
        """The episode envs with turn budget ``max_turns`` (a mixture's horizon curriculum), built once."""
        import agentrl
        from agentrl.rollout.remote_env import episode_envs

        if max_turns is None:
            return self.episode_env
        if max_turns not in self._budget_envs:
            kwargs = {**self.env_kwargs, "max_turns": max_turns}
            env_id = self.config.env.id
            self._budget_envs[max_turns] = episode_envs(self.config.env, kwargs, lambda: agentrl.make(env_id, **kwargs))
        return self._budget_envs[max_turns]

    def run(self, tasks: list[Any], *, seed: int, version: int, group_size: int, temperature: float | None = None,
            out_path: Path | None = None, on_episode: Any = None, branches: int = 0,
            max_turns: int | None = None) -> tuple[list[Episode], RunStats]:  # fmt: skip
        """One wave of episodes; returns them and what the runner measured (``.as_metrics()``).
        ``branches``: tree rollouts (training passes ``rollout.branches``; evals run chains).
        ``max_turns``: another turn budget than ``env.max_turns`` (a mixture's horizon curriculum)."""
        from agentrl.rollout.runner import RunStats, run_episodes

        settings = dataclasses.replace(self.config.rollout, group_size=group_size, branches=branches)
        if temperature is not None:
            settings = dataclasses.replace(settings, temperature=temperature)
        stats = RunStats()
        episodes = run_episodes(
            self._envs_for(max_turns), tasks, self.generator, self.tokenizer, settings, seed=seed,
            policy_version=version, stats=stats, out_path=out_path, on_episode=on_episode, **self.run_options,
        )  # fmt: skip
        return episodes, stats

    def demonstrations(self, count: int, seed: int, on_episode: Any = None) -> tuple[list[Episode], int]:
        """The warm-up's oracle demonstrations on ``count`` sampled training tasks, and how many of them
        were played with branch/return folding (the first ``train.sft_fold_share`` of the tasks)."""
        from agentrl.registry import load_entry_point
        from agentrl.rollout.runner import run_oracle_episodes

        train = self.config.train
        tasks = random.Random(seed).sample(self.train_tasks, min(count, len(self.train_tasks)))
        n_fold = round(train.sft_fold_share * len(tasks))
        # the oracle's text is not sampled, so the per-turn token budget must not cut it
        rollout = self.config.rollout
        settings = dataclasses.replace(rollout, max_new_tokens=max(rollout.max_new_tokens, 512), group_size=1,
                                       branches=0)  # one demonstration per task: chains
        episodes: list[Episode] = []
        folded = dataclasses.replace(settings, folding="branch")
        for part, oracle, field, how in ((tasks[:n_fold], train.fold_oracle, "train.fold_oracle", folded),
                                         (tasks[n_fold:], train.oracle, "train.oracle", settings)):  # fmt: skip
            if part:
                oracle_cls = load_entry_point(oracle, field=field)
                episodes += run_oracle_episodes(self.episode_env, part, oracle_cls, self.tokenizer, how, seed=seed,
                                                on_episode=on_episode, **self.run_options)  # fmt: skip
        return episodes, n_fold


def warn_long_turns(demos: list[Episode], budget: int, logger: Any) -> int:
    """Say so when demonstrations hold turns longer than the policy's per-turn budget
    (``rollout.max_new_tokens``; the oracle's own budget is larger): the warm-up teaches those turns,
    but the policy is cut off before it can finish one. Logged as ``sft/demos_over_budget``."""
    lengths = [max((len(t.output_ids) for s in d.segments for t in s.turns), default=0) for d in demos]
    over = [n for n in lengths if n > budget]
    logger.log(0, {"sft/demos_over_budget": float(len(over))})
    if over:
        logger.console.print(
            f"warm-up: {len(over)} of {len(demos)} demonstrations have a turn longer than rollout.max_new_tokens="
            f"{budget} (longest {max(over)} tokens); the policy is cut off before it can finish such a turn: "
            "raise rollout.max_new_tokens or shorten the oracle's actions"
        )  # fmt: skip
    return len(over)


def episode_metrics(episodes: list[Episode]) -> dict[str, float]:
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


def entry_config(config: RunConfig, entry: Any) -> RunConfig:
    """The run config one env of a mixture runs under: ``env`` that entry (placement shared), the
    warm-up's oracle the entry's own."""
    env = dataclasses.replace(config.env, id=entry.id, split=entry.split, eval_split=entry.eval_split,
                              max_turns=entry.max_turns, max_obs_chars=entry.max_obs_chars, kwargs=dict(entry.kwargs),
                              ray_resources=dict(entry.ray_resources or config.env.ray_resources), mixture=(),
                              normalize_rewards="none", filter_window=0)  # fmt: skip
    train = dataclasses.replace(config.train, oracle=entry.oracle, sft_fold_share=0.0)
    return dataclasses.replace(config, env=env, train=train)


def make_rollouts(config: RunConfig, generator: Any, tokenizer: Any) -> Any:
    """``Rollouts`` of the one env, or a mixture's (:class:`agentrl.train.mixture.MixtureRollouts`)."""
    if not config.env.mixture:
        return Rollouts(config, generator, tokenizer)
    from agentrl.train.mixture import MixtureRollouts

    return MixtureRollouts(config, [Rollouts(entry_config(config, e), generator, tokenizer) for e in config.env.mixture])


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


def mixture_lines(config: RunConfig, rollouts: Any) -> list[str]:
    """What a mixture run resolved, for the log: per env its share of a step, pool, held-out tasks,
    turn budget (and curriculum), oracle; then the filter and the reward normalisation."""
    from agentrl.train.mixture import apportion

    env, n = config.env, config.rollout.tasks_per_step
    first = apportion(n, [e.weight for e in env.mixture], [0] * len(env.mixture))
    held = {name: sum(1 for i, _ in rollouts.held_out(config.train.eval_episodes) if i == k)
            for k, name in enumerate(rollouts.names)}  # fmt: skip
    lines = [f"mixture: {len(env.mixture)} envs, tasks_per_step={n} apportioned by weight (first step: "
             + ", ".join(f"{name} {c}" for name, c in zip(rollouts.names, first, strict=True)) + ")"]
    for name, entry, size in zip(rollouts.names, env.mixture, rollouts.sizes, strict=True):
        horizon = (f"turns {entry.horizon_start} -> {entry.max_turns} (+{entry.horizon_by} every {entry.horizon_every} steps)"
                   if entry.horizon_start else f"turns {entry.max_turns}")  # fmt: skip
        lines.append(f"  {name}: {entry.id} weight={entry.weight:g} split={entry.split} ({size} tasks) "
                     f"eval_split={entry.eval_split} ({held[name]} held-out) {horizon} "
                     f"oracle={entry.oracle or '-'} kwargs={dict(entry.kwargs)}")  # fmt: skip
    lines.append("  difficulty filter: " + (
        f"window {env.filter_window} groups, solved >= {env.filter_solved:g}, failed <= {env.filter_failed:g}, "
        f"passed over for {env.filter_cooldown} steps" if env.filter_window else "off (env.filter_window=0)"))  # fmt: skip
    lines.append(f"  reward normalisation: {env.normalize_rewards} (env.normalize_rewards)")
    return lines


# --------------------------------------------------------------------------- the loop
def train(config: RunConfig) -> dict[str, Any]:
    """Run a whole training job; returns a summary (success before/after, steps, out_dir)."""
    from agentrl.rollout.generators.base import make_generator
    from agentrl.rollout.model import load_model

    config = resolve_env_budgets(config)  # unset turn budget / observation cap: the env's registration
    if config.env.mixture:  # entries' names and eval sizes resolved: printed and saved as they run
        from agentrl.train.mixture import resolve

        config = resolve(config)
    train_cfg, algo = config.train, config.algo
    if train_cfg.num_threads > 0:
        torch.set_num_threads(train_cfg.num_threads)
    seed_everything(train_cfg.seed, strict=train_cfg.deterministic)
    out_dir = Path(train_cfg.out_dir)
    resume_from = latest_checkpoint(out_dir) if train_cfg.resume else None
    rank0 = world()[0] == 0
    if train_cfg.eval_before_from:  # fail before the model loads
        _shared_summary(train_cfg.eval_before_from)
        _check_same_eval(train_cfg.eval_before_from, config)
    progress = RunProgress(out_dir, enabled=rank0, append=resume_from is not None)
    if not config.env.mixture:  # a mixture's per-env budgets are in its lines below
        progress.print(f"env: {config.env.id} max_turns={config.env.max_turns} max_obs_chars={config.env.max_obs_chars} "
                       "(unset in the config: the env's registration)")  # fmt: skip

    # model, policy (LoRA, critic), generator over the live model, env tasks
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with progress.phase("model load", per_step=False):
        model, tokenizer = load_model(
            config.model.name, dtype=config.model.dtype, adapter=config.model.adapter, device=device
        )
    # train.bf16_autocast: auto -> measured on this machine (agentrl.train.precision); saved resolved
    # (a resumed run keeps the decision it made at its start)
    precision = resolve_bf16(train_cfg.bf16_autocast, model, rows=train_cfg.micro_batch_size,
                             resumed_from=out_dir if resume_from is not None else None)  # fmt: skip
    config = dataclasses.replace(config, train=dataclasses.replace(train_cfg, bf16_autocast=precision.bf16))
    progress.print(precision.line())
    policy = build_policy(model, config)
    # train.sft_temperature unset -> the temperature the policy divides logits by (the sampler's)
    config = dataclasses.replace(config, train=dataclasses.replace(
        config.train, sft_temperature=config.train.sft_temperature or policy.temperature))  # fmt: skip
    train_cfg = config.train
    if algo.kl_coef > 0:
        policy.prepare_reference()
    pad_id = int(tokenizer.pad_token_id)
    if config.rollout.backend == "hf":
        config = _resolve_prefix_cache(config, policy.model, progress)
        # one decode batch can hold every episode in flight
        generator = make_generator("hf", model=policy.model, tokenizer=tokenizer, seed=train_cfg.seed,
                                   max_batch_size=max(32, config.rollout.concurrency),
                                   prefix_cache_tokens=config.rollout.prefix_cache_tokens)  # fmt: skip
    elif config.rollout.backend == "vllm":  # its own engine; sync_generator brings it the learner's weights
        generator = make_generator("vllm", model_name=config.model.name, dtype=config.model.dtype, seed=train_cfg.seed,
                                   max_model_len=config.rollout.max_context_tokens + config.rollout.max_new_tokens)  # fmt: skip
    else:
        generator = make_generator(
            config.rollout.backend, model_name=config.model.name, dtype=config.model.dtype,
            base_url=config.rollout.base_url,
        )  # fmt: skip
    rollouts = make_rollouts(config, generator, tokenizer)
    progress.print(batching_line(generator, rollouts.run_options["lockstep"]))
    mixture = bool(config.env.mixture)
    if mixture:
        from agentrl.train.mixture import env_metrics, normalize_rewards, pass_rates

        for line in mixture_lines(config, rollouts):
            progress.print(line)
    logger = MetricsLogger(out_dir, enabled=rank0, wandb=train_cfg.wandb, run_config=to_dict(config),
                           resume=resume_from is not None, console=progress.console)  # fmt: skip
    if rank0:
        resolved = yaml.safe_dump(to_dict(config), sort_keys=False)  # auto settings resolved
        (out_dir / "resolved_config.yaml").write_text(resolved)
    if config.rollout.folding == "branch":
        from agentrl.rollout.process_rewards import describe

        logger.console.print(describe(config.rollout))
    peaks = PhasePeaks()  # perf/rss_peak_<phase>_gib per step / eval; the run's maxima in summary.json
    evaluate = _evaluator(config, rollouts, policy, logger, progress, out_dir if rank0 else None, peaks)
    plan = objective_plan(config)
    objective = plan.summary()  # resolved options: printed now, saved in summary.json
    logger.console.print(f"objective: {json.dumps(objective)}")

    # supervised warm-up on oracle demonstrations (fresh runs only: a checkpoint already has it)
    if resume_from is None and train_cfg.sft_warmup_steps > 0:
        from agentrl.env import solved
        from agentrl.train.sft import sft_warmup

        t0 = time.perf_counter()
        peaks.start()
        wanted = rollouts.demo_count(train_cfg.sft_demos)
        with progress.phase("warm-up demonstrations", wanted, unit="episode", per_step=False) as phase:
            demos, n_fold = rollouts.demonstrations(train_cfg.sft_demos, train_cfg.seed,
                                                    on_episode=phase.on_episode("success", lambda ep: solved(
                                                        ep.metrics, ep.outcome, rollouts.success_metric(ep))))  # fmt: skip
        usable = [not d.failed and d.outcome > 0 for d in demos]
        folded = f" ({sum(usable[:n_fold])} of them folded, train.sft_fold_share)" if n_fold else ""
        logger.console.print(f"warm-up: {sum(usable)} demonstrations{folded}, "
                             f"NLL at temperature {train_cfg.sft_temperature:g} (train.sft_temperature)")  # fmt: skip
        warn_long_turns([d for d, ok in zip(demos, usable, strict=True) if ok], config.rollout.max_new_tokens,
                        logger)  # fmt: skip
        sft_steps = train_cfg.sft_warmup_steps
        with progress.phase("warm-up", sft_steps) as phase:
            # warm-up steps are logged at steps -sft_steps .. -1 (RL starts at 1), so curve.png shows them
            def sft_log(i: int, values: dict[str, float]) -> None:
                logger.log(i - sft_steps, values)
                phase.advance(loss=values["sft/loss"])

            losses = sft_warmup(policy, demos, steps=sft_steps, lr=train_cfg.sft_lr, log=sft_log,
                                batch_size=train_cfg.sft_batch_size, micro_batch_size=train_cfg.micro_batch_size,
                                seed=train_cfg.seed, pad_id=pad_id, max_grad_norm=train_cfg.max_grad_norm,
                                temperature=train_cfg.sft_temperature)  # fmt: skip
        logger.log(0, {"sft/loss_first": losses[0], "sft/loss_last": losses[-1], "perf/sft_s": time.perf_counter() - t0,
                       **peaks.end("sft")}, echo=("sft/loss_first", "sft/loss_last"))  # fmt: skip

    engine = make_engine(policy, config)
    if train_cfg.skip_zero_advantage and engine.world_size > 1:
        raise ConfigError("train.skip_zero_advantage", f"needs one process (this run has {engine.world_size}): "
                          "every rank must run the same backward passes", "set train.skip_zero_advantage=false")  # fmt: skip
    ig_scorer = GoldAnswerScorer(
        None, tokenizer, algo.ig_template, continuation=learner_continuation_scorer(engine)
    )  # runs only if the advantage estimator reads gt_logprob
    sampler = make_sampler(config, rollouts)
    start_step, state = 0, {"history": {}}
    if resume_from is not None:
        start_step, state = load_checkpoint(resume_from, engine)
        sampler = make_sampler(config, rollouts, state["sampler"])
        _restore_generator_rng(generator, state.get("generator_rng"))
        logger.truncate(start_step)
        logger.console.print(f"resumed from {resume_from} (step {start_step})")
    sync_generator(engine, generator)  # a separate generator (vLLM) gets the warmed-up or resumed weights
    if "eval_before" not in state:
        state["eval_before"], state["eval_before_details"] = evaluate(0)

    for step in range(start_step, train_cfg.steps):
        t_step = time.perf_counter()
        # 1. rollouts: tasks_per_step tasks x group_size samples (this rank's share)
        rank, world_size = world()
        picked = sampler.next(config.rollout.tasks_per_step * world_size)[rank::world_size]
        policy.eval()
        t0 = time.perf_counter()
        peaks.start()
        tag = f"step {step + 1}/{train_cfg.steps}"
        with progress.phase(f"{tag} rollout", len(picked) * config.rollout.episodes_per_task, unit="episode",
                            per_step=False, key="rollout") as phase:  # fmt: skip
            episodes, rollout_stats = rollouts.run(
                [rollouts.train_tasks[i] for i in picked], seed=derive_seed(train_cfg.seed, "rollout", step),
                version=step, group_size=config.rollout.group_size, on_episode=phase.on_episode(),
                branches=config.rollout.branches, **({"horizon_step": step} if mixture else {}),
            )  # fmt: skip
        first_wave = episodes  # the groups of the tasks picked above (the difficulty filter's evidence)
        kept, filter_stats = filter_episodes(episodes, config)
        if algo.refill_rounds:  # DAPO over-sampling: more tasks until the step's groups are informative
            episodes, kept, filter_stats, rollout_stats = refill_groups(
                episodes, kept, filter_stats, rollout_stats, config, rollouts, sampler, engine, step=step, tag=tag, progress=progress
            )  # fmt: skip
        if train_cfg.save_episodes and rank0:
            (out_dir / "episodes").mkdir(parents=True, exist_ok=True)
            write_jsonl(episodes, out_dir / "episodes" / f"step-{step + 1:06d}.jsonl")
        rollout_s = time.perf_counter() - t0
        metrics = {**episode_metrics(episodes), **context_metrics(episodes, config.rollout.folding),
                   **rollout_stats.as_metrics(), "perf/rollout_s": rollout_s}  # fmt: skip
        metrics |= filter_stats | peaks.end("rollout") | informative_groups(kept, rollout_stats.generated_tokens)
        if mixture:  # per env: the step's episodes, the sampler and its filter, the curriculum's budget
            from agentrl.env import solved

            solved_ep = lambda ep: solved(ep.metrics, ep.outcome, rollouts.success_metric(ep))  # noqa: E731
            metrics |= env_metrics(episodes, rollouts.name_of, solved_ep, rollouts.names)
            metrics |= sampler.observe(step, picked, pass_rates(picked, first_wave, solved_ep))
            metrics |= {f"mix/{n}/max_turns": float(e.turn_budget(step)) for n, e in zip(rollouts.names, rollouts.entries, strict=True)}
            if config.env.normalize_rewards == "env_std":
                metrics |= normalize_rewards(kept, rollouts.name_of)
        if kept:
            # 2. behaviour (+ reference) log-probs, advantages; 3. PPO epochs
            policy.train()
            t0 = time.perf_counter()
            tokens = build_batch(kept, pad_id=pad_id)
            old = LazyScores(lambda tokens=tokens: score_tokens(engine, tokens, train_cfg.micro_batch_size))
            ref = (
                score_tokens(engine, tokens, train_cfg.micro_batch_size, reference=True)["logp"]
                if algo.kl_coef > 0
                else None
            )
            data = StepData(
                episodes=kept, tokens=tokens, old=old, config=config, plan=objective_plan(config),
                ig_scorer=ig_scorer, engine=engine,
            )  # fmt: skip
            with progress.phase(f"{tag} scoring", per_step=False, key="scoring"):
                adv, returns, batch = compute_advantages(data)  # the behaviour pass runs here (lazy)
                metrics |= plan.estimator.diagnostics(batch, plan.advantage_options)  # e.g. IGPO's gains
                if not shares_model(engine, generator):
                    old["logp"]  # a separate sampler is always measured: the behaviour pass runs before the update
            scoring_s = time.perf_counter() - t0
            metrics |= peaks.end("scoring")
            t0 = time.perf_counter()
            with progress.phase(f"{tag} learner", per_step=False, key="learner") as phase:
                update = ppo_update(engine, data, batch, adv, returns, ref, rng=torch.Generator().manual_seed(train_cfg.seed * 7919 + step))  # fmt: skip
                # every row skipped (train.skip_zero_advantage): no loss was computed
                phase.update(**({"loss": update["loss"]} if "loss" in update else {"skipped_rows": update["skipped_rows"]}))
            learner_s = time.perf_counter() - t0
            metrics |= peaks.end("learner")
            if old.computed:  # the sampler's log-probs against the learner's pre-update pass (cached before any step)
                metrics |= mismatch_metrics(old["logp"], tokens.old_logprobs, tokens.loss_mask,
                                            cap=plan.loss_options.get("mismatch_cap", 2.0))  # fmt: skip
            trained_tokens = update.pop("forwarded_loss_tokens")  # tokens with a loss, all epochs
            seq_tokens = update.pop("forwarded_tokens")  # tokens forwarded (train.skip_zero_advantage skips some)
            metrics |= {f"loss/{k}": v for k, v in update.items()}
            metrics |= {"perf/scoring_s": scoring_s, "perf/learner_s": learner_s,
                        "perf/train_tokens_per_s": trained_tokens / max(learner_s, 1e-9),
                        "perf/seq_tokens_per_s": seq_tokens / max(learner_s, 1e-9),
                        "rollout/advantage_abs": float(adv.abs().sum() / tokens.loss_mask.sum().clamp_min(1))}  # fmt: skip
            # 4. weights to the generator
            sync_generator(engine, generator)
        metrics["perf/step_s"] = time.perf_counter() - t_step
        metrics |= gpu_memory()
        if train_cfg.eval_every and (step + 1) % train_cfg.eval_every == 0 and step + 1 < train_cfg.steps:
            evaluate(step + 1)  # logged; the summary compares the evals before and after RL
        logger.log(
            step + 1, metrics, echo=("env/reward", "loss/loss", "loss/entropy", "perf/step_s", "eval/success")
        )
        if (train_cfg.save_every and (step + 1) % train_cfg.save_every == 0) or step + 1 == train_cfg.steps:
            state |= {"sampler": sampler.state(), "generator_rng": _generator_rng(generator)}
            save_checkpoint(out_dir, step + 1, engine, state)

    # no RL step ran (a study's warm-up run): the weights are the ones just evaluated
    before_details = state.get("eval_before_details") or {}  # a checkpoint from before they were kept: none
    if train_cfg.steps > 0:
        eval_after, after_details = evaluate(train_cfg.steps)
    else:
        eval_after, after_details = state["eval_before"], before_details
    common = dict.fromkeys(state["eval_before"].keys() & eval_after.keys())  # the tasks compare_evals pairs
    summary = {**compare_evals(state["eval_before"], eval_after),
               "steps": train_cfg.steps, "out_dir": str(out_dir), "objective": objective,
               "eval_tasks": {"before": state["eval_before"], "after": eval_after},  # per task: paired tests
               "eval_details": {"before": before_details, "after": after_details},
               "held_out_means": {"before": held_out_means(before_details, common),
                                  "after": held_out_means(after_details, common)}}  # fmt: skip
    row = lambda s: (f"{s['success_before']:.3f}", f"{s['success_after']:.3f}", str(s["eval_episodes"]),  # noqa: E731
                     str(s["gained"]), str(s["lost"]), f"{s['p_value']:.3g}")  # fmt: skip
    if mixture:  # one row per env (its own sign test), then all tasks together
        summary["per_env"] = {name: compare_evals(*({t: v for t, v in table.items() if t.startswith(f"{name}/")}
                                                    for table in (state["eval_before"], eval_after)))
                              for name in rollouts.names}  # fmt: skip
        logger.table("held-out success per env (same tasks before and after RL)",
                     [(name, *row(s)) for name, s in summary["per_env"].items()] + [("all", *row(summary))],
                     ("env", "before RL", "after RL", "tasks", "gained", "lost", "sign-test p"))  # fmt: skip
        logger.plot(("sft/loss", tuple(f"env/{n}/reward" for n in rollouts.names),
                     tuple(f"eval/{n}/success" for n in rollouts.names), tuple(f"mix/{n}/max_turns" for n in rollouts.names),
                     tuple(f"mix/{n}/filtered" for n in rollouts.names), "loss/loss"))  # fmt: skip
    else:
        logger.table("held-out success (same tasks before and after RL)", [row(summary)],
                     ("before RL", "after RL", "tasks", "gained", "lost", "sign-test p"))  # fmt: skip
        logger.plot(("sft/loss", "env/reward", "eval/success", "loss/loss", "loss/entropy"))
    if line := peaks.line():
        logger.console.print(line)
    logger.close()
    progress.close()
    summary["precision"] = precision.as_dict()
    summary["peak_rss_gib"] = dict(peaks.peaks)  # this process, per phase (agentrl.train.memory)
    summary["model_dir"] = str(export_model(engine, tokenizer, out_dir / "model", write=rank0))
    if rank0:
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


EVAL_SEED = 10_000_019  # held-out evals sample (at eval_temperature > 0) from streams of this seed


def _evaluator(config: RunConfig, rollouts: Rollouts, policy: Any, logger: MetricsLogger,
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
            outcomes, record, details = shared_eval(config.train.eval_before_from, [task_id(t) for t in tasks])
            logger.log(0, record, echo=("eval/success",))
            progress.line(f"eval before RL: taken from {config.train.eval_before_from} (train.eval_before_from): "
                          f"{len(outcomes)} tasks, success={record['eval/success']:.3g}")  # fmt: skip
            return outcomes, details
        policy.eval()
        if peaks is not None:
            peaks.start()
        name = "eval before RL" if step == 0 else f"eval after step {step}"
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
        for name in names or ():  # eval/<name>/success, eval/<name>/outcome, eval/<name>/failed
            mine = {t: v for t, v in outcomes.items() if t.startswith(f"{name}/")}
            per_env |= {f"eval/{name}/success": float(np.mean(list(mine.values()))) if mine else 0.0,
                        f"eval/{name}/failed": float(sum(ep.failed for ep in episodes if ep.task_id.startswith(f"{name}/")))}  # fmt: skip
            per_env |= {(f"eval/{name}/outcome" if k == "outcome" else f"eval/{name}/metric/{k}"): v
                        for k, v in held_out_means(details, mine).items()}  # fmt: skip
        logger.log(step, {"eval/success": float(np.mean(list(outcomes.values()))) if outcomes else 0.0,
                          "eval/failed": float(sum(ep.failed for ep in episodes)), "eval/replayed": float(replayed),
                          **_means_record(means), **per_env, **gpu_memory(), **(peaks.end("eval") if peaks else {})},
                   echo=("eval/success",))  # fmt: skip
        if names:
            progress.line(f"{name} per env: " + ", ".join(f"{n} success={per_env[f'eval/{n}/success']:.3g}" for n in names))
        return outcomes, details

    return evaluate


def replay_failed(episodes: list[Episode], tasks: list[Any], rollouts: Rollouts, name: str, step: int,
                  config: RunConfig, progress: RunProgress, rounds: int = 2) -> tuple[list[Episode], int]:  # fmt: skip
    """Replay a held-out eval's failed (crashed) episodes up to ``rounds`` times, each from the start
    of its own task (its sampling stream is keyed by the task, so a greedy replay is the episode the
    crash interrupted; the env's reset seed follows the position in the replayed list). Returns the
    episodes in task order and how many replays ran."""
    episodes, replayed = list(episodes), 0
    for _ in range(rounds):
        failed = [i for i, ep in enumerate(episodes) if ep.failed]
        if not failed:
            break
        progress.line(f"{name}: {len(failed)} of {len(tasks)} episodes failed ({episodes[failed[0]].error}); "
                      "replaying them")  # fmt: skip
        again, _ = rollouts.run([tasks[i] for i in failed], seed=EVAL_SEED, version=step, group_size=1,
                                temperature=config.train.eval_temperature)  # fmt: skip
        for i, episode in zip(failed, again, strict=True):
            episodes[i] = episode
        replayed += len(failed)
    return episodes, replayed


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


def gpu_memory() -> dict[str, float]:
    """Peak GPU memory of this process since the last call (GiB, allocated by tensors and reserved by
    torch's caching allocator), then the peak is reset; nothing on a machine without CUDA."""
    if not torch.cuda.is_available():
        return {}
    values = {"perf/gpu_peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
              "perf/gpu_peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30}  # fmt: skip
    torch.cuda.reset_peak_memory_stats()
    return values


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


def batching_line(generator: Any, lockstep: bool | None) -> str:
    """How rollout and eval decode batches form (``lockstep`` as the runs are given it, resolved by
    ``runner.lockstep_mode``), for the log."""
    from agentrl.rollout.runner import lockstep_mode

    lockstep, wait = lockstep_mode(lockstep, generator)
    if not lockstep:
        return "rollout batching: per request (a remote server batches them): not repeatable bit for bit"
    limit = "without a wait limit (train.deterministic)" if wait is None else (
        f"waiting at most {wait:g}s for a slow env call (rollout/lockstep_cut counts batches that did not)")  # fmt: skip
    return ("rollout batching: lock-step (each decode batch holds every active episode's request, ordered by seed: "
            f"the same seed gives the same run), {limit}")  # fmt: skip


def _resolve_prefix_cache(config: RunConfig, model: Any, progress: Any) -> RunConfig:
    """``rollout.prefix_cache_tokens`` resolved (unset: every episode in flight, within a quarter of
    the machine's memory) and printed."""
    from agentrl.rollout.generators.kv_cache import kv_bytes_per_token, prefix_cache_budget

    tokens = config.rollout.prefix_cache_tokens
    if tokens is None:
        tokens, why = prefix_cache_budget(model, config.rollout.concurrency * config.rollout.max_context_tokens)
    else:
        why = f"{tokens} tokens ({tokens * kv_bytes_per_token(model) / 2**30:.1f} GiB), as set"
    progress.print(f"generator: hf, rollout.prefix_cache_tokens={tokens}: {why}")
    return dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, prefix_cache_tokens=tokens))


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
    from math import comb

    tasks = sorted(before.keys() & after.keys())
    solved = lambda table, t: table[t] >= 1.0  # noqa: E731
    gained = sum(solved(after, t) and not solved(before, t) for t in tasks)
    lost = sum(solved(before, t) and not solved(after, t) for t in tasks)
    n = gained + lost
    tail = sum(comb(n, k) for k in range(min(gained, lost) + 1)) / 2**n if n else 0.5
    return {
        "success_before": float(np.mean([before[t] for t in tasks])) if tasks else 0.0,
        "success_after": float(np.mean([after[t] for t in tasks])) if tasks else 0.0,
        "eval_episodes": len(tasks),
        "gained": gained,
        "lost": lost,
        "p_value": min(1.0, 2 * tail),
    }


def _generator_rng(generator: Any) -> Any:
    # HFGenerator keeps a private torch.Generator for sampling; saved so a resumed run samples alike
    rng = getattr(generator, "_rng", None)
    return rng.get_state() if isinstance(rng, torch.Generator) else None


def _restore_generator_rng(generator: Any, state: Any) -> None:
    rng = getattr(generator, "_rng", None)
    if state is not None and isinstance(rng, torch.Generator):
        rng.set_state(state)


def main(config_path: str | None, overrides: list[str] | None = None) -> int:
    """``agentrl train CONFIG [overrides]``: 0 on success, 2 on a bad config, 1 on a run error."""
    from rich.console import Console

    console = Console(stderr=True)
    try:
        config = load_config(config_path, list(overrides or []))
    except ConfigError as exc:
        console.print(f"[red]config error:[/red] {exc}")
        return 2
    try:
        summary = train(config)
    except AgentRLError as exc:
        console.print(f"[red]training failed:[/red] {exc}")
        log = Path(config.train.out_dir) / "train.log"
        if world()[0] == 0 and log.exists():  # the run's log says how it ended, as the terminal did
            with log.open("a") as handle:
                handle.write(f"training failed: {exc}\n")
        return 1
    if world()[0] == 0:
        for name, part in summary.get("per_env", {}).items():
            print(f"held-out success on {name} before RL: {part['success_before']:.3f}  after RL: "
                  f"{part['success_after']:.3f}  ({part['gained']} tasks gained, {part['lost']} lost, "
                  f"sign-test p={part['p_value']:.3g})")  # fmt: skip
        print(
            f"held-out success before RL: {summary['success_before']:.3f}  after RL: {summary['success_after']:.3f}"
            f"  ({summary['gained']} tasks gained, {summary['lost']} lost, sign-test p={summary['p_value']:.3g})"
        )
    return 0


__all__ = ["TaskSampler", "compare_evals", "filter_episodes", "main", "train"]
