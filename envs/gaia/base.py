"""What every GAIA-shaped env shares: the prompt, ``FINAL ANSWER:`` parsing, the official scorer,
and the file tools over the task's attachment."""

from __future__ import annotations

from pathlib import Path

from agentrl.env import Score, Task, TextEnv
from agentrl.scorers.gaia import question_scorer
from agentrl.tools.base import Tool
from agentrl.tools.files import make_file_tools

# GAIA's answer-format instructions, in our words, plus how tools are called here.
GAIA_SYSTEM_PROMPT = """You are a general AI assistant that answers questions using tools.
Think step by step, call tools when you need facts or computation, and finish with one line:
FINAL ANSWER: [YOUR FINAL ANSWER]
The final answer is a number, or as few words as possible, or a comma separated list of numbers and/or strings.
Numbers: no thousands separators, no units such as $ or % unless the question asks for them.
Strings: no articles, no abbreviations (e.g. for cities); write digits in plain text unless asked otherwise.
Lists: apply the rules above to each element, in the order the question asks for.
Call a tool with <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>; one or more per turn."""


class GaiaBaseEnv(TextEnv):
    """GAIA task shape: question, level 1-3, optional attachment, ``FINAL ANSWER:`` scored by GAIA's rules.

    Task payload keys used here: ``file_name`` (name shown to the model, may be empty) and
    ``file_path`` (where the attachment is on disk). Subclasses add tools and task sources.
    """

    success_metric = "correct"
    system_prompt = GAIA_SYSTEM_PROMPT
    final_answer_prefix = True
    # by its tools: search, open and the file readers are read-only (the episode record is copied);
    # the python interpreter's state is replayed into a sandbox of the fork's own (as the code env)
    fork_method = "replay"
    stateful_tools = ("python",)
    shared_services = ("sandbox_pool",)  # with env.placement ray: one sandbox pool per node (python tool)
    #: Offer the sandboxed ``python`` tool (subclasses set these in ``__init__``).
    python: bool = False
    sandbox_backend: str = "auto"
    python_timeout_s: float = 10.0
    _slot = None  # the episode's sandbox slot, leased on the first python call

    def attachment_path(self, task: Task) -> Path | None:
        """Where the task's attached file is (``None`` without one); subclasses may create it here."""
        path = task.payload.get("file_path")
        return Path(path) if path else None

    def make_tools(self) -> list[Tool]:
        self._release_sandbox()
        files = {}
        if self.task is not None and self.task.payload.get("file_name"):
            path = self.attachment_path(self.task)
            if path is not None:
                files[self.task.payload["file_name"]] = path
        tools = make_file_tools(files)
        if self.python:
            from agentrl.tools.python import SandboxSlot, make_python_tool

            self._slot = SandboxSlot(backend=self.sandbox_backend)
            tools.append(make_python_tool(self._slot, timeout_s=self.python_timeout_s))
        return tools

    def fork_detach(self) -> None:
        self._slot = None  # the parent's lease; make_tools gives the fork a slot of its own

    def _release_sandbox(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()

    def on_close(self) -> None:
        self._release_sandbox()

    def render_task(self, task: Task) -> str:
        name = task.payload.get("file_name") or ""
        if not name:
            return task.question
        return f"{task.question}\n\nAttached file: {name} (read it with the read_file tool)."

    def score(self, answer: str | None, task: Task) -> Score:
        gold = str(task.answer)
        correct = float(question_scorer(answer, gold))
        return Score(reward=correct, metrics={"correct": correct})
