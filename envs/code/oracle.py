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

from typing import Any

from agentrl.env import Task, play_policy
from agentrl.envs.scripted import TurnScript, stable_coin, tool_call


def call(code: str) -> str:
    """A ``python`` tool call running ``code``."""
    return tool_call("python", code=code)


class CodeOracle(TurnScript):
    """``reset(task)`` then ``act(observation) -> action text`` until the episode ends."""

    def turn_action(self, task: Task, turn: int, observation: str) -> str:
        if turn == 1:
            code = task.payload.get("solution_code")
            if code is None:
                code = f"print({str(task.answer)!r})"
            # run the program, keeping its output in a variable; the next cell prints it (state persists)
            wrapped = f"import contextlib, io\n_buf = io.StringIO()\nwith contextlib.redirect_stdout(_buf):\n    exec({code!r})"
            return "I'll compute it.\n" + call(wrapped)
        if turn == 2:
            return call("print(_buf.getvalue().strip())")
        value = observation.strip()
        if stable_coin(task.id):
            return f"The result is $\\boxed{{{value}}}$."
        return f"<answer>{value}</answer>"


def run_oracle(env: Any, task: Task | None = None, seed: int | None = None) -> tuple[float, dict[str, Any]]:
    """Play one episode of ``env`` (made with ``agentrl.make``) with a fresh :class:`CodeOracle`."""
    return play_policy(env, CodeOracle(), task=task, seed=seed)
