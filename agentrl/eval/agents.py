"""The AGENT argument of ``agentrl eval``: what it names and how scripted agents act.

- ``oracle``: the suite's scripted oracle (upper bound; acts only through the tools).
- ``random``: a seeded baseline that emits random but well-formed actions from the env's tool list.
- ``smollm2-135m``, a Hugging Face id or a local folder, optionally ``+ADAPTER`` (a PEFT adapter
  folder or one of our checkpoints): a model run through the rollout engine (HF generator).
- ``openai:URL[#model]``: any OpenAI-compatible *completions* server with token ids in and out
  (``agentrl serve``, vLLM ...); needs the model's tokenizer here.
- ``chat:URL[#model]``: any OpenAI-compatible *chat* server (hosted APIs, vLLM, llama.cpp, Ollama,
  ``agentrl serve``) with native tool calls; no tokenizer (see :mod:`agentrl.eval.chat_agent`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from agentrl.env import Task
from agentrl.errors import ConfigError
from agentrl.registry import load_entry_point


class ScriptedAgent(Protocol):
    """The oracle protocol (see envs/search/oracle.py)."""

    def reset(self, task: Task) -> None: ...

    def act(self, observation: str) -> str: ...


@dataclass(frozen=True)
class AgentSpec:
    """A parsed AGENT string."""

    kind: str  # "oracle" | "random" | "model" | "openai" | "chat"
    model: str = ""  # model name / HF id / path, or the served model name for openai
    adapter: str | None = None
    url: str = ""

    @property
    def label(self) -> str:
        if self.kind in ("oracle", "random"):
            return self.kind
        if self.kind in REMOTE_KINDS:
            return f"{self.kind}:{self.url}" + (f"#{self.model}" if self.model else "")
        return self.model + (f"+{self.adapter}" if self.adapter else "")


REMOTE_KINDS = ("openai", "chat")


def parse_agent(spec: str) -> AgentSpec:
    """Parse ``oracle`` | ``random`` | ``MODEL[+ADAPTER]`` | ``openai:URL[#model]`` | ``chat:URL[#model]``."""
    spec = spec.strip()
    if not spec:
        raise ConfigError(
            "agent",
            "the agent is empty",
            "use oracle, random, smollm2-135m, openai:URL[#model] or chat:URL#model",
        )
    if spec in ("oracle", "random"):
        return AgentSpec(spec)
    kind, colon, rest = spec.partition(":")
    if colon and kind in REMOTE_KINDS:
        url, _, model = rest.partition("#")
        if not re.match(r"^https?://", url):
            raise ConfigError(
                "agent", f"{spec!r} has no http(s) URL", f"write {kind}:http://HOST:PORT/v1[#model]"
            )
        return AgentSpec(kind, model=model, url=url.rstrip("/"))
    model, _, adapter = spec.partition("+")
    if re.match(r"^[A-Za-z][A-Za-z0-9_.-]*:", spec) and not Path(model).exists():
        # "http://HOST/v1", "chta:URL" or "opneai:URL": a server without a known kind, not a model
        what = (
            "is a URL without an agent kind"
            if re.match(r"^https?://", spec)
            else f"names no agent: {kind + ':'!r} is not an agent kind and no folder of that name exists"
        )
        raise ConfigError(
            "agent",
            f"{spec!r} {what}",
            "write openai:URL[#model] (token-id completions) or chat:URL#model (chat completions) for a "
            "server; oracle, random, a model name or a folder otherwise",
        )
    return AgentSpec("model", model=model, adapter=adapter or None)


def load_oracle(target: str | None, suite_name: str) -> type:
    """The oracle class of a suite (``"module:Class"``)."""
    if target is None:
        raise ConfigError(
            "agent",
            f"suite {suite_name!r} has no scripted oracle",
            "use --agent random or a model on this suite",
        )
    try:
        return load_entry_point(target, field="agent")
    except ConfigError as exc:
        raise ConfigError(
            "agent", f"the oracle of suite {suite_name!r} is not available: {exc}", "use --agent random"
        ) from exc


class OracleAdapter:
    """Calls an oracle's ``act`` with only the observation (oracles differ in optional arguments)."""

    def __init__(self, oracle: Any):
        self.oracle = oracle

    def reset(self, task: Task) -> None:
        self.oracle.reset(task)

    def act(self, observation: str) -> str:
        return self.oracle.act(observation)


_WORD_RE = re.compile(r"[A-Za-z][A-Za-z0-9'-]{2,}|\d+(?:\.\d+)?")


class RandomAgent:
    """Random well-formed actions: a tool call with arguments drawn from the text seen so far, or an answer.

    Args:
        tools: the env's tool schemas, or a function returning them (called at each reset, since an
            env's tools may depend on the task, e.g. query_sqlite only with a SQLite attachment).
        seed: RNG seed; the same seed and observations give the same actions.
        answer_prob: chance that a turn gives a final answer instead of calling a tool.
    """

    def __init__(
        self,
        tools: list[dict[str, Any]] | Callable[[], list[dict[str, Any]]],
        seed: int,
        answer_prob: float = 0.25,
    ):
        self._tools_source = tools
        self.tools: list[dict[str, Any]] = [] if callable(tools) else list(tools)
        self.rng = np.random.default_rng(seed)
        self.answer_prob = answer_prob
        self.words: list[str] = []

    def reset(self, task: Task) -> None:
        if callable(self._tools_source):
            self.tools = list(self._tools_source())
        self.words = _WORD_RE.findall(task.question) or ["unknown"]

    def _words(self, n: int) -> str:
        picks = self.rng.integers(len(self.words), size=n)
        return " ".join(self.words[int(i)] for i in picks)

    def _argument(self, schema: dict[str, Any]) -> Any:
        if "enum" in schema:
            return schema["enum"][int(self.rng.integers(len(schema["enum"])))]
        kind = schema.get("type", "string")
        if kind == "integer":
            return int(self.rng.integers(1, 6))
        if kind == "number":
            return float(np.round(self.rng.uniform(0, 10), 2))
        if kind == "boolean":
            return bool(self.rng.integers(2))
        return self._words(int(self.rng.integers(1, 4)))

    def act(self, observation: str) -> str:
        self.words += _WORD_RE.findall(observation)[:200]
        if not self.tools or self.rng.random() < self.answer_prob:
            return f"<answer>{self._words(int(self.rng.integers(1, 3)))}</answer>"
        schema = self.tools[int(self.rng.integers(len(self.tools)))]["function"]
        params = schema.get("parameters", {})
        arguments = {name: self._argument(params["properties"][name]) for name in params.get("required", [])}
        return f"<tool_call>{json.dumps({'name': schema['name'], 'arguments': arguments})}</tool_call>"
