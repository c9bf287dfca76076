"""The environment contract: multi-turn, text-in/text-out, Gymnasium-style.

``reset(*, seed=None, options=None) -> (obs, info)``: the first observation is the task.
``options`` may hold ``{"task_id": ...}``, ``{"split": "test"}`` or ``{"task": Task | dict}``.

``step(action) -> (obs, reward, terminated, truncated, info)``: ``action`` is the model's raw text
for one turn. Tool calls run and their results are the next observation; a final answer ends the
episode (``terminated``); a budget ends it (``truncated``, set by the wrappers that
:func:`make` applies). ``info`` always carries ``turn`` and ``tool_calls``; the last step also
carries ``answer``, ``ground_truth`` and ``metrics``. Those flat keys are for gymnasium users;
``info["outcome"]`` holds the same step typed (:class:`agentrl.outcome.StepOutcome`: the tool
outcomes, and the episode's :class:`~agentrl.outcome.EpisodeMetrics` on the last step), which is
what agentrl's episode loop and evaluation read.

A new environment is one subclass of :class:`TextEnv` that implements ``load_tasks`` and
``score`` (and usually ``make_tools`` and ``system_prompt``), plus one :func:`register` call.

``fork() -> TextEnv`` (and :func:`fork_env` for a made env, wrappers included): an independent env
in the same state mid-episode, so that the same actions give the same observations and rewards in
both and neither sees the other's later changes (tree rollouts, :mod:`agentrl.rollout.tree`). An env
declares how (:attr:`TextEnv.fork_method`) or why it cannot (:attr:`TextEnv.fork_unsupported`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
from gymnasium import spaces

from agentrl.actions import ParsedAction, parse_action
from agentrl.errors import EnvError
from agentrl.outcome import OUTCOME, EpisodeMetrics, StepOutcome, end_step
from agentrl.registry import load_entry_point
from agentrl.tools.base import Tool, ToolOutcome

MAX_TEXT = 1 << 20


class AnyText(spaces.Text):
    """A Text space that accepts any Unicode string up to ``max_length`` (gymnasium's default
    charset is 62 alphanumerics, which rejects spaces, newlines and tool output)."""

    def __init__(self, max_length: int = MAX_TEXT, **kwargs: Any):
        import string

        super().__init__(max_length=max_length, min_length=0, charset=string.printable, **kwargs)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


@dataclass
class Task:
    """One task: what the model is asked and what counts as solving it.

    ``payload`` holds the family's own data (documented by each env), e.g. a product goal or a
    database name; ``answer`` is the gold answer in whatever form the env's ``score`` expects.
    """

    id: str
    question: str
    answer: Any = None
    split: str = "train"
    level: int | str | None = None
    payload: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Task:
        known = {
            k: record[k] for k in ("id", "question", "answer", "split", "level", "payload") if k in record
        }
        return cls(**known)


@dataclass
class Score:
    """The outcome of scoring a final answer: the reward and the metrics that explain it."""

    reward: float
    metrics: dict[str, float] = field(default_factory=dict)


class TextEnv(gym.Env[str, str]):
    """Base class of every agentrl environment. Subclasses implement the hooks below."""

    metadata = {"render_modes": ["ansi"]}
    #: System prompt for the chat template.
    system_prompt: str = "You are a helpful assistant."
    #: Splits the env knows; ``reset(options={"split": ...})`` picks one.
    splits: tuple[str, ...] = ("train", "dev", "test")
    #: Also accept ``FINAL ANSWER: ...`` as a final answer (GAIA style).
    final_answer_prefix: bool = False
    #: Accept ReAct-style ``name[argument]`` calls.
    react_actions: bool = True
    #: At most this many tool calls run per turn; more are refused with an observation.
    max_calls_per_turn: int = 4
    #: The final-info metric that says the task was solved (a value >= 1 counts; see :func:`solved`).
    #: Training (``eval/success``) and evaluation (the ``success`` column) both read it.
    success_metric: str = "reward"
    #: How :meth:`fork` reaches this env's state, in a word shown to users (``"copy"``: the episode's
    #: state is copied, the tools are rebuilt on resources of the fork's own); None: it cannot fork,
    #: and :attr:`fork_unsupported` says why. An env opts in: a subclass may keep state that a copy
    #: would share (a tool's closure), so the base class does not claim that a copy is a fork.
    fork_method: str | None = None
    #: Why :meth:`fork` is refused (with ``fork_method = None``).
    fork_unsupported: str = (
        "it does not declare how its state is forked (set TextEnv.fork_method; see TextEnv.fork)"
    )
    #: Tools whose calls change state that the episode's record does not hold (a python interpreter's
    #: variables and files): :meth:`fork` replays their calls, in order, into the fork's own fresh
    #: tools and checks that each gives the same observation text as it did here.
    stateful_tools: tuple[str, ...] = ()
    #: Tool services the env's instances share when they run in Ray actors (``env.placement: ray``,
    #: scoped by ``env.ray_services``): ``"sandbox_pool"`` (its tools lease boxes through
    #: ``tools.python.shared_pool``: one pool per node) and ``"shop"`` (it takes ``server_url``: one
    #: shop server per node or cluster). See :mod:`agentrl.cluster.services`.
    shared_services: tuple[str, ...] = ()

    def __init__(self, *, split: str = "train", render_mode: str | None = None):
        if split not in self.splits:
            raise EnvError(f"{type(self).__name__} has no split {split!r}; choose one of {self.splits}")
        self.split = split
        self.render_mode = render_mode
        self.observation_space = AnyText()
        self.action_space = AnyText()
        self.task: Task | None = None
        self._tools: dict[str, Tool] = {}
        self._task_cache: dict[str, Sequence[Task]] = {}
        self._transcript: list[tuple[str, str]] = []
        self._turn = 0
        self._done = False
        self._metrics: dict[str, float] = {}
        self._stateful_calls: list[tuple[str, dict[str, Any], str]] = []  # (tool, arguments, observation)

    # ----------------------------------------------------------------- hooks for subclasses
    def load_tasks(self, split: str) -> Sequence[Task]:
        """Return the tasks of ``split`` (called once per split, cached). Every env implements it."""
        raise NotImplementedError(f"{type(self).__name__} must implement load_tasks(split) -> Sequence[Task]")

    def make_tools(self) -> list[Tool]:
        """Tools for the episode that starts now (may bind per-episode state)."""
        return []

    def score(self, answer: str | None, task: Task) -> Score:
        """Score a final answer (``None`` when the episode ended without one). Every env implements it."""
        raise NotImplementedError(f"{type(self).__name__} must implement score(answer, task) -> Score")

    def render_task(self, task: Task) -> str:
        """The first observation for ``task``."""
        return task.question

    def on_close(self) -> None:
        """Release resources (sandboxes, servers). Must be safe to call twice."""

    def fork_detach(self) -> None:
        """Fork hook, on the fork (a shallow copy of the parent): drop every reference to a resource
        the parent owns (a sandbox slot, a server handle, an HTTP client), without any I/O, so that
        closing the fork can never touch the parent's. Runs before :meth:`fork_attach`."""

    def fork_attach(self, parent: TextEnv) -> None:
        """Fork hook, on the fork: acquire resources of its own and bring them to ``parent``'s state
        (e.g. a session copied on the server). The episode state (task, turn, transcript, metrics,
        RNG) is already copied; :meth:`make_tools` runs next, then the stateful tools' replay.
        If it raises, the fork is closed (:meth:`on_close`) and the error propagates."""

    # ----------------------------------------------------------------- fork
    def fork(self) -> TextEnv:
        """An independent env in this env's state mid-episode: the same actions give the same
        observations and rewards in both, and neither sees the other's later changes.

        The fork is a shallow copy with the episode state copied (task, turn, transcript, metrics,
        the RNG), then :meth:`fork_detach` / :meth:`fork_attach` give it resources of its own (a
        sandbox lease from the same pool, a session on the server), :meth:`make_tools` builds its
        tools, and the calls of :attr:`stateful_tools` are replayed into them. Close it like any env.

        Raises:
            NotImplementedError: the env cannot fork (:attr:`fork_unsupported` says why).
            EnvError: before ``reset()``, after the episode ended, or a replayed stateful call gave
                another observation than it did here (the tool is not deterministic).
        """
        if self.fork_method is None:
            raise NotImplementedError(f"{type(self).__name__} cannot fork: {self.fork_unsupported}")
        if self.task is None:
            raise EnvError("fork() needs an episode in progress: call reset() first")
        if self._done:
            raise EnvError("the episode is over: there is no state left to fork")
        child = copy.copy(self)
        child._transcript = list(self._transcript)
        child._metrics = dict(self._metrics)
        child._stateful_calls = list(self._stateful_calls)
        child._tools = {}
        if getattr(self, "_np_random", None) is not None:
            child._np_random = copy.deepcopy(self._np_random)
        child.fork_detach()
        try:
            child.fork_attach(self)
            child._tools = {t.name: t for t in child.make_tools()}
            child._replay_stateful_calls()
        except BaseException:
            try:
                child.on_close()
            finally:
                child._tools = {}
            raise
        return child

    def _replay_stateful_calls(self) -> None:
        for index, (name, arguments, text) in enumerate(self._stateful_calls):
            outcome = self._tools[name].call(arguments)
            if outcome.text != text:
                raise EnvError(
                    f"fork of {type(self).__name__}: replaying stateful call {index} ({name}) gave another "
                    f"observation than the original did, so the tool is not deterministic and the fork "
                    f"would not be in the same state (first difference near: {_first_difference(text, outcome.text)!r})"
                )

    # ----------------------------------------------------------------- public helpers
    @property
    def tools(self) -> list[dict[str, Any]]:
        """JSON schemas of the tools, for the chat template."""
        if not self._tools:
            self._tools = {t.name: t for t in self.make_tools()}
        return [t.schema for t in self._tools.values()]

    def tasks(self, split: str | None = None) -> Sequence[Task]:
        split = split or self.split
        if split not in self.splits:
            raise EnvError(f"unknown split {split!r}; {type(self).__name__} has {self.splits}")
        if split not in self._task_cache:
            self._task_cache[split] = self.load_tasks(split)
        return self._task_cache[split]

    def get_task(self, task_id: str, split: str | None = None) -> Task:
        for candidate_split in [split] if split else [self.split, *self.splits]:
            for task in self.tasks(candidate_split):
                if task.id == task_id:
                    return task
        raise EnvError(f"no task with id {task_id!r} in {type(self).__name__} (split {split or 'any'})")

    # ----------------------------------------------------------------- gymnasium API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        split = options.get("split", self.split)
        if "task" in options:
            task = options["task"]
            task = task if isinstance(task, Task) else Task.from_dict(task)
        elif "task_id" in options:
            task = self.get_task(str(options["task_id"]), options.get("split"))
        else:
            pool = self.tasks(split)
            if not pool:
                raise EnvError(f"{type(self).__name__} split {split!r} has no tasks")
            task = pool[int(self.np_random.integers(len(pool)))]
        self.task = task
        self._tools = {t.name: t for t in self.make_tools()}
        self._turn = 0
        self._done = False
        self._metrics = {"tool_calls": 0.0, "tool_errors": 0.0, "format_errors": 0.0, "void_turns": 0.0}
        self._stateful_calls = []
        obs = self.render_task(task)
        self._transcript = [("task", obs)]
        return obs, {
            "turn": 0,
            "tool_calls": [],
            "task_id": task.id,
            "split": task.split,
            "level": task.level,
        }

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.task is None:
            raise EnvError("call reset() before step()")
        if self._done:
            raise EnvError("the episode is over; call reset() to start a new one")
        self._turn += 1
        parsed = self.parse(action)
        self._transcript.append(("action", action))
        self._metrics["format_errors"] += len(parsed.problems)
        if parsed.is_void:
            self._metrics["void_turns"] += 1
        problems = tuple(p.kind for p in parsed.problems)
        if parsed.is_final:
            return self._finish(parsed.answer, StepOutcome(void=parsed.is_void, problems=problems), obs="")

        outcomes = self._run_calls(parsed)
        step = StepOutcome(calls=tuple(outcomes), void=parsed.is_void, problems=problems)
        obs = self._format_observation(parsed, outcomes)
        self._transcript.append(("observation", obs))
        done = next((o for o in outcomes if o.done), None)
        if done is not None:
            return self._finish(done.answer, step, obs=obs)
        return obs, self.step_reward(parsed, outcomes), False, False, step.info(self._turn)

    def parse(self, action: str) -> ParsedAction:
        """Turn the model's text into tool calls / an answer. Override to accept more formats."""
        return parse_action(
            action,
            {name: t.param_names for name, t in self._tools.items()},
            react=self.react_actions,
            final_answer_prefix=self.final_answer_prefix,
        )

    def step_reward(self, parsed: ParsedAction, outcomes: list[ToolOutcome]) -> float:
        """Reward of a non-final turn (0 by default: the outcome reward comes at the end)."""
        return 0.0

    def final_info(self, answer: str | None, *, truncated: bool = False) -> tuple[float, dict[str, Any]]:
        """Score the episode and build the last step's info fields (flat, and typed under ``outcome``)."""
        assert self.task is not None
        score = self.score(answer, self.task)
        metrics = EpisodeMetrics(
            **self._metrics,
            reward=float(score.reward),
            turns=float(self._turn),
            truncated=float(truncated),
            answered=float(answer is not None),
            score=dict(score.metrics),
        )
        self._done = True
        final = StepOutcome(ended=True, answer=answer, ground_truth=self.task.answer, metrics=metrics)
        return float(score.reward), {**final.final_fields(), OUTCOME: final}

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n".join(f"[{kind}] {text}" for kind, text in self._transcript)

    def close(self) -> None:
        self.on_close()
        self._tools = {}  # tools often close over the env: drop them, so refcounting frees a closed env
        super().close()

    # ----------------------------------------------------------------- internals
    def _finish(
        self, answer: str | None, step: StepOutcome, obs: str
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        reward, final = self.final_info(answer)
        return obs, reward, True, False, end_step(step.info(self._turn), final)

    def _run_calls(self, parsed: ParsedAction) -> list[ToolOutcome]:
        outcomes = []
        for call in parsed.tool_calls[: self.max_calls_per_turn]:
            outcome = (
                self._tools[call.name].call(call.arguments)
                if call.name in self._tools
                else ToolOutcome(
                    call.name,
                    f"Error: unknown tool {call.name!r}. Available: {', '.join(self._tools)}",
                    ok=False,
                    error_kind="unknown_tool",
                )
            )
            self._metrics["tool_calls"] += 1
            if call.name in self.stateful_tools and call.name in self._tools:
                self._stateful_calls.append((call.name, dict(call.arguments), outcome.text))
            if not outcome.ok:
                self._metrics["tool_errors"] += 1
            outcomes.append(outcome)
            if outcome.done:
                break
        return outcomes

    def _format_observation(self, parsed: ParsedAction, outcomes: list[ToolOutcome]) -> str:
        parts = [p.message for p in parsed.problems]
        if len(parsed.tool_calls) > self.max_calls_per_turn:
            parts.append(
                f"Only the first {self.max_calls_per_turn} tool calls of a turn run; the rest were ignored."
            )
        if len(outcomes) == 1 and not parts:
            return outcomes[0].text
        parts += [f"[{o.name}] {o.text}" for o in outcomes]
        return "\n\n".join(parts)


def _first_difference(a: str, b: str) -> str:
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return b[max(at - 20, 0) : at + 40]


def fork_env(env: gym.Env) -> gym.Env:
    """Fork a made env (``make``'s wrappers included: their counters are copied): the
    :meth:`TextEnv.fork` of the env inside, wrapped by copies of the same wrappers."""
    if isinstance(env, gym.Wrapper):
        inner = fork_env(env.env)
        try:
            child = copy.copy(env)
            child.env = inner
        except BaseException:
            inner.close()
            raise
        return child
    if not isinstance(env, TextEnv):
        raise NotImplementedError(f"{type(env).__name__} is not a TextEnv and has no fork()")
    return env.fork()


def fork_support(env: Any) -> tuple[str | None, str]:
    """``(method, reason)`` of an env (made or not; a registered id is read from its class, no env
    is built): ``method`` None when it cannot fork (a remote env, or an env that declares so)."""
    if isinstance(env, str):
        make_kwargs = gym.spec(env).kwargs if env in ENV_DESCRIPTIONS else {}
        if "entry_point" not in make_kwargs:
            return None, f"{env!r} is not a registered agentrl env"
        env = load_entry_point(make_kwargs["entry_point"])
    inner = env.unwrapped if isinstance(env, gym.Env) else env
    if not (isinstance(inner, TextEnv) or (isinstance(inner, type) and issubclass(inner, TextEnv))):
        return None, f"{getattr(inner, '__name__', type(inner).__name__)} is not an in-process TextEnv"
    return inner.fork_method, inner.fork_unsupported if inner.fork_method is None else ""


# --------------------------------------------------------------------------- wrappers
class TurnBudget(gym.Wrapper):
    """Ends the episode with ``truncated=True`` after ``max_turns`` steps, scoring it as unanswered."""

    def __init__(self, env: gym.Env, max_turns: int):
        super().__init__(env)
        if max_turns < 1:
            raise EnvError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self._turns = 0

    def reset(self, **kwargs: Any):
        self._turns = 0
        return self.env.reset(**kwargs)

    def step(self, action: str):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._turns += 1
        if not terminated and not truncated and self._turns >= self.max_turns:
            reward, final = self.env.unwrapped.final_info(None, truncated=True)
            info = end_step(info, final)
            truncated = True
        return obs, reward, terminated, truncated, info


class ObservationBudget(gym.Wrapper):
    """Cuts observations longer than ``max_chars`` (keeping head and tail) and says so."""

    def __init__(self, env: gym.Env, max_chars: int):
        super().__init__(env)
        self.max_chars = max_chars

    def _cut(self, obs: str) -> tuple[str, bool]:
        if len(obs) <= self.max_chars:
            return obs, False
        head = self.max_chars * 3 // 4
        tail = self.max_chars - head
        note = f"\n[... {len(obs) - self.max_chars} characters cut: observation over {self.max_chars} ...]\n"
        return obs[:head] + note + (obs[-tail:] if tail else ""), True

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        return obs, info  # the task itself is never cut

    def step(self, action: str):
        obs, reward, terminated, truncated, info = self.env.step(action)
        obs, cut = self._cut(obs)
        if cut:
            info = {**info, "observation_cut": True}
        return obs, reward, terminated, truncated, info


def play_policy(
    env: gym.Env, policy: Any, *, task: Task | None = None, seed: int | None = None
) -> tuple[float, dict[str, Any]]:
    """Play one episode with a scripted policy (``policy.reset(task)``, ``policy.act(obs) -> text``)
    through the one episode loop (:func:`agentrl.rollout.agent.play_text`).

    Returns:
        The final reward and the last step's info.
    """
    from agentrl.rollout.agent import play_text

    last: dict[str, Any] = {}

    class LastStep:
        def reset(self, obs: str, info: dict[str, Any]) -> None:
            last["info"] = info

        def step(self, action: str, step: tuple[Any, ...]) -> None:
            last["info"] = step[4]

    episode = play_text(env, policy, seed=seed, options={"task": task} if task is not None else None,
                        observer=LastStep())  # fmt: skip
    return float(episode.outcome), last["info"]


def solved(metrics: dict[str, float], outcome: float, metric: str) -> float:
    """1.0 when the episode solved its task: its ``metric`` (the env's :attr:`TextEnv.success_metric`;
    the outcome reward when the episode has no such metric) is >= 1, else 0.0."""
    return 1.0 if float(metrics.get(metric, outcome)) >= 1.0 else 0.0


# --------------------------------------------------------------------------- registry
ENV_DESCRIPTIONS: dict[str, str] = {}
#: the observation cap (characters) of a registration that states none: the one default of it
#: (``env.max_obs_chars`` unset means the registration's cap)
MAX_OBS_CHARS = 8192


def build_env(*, entry_point: str, max_turns: int, max_obs_chars: int, **kwargs: Any) -> gym.Env:
    """Construct an env and apply the one wrapper stack (budgets); gymnasium adds order checks. The
    budgets come from the registration (:func:`register`) or the caller: there is no default here."""
    env = load_entry_point(entry_point)(**kwargs)
    env = ObservationBudget(env, max_obs_chars)
    return TurnBudget(env, max_turns)


def register(
    id: str,
    entry_point: str,
    *,
    description: str,
    max_turns: int,
    max_obs_chars: int = MAX_OBS_CHARS,
    kwargs: dict[str, Any] | None = None,
) -> None:
    """Register an env id (``agentrl/Name-v0``) with a lazy ``"module:Class"`` entry point.

    ``max_turns`` is the env's own turn budget, stated by every registration (WebShop 15, GAIA 30):
    a run's ``env.max_turns`` unset means it, as do ``agentrl eval`` and ``agentrl.make``.

    ``gymnasium.make(id)`` and :func:`make` both apply the budgets; ``kwargs`` become the
    constructor's defaults and may be overridden at ``make`` time (as may ``max_turns`` and
    ``max_obs_chars``).
    """
    gym.register(
        id=id,
        entry_point=build_env,
        kwargs={
            "entry_point": entry_point,
            "max_turns": max_turns,
            "max_obs_chars": max_obs_chars,
            **(kwargs or {}),
        },
        disable_env_checker=True,
    )
    ENV_DESCRIPTIONS[id] = description


def make(id: str, **kwargs: Any) -> gym.Env:
    """``gymnasium.make`` for agentrl ids (imports the env families first)."""
    import agentrl.envs  # noqa: F401  (registers the ids)

    if id not in ENV_DESCRIPTIONS:
        known = ", ".join(sorted(ENV_DESCRIPTIONS))
        raise EnvError(f"unknown env id {id!r}; registered: {known}")
    return gym.make(id, **kwargs)


def registered_turn_budget(id: str, kwargs: dict[str, Any] | None = None) -> int | None:
    """The turn budget ``make(id, **kwargs)`` gives (``max_turns`` in kwargs, else the registration's)."""
    if kwargs and "max_turns" in kwargs:
        return int(kwargs["max_turns"])
    return int(gym.spec(id).kwargs["max_turns"]) if id in ENV_DESCRIPTIONS else None


def registered_obs_cap(id: str, kwargs: dict[str, Any] | None = None) -> int | None:
    """The observation cap ``make(id, **kwargs)`` gives (``max_obs_chars`` in kwargs, else the registration's)."""
    if kwargs and "max_obs_chars" in kwargs:
        return int(kwargs["max_obs_chars"])
    return int(gym.spec(id).kwargs["max_obs_chars"]) if id in ENV_DESCRIPTIONS else None


def success_metric(id: str) -> str:
    """The :attr:`TextEnv.success_metric` a registered id declares (read from its class; no env is built)."""
    make_kwargs = gym.spec(id).kwargs if id in ENV_DESCRIPTIONS else {}
    if "entry_point" not in make_kwargs:
        return TextEnv.success_metric
    return str(
        getattr(load_entry_point(make_kwargs["entry_point"]), "success_metric", TextEnv.success_metric)
    )


def registered_ids() -> list[str]:
    import agentrl.envs  # noqa: F401

    return sorted(ENV_DESCRIPTIONS)
