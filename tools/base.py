"""The Tool protocol: a typed function with a docstring, its JSON schema derived, not written twice.

    @tool
    def search(query: str, k: int = 5) -> str:
        '''Search the corpus.

        Args:
            query: what to look for.
            k: how many results to return.
        '''

``search.schema`` is the OpenAI/Hermes function schema for the chat template, and
``search.call({"query": "x"})`` validates and coerces the arguments and returns a
:class:`ToolOutcome`. Bad arguments and :class:`ToolError` / :class:`SandboxError` raised by the
function become an observation telling the model what went wrong; other exceptions are bugs and
propagate.
"""

from __future__ import annotations

import inspect
import re
import time
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrl.errors import SandboxError, ToolError

_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
}


@dataclass
class ToolResult:
    """What a tool may return instead of a plain string, to end the episode or attach data."""

    text: str
    done: bool = False  # the tool ends the episode (e.g. WebShop's Buy Now)
    answer: str | None = None
    usage: dict[str, float] | None = None  # sandbox usage of this call (wall_s, cpu_s, peak_mem_bytes)


@dataclass
class ToolOutcome:
    """The observation of one call plus bookkeeping for metrics."""

    name: str
    text: str
    ok: bool
    error_kind: str | None = None  # "bad_arguments" | "tool_error" | "sandbox_error"
    done: bool = False
    answer: str | None = None
    seconds: float = 0.0
    usage: dict[str, float] | None = None
    arguments: dict[str, Any] = field(default_factory=dict)


def _json_type(annotation: Any) -> dict[str, Any]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _json_type(args[0]) if len(args) == 1 else {}
    if origin is typing.Literal:
        values = list(typing.get_args(annotation))
        return {"type": _JSON_TYPES.get(type(values[0]), "string"), "enum": values}
    if origin in (list, tuple):
        item = typing.get_args(annotation)
        return {"type": "array", "items": _json_type(item[0]) if item else {}}
    if origin is dict:
        return {"type": "object"}
    return {"type": _JSON_TYPES[annotation]} if annotation in _JSON_TYPES else {}


def parse_google_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (summary, {arg: description})."""
    doc = inspect.cleandoc(doc or "")
    summary_lines, params, current, in_args = [], {}, None, False
    for line in doc.splitlines():
        if re.match(r"^(Args|Arguments|Parameters):\s*$", line):
            in_args = True
            continue
        if re.match(r"^(Returns|Raises|Yields|Examples?|Note):\s*$", line):
            in_args = False
            continue
        if in_args:
            found = re.match(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
            if found and (len(line) - len(line.lstrip())) <= 8:
                current = found.group(1)
                params[current] = found.group(2).strip()
            elif current and line.strip():
                params[current] += " " + line.strip()
        elif not params:
            summary_lines.append(line)
    return " ".join(" ".join(summary_lines).split()), params


class Tool:
    """A callable tool with a JSON schema derived from its signature and docstring."""

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None):
        self.fn = fn
        self.name = name or fn.__name__
        summary, arg_docs = parse_google_docstring(fn.__doc__ or "")
        self.description = description or summary
        if not self.description:
            raise ValueError(f"tool {self.name!r} needs a docstring: it is the model's only help")
        hints = typing.get_type_hints(fn)
        self._params: dict[str, inspect.Parameter] = {}
        properties: dict[str, Any] = {}
        required: list[str] = []
        for pname, param in inspect.signature(fn).parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or pname.startswith("_"):
                continue
            self._params[pname] = param
            prop = _json_type(hints.get(pname, str))
            if pname in arg_docs:
                prop["description"] = arg_docs[pname]
            if param.default is param.empty:
                required.append(pname)
            else:
                prop["default"] = param.default
            properties[pname] = prop
        self._hints = hints
        self.parameters = {"type": "object", "properties": properties, "required": required}

    @property
    def param_names(self) -> list[str]:
        return list(self._params)

    @property
    def schema(self) -> dict[str, Any]:
        """OpenAI-style function schema, as chat templates expect it."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def _coerce(self, pname: str, value: Any) -> Any:
        expected = self.parameters["properties"][pname].get("type")
        if expected == "integer" and not isinstance(value, bool):
            if isinstance(value, int):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
            if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
                return int(value)
        elif expected == "number" and not isinstance(value, bool):
            if isinstance(value, int | float):
                return float(value)
            if isinstance(value, str):
                try:
                    return float(value)
                except ValueError:
                    pass
        elif expected == "string":
            if isinstance(value, str):
                return value
            if isinstance(value, int | float) and not isinstance(value, bool):
                return str(value)
        elif expected == "boolean":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
        elif expected == "array" and isinstance(value, list | tuple):
            return list(value)
        elif expected == "object" and isinstance(value, dict):
            return value
        elif expected is None:
            return value
        enum = self.parameters["properties"][pname].get("enum")
        raise ToolError(
            f"argument {pname!r} must be {expected}{f' in {enum}' if enum else ''}, got {value!r}"
        )

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Check names and types; raise ToolError with a message meant for the model."""
        unknown = [a for a in arguments if a not in self._params]
        if unknown:
            raise ToolError(
                f"{self.name} got unknown argument(s) {', '.join(map(repr, unknown))}; "
                f"it takes: {', '.join(self._params) or 'no arguments'}"
            )
        missing = [p for p in self.parameters["required"] if p not in arguments]
        if missing:
            raise ToolError(f"{self.name} is missing required argument(s): {', '.join(missing)}")
        values = {p: self._coerce(p, v) for p, v in arguments.items()}
        for pname, value in values.items():
            enum = self.parameters["properties"][pname].get("enum")
            if enum and value not in enum:
                raise ToolError(f"argument {pname!r} must be one of {enum}, got {value!r}")
        return values

    def call(self, arguments: Mapping[str, Any]) -> ToolOutcome:
        """Run the tool; failures at this boundary become an observation, not an exception."""
        start = time.perf_counter()
        try:
            values = self.validate(arguments)
        except ToolError as exc:
            return ToolOutcome(
                self.name, f"Error: {exc}", ok=False, error_kind="bad_arguments", arguments=dict(arguments)
            )
        try:
            result = self.fn(**values)
        except SandboxError as exc:
            text, kind = f"Error: sandbox failure in {self.name}: {exc}", "sandbox_error"
            return ToolOutcome(
                self.name,
                text,
                ok=False,
                error_kind=kind,
                seconds=time.perf_counter() - start,
                arguments=values,
            )
        except ToolError as exc:
            text = f"Error: {exc}"
            return ToolOutcome(
                self.name,
                text,
                ok=False,
                error_kind="tool_error",
                seconds=time.perf_counter() - start,
                arguments=values,
            )
        seconds = time.perf_counter() - start
        if isinstance(result, ToolResult):
            return ToolOutcome(
                self.name,
                result.text,
                ok=True,
                done=result.done,
                answer=result.answer,
                seconds=seconds,
                usage=result.usage,
                arguments=values,
            )
        return ToolOutcome(self.name, str(result), ok=True, seconds=seconds, arguments=values)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"


def tool(
    fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None
) -> Any:
    """Decorator: turn a typed function with a Google docstring into a :class:`Tool`."""
    if fn is None:
        return lambda f: Tool(f, name=name, description=description)
    return Tool(fn, name=name, description=description)
