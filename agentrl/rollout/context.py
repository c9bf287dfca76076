"""Context strategies: how an episode's turns become working contexts and training rows.

The episode loop (:class:`agentrl.rollout.agent.EpisodeRun`) is the same for every caller; what
differs is chosen once, before any episode, as one of these classes (:func:`choose_context`):

- :class:`Concat`: one row; each turn appends the sampled ids and the bridge ids (template
  scaffolding + observation) to the prompt, nothing re-tokenized.
- :class:`PerTurn`: the template cannot render incrementally, so each turn is prompted with a full
  re-render of the conversation and recorded as its own row (Segment kind ``"turn"``).
- :class:`Branch`: Concat plus FoldGRPO branch/return (extra tools, a row per branch, process rewards).
- :class:`Summary`: Concat plus SUPO/FoldAct summarization (a row per context restart).
- :class:`Text`: no tokenizer at all (scripted and chat agents in evaluation): turns keep their
  action text and observation only.

The loop calls the hooks in this order: ``start`` once; per turn ``prompt``, ``record`` (after
generation), ``fold`` (a turn that does not step the env), then ``add_final`` or ``after_step``;
``finish`` once the episode has ended. Each instance holds one episode's threads.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from agentrl.rollout import folding, process_rewards
from agentrl.rollout.template import ChatFormat, conformance
from agentrl.trajectory import Episode, Segment, Source, Turn


@dataclass
class Thread:
    """One working context under construction (becomes one Segment)."""

    segment: Segment
    ids: list[int]

    def add(self, turn: Turn) -> None:
        self.segment.turns.append(turn)
        self.ids += turn.output_ids + turn.obs_ids


class Context:
    """Base strategy: one row, prompted with its growing ids (see :class:`Concat`)."""

    #: extra tool schemas the model is shown (branch/return)
    extra_tools: list[dict[str, Any]] = []
    #: whether the runner builds a branch-scope judge for it (FoldGRPO)
    needs_judge = False
    #: generated turns allowed per env turn (env budget ``T`` -> at most ``T * turns_per_env_turn + 1``)
    turns_per_env_turn = 1

    def __init__(self, run: Any):
        """``run``: the :class:`~agentrl.rollout.agent.EpisodeRun` this episode belongs to (its
        ``config``, ``tokenizer``, ``segments``, ``generate_turn``, ...; agent.py imports this module).
        The run owns its context; the context refers back weakly, so a finished run (and its env)
        is freed by reference counting, without waiting for the cycle collector."""
        self.run = weakref.proxy(run)
        self.config = run.config
        self.fmt: ChatFormat | None = None
        self.main: Thread | None = None
        self.current: Thread | None = None

    @classmethod
    def turn_cap(cls, env_turns: int) -> int:
        """All generated turns an episode may take when its env allows ``env_turns`` steps (the env's
        own budget ends it first whenever every turn steps the env)."""
        return env_turns * cls.turns_per_env_turn + 1

    def start(self, tools: list[dict[str, Any]], system: str, task_text: str) -> None:
        self.fmt = ChatFormat(
            self.run.tokenizer, tools + self.extra_tools, tool_schemas=self.config.tool_schemas
        )
        self.system, self.task_text = system, task_text
        self.main = self.current = self._thread(self.fmt.prompt_ids(system, task_text), "main", 0)

    def _thread(self, prompt_ids: list[int], kind: str, fold_id: int) -> Thread:
        thread = Thread(Segment(prompt_ids=list(prompt_ids), kind=kind, fold_id=fold_id), list(prompt_ids))
        self.run.segments.append(thread.segment)
        return thread

    def prompt(self) -> list[int]:
        assert self.current is not None
        return self.current.ids

    def record(self, turn: Turn, prompt: list[int]) -> None:
        """A turn was generated from ``prompt`` (PerTurn opens its row here)."""

    def fold(self, turn: Turn) -> str | None:
        """Handle a turn that does not step the env; return the next observation, or None to step."""
        return None

    def add_final(self, turn: Turn) -> None:
        assert self.current is not None
        self.current.add(turn)

    async def after_step(self, turn: Turn, obs: str) -> str | None:
        """Add a non-final stepped turn with its observation; return a truncation reason to stop."""
        self.set_obs(turn, [self.fmt.obs_message(obs)], [int(Source.TOOL)])
        self.current.add(turn)
        return None

    async def finish(self, episode: Episode) -> None:
        """After the episode ended (Branch scores its process rewards here)."""

    def turn_timings(self, out: Any) -> dict[str, float]:
        """A generated turn's timings (the policy call's wall time)."""
        return {"generate_s": out.timings.get("wall_s", 0.0)}

    def set_obs(self, turn: Turn, messages: list[dict[str, Any]], sources: list[int]) -> None:
        assert self.fmt is not None
        bridge = self.fmt.bridge(messages, ended_with_eos=self.run.ended(turn), sources=sources)
        turn.obs_ids, turn.obs_source = bridge.ids, bridge.source


class Concat(Context):
    """One row per episode: sampled ids and bridge ids appended to the prompt (the default)."""


class PerTurn(Context):
    """A full re-render of the conversation per turn, each turn its own row (kind ``"turn"``)."""

    def start(self, tools: list[dict[str, Any]], system: str, task_text: str) -> None:
        self.fmt = ChatFormat(self.run.tokenizer, tools, tool_schemas=self.config.tool_schemas)
        self.messages = self.fmt.prompt_messages(system, task_text)

    def prompt(self) -> list[int]:
        assert self.fmt is not None
        return self.fmt.encode(self.fmt.render(self.messages, add_generation_prompt=True))

    def record(self, turn: Turn, prompt: list[int]) -> None:
        self.main = self.current = self._thread(prompt, "turn", 0)

    async def after_step(self, turn: Turn, obs: str) -> str | None:
        assert self.fmt is not None and self.current is not None
        self.messages = [
            *self.messages,
            {"role": "assistant", "content": turn.action_text},
            self.fmt.obs_message(obs),
        ]
        self.current.add(turn)
        return None


class Branch(Context):
    """FoldGRPO branch/return: a branch's context is the main history up to the call plus an
    instruction; only its returned message comes back to the main thread. Branch and return turns
    do not step the env, so each env turn may come with two of them (``turns_per_env_turn = 3``)."""

    extra_tools = folding.BRANCH_TOOLS
    turns_per_env_turn = 3
    needs_judge = True

    def __init__(self, run: Any):
        super().__init__(run)
        self.branches = 0
        self.branch_turns = 0
        self.pending: Turn | None = None  # the main-thread turn waiting for its branch's result

    def start(self, tools: list[dict[str, Any]], system: str, task_text: str) -> None:
        if not self.config.tool_schemas:  # the env's prompt documents its tools in text: add branch/return there
            system = f"{system}\n{folding.branch_tools_text()}" if system else folding.branch_tools_text()
        super().start(tools, system, task_text)

    def fold(self, turn: Turn) -> str | None:
        assert self.fmt is not None and self.main is not None and self.current is not None
        call = folding.find_fold_call(turn.action_text)
        if call is None:
            return None
        in_branch = self.current is not self.main
        if call.name == "branch" and not in_branch and self.branches < self.config.max_branches:
            turn.kind = "branch"
            self.main.add(turn)
            self.pending = turn
            self.branches += 1
            self.branch_turns = 0
            instruction = folding.branch_instruction(call)
            bridge = self.fmt.bridge(
                [self.fmt.obs_message(instruction)],
                ended_with_eos=self.run.ended(turn),
                sources=[int(Source.SYSTEM)],
            )
            self.current = self._thread(self.main.ids + bridge.ids, "branch", self.branches)
            return instruction
        if call.name == "return" and in_branch:
            turn.kind = "return"
            self.current.add(turn)
            return self._close(call)
        if call.name == "branch" and in_branch:
            message = folding.NESTED_BRANCH
        elif call.name == "return":
            message = folding.RETURN_IN_MAIN
        else:
            message = folding.BRANCH_LIMIT
        turn.observation = message
        turn.error = f"{call.name} call refused: {message}"
        self.set_obs(turn, [self.fmt.obs_message(message)], [int(Source.TOOL)])
        self.current.add(turn)
        return message

    async def after_step(self, turn: Turn, obs: str) -> str | None:
        in_branch = self.current is not self.main
        if in_branch:
            self.branch_turns += 1
        await super().after_step(turn, obs)
        if in_branch and self.branch_turns >= self.config.branch_max_turns:
            self.run.observation = self._close(None)
        return None

    def _close(self, call: folding.FoldCall | None) -> str:
        """Close the branch: its message becomes the pending branch call's observation."""
        assert self.pending is not None and self.main is not None
        pending, self.pending = self.pending, None
        pending.observation = folding.return_observation(call)
        self.set_obs(pending, [self.fmt.obs_message(pending.observation)], [int(Source.TOOL)])
        self.main.ids += pending.obs_ids  # the pending turn's output ids are already in main.ids
        self.current = self.main
        return self.main.segment.turns[-1].observation

    async def finish(self, episode: Episode) -> None:
        self.run.progress.touch("judge")
        await process_rewards.assign_process_rewards(episode, self.config, self.run.judge)
        self.run.progress.touch("done")


class Summary(Context):
    """SUPO/FoldAct: past ``summary_threshold`` tokens the policy summarizes and the context restarts
    as the task plus that summary. A summary follows an env turn, so at most one per env turn."""

    turns_per_env_turn = 2

    def __init__(self, run: Any):
        super().__init__(run)
        self.summaries = 0

    async def after_step(self, turn: Turn, obs: str) -> str | None:
        assert self.fmt is not None and self.current is not None
        self.set_obs(turn, [self.fmt.obs_message(obs)], [int(Source.TOOL)])
        over = (
            len(self.current.ids) + len(turn.output_ids) + len(turn.obs_ids) > self.config.summary_threshold
        )
        if not over or self.summaries >= self.config.max_summaries:
            self.current.add(turn)
            return None
        self.set_obs(
            turn,
            [self.fmt.obs_message(obs), {"role": "user", "content": folding.SUMMARY_INSTRUCTION}],
            [int(Source.TOOL), int(Source.SYSTEM)],
        )
        self.current.add(turn)
        if self.run.out_of_turns():
            return self.run.TURN_BUDGET
        summary = await self.run.generate_turn(self.current.ids, folding.SUMMARY_INSTRUCTION, kind="summary")
        self.current.add(summary)
        self.summaries += 1
        restart = self.fmt.prompt_ids(self.system, folding.summary_task(self.task_text, summary.action_text))
        self.main = self.current = self._thread(restart, "summary", self.summaries)
        return None


class Text(Context):
    """Text agents (scripted, chat): one segment of turns with their action text and observations;
    no tokenizer, no token ids (the policy replies with text)."""

    def start(self, tools: list[dict[str, Any]], system: str, task_text: str) -> None:
        self.main = self.current = self._thread([], "main", 0)

    async def after_step(self, turn: Turn, obs: str) -> str | None:
        assert self.current is not None
        self.current.add(turn)
        return None

    def turn_timings(self, out: Any) -> dict[str, float]:
        """What the agent measured (chat: latency, token usage) and its act time."""
        return {
            "act_s": out.timings.get("wall_s", 0.0),
            **{k: v for k, v in out.timings.items() if k != "wall_s"},
        }


def choose_context(config: Any, tokenizer: Any) -> type[Context]:
    """The context strategy for ``config`` and this tokenizer's template (checked once, before any episode)."""
    per_turn = config.template_mode == "per_turn" or (
        config.template_mode == "auto" and not conformance(tokenizer).ok
    )
    if config.folding != "none" and per_turn:
        from agentrl.errors import ConfigError

        raise ConfigError(
            "rollout.folding",
            f"folding needs a chat template that renders incrementally; {conformance(tokenizer).summary()}",
            "use folding=none with this model, or a model whose template passes the check",
        )
    if config.folding == "branch":
        return Branch
    if config.folding == "summary":
        return Summary
    return PerTurn if per_turn else Concat
