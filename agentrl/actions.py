"""Parse model output into tool calls and final answers.

Three formats are understood, and may be mixed in one turn:

- Hermes / Qwen: ``<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>``
- final answers: ``<answer>...</answer>`` (also ``FINAL ANSWER: ...`` when ``final_answer_prefix``)
- ReAct style: ``search[some query]`` for tools that take one argument.

Parsing never raises on model output: what cannot be understood is returned as
:class:`ActionProblem` entries that the env turns into an observation telling the model what to fix.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
UNCLOSED_TOOL_CALL_RE = re.compile(r"<tool_call>(?!.*</tool_call>)", re.DOTALL)
ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
FINAL_ANSWER_RE = re.compile(r"FINAL ANSWER:\s*(.+)", re.DOTALL)
# name[argument]; the argument may contain brackets, so match up to the last ']' on the line.
REACT_RE = re.compile(r"(?<![\w<])([A-Za-z_][A-Za-z0-9_]*)\[(.*)\]")

MAX_ECHO = 200  # characters of offending text echoed back to the model


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for."""

    name: str
    arguments: dict[str, Any]
    format: str  # "hermes" | "react"


@dataclass(frozen=True)
class ActionProblem:
    """Something in the model output that could not be turned into an action."""

    kind: str  # "malformed_json" | "unknown_tool" | "bad_arguments" | "unclosed_tag" | "no_action"
    message: str


@dataclass(frozen=True)
class ParsedAction:
    """The result of parsing one model turn."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    answer: str | None = None
    problems: tuple[ActionProblem, ...] = field(default_factory=tuple)

    @property
    def is_final(self) -> bool:
        return self.answer is not None

    @property
    def is_void(self) -> bool:
        """Neither a tool call nor a final answer (SimpleTIR's void turn)."""
        return not self.tool_calls and self.answer is None


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_ECHO else text[:MAX_ECHO] + "..."


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """A call written the way the Hermes format (and ``tools_system_block``) asks the model to."""
    payload = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{payload}\n{TOOL_CALL_CLOSE}"


def parse_tool_call(body: str, tools: Mapping[str, Sequence[str]] | None = None) -> ToolCall | ActionProblem:
    """The call inside one ``<tool_call>...</tool_call>`` (``body`` is the text between the tags)."""
    try:
        payload = json.loads(body.strip())
    except json.JSONDecodeError as exc:
        return ActionProblem(
            "malformed_json",
            f"Your <tool_call> is not valid JSON ({exc.msg} at char {exc.pos}): {_clip(body)!r}. "
            'Write <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>.',
        )
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return ActionProblem(
            "malformed_json",
            f'A <tool_call> needs a JSON object with a "name" string; got {_clip(body)!r}.',
        )
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):  # some models double-encode the arguments
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return ActionProblem(
            "bad_arguments",
            f'"arguments" of {payload["name"]!r} must be a JSON object, got {type(arguments).__name__}.',
        )
    name = payload["name"]
    if tools is not None and name not in tools:
        return ActionProblem("unknown_tool", f"Unknown tool {name!r}. Available tools: {', '.join(tools)}.")
    return ToolCall(name=name, arguments=arguments, format="hermes")


def _parse_react(name: str, arg: str, tools: Mapping[str, Sequence[str]]) -> ToolCall | ActionProblem:
    params = list(tools[name])
    if len(params) == 0:
        return ToolCall(name=name, arguments={}, format="react")
    return ToolCall(name=name, arguments={params[0]: arg.strip()}, format="react")


def parse_action(
    text: str,
    tools: Mapping[str, Sequence[str]] | None = None,
    *,
    react: bool = True,
    final_answer_prefix: bool = False,
) -> ParsedAction:
    """Parse one model turn.

    Args:
        text: the model's output for this turn (decoded text).
        tools: tool name -> parameter names (first one receives a ReAct argument). ``None`` accepts
            any Hermes tool name and disables ReAct parsing.
        react: also accept ``name[argument]`` for known tools.
        final_answer_prefix: also accept GAIA's ``FINAL ANSWER: ...`` as the final answer.

    Returns:
        A ParsedAction; ``problems`` lists what could not be parsed (never raises on model text).
    """
    calls: list[ToolCall] = []
    problems: list[ActionProblem] = []

    for match in TOOL_CALL_RE.finditer(text):
        parsed = parse_tool_call(match.group(1), tools)
        (calls if isinstance(parsed, ToolCall) else problems).append(parsed)
    stripped = TOOL_CALL_RE.sub(" ", text)
    if UNCLOSED_TOOL_CALL_RE.search(stripped):
        problems.append(
            ActionProblem("unclosed_tag", "A <tool_call> tag was opened but never closed with </tool_call>.")
        )

    answer: str | None = None
    answers = ANSWER_RE.findall(stripped)
    if answers:
        answer = answers[-1].strip()
    elif "<answer>" in stripped:
        problems.append(
            ActionProblem("unclosed_tag", "An <answer> tag was opened but never closed with </answer>.")
        )
    elif final_answer_prefix:
        found = FINAL_ANSWER_RE.search(stripped)
        if found:
            answer = found.group(1).strip().splitlines()[0].strip() if found.group(1).strip() else ""

    if react and tools and not calls and answer is None:
        body = ANSWER_RE.sub(" ", stripped)
        for line in body.splitlines():
            for match in REACT_RE.finditer(line):
                name, arg = match.group(1), match.group(2)
                if name in tools:
                    parsed = _parse_react(name, arg, tools)
                    (calls if isinstance(parsed, ToolCall) else problems).append(parsed)

    if not calls and answer is None and not problems:
        hint = (
            "Call a tool with <tool_call>{...}</tool_call> or give the final answer in <answer>...</answer>."
        )
        problems.append(ActionProblem("no_action", f"No tool call or answer found. {hint}"))
    return ParsedAction(text=text, tool_calls=tuple(calls), answer=answer, problems=tuple(problems))
