"""The agent: the one episode loop (:class:`EpisodeRun`) every caller runs, token ids in and out.

Training rollouts, oracle demonstrations, ``agentrl play --folding``, evaluation's model agents
(through the runner) and its scripted and chat agents (:class:`TextPolicy`) all play here. The loop
resets the env, asks the sampling policy for a turn, steps the env, and ends on the env's
terminated/truncated or on one of its own two budgets (turn cap, context tokens; :meth:`_truncate`
is the one place the agent truncates). How turns become contexts and training rows - one
concatenated row, a row per turn, branch/return folding, summaries, or text only - is the context
strategy (:mod:`agentrl.rollout.context`) chosen once; the loop has no mode checks. The turn cap
comes from the env's own turn budget (its TurnBudget wrapper) and the strategy's
``turns_per_env_turn`` unless ``rollout.max_turns`` is set. An env with a ``start()`` (a remote env:
a Ray actor, the env built on it) is started first, in the ``starting`` phase the runner's watchdog
does not count. Env steps come back typed (``info["outcome"]``: :mod:`agentrl.outcome`); the
context strategy refers back to its run weakly, so a finished run is freed by refcounting.
Settings are the one :class:`~agentrl.rollout.settings.RolloutConfig`. Sampled ids are appended
exactly as sampled; nothing is re-tokenized.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentrl.outcome import OUTCOME, StepOutcome
from agentrl.rollout import process_rewards
from agentrl.rollout.context import Context, choose_context
from agentrl.rollout.generators.base import GenerationOutput, SamplingParams, derive_seed
from agentrl.rollout.generators.hidden import SamplerHidden
from agentrl.rollout.settings import RolloutConfig
from agentrl.trajectory import Episode, Segment, Turn

MAX_ACTION_ECHO = 200
DEFAULT_MAX_TURNS = 32  # turn cap of an env that declares no turn budget


class SamplingPolicy(Protocol):
    """Produces one assistant turn (token ids + log-probs) for a prompt."""

    async def start(self, task: Any) -> None: ...

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, observation: str
    ) -> GenerationOutput: ...


class TextPolicy:
    """A text agent (``reset(task)``, ``act(observation) -> str``: scripted oracles, random and chat
    agents of evaluation) as a sampling policy; its reply comes back as text (no token ids), with
    what it measured (``agent.last_turn``: latency, token usage) as timings."""

    def __init__(self, agent: Any):
        self.agent = agent

    async def start(self, task: Any) -> None:
        self.agent.reset(task)

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, observation: str
    ) -> GenerationOutput:
        text = self.agent.act(observation)
        measured = dict(getattr(self.agent, "last_turn", None) or {})
        return GenerationOutput(ids=[], logprobs=[], text=text, timings=measured, finish_reason=None)


class ModelPolicy:
    """A policy backed by a generator (usually through a :class:`~agentrl.rollout.batcher.Batcher`)."""

    def __init__(self, submit: Callable[[list[int], SamplingParams], Awaitable[GenerationOutput]]):
        self.submit = submit

    async def start(self, task: Any) -> None:
        return None

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, observation: str
    ) -> GenerationOutput:
        return await self.submit(prompt_ids, sampling)


@dataclass
class Progress:
    """What the watchdog and the progress display read while the episode runs."""

    env_id: str
    episode_id: str
    turn: int = 0
    last_action: str = ""
    #: starting (an env's own start: a Ray actor, the env built on it; not watched) | reset |
    #: generate | env | between | judge | done
    phase: str = "reset"
    last_progress: float = field(default_factory=time.monotonic)
    sandbox_id: str | None = None
    generate_s: float = 0.0
    env_s: float = 0.0
    generated_tokens: int = 0

    def touch(self, phase: str) -> None:
        self.phase = phase
        self.last_progress = time.monotonic()

    def waiting_s(self, now: float) -> float:
        """Seconds spent waiting for the policy so far, the call in flight included."""
        return self.generate_s + (now - self.last_progress if self.phase == "generate" else 0.0)

    def describe(self) -> str:
        action = self.last_action.replace("\n", " ")[:MAX_ACTION_ECHO]
        return (
            f"episode {self.episode_id} of {self.env_id}: turn {self.turn}, phase {self.phase}, "
            f"sandbox {self.sandbox_id or '-'}, last action {action!r}"
        )


class EndEpisode(Exception):  # noqa: N818 - a signal, not an error
    """Raised by a text agent that has no next action (a replayed script ran out, end of input):
    the episode stops where it is, unfinished."""


class OutOfBudget(Exception):  # noqa: N818 - a signal, not an error
    """Raised by a text agent whose next request cannot fit its budget (a chat agent's context
    window): the episode ends truncated, with ``reason`` as its recorded truncation, like a token
    agent's context budget."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def play_text(env: Any, agent: Any, *, env_id: str = "", seed: int | None = None,
              options: dict[str, Any] | None = None, observer: Any = None, **run: Any) -> Episode:  # fmt: skip
    """One episode of a text agent (``reset(task)``, ``act(observation) -> str``) on ``env``, through
    the loop, synchronously (env calls inline; a remote env's are awaited). ``run``: more
    :class:`EpisodeRun` arguments (episode_id, group_id ...). :class:`EndEpisode` propagates."""
    from agentrl.rollout.context import Text

    episode_run = EpisodeRun(env, TextPolicy(agent), None, RolloutConfig(), env_id=env_id, call_env=_call_awaiting,
                             seed=seed, options=options, context=Text, observer=observer, **run)  # fmt: skip
    return asyncio.run(episode_run.run())


async def _call_awaiting(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    result = fn(*args, **kwargs)
    return await result if inspect.isawaitable(result) else result


def turn_budget(env: Any) -> int | None:
    """The env's own turn budget: the ``max_turns`` of its :class:`~agentrl.env.TurnBudget` wrapper
    (or of a remote env that declares one); None when it has none."""
    inner = getattr(env, "unwrapped", None)
    while env is not None:
        if isinstance(getattr(env, "max_turns", None), int):
            return int(env.max_turns)
        env = getattr(env, "env", None)
    budget = getattr(inner, "max_turns", None)  # a remote env declares it itself
    return int(budget) if isinstance(budget, int) else None


def _sandbox_id(env: Any) -> str | None:
    inner = getattr(env, "unwrapped", env)
    for attr in ("sandbox_id",):
        if getattr(inner, attr, None):
            return str(getattr(inner, attr))
    sandbox = getattr(inner, "sandbox", None)
    for attr in ("id", "name", "container_id"):
        if sandbox is not None and getattr(sandbox, attr, None):
            return str(getattr(sandbox, attr))
    return None


class EpisodeRun:
    """Runs one episode. The runner reads :attr:`progress` (watchdog) and, if ``run`` raises,
    :meth:`episode` still returns what was recorded so far (with the error)."""

    def __init__(
        self,
        env: Any,
        policy: SamplingPolicy,
        tokenizer: Any,
        config: RolloutConfig,
        *,
        env_id: str,
        call_env: Callable[..., Awaitable[Any]] | None = None,
        episode_id: str | None = None,
        group_id: str = "",
        seed: int | None = None,
        options: dict[str, Any] | None = None,
        policy_version: int = 0,
        judge: process_rewards.ScopeJudge | None = None,
        sampling_seed: int | None = None,
        context: type[Context] | None = None,
        observer: Any = None,
        own_temperature: tuple[int, float] | None = None,
    ):
        """``seed`` is the env's reset seed; ``sampling_seed`` (when given) seeds this episode's own
        sampling stream: generate call ``n`` samples with seed ``derive_seed(sampling_seed, n)``.
        ``context``: the strategy class the runner chose once (default: :func:`choose_context`).
        ``observer``: sees the raw env results as they come (``reset(obs, info)``, ``step(action,
        (obs, reward, terminated, truncated, info))``): ``agentrl play``'s transcript.
        ``own_temperature``: ``(n, t)``: generate calls from the ``n``-th on sample at temperature ``t``
        (a tree branch's own turns after ``n`` replayed ones, rollout.branch_temperature)."""
        context = context or choose_context(config, tokenizer)
        if judge is None and context.needs_judge:
            judge = process_rewards.build_judge(config)  # rule / openai / none ("policy" needs the runner's)
        self.judge = judge
        self.env = env
        self.policy = policy
        self.tokenizer = tokenizer
        self.config = config
        self.env_id = env_id
        self.call_env = call_env or _call_inline
        self.episode_id = episode_id or uuid.uuid4().hex[:12]
        self.group_id = group_id
        self.seed = seed
        self.sampling_seed = sampling_seed
        self._generate_calls = 0
        self.own_temperature = own_temperature
        self._started = False
        self.options = options
        self.policy_version = policy_version
        self.progress = Progress(env_id=env_id, episode_id=self.episode_id)
        self.segments: list[Segment] = []
        self.task_id = ""
        self.stop_ids = {tokenizer.eos_token_id} if tokenizer is not None else set()
        self.result: dict[str, Any] = {}
        self.index = 0  # the next turn's number (generation order, folding turns included)
        self.sampler_hidden: SamplerHidden | None = None  # the last generate call's kept states, if any
        self.max_turns = config.max_turns or DEFAULT_MAX_TURNS  # set from the env's budget at reset
        self.observation = ""  # what the policy is answering (task, tool result, branch instruction)
        self._t0 = time.perf_counter()
        self.context = context(self)
        self.observer = observer

    # ------------------------------------------------------------------ helpers
    def _own_temperature(self, call: int) -> float | None:
        """The temperature generate call ``call`` samples at where it is not rollout.temperature (a
        tree branch's own turn under rollout.branch_temperature), else None."""
        own = self.own_temperature
        if own is None or call < own[0] or own[1] == self.config.temperature:
            return None
        return own[1]

    async def _generate(self, prompt: list[int], observation: str) -> GenerationOutput:
        self.progress.touch("generate")
        t0 = time.perf_counter()
        budget = self.config.max_context_tokens - len(prompt)
        request: dict[str, Any] = {"max_new_tokens": max(1, min(self.config.max_new_tokens, budget))}
        if self.sampling_seed is not None:
            request["seed"] = derive_seed(self.sampling_seed, self._generate_calls)
        own = self._own_temperature(self._generate_calls)
        if own is not None:
            request["temperature"] = own
        sampling = self.config.sampling(**request)
        self._generate_calls += 1
        try:
            out = await self.policy.generate(prompt, sampling, observation)
        finally:  # the wait is over: counted once in generate_s, no longer "in flight" (waiting_s)
            self.progress.generate_s += time.perf_counter() - t0
            self.progress.touch("between")
        if not out.timings.get("replayed"):  # a tree branch's replayed turn was generated by its root
            self.progress.generated_tokens += len(out.ids)
        out.timings = {**out.timings, "wall_s": time.perf_counter() - t0}
        return out

    async def generate_turn(self, prompt: list[int], observation: str, kind: str = "action") -> Turn:
        """Generate the next turn (numbered in generation order) from ``prompt``."""
        out = await self._generate(prompt, observation)
        if out.hidden is not None and out.ids:  # the learner may start from them (generators/hidden.py)
            self.sampler_hidden = SamplerHidden(tuple(prompt) + tuple(out.ids[:-1]), out.hidden)
        if out.text is not None:  # a text agent (scripted, chat): no ids to decode
            action = out.text
        else:
            text_ids = out.ids[:-1] if out.ids and out.ids[-1] in self.stop_ids else out.ids
            action = self.tokenizer.decode(text_ids, skip_special_tokens=False)
        index, self.index = self.index, self.index + 1
        self.progress.turn = index
        self.progress.last_action = action
        return Turn(
            index=index,
            output_ids=list(out.ids),
            output_logprobs=list(out.logprobs),
            output_entropy=list(out.entropy) if out.entropy is not None else None,
            kind=kind,
            action_text=action,
            finish_reason=out.finish_reason,
            timings=self.context.turn_timings(out),
            temperature=self._own_temperature(self._generate_calls - 1),  # the call that made this turn
        )

    async def _env(self, fn: Callable[..., Any], *args: Any, phase: str = "env", **kwargs: Any) -> Any:
        self.progress.touch(phase)
        t0 = time.perf_counter()
        try:
            return await self.call_env(fn, *args, **kwargs)
        finally:
            self.progress.env_s += time.perf_counter() - t0
            self.progress.touch("between")

    def ended(self, turn: Turn) -> bool:
        """The turn ended with a stop id (the template's bridge then does not add one)."""
        return bool(turn.output_ids) and turn.output_ids[-1] in self.stop_ids

    def out_of_turns(self) -> bool:
        return self.index >= self.max_turns

    def _fill_step(self, turn: Turn, step: tuple[Any, ...], env_s: float) -> None:
        obs, reward, _terminated, _truncated, info = step
        outcome: StepOutcome = info[OUTCOME]
        turn.observation = obs
        turn.reward = float(reward)
        turn.tool_calls = outcome.tool_call_records()
        turn.void = outcome.void
        turn.timings["env_s"] = env_s
        turn.sandbox_usage = outcome.usage()
        turn.error = outcome.error()

    # ------------------------------------------------------------------ the episode
    TURN_BUDGET = "turn budget (rollout.max_turns)"
    CONTEXT_BUDGET = "context budget (rollout.max_context_tokens)"

    async def start(self) -> None:
        """Start the env if it has a ``start()`` (a remote env: a Ray actor, the env built on it): the
        ``starting`` phase, bounded by the env's own start limit, not by the watchdog or the
        episode timeout (the runner awaits it before the timed part). Idempotent."""
        start = getattr(self.env, "start", None)
        if start is not None and not self._started:
            await self._env(start, phase="starting")
        self._started = True

    async def run(self) -> Episode:
        """Play the episode through the context strategy; then let it finish (FoldGRPO's Q)."""
        await self.start()
        episode = await self._play()
        await self.context.finish(episode)
        return episode

    async def _play(self) -> Episode:
        obs, info = await self._env(self.env.reset, seed=self.seed, options=self.options)
        if self.observer is not None:
            self.observer.reset(obs, info)
        inner = self.env.unwrapped
        self.progress.sandbox_id = _sandbox_id(self.env)
        task = inner.task
        self.task_id = str(info.get("task_id", getattr(task, "id", "")))
        env_turns = turn_budget(self.env)
        if self.config.max_turns is not None:
            self.max_turns = self.config.max_turns
        elif env_turns is not None:
            self.max_turns = self.context.turn_cap(env_turns)
        else:
            self.max_turns = DEFAULT_MAX_TURNS
        self.context.start(list(inner.tools), inner.system_prompt, obs)
        await self.policy.start(task)
        self.observation = obs
        while True:
            if self.out_of_turns():
                return await self._truncate(self.TURN_BUDGET)
            prompt = self.context.prompt()
            if len(prompt) + 1 > self.config.max_context_tokens:
                return await self._truncate(self.CONTEXT_BUDGET)
            try:
                turn = await self.generate_turn(prompt, self.observation)
            except OutOfBudget as exc:
                return await self._truncate(exc.reason)
            self.context.record(turn, prompt)
            folded = self.context.fold(turn)
            if folded is not None:  # a branch/return call: no env step
                self.observation = folded
                continue
            t0 = time.perf_counter()
            step = await self._env(self.env.step, turn.action_text)
            self._fill_step(turn, step, time.perf_counter() - t0)
            if self.observer is not None:
                self.observer.step(turn.action_text, step)
            obs, reward, terminated, truncated, info = step
            self.observation = obs
            if terminated or truncated:
                self.context.add_final(turn)
                return self._finish(reward, terminated, truncated, info)
            reason = await self.context.after_step(turn, obs)
            if reason is not None:
                return await self._truncate(reason)

    async def _truncate(self, reason: str) -> Episode:
        reward, final = await self._env(self.env.unwrapped.final_info, None, truncated=True)
        final = {**final, "truncation": reason}
        return self._finish(reward, False, True, final)

    def _finish(self, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> Episode:
        self.progress.touch("done")
        outcome: StepOutcome = info[OUTCOME]
        metrics = outcome.metrics.flat() if outcome.metrics is not None else {}
        self.result = {
            "outcome": float(reward),
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "answer": outcome.answer,
            "ground_truth": outcome.ground_truth,
            "metrics": {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)},
        }
        if "truncation" in info:
            self.result["metrics"]["agent_truncated"] = 1.0
        return self.episode()

    def episode(self, error: str | None = None) -> Episode:
        """The episode recorded so far (complete after ``run`` returns)."""
        wall = time.perf_counter() - self._t0
        episode = Episode(
            episode_id=self.episode_id,
            env_id=self.env_id,
            task_id=self.task_id,
            segments=self.segments,
            group_id=self.group_id,
            seed=self.seed,
            outcome=self.result.get("outcome", 0.0),
            terminated=self.result.get("terminated", False),
            truncated=self.result.get("truncated", False),
            answer=self.result.get("answer"),
            ground_truth=self.result.get("ground_truth"),
            metrics=self.result.get("metrics", {}),
            policy_version=self.policy_version,
            error=error,
            timings={
                "wall_s": wall,
                "generate_s": self.progress.generate_s,
                "env_s": self.progress.env_s,
                "generated_tokens": float(self.progress.generated_tokens),
            },
        )
        if self.sampler_hidden is not None and error is None:
            episode.sampler_hidden = self.sampler_hidden  # not a field: never saved
        return episode


async def _call_inline(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


async def call_in_executor(executor: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a blocking env call in a thread pool so generation and other episodes go on."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor, lambda: fn(*args, **kwargs))
