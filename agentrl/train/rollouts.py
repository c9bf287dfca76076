"""Episodes for training and held-out evals: :class:`Rollouts` runs the configured env with the
generator (train and eval tasks, the warm-up's oracle demonstrations, a mixture entry's turn budget);
:func:`make_rollouts` gives one env's or a mixture's (:class:`agentrl.train.mixture.MixtureRollouts`)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.config import RunConfig
from agentrl.trajectory import Episode

if TYPE_CHECKING:
    from agentrl.rollout.runner import RunStats


class Rollouts:
    """Runs episodes of the configured env with the generator (train and eval)."""

    def __init__(self, config: RunConfig, generator: Any, tokenizer: Any):
        import agentrl
        from agentrl.cluster.remote_env import episode_envs

        env_cfg = config.env
        budgets = {"max_turns": env_cfg.max_turns, "max_obs_chars": env_cfg.max_obs_chars}
        # an unset budget is the env's registration's (agentrl.config.resolve_env_budgets)
        self.env_kwargs = {**{k: v for k, v in budgets.items() if v is not None}, **env_cfg.kwargs}
        self.make_env = lambda: agentrl.make(env_cfg.id, **self.env_kwargs)
        # local, or Ray actors sized to the cluster for rollout.concurrency episodes before any is made
        self.episode_env = episode_envs(env_cfg, self.env_kwargs, self.make_env, config.rollout.concurrency)
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
        from agentrl.cluster.remote_env import episode_envs

        if max_turns is None:
            return self.episode_env
        if max_turns not in self._budget_envs:
            kwargs = {**self.env_kwargs, "max_turns": max_turns}
            env_id = self.config.env.id
            self._budget_envs[max_turns] = episode_envs(
                self.config.env, kwargs, lambda: agentrl.make(env_id, **kwargs), self.config.rollout.concurrency
            )
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
        settings = dataclasses.replace(
            rollout, max_new_tokens=max(rollout.max_new_tokens, 512), group_size=1, branches=0
        )  # one demonstration per task: chains
        episodes: list[Episode] = []
        folded = dataclasses.replace(settings, folding="branch")
        for part, oracle, field, how in ((tasks[:n_fold], train.fold_oracle, "train.fold_oracle", folded),
                                         (tasks[n_fold:], train.oracle, "train.oracle", settings)):  # fmt: skip
            if part:
                oracle_cls = load_entry_point(oracle, field=field)
                episodes += run_oracle_episodes(self.episode_env, part, oracle_cls, self.tokenizer, how, seed=seed,
                                                on_episode=on_episode, **self.run_options)  # fmt: skip
        return episodes, n_fold


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

    return MixtureRollouts(
        config, [Rollouts(entry_config(config, e), generator, tokenizer) for e in config.env.mixture]
    )


def mixture_lines(config: RunConfig, rollouts: Any) -> list[str]:
    """What a mixture run resolved, for the log: per env its share of a step, pool, held-out tasks,
    turn budget (and curriculum), oracle; then the filter and the reward normalisation."""
    from agentrl.train.mixture import apportion

    env, n = config.env, config.rollout.tasks_per_step
    first = apportion(n, [e.weight for e in env.mixture], [0] * len(env.mixture))
    held = {name: sum(1 for i, _ in rollouts.held_out(config.train.eval_episodes) if i == k)
            for k, name in enumerate(rollouts.names)}  # fmt: skip
    lines = [
        f"mixture: {len(env.mixture)} envs, tasks_per_step={n} apportioned by weight (first step: "
        + ", ".join(f"{name} {c}" for name, c in zip(rollouts.names, first, strict=True))
        + ")"
    ]
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
