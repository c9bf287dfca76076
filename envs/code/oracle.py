"""A scripted code-interpreter agent that solves tasks through the env's real python tool.

Turn 1 runs the task's ``solution_code`` (generated problems) or a cell that stores and prints the gold
answer (real sets, where no program is known) in the sandbox, split across two calls so that
interpreter state must persist; turn 2 answers with what the interpreter printed (``\\boxed{}`` on
half the tasks, ``<answer>`` on the other half). Follows the oracle protocol of ``api-search.md``.

On generated tasks it never reads the gold answer (the program computes it). On the real sets (MATH-500,
AIME) no program is known, so it prints the gold answer: there it checks the pipeline (sandbox, answer
forms, math-verify scoring), not problem solving.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from agentrl.env import Task, play_policy


def call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


class CodeOracle:
    """``reset(task)`` then ``act(observation) -> action text`` until the episode ends."""

    def __init__(self) -> None:
        self.task: Task | None = None
        self.turn = 0

    def reset(self, task: Task) -> None:
        self.task = task
        self.turn = 0

    def act(self, observation: str, info: dict[str, Any] | None = None) -> str:
        assert self.task is not None, "call reset(task) first"
        self.turn += 1
        if self.turn == 1:
            code = self.task.payload.get("solution_code")
            if code is None:
                code = f"print({str(self.task.answer)!r})"
            # run the program, keeping its output in a variable; the next cell prints it (state persists)
            wrapped = f"import contextlib, io\n_buf = io.StringIO()\nwith contextlib.redirect_stdout(_buf):\n    exec({code!r})"
            return "I'll compute it.\n" + call(wrapped)
        if self.turn == 2:
            return call("print(_buf.getvalue().strip())")
        value = observation.strip()
        if int(hashlib.sha256(self.task.id.encode()).hexdigest()[:4], 16) % 2:
            return f"The result is $\\boxed{{{value}}}$."
        return f"<answer>{value}</answer>"


def run_oracle(env: Any, task: Task | None = None, seed: int | None = None) -> tuple[float, dict[str, Any]]:
    """Play one episode of ``env`` (made with ``agentrl.make``) with a fresh :class:`CodeOracle`."""
    return play_policy(env, CodeOracle(), task=task, seed=seed)
