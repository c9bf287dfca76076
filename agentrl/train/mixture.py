"""Several environments in one run: the mixture's checks, its task sampler (weights, online
difficulty filter), its turn-budget curriculum and the rollouts that run each env's share.

``env:`` given as a list (``agentrl.config.EnvEntry`` per item) turns this on; one env runs the
plain path in :mod:`agentrl.train.trainer` unchanged.

- **Checks** (:func:`validate_mixture`, before anything runs): every entry's id, weight, budgets,
  curriculum and names; each env is built once to compare them: the same tool name with two
  different schemas, or two envs teaching different action/answer formats, is refused naming both
  entries. :func:`check_envs_feed` refuses an objective one env cannot feed (IGPO's gold-answer
  scoring on an env whose answers are not text).
- **Sampling** (:class:`MixtureSampler`): each step's ``tasks_per_step`` are apportioned to the envs
  by weight, largest deficit first over the run so far (weights 2:1:1 and 4 tasks give 2, 1, 1
  every step; 1:1 and 3 tasks alternate 2, 1 and 1, 2), and each env's tasks come from a seeded
  permutation of its pool. No random draw decides the shares, so the same seed gives the same
  tasks, on every data-parallel rank alike. Each task is its own group, so group-relative
  advantages never mix envs.
- **Difficulty filter**: per task, the pass rates of its last ``env.filter_window`` groups; a task
  whose window is all solved (>= ``env.filter_solved``) or all failed (<= ``env.filter_failed``) is
  passed over for ``env.filter_cooldown`` steps (the env's next task is drawn instead).
- **Horizon curriculum** (``EnvEntry.turn_budget``): AgentGym-RL's ScalingInter-RL, a training turn
  budget that grows on a schedule; held-out evals always use the full ``max_turns``.
"""

from __future__ import annotations

import dataclasses
import re
from collections import deque
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from agentrl.errors import ConfigError

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
NORMALIZE = ("none", "env_std")


# --------------------------------------------------------------------------- checks
@lru_cache(maxsize=64)
def _probe(env_id: str, kwargs_items: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """What the checks compare of one env, built once: its tools' schemas, prompt format, splits
    and whether its tasks' answers are text."""
    import json

    import agentrl

    env = agentrl.make(env_id, **dict(kwargs_items))
    try:
        inner = env.unwrapped
        prompt = str(getattr(inner, "system_prompt", ""))
        tools = {}
        for schema in inner.tools:
            fn = schema.get("function", schema)
            tools[fn.get("name", "")] = json.dumps(fn, sort_keys=True)
        actions = "<tool_call> JSON" if "<tool_call>" in prompt else "ReAct name[argument]"
        answers = "<answer>...</answer>" if "<answer>" in prompt else (
            "FINAL ANSWER: ..." if getattr(inner, "final_answer_prefix", False) else "(none taught)")  # fmt: skip
        tasks = list(inner.load_tasks(inner.split))
        answer = tasks[0].answer if tasks else None
        text = isinstance(answer, str) or (
            isinstance(answer, list | tuple) and bool(answer) and all(isinstance(a, str) for a in answer))  # fmt: skip
        return {"tools": tools, "format": (actions, answers), "splits": tuple(getattr(inner, "splits", ())),
                "text_answers": text}  # fmt: skip
    finally:
        env.close()


def probe(entry: Any, prefix: str) -> dict[str, Any]:
    """:func:`_probe` of an entry; a failure to build the env is a ConfigError naming the entry."""
    try:
        return _probe(entry.id, tuple(sorted((k, _hashable(v)) for k, v in entry.kwargs.items())))
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - any constructor error is the entry's
        raise ConfigError(f"{prefix}.kwargs", f"{entry.id} could not be built with kwargs {entry.kwargs}: {exc}",
                          "fix the kwargs (the env's constructor arguments)") from exc  # fmt: skip


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


# agentrl.config's env.id of a mixture, and the EnvConfig fields each entry sets (left at their defaults
# at the top); this module does not import the config (the config's checks import this module)
MIXTURE_ID = "mixture"
PER_ENTRY = ("split", "eval_split", "max_turns", "max_obs_chars", "kwargs", "ray_resources")


def validate_mixture(env: Any, prefix: str = "env", *, mixture_id: str = MIXTURE_ID,
                     per_entry: Sequence[str] = PER_ENTRY) -> None:  # fmt: skip
    """Every check of a mixture (``EnvConfig.validate`` calls it); a ConfigError names the entry
    (``env[1].weight``) and the fix."""
    from agentrl.cluster.remote_env import validate_placement
    from agentrl.env import registered_ids

    if not env.mixture:
        raise ConfigError(f"{prefix}.mixture", "is empty, but env.id says this run is a mixture",
                          "list the envs (env: [{id: ...}, ...]) or give env.id one registered id")  # fmt: skip
    if env.id != mixture_id:
        raise ConfigError(f"{prefix}.id", f"is {env.id!r}, but a mixture names its envs per entry (env[i].id)",
                          f"leave {prefix}.id out when env is a list")  # fmt: skip
    defaults = {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())  # type: ignore[misc]
                for f in dataclasses.fields(env)}  # fmt: skip
    for name in per_entry:
        if getattr(env, name) != defaults[name]:
            raise ConfigError(f"{prefix}.{name}", "is set for the whole mixture, where each env has its own",
                              f"set it per entry: env[i].{name}")  # fmt: skip
    if env.normalize_rewards not in NORMALIZE:
        raise ConfigError(f"{prefix}.normalize_rewards", f"{env.normalize_rewards!r} is not allowed",
                          f"use one of: {', '.join(NORMALIZE)}")  # fmt: skip
    if env.filter_window < 0:
        raise ConfigError(f"{prefix}.filter_window", f"must be >= 0, got {env.filter_window}", "0 turns the filter off")
    if not 0.0 <= env.filter_failed < env.filter_solved <= 1.0:
        raise ConfigError(f"{prefix}.filter_solved", f"needs 0 <= filter_failed < filter_solved <= 1, got "
                          f"filter_failed={env.filter_failed:g}, filter_solved={env.filter_solved:g}",
                          "e.g. filter_failed=0, filter_solved=1: only groups all failed or all solved count")  # fmt: skip
    if env.filter_cooldown < 1:
        raise ConfigError(f"{prefix}.filter_cooldown", f"must be >= 1, got {env.filter_cooldown}",
                          "the steps a filtered task is passed over; filter_window=0 turns the filter off")  # fmt: skip
    if not env.filter_window:
        for name in ("filter_solved", "filter_failed", "filter_cooldown"):
            if getattr(env, name) != defaults[name]:
                raise ConfigError(f"{prefix}.{name}", "is a setting of the difficulty filter, which is off",
                                  f"set {prefix}.filter_window to a window of groups, or leave {name} out")  # fmt: skip
    validate_placement(env, prefix)
    ids = registered_ids()
    names: dict[str, int] = {}
    probes = []
    for i, entry in enumerate(env.mixture):
        at = f"env[{i}]"
        if entry.id not in ids:
            raise ConfigError(f"{at}.id", f"unknown env {entry.id!r}" if entry.id else "is missing",
                              f"use one of: {', '.join(ids)}")  # fmt: skip
        if not entry.weight > 0:
            raise ConfigError(f"{at}.weight", f"must be > 0, got {entry.weight:g}",
                              "give every env a positive share (e.g. 1), or drop the entry")  # fmt: skip
        for name in ("max_turns", "max_obs_chars"):  # unset: the registration's (config.resolve_env_budgets)
            if getattr(entry, name) is not None and getattr(entry, name) < 1:
                raise ConfigError(f"{at}.{name}", f"must be >= 1, got {getattr(entry, name)}",
                                  "or leave it unset for the env's registration")  # fmt: skip
        if entry.train_tasks < 0:
            raise ConfigError(f"{at}.train_tasks", f"must be >= 0, got {entry.train_tasks}", "0 uses every task")
        if entry.eval_episodes is not None and entry.eval_episodes < 1:
            raise ConfigError(f"{at}.eval_episodes", f"must be >= 1, got {entry.eval_episodes}",
                              "leave it unset for train.eval_episodes")  # fmt: skip
        if entry.oracle and ":" not in entry.oracle:
            raise ConfigError(f"{at}.oracle", f"{entry.oracle!r} is not module:Class",
                              "e.g. agentrl.envs.sql.oracle:SQLOracle, or leave it empty")  # fmt: skip
        if entry.max_turns is not None and not 0 <= entry.horizon_start <= entry.max_turns:
            raise ConfigError(f"{at}.horizon_start", f"must be in [0, max_turns={entry.max_turns}], got {entry.horizon_start}",
                              "the curriculum's first turn budget; 0 turns it off")  # fmt: skip
        for name in ("horizon_every", "horizon_by"):
            if getattr(entry, name) < 1:
                raise ConfigError(f"{at}.{name}", f"must be >= 1, got {getattr(entry, name)}")
            if not entry.horizon_start and getattr(entry, name) != 1:
                raise ConfigError(f"{at}.{name}", "is a setting of the horizon curriculum, which is off",
                                  f"set {at}.horizon_start to the first turn budget, or leave {name} out")  # fmt: skip
        if entry.ray_resources and env.placement != "ray":
            raise ConfigError(f"{at}.ray_resources", "only applies to placement ray",
                              f"set {prefix}.placement=ray, or leave it out")  # fmt: skip
        name = entry.short_name()
        if not NAME.match(name):
            raise ConfigError(f"{at}.name", f"{name!r} is not a short name (lower-case letters, digits, - and _)",
                              f"set {at}.name, e.g. {re.sub(r'[^a-z0-9_-]', '', name.lower()) or 'env'}")  # fmt: skip
        if name in names:
            raise ConfigError(f"{at}.name", f"{name!r} is also env[{names[name]}]'s name",
                              f"give the entries distinct names ({at}.name=...): metrics and task ids carry them")  # fmt: skip
        names[name] = i
        info = probe(entry, at)
        for field in ("split", "eval_split"):
            if info["splits"] and getattr(entry, field) not in info["splits"]:
                raise ConfigError(f"{at}.{field}", f"{entry.id} has no split {getattr(entry, field)!r}",
                                  f"use one of: {', '.join(info['splits'])}")  # fmt: skip
        for j, other in probes:
            for tool, schema in info["tools"].items():
                if tool in other["tools"] and other["tools"][tool] != schema:
                    raise ConfigError(f"{at}.id", f"its tool {tool!r} collides with env[{j}] "
                                      f"({env.mixture[j].id})'s tool of the same name, which takes other arguments: "
                                      "the policy could not tell which one a call means",
                                      "mix envs whose same-named tools are the same tool, or leave one out")  # fmt: skip
            if info["format"] != other["format"]:
                raise ConfigError(f"{at}.id", f"{entry.id} teaches actions as {info['format'][0]} and answers as "
                                  f"{info['format'][1]}, but env[{j}] ({env.mixture[j].id}) teaches "
                                  f"{other['format'][0]} and {other['format'][1]}: mismatched prompt formats",
                                  "mix envs that teach the same action and answer format")  # fmt: skip
        probes.append((i, info))


def resolve(config: Any) -> Any:
    """The mixture with every entry's defaults resolved (``name`` from the id, ``eval_episodes``
    from ``train.eval_episodes``): what the run prints and saves in resolved_config.yaml."""
    if not config.env.mixture:
        return config
    entries = tuple(dataclasses.replace(e, name=e.short_name(), eval_episodes=e.eval_episodes or config.train.eval_episodes)
                    for e in config.env.mixture)  # fmt: skip
    return dataclasses.replace(config, env=dataclasses.replace(config.env, mixture=entries))


def check_mixture_run(config: Any) -> None:
    """The run's other sections against its mixture: the warm-up's oracles are per env
    (``env[i].oracle``), and branch/return demonstrations (``train.sft_fold_share``) are not mixed."""
    train = config.train
    if train.oracle:
        raise ConfigError("train.oracle", "is one env's oracle, but this run mixes envs",
                          "set each env's own: env[i].oracle=module:Class")  # fmt: skip
    if train.sft_fold_share:
        raise ConfigError("train.sft_fold_share", "folded demonstrations are not mixed across envs",
                          "set train.sft_fold_share=0")  # fmt: skip
    if train.sft_warmup_steps > 0 and not any(e.oracle for e in config.env.mixture):
        raise ConfigError("train.sft_warmup_steps", "the warm-up needs demonstrations, and no env names an oracle",
                          "set env[i].oracle=module:Class for the envs to demonstrate, or train.sft_warmup_steps=0")  # fmt: skip


def check_envs_feed(config: Any, who: str, needs: Sequence[str]) -> None:
    """Refuse an objective one env of a mixture cannot feed, naming the env (``train/plan.py``)."""
    if "gt_logprob" not in needs:
        return
    for i, entry in enumerate(config.env.mixture):
        if not probe(entry, f"env[{i}]")["text_answers"]:
            raise ConfigError(f"env[{i}].id", f"{who} needs gold-answer scoring ('gt_logprob': the policy's "
                              f"log-prob of the gold answer as text), but {entry.id}'s tasks have no text answer",
                              "train this objective on envs whose answers are text (search, code), or leave "
                              f"env[{i}] out")  # fmt: skip


# --------------------------------------------------------------------------- sampling
def apportion(count: int, weights: Sequence[float], drawn: Sequence[int]) -> list[int]:
    """Split ``count`` tasks among envs by ``weights``, given how many each has had so far
    (``drawn``): each task goes to the env furthest below its share of the total (ties: the
    earlier entry). Over any run each env's count stays within one task of its exact share."""
    total_w = float(sum(weights))
    have = list(drawn)
    total = sum(have) + count
    out = [0] * len(weights)
    for _ in range(count):
        deficit = [total * w / total_w - h for w, h in zip(weights, have, strict=True)]
        best = max(range(len(weights)), key=lambda i: (deficit[i], -i))
        out[best] += 1
        have[best] += 1
    return out


class MixtureSampler:
    """Each step's tasks over a mixture: apportioned by weight, a seeded permutation per env, the
    difficulty filter on top. ``next(count)`` returns flat indices into the mixture's task list
    (env 0's pool, then env 1's, ...); ``observe`` feeds the filter a step's groups."""

    def __init__(self, sizes: Sequence[int], weights: Sequence[float], names: Sequence[str], seed: int, *,
                 window: int = 0, solved: float = 1.0, failed: float = 0.0, cooldown: int = 4,
                 state: dict[str, Any] | None = None):  # fmt: skip
        self.sizes, self.weights, self.names, self.seed = list(sizes), list(weights), list(names), seed
        self.window, self.solved, self.failed, self.cooldown = window, solved, failed, cooldown
        self.offsets = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        state = state or {}
        self.drawn = list(state.get("drawn", [0] * len(sizes)))
        self.walk = [tuple(w) for w in state.get("walk", [(0, 0)] * len(sizes))]  # (epoch, cursor) per env
        self.step = int(state.get("step", 0))
        self.history: dict[int, deque[float]] = {int(k): deque(v, maxlen=max(window, 1))
                                                 for k, v in state.get("history", {}).items()}  # fmt: skip
        self.skip_until: dict[int, int] = {int(k): int(v) for k, v in state.get("skip_until", {}).items()}
        self._orders: dict[tuple[int, int], list[int]] = {}
        self._step_counts: dict[str, float] = {}

    def _order(self, env: int, epoch: int) -> list[int]:
        import numpy as np

        from agentrl.rollout.generators.base import derive_seed

        key = (env, epoch)
        if key not in self._orders:
            rng = np.random.default_rng([derive_seed(self.seed, "mixture", self.names[env]), epoch])
            self._orders[key] = rng.permutation(self.sizes[env]).tolist()
        return self._orders[key]

    def _take(self, env: int) -> int:
        epoch, cursor = self.walk[env]
        local = self._order(env, epoch)[cursor]
        cursor += 1
        if cursor == self.sizes[env]:
            epoch, cursor = epoch + 1, 0
        self.walk[env] = (epoch, cursor)
        return self.offsets[env] + local

    def next(self, count: int) -> list[int]:
        shares = apportion(count, self.weights, self.drawn)
        picked: list[int] = []
        for env, share in enumerate(shares):
            self.drawn[env] += share
            name = self.names[env]
            self._step_counts[f"mix/{name}/tasks"] = self._step_counts.get(f"mix/{name}/tasks", 0.0) + share
            for _ in range(share):
                for attempt in range(self.sizes[env]):  # pass over filtered tasks (all filtered: take one anyway)
                    flat = self._take(env)
                    if self.skip_until.get(flat, -1) <= self.step:
                        break
                    key = f"mix/{name}/" + ("forced" if attempt == self.sizes[env] - 1 else "skipped_draws")
                    self._step_counts[key] = self._step_counts.get(key, 0.0) + 1
                picked.append(flat)
        return picked

    def env_of(self, flat: int) -> int:
        return max(i for i, off in enumerate(self.offsets) if flat >= off)

    def observe(self, step: int, picked: Sequence[int], pass_rates: Sequence[float | None]) -> dict[str, float]:
        """The step's groups (``picked[k]``'s pass rate, None when every episode of it failed to
        run) into the filter; returns the step's sampler metrics, per env: ``tasks`` drawn,
        ``skipped_draws`` (filtered tasks passed over), ``forced`` (every task of the env filtered:
        one taken anyway), ``too_easy`` / ``too_hard`` (tasks filtered at this step), ``filtered``
        (tasks being passed over from the next step). The filter's next step is ``step + 1``."""
        metrics = {f"mix/{n}/{k}": 0.0 for n in self.names
                   for k in ("tasks", "skipped_draws", "forced", "too_easy", "too_hard")}  # fmt: skip
        metrics |= self._step_counts
        self._step_counts = {}
        for flat, rate in zip(picked, pass_rates, strict=True):
            if rate is None or not self.window:
                continue
            recent = self.history.setdefault(flat, deque(maxlen=self.window))
            recent.append(float(rate))
            if len(recent) < self.window:
                continue
            name = self.names[self.env_of(flat)]
            if all(r >= self.solved for r in recent):
                metrics[f"mix/{name}/too_easy"] += 1
            elif all(r <= self.failed for r in recent):
                metrics[f"mix/{name}/too_hard"] += 1
            else:
                continue
            self.skip_until[flat] = step + 1 + self.cooldown
        self.step = step + 1
        for env, name in enumerate(self.names):
            lo, hi = self.offsets[env], self.offsets[env] + self.sizes[env]
            metrics[f"mix/{name}/filtered"] = float(sum(lo <= f < hi and until > self.step
                                                        for f, until in self.skip_until.items()))  # fmt: skip
        return metrics

    def state(self) -> dict[str, Any]:
        return {"drawn": list(self.drawn), "walk": [list(w) for w in self.walk], "step": self.step,
                "history": {str(k): list(v) for k, v in self.history.items()},
                "skip_until": {str(k): v for k, v in self.skip_until.items()}}  # fmt: skip


# --------------------------------------------------------------------------- rollouts
def split_name(task_id: str) -> tuple[str, str]:
    """``"sql/train-3"`` -> ``("sql", "train-3")``: a mixture's task ids carry their env's name."""
    name, _, rest = task_id.partition("/")
    return name, rest


class MixtureRollouts:
    """The trainer's ``Rollouts`` over several envs: one per env, each running its share of a
    wave in turn (the env's own seed stream, derived from the wave's seed and the env's name).
    Tasks are ``(env index, task)``; episodes come back in the order of the tasks given, with
    ``task_id`` and ``group_id`` prefixed by the env's short name (``sql/train-3``)."""

    def __init__(self, config: Any, envs: Sequence[Any]):
        self.config, self.envs = config, list(envs)
        self.entries = list(config.env.mixture)
        self.names = [e.short_name() for e in self.entries]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.train_tasks = []
        for i, (entry, env) in enumerate(zip(self.entries, self.envs, strict=True)):
            pool = env.train_tasks[: entry.train_tasks] if entry.train_tasks else env.train_tasks
            self.train_tasks += [(i, t) for t in pool]
        self.sizes = [sum(1 for i, _ in self.train_tasks if i == k) for k in range(len(self.envs))]
        self.run_options = self.envs[0].run_options

    @property
    def generator(self) -> Any:
        """The generator every env's rollouts share."""
        return self.envs[0].generator

    def demo_count(self, count: int) -> int:
        """How many demonstrations :meth:`demonstrations` plays for ``count`` asked."""
        with_oracle = [i for i, e in enumerate(self.entries) if e.oracle]
        shares = apportion(count, [self.entries[i].weight for i in with_oracle], [0] * len(with_oracle))
        return sum(min(share, len(self.envs[i].train_tasks)) for i, share in zip(with_oracle, shares, strict=True))

    def held_out(self, default: int) -> list[tuple[int, Any]]:
        """Each env's first ``eval_episodes`` (its own, else ``default``) held-out tasks, env by env."""
        return [(i, t) for i, (entry, env) in enumerate(zip(self.entries, self.envs, strict=True))
                for t in env.eval_tasks[: entry.eval_episodes or default]]  # fmt: skip

    def success_metric(self, episode: Any) -> str:
        from agentrl.env import success_metric

        return success_metric(self.entries[self.index[split_name(episode.task_id)[0]]].id)

    def name_of(self, episode: Any) -> str:
        return split_name(episode.task_id)[0]

    def run(self, tasks: list[tuple[int, Any]], *, seed: int, version: int, group_size: int,
            temperature: float | None = None, out_path: Any = None, on_episode: Any = None, branches: int = 0,
            horizon_step: int | None = None) -> tuple[list[Any], Any]:  # fmt: skip
        """One wave over the mixture; ``horizon_step``: the RL step whose curriculum budget training
        rollouts get (None: each env's full ``max_turns``, as held-out evals)."""
        from agentrl.rollout.generators.base import derive_seed

        if out_path is not None:
            raise ValueError("a mixture's waves are not streamed to a file")
        results: list[list[Any] | None] = [None] * len(tasks)
        stats = None
        for env_index in sorted({i for i, _ in tasks}):
            positions = [p for p, (i, _) in enumerate(tasks) if i == env_index]
            entry, name = self.entries[env_index], self.names[env_index]
            budget = entry.turn_budget(horizon_step) if horizon_step is not None else entry.max_turns
            labelled: set[int] = set()

            def label(ep: Any, name: str = name, labelled: set[int] = labelled) -> Any:
                if id(ep) not in labelled:  # as it ends (the callback reads it), or after the wave
                    labelled.add(id(ep))
                    ep.task_id, ep.group_id = f"{name}/{ep.task_id}", f"{name}/{ep.group_id}"
                return ep

            episodes, run_stats = self.envs[env_index].run(
                [tasks[p][1] for p in positions], seed=derive_seed(seed, "env", name), version=version,
                group_size=group_size, temperature=temperature, branches=branches, max_turns=budget,
                on_episode=None if on_episode is None else (lambda ep, label=label: on_episode(label(ep))),
            )  # fmt: skip
            episodes = [label(ep) for ep in episodes]
            per_task = len(episodes) // max(len(positions), 1)
            for k, p in enumerate(positions):
                results[p] = episodes[k * per_task : (k + 1) * per_task]
            stats = run_stats if stats is None else stats.merge(run_stats)
        if stats is None:
            from agentrl.rollout.runner import RunStats

            stats = RunStats()
        return [ep for chunk in results for ep in (chunk or [])], stats

    def demonstrations(self, count: int, seed: int, on_episode: Any = None) -> tuple[list[Any], int]:
        """The warm-up's demonstrations: ``count`` apportioned by weight among the envs that name an
        oracle (``env[i].oracle``), each played by its env's oracle; none folded."""
        from agentrl.rollout.generators.base import derive_seed

        with_oracle = [i for i, e in enumerate(self.entries) if e.oracle]
        shares = apportion(count, [self.entries[i].weight for i in with_oracle], [0] * len(with_oracle))
        out: list[Any] = []
        for i, share in zip(with_oracle, shares, strict=True):
            if share:
                name, labelled = self.names[i], set()

                def label(ep: Any, name: str = name, labelled: set[int] = labelled) -> Any:
                    if id(ep) not in labelled:
                        labelled.add(id(ep))
                        ep.task_id, ep.group_id = f"{name}/{ep.task_id}", f"{name}/{ep.group_id}"
                    return ep

                episodes, _ = self.envs[i].demonstrations(
                    share, derive_seed(seed, "demos", name) % 2**32,
                    on_episode=None if on_episode is None else (lambda ep, label=label: on_episode(label(ep))))  # fmt: skip
                out += [label(ep) for ep in episodes]
        return out, 0


def pass_rates(picked: Sequence[int], episodes: Sequence[Any], solved: Callable[[Any], float]) -> list[float | None]:
    """Per picked task, the share of its group's episodes that solved it (episodes come task-major,
    an equal number per task); None for a group none of whose episodes ran."""
    per = len(episodes) // max(len(picked), 1)
    out: list[float | None] = []
    for k in range(len(picked)):
        ran = [ep for ep in episodes[k * per : (k + 1) * per] if not ep.failed]
        out.append(sum(solved(ep) for ep in ran) / len(ran) if ran else None)
    return out


def normalize_rewards(kept: Sequence[Any], name_of: Callable[[Any], str]) -> dict[str, float]:
    """``env.normalize_rewards=env_std``: each env's kept episodes' outcomes divided by their standard
    deviation over the step (left as they are when it is 0: all equal). Returns the stds
    (``mix/<name>/reward_std``)."""
    import statistics

    by_env: dict[str, list[Any]] = {}
    for ep in kept:
        by_env.setdefault(name_of(ep), []).append(ep)
    out = {}
    for name, eps in by_env.items():
        std = statistics.pstdev([ep.outcome for ep in eps]) if len(eps) > 1 else 0.0
        out[f"mix/{name}/reward_std"] = std
        if std > 0:
            for ep in eps:
                ep.outcome = ep.outcome / std
    return out


def env_metrics(episodes: Sequence[Any], name_of: Callable[[Any], str], solved: Callable[[Any], float],
                names: Sequence[str]) -> dict[str, float]:  # fmt: skip
    """Per-env means of a step's training episodes: ``env/<name>/reward``, ``success``, ``turns``,
    ``truncated``, ``tool_calls``, ``tool_errors`` (per episode), ``tokens`` (generated, summed),
    ``env_s`` (seconds in env calls and their sandboxes, summed), ``episodes``, ``failed``."""
    out: dict[str, float] = {}
    for name in names:
        eps = [ep for ep in episodes if name_of(ep) == name]
        done = [ep for ep in eps if not ep.failed]
        out[f"env/{name}/episodes"] = float(len(eps))
        out[f"env/{name}/failed"] = float(len(eps) - len(done))
        if not done:
            continue
        mean = lambda values: float(sum(values) / len(values))  # noqa: E731
        out |= {
            f"env/{name}/reward": mean([ep.outcome for ep in done]),
            f"env/{name}/success": mean([solved(ep) for ep in done]),
            f"env/{name}/turns": mean([ep.num_turns for ep in done]),
            f"env/{name}/truncated": mean([float(ep.truncated) for ep in done]),
            f"env/{name}/tool_calls": mean([float((ep.metrics or {}).get("tool_calls", 0.0)) for ep in done]),
            f"env/{name}/tool_errors": mean([float((ep.metrics or {}).get("tool_errors", 0.0)) for ep in done]),
            f"env/{name}/tokens": float(sum(ep.timings.get("generated_tokens", 0.0) for ep in done)),
            f"env/{name}/env_s": float(sum(ep.timings.get("env_s", 0.0) for ep in done)),
        }
    return out


__all__ = ["MixtureRollouts", "MixtureSampler", "apportion", "check_envs_feed", "check_mixture_run", "resolve", "env_metrics", "normalize_rewards",
           "pass_rates", "validate_mixture"]  # fmt: skip
