"""Toy envs shared by the foundation tests (registered as test/* ids on import)."""

from __future__ import annotations

import agentrl
from agentrl import Score, Task, TextEnv
from agentrl.tools import tool


class CounterEnv(TextEnv):
    """Toy env: ``add(n)`` adds to a counter; the answer is the task's target."""

    system_prompt = "Reach the target with add(n), then answer it."

    def load_tasks(self, split):
        return [Task(id=f"{split}-{i}", question=f"Reach {i * 10}.", answer=str(i * 10), split=split) for i in range(6)]

    def make_tools(self):
        total = {"value": 0}

        @tool
        def add(n: int) -> str:
            """Add n to the counter.

            Args:
                n: how much to add.
            """
            total["value"] += n
            return f"counter = {total['value']}"

        return [add]

    def score(self, answer, task):
        hit = float(answer is not None and answer.strip() == task.answer)
        return Score(hit, {"em": hit})


agentrl.register("test/Counter-v0", "toy_envs:CounterEnv", description="toy counter", max_turns=4, max_obs_chars=200)


class FlakyEnv(CounterEnv):
    """CounterEnv whose reset crashes on held-out (test split) tasks: ``crashes[task id]`` more times
    (-1: always). Class-level, so a test sets it before a run (the envs run in this process)."""

    crashes: dict[str, int] = {}

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        left = FlakyEnv.crashes.get(self.task.id, 0)
        if left:
            FlakyEnv.crashes[self.task.id] = left - 1 if left > 0 else left
            raise RuntimeError(f"simulated crash on {self.task.id}")
        return obs, info


agentrl.register("test/Flaky-v0", "toy_envs:FlakyEnv", description="toy counter that crashes on some held-out tasks",
                 max_turns=4, max_obs_chars=200)  # fmt: skip
