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
