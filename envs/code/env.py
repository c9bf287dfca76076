"""Code interpreter: solve math and computation problems with a stateful Python tool.

Tool: ``python(code)`` runs a cell in a sandboxed interpreter whose variables persist across turns
(:mod:`agentrl.tools.python`); output is cut with a note; timeouts and crashes become observations.

Final answer: ``<answer>...</answer>``; a turn with no tool call whose text has a ``\\boxed{...}`` is
read as the final answer too, and (``code_blocks=True``) a turn with no tool call that has a
fenced ```` ```python ```` block runs that block as a python call (SimpleTIR's format).

Reward: 1.0 when the answer equals the gold answer: by ``math-verify`` (MATH-500), as integers
(AIME and the integer generated problems), as decimals or as text (see :mod:`.scoring`).

SimpleTIR's void turns (neither a tool call nor a final answer): ``void_turn_policy="off"`` only
counts them (``void_turns``); ``"flag"`` also sets ``metrics["void_trajectory"] = 1.0`` on episodes that
had one, which trainers drop from the update; ``"end"`` flags and ends the episode at the first one.

Task sources: ``"generated"`` (seeded problems from :mod:`.generator`, splits train/dev/test) or the real
sets ``"math500"``, ``"aime2024"``, ``"aime2025"`` shipped in ``data/math/`` (split "test"; see :func:`agentrl.paths.benchmark_file`).
Task payload: ``compare`` (scoring mode), and for generated tasks ``kind``, ``template``, ``solution_code``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from agentrl.actions import ParsedAction, ToolCall
from agentrl.env import Score, Task, TextEnv
from agentrl.envs.code.generator import KINDS, generate, to_record
from agentrl.envs.code.scoring import is_correct, last_boxed
from agentrl.errors import ConfigError
from agentrl.outcome import OUTCOME, end_step
from agentrl.paths import benchmark_file
from agentrl.tools.base import Tool
from agentrl.tools.python import SandboxSlot, make_python_tool

SOURCES = {
    "generated": None,
    "math500": "math500.jsonl",
    "aime2024": "aime2024.jsonl",
    "aime2025": "aime2025.jsonl",
}
VOID_POLICIES = ("off", "flag", "end")
SPLIT_SEED = {"train": 0, "dev": 1, "test": 2}
DEFAULT_N_TASKS = {"train": 2000, "dev": 200, "test": 200}
CODE_BLOCK_RE = re.compile(r"```(?:python|py)\s*\n(.*?)```", re.DOTALL)

SYSTEM_PROMPT = """You solve math and computation problems. You have a Python interpreter: call it with
<tool_call>{"name": "python", "arguments": {"code": "print(2**100)"}}</tool_call>
Variables, imports and functions persist between calls; print() what you want to see. Only the standard
library is available. Each call may run at most {timeout:g} seconds.
When you are sure, give only the final answer as <answer>...</answer> (\\boxed{...} is also accepted)."""


class CodeEnv(TextEnv):
    """Math / computation with a python tool (see the module docstring).

    Args:
        split: "train" | "dev" | "test" (the real sets have only "test").
        source: "generated", "math500", "aime2024" or "aime2025".
        n_tasks: problems per split for the generated source (int, or dict split -> int).
        seed: seed of the generated problems.
        kinds: generated problem kinds (subset of arithmetic, combinatorics, dates, tables).
        timeout_s: time limit of one python call.
        max_output_chars: output kept per call (head and tail).
        void_turn_policy: "off" | "flag" | "end" (SimpleTIR).
        code_blocks: run a fenced python block in a turn without a tool call.
        sandbox_backend: "auto" | "docker" | "bwrap".
        pool_size: size of the shared sandbox pool.
        memory_mb: memory limit of the sandbox.
    """

    success_metric = "correct"
    splits = ("train", "dev", "test")
    # the state is the interpreter's (variables, files in its work dir): a fork leases a pristine
    # sandbox from the same pool and replays the episode's python cells into it, checking each
    # output (a snapshot of the lease's files would miss the interpreter's memory: see
    # docs/guides/tree-rollouts.md for the measurement)
    fork_method = "replay"
    stateful_tools = ("python",)
    shared_services = ("sandbox_pool",)  # with env.placement ray: one sandbox pool per node

    def __init__(
        self,
        *,
        split: str = "train",
        render_mode: str | None = None,
        source: str = "generated",
        n_tasks: int | dict[str, int] | None = None,
        seed: int = 0,
        kinds: Sequence[str] = KINDS,
        timeout_s: float = 10.0,
        max_output_chars: int = 4000,
        void_turn_policy: str = "flag",
        code_blocks: bool = True,
        sandbox_backend: str = "auto",
        pool_size: int = 4,
        memory_mb: int = 512,
    ):
        super().__init__(split=split, render_mode=render_mode)
        if source not in SOURCES:
            raise ConfigError("env.source", f"unknown source {source!r}", f"choose one of {list(SOURCES)}")
        if void_turn_policy not in VOID_POLICIES:
            raise ConfigError(
                "env.void_turn_policy", f"got {void_turn_policy!r}", f"choose one of {VOID_POLICIES}"
            )
        unknown = [k for k in kinds if k not in KINDS]
        if unknown or not kinds:
            raise ConfigError(
                "env.kinds", f"unknown or empty kinds {list(kinds)}", f"choose from {list(KINDS)}"
            )
        if timeout_s <= 0 or max_output_chars < 100:
            raise ConfigError(
                "env.timeout_s/max_output_chars", "too small", "e.g. timeout_s=10, max_output_chars=4000"
            )
        counts = dict(DEFAULT_N_TASKS)
        if isinstance(n_tasks, int):
            counts = {s: n_tasks for s in counts}
        elif isinstance(n_tasks, dict):
            counts.update(n_tasks)
        self.n_tasks = counts
        self.source = source
        self.seed = seed
        self.kinds = tuple(kinds)
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.void_turn_policy = void_turn_policy
        self.code_blocks = code_blocks
        self.slot = SandboxSlot(sandbox_backend, pool_size, memory_mb=memory_mb)
        self.memory_mb = memory_mb
        self.system_prompt = SYSTEM_PROMPT.replace("{timeout:g}", f"{timeout_s:g}")

    # ----------------------------------------------------------------- tasks
    def load_tasks(self, split: str) -> Sequence[Task]:
        if self.source == "generated":
            problems = generate(
                self.n_tasks[split], seed=self.seed * 1000 + SPLIT_SEED[split], kinds=self.kinds
            )
            return [
                Task(f"gen-{split}-{self.seed}-{i}", p.question, p.answer, split, p.level, to_record(p))
                for i, p in enumerate(problems)
            ]
        if split != "test":
            return []
        path = benchmark_file("math", SOURCES[self.source])  # checked against its SHA256SUMS
        compare = "int" if self.source.startswith("aime") else "math"
        tasks = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                payload = {"compare": compare, "source": row.get("source", self.source)}
                tasks.append(Task(str(row["id"]), row["problem"], str(row["answer"]), "test", None, payload))
        return tasks

    def make_tools(self) -> list[Tool]:
        self.slot.release()
        self.slot.reset_timings()
        tool = make_python_tool(self.slot, timeout_s=self.timeout_s, max_output_chars=self.max_output_chars)
        return [tool]

    # ----------------------------------------------------------------- steps
    def parse(self, action: str) -> ParsedAction:
        """Also read ``\\boxed{}`` and fenced python blocks in turns that have no tool call or answer."""
        parsed = super().parse(action)
        if parsed.tool_calls or parsed.answer is not None or "<answer>" in action:
            return parsed
        blocks = CODE_BLOCK_RE.findall(action) if self.code_blocks else []
        if blocks:
            return ParsedAction(text=action, tool_calls=(ToolCall("python", {"code": blocks[-1]}, "fenced"),))
        boxed = last_boxed(action)
        if boxed is not None:
            return ParsedAction(text=action, answer=boxed)
        return parsed

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)
        if info[OUTCOME].void and self.void_turn_policy == "end" and not terminated:
            reward, final = self.final_info(None)
            info = end_step(info, final)
            terminated = True
        return obs, reward, terminated, truncated, info

    def score(self, answer: str | None, task: Task) -> Score:
        correct = is_correct(answer, str(task.answer), task.payload.get("compare", "math"))
        self.slot.release()  # the episode is over: its sandbox goes back to the pool now
        metrics = {"correct": float(correct)}
        if self.void_turn_policy != "off":
            metrics["void_trajectory"] = float(self._metrics.get("void_turns", 0.0) > 0)
        return Score(float(correct), metrics)

    def fork_detach(self) -> None:
        self.slot = self.slot.sibling()

    def on_close(self) -> None:
        self.slot.release()
