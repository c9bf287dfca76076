"""Run scripted oracle policies through the same agent and runner as a model.

An oracle (protocol in the env families: ``reset(task)``, ``act(observation, info=None) -> str``)
writes action text; :class:`OraclePolicy` turns it into token ids of the model's tokenizer (plus
EOS) with log-prob 0, so oracle episodes are ordinary :class:`~agentrl.trajectory.Episode` rows for
the supervised warm-up (their output tokens are the demonstration targets).
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Protocol

from agentrl.rollout.generators.base import GenerationOutput, SamplingParams


class Oracle(Protocol):
    def reset(self, task: Any) -> None: ...

    def act(self, observation: str, info: dict | None = None) -> str: ...


class OraclePolicy:
    """Adapter: oracle text -> generated ids (``encode(text) + [eos]``, log-prob 0, entropy 0)."""

    def __init__(self, oracle: Oracle, tokenizer: Any):
        self.oracle = oracle
        self.tokenizer = tokenizer
        self._takes_info = len(inspect.signature(oracle.act).parameters) >= 2

    async def start(self, task: Any) -> None:
        await asyncio.to_thread(self.oracle.reset, task)

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, observation: str
    ) -> GenerationOutput:
        text = await asyncio.to_thread(self.oracle.act, observation)
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        finish = "stop"
        if len(ids) >= sampling.max_new_tokens:  # the model could not have produced more either
            ids, finish = ids[: sampling.max_new_tokens], "length"
        else:
            ids.append(self.tokenizer.eos_token_id)
        return GenerationOutput(
            ids=ids, logprobs=[0.0] * len(ids), entropy=[0.0] * len(ids), finish_reason=finish
        )


class ReplayOracle:
    """Replays fixed action texts in order, one per turn (``agentrl play --script --folding ...``)."""

    def __init__(self, actions: list[str]):
        self.actions = list(actions)
        self.next = 0

    def reset(self, task: Any) -> None:
        self.next = 0

    def act(self, observation: str, info: dict | None = None) -> str:
        self.next += 1
        return self.actions[self.next - 1]


def replay_through_agent(
    env_id: str, actions: list[str], task: Any, rollout: Any, tokenizer: Any, *, seed: int | None = None
) -> Any:
    """One episode of ``actions`` through the agent (folding, process rewards) as the rollout config says.

    The turn budget is the number of actions, so a script that ends early ends the episode
    (truncated); the per-turn token budget is raised so scripted text is never cut.
    """
    import dataclasses

    from agentrl.rollout.runner import RunnerConfig, run_oracle_episodes

    config = RunnerConfig.from_rollout(rollout, progress=False, concurrency=1, group_size=1)
    agent = dataclasses.replace(
        config.agent,
        max_turns=len(actions),
        max_new_tokens=max(config.agent.max_new_tokens, min(1024, config.agent.max_context_tokens // 2)),
    )
    config = dataclasses.replace(config, agent=agent)
    (episode,) = run_oracle_episodes(
        env_id, [task], lambda: ReplayOracle(actions), tokenizer, config, seeds=[seed]
    )
    return episode


def turn_records(episode: Any) -> list[dict[str, Any]]:
    """Per turn, in order: thread, kind, action, observation, error, reward parts, per-token process reward."""
    rows = []
    for seg in episode.segments:
        thread = "main" if seg.fold_id == 0 else f"{seg.kind} {seg.fold_id}"
        for turn in seg.turns:
            rows.append(
                {
                    "turn": turn.index,
                    "thread": thread,
                    "kind": turn.kind,
                    "action": turn.action_text,
                    "observation": turn.observation,
                    "error": turn.error,
                    "reward_parts": turn.reward_parts,
                    "process_reward": turn.process_reward,
                }
            )
    return sorted(rows, key=lambda r: r["turn"])
