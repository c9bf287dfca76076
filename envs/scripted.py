"""What the scripted oracles share: one-line tool calls, a fair coin fixed per task, and the
turn-by-turn script (the task, a turn counter, ``reset`` / ``act``) of oracles whose every turn is
known in advance (code, SQL)."""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from typing import Any

from agentrl.env import Task


def tool_call(name: str, **arguments: Any) -> str:
    """A Hermes tool call as a model would write it, on one line."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def stable_coin(task_id: str) -> bool:
    """A fair coin fixed per task id (the same on every machine and run): which answer form to use."""
    return bool(int(hashlib.sha256(task_id.encode()).hexdigest()[:4], 16) % 2)


class TurnScript(ABC):
    """``reset(task)`` then ``act(observation) -> action text`` until the episode ends; a subclass
    writes turn ``n`` (1-based) in :meth:`turn_action`."""

    def __init__(self) -> None:
        self.task: Task | None = None
        self.turn = 0

    def reset(self, task: Task) -> None:
        self.task = task
        self.turn = 0

    def act(self, observation: str, info: dict[str, Any] | None = None) -> str:
        if self.task is None:
            raise RuntimeError("call reset(task) first")
        self.turn += 1
        return self.turn_action(self.task, self.turn, observation)

    @abstractmethod
    def turn_action(self, task: Task, turn: int, observation: str) -> str:
        """The action text of turn ``turn`` (1-based), given the last observation."""
