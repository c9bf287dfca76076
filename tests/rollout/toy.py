"""A tiny TextEnv for rollout tests: look a key up, answer its value."""

from __future__ import annotations

import time

from agentrl.env import ObservationBudget, Score, Task, TextEnv, TurnBudget
from agentrl.tools import tool


class LookupEnv(TextEnv):
    system_prompt = "Find the value of the key with the lookup tool, then answer it in <answer></answer>."
    #: behaviour switches for failure tests: {"crash_on": task id, "hang_on": task id, "hang_s": seconds}
    faults: dict = {}
    hangs_left = {"count": 0}

    def load_tasks(self, split):
        return [
            Task(id=f"k{i}", question=f"What is the value of key k{i}?", answer=f"v{i}", split=split)
            for i in range(8)
        ]

    def make_tools(self):
        task = self.task

        @tool
        def lookup(key: str) -> str:
            """Look a key up.

            Args:
                key: the key name.
            """
            if self.faults.get("crash_on") == task.id:
                raise RuntimeError(f"simulated env crash on {task.id}")
            if self.faults.get("hang_on") == task.id and LookupEnv.hangs_left["count"] > 0:
                LookupEnv.hangs_left["count"] -= 1
                time.sleep(self.faults.get("hang_s", 30))
            return f"VALUE of {key}: v{key[1:]}" if key.startswith("k") else f"Error: no key {key!r}"

        return [lookup]

    def score(self, answer, task):
        hit = float(answer is not None and answer.strip() == task.answer)
        return Score(hit, {"em": hit})


def make_lookup_env(max_turns: int = 6, max_obs_chars: int = 2000):
    return TurnBudget(ObservationBudget(LookupEnv(), max_obs_chars), max_turns)


class LookupOracle:
    """Scripted oracle: one lookup, then the value it read."""

    def reset(self, task):
        self.key = task.question.split("key ")[1].rstrip("?")
        self.done_lookup = False

    def act(self, observation, info=None):
        if not self.done_lookup:
            self.done_lookup = True
            return f'<tool_call>{{"name": "lookup", "arguments": {{"key": "{self.key}"}}}}</tool_call>'
        return f"<answer>{observation.split(': ')[-1].strip()}</answer>"
