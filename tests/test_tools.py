"""Tool schemas are derived from signatures and docstrings; failures become observations."""

from __future__ import annotations

from typing import Literal

import pytest

from agentrl.errors import SandboxError, ToolError
from agentrl.tools import ToolResult, tool


@tool
def lookup(query: str, k: int = 3, mode: Literal["fast", "exact"] = "fast", strict: bool | None = None) -> str:
    """Look things up.

    Args:
        query: what to look for,
            possibly long.
        k: how many results.
        mode: search mode.
        strict: whether to be strict.

    Returns:
        text
    """
    return f"{query}|{k}|{mode}|{strict}"


def test_schema_from_signature_and_docstring():
    assert lookup.schema == {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look things up.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "what to look for, possibly long."},
                    "k": {"type": "integer", "description": "how many results.", "default": 3},
                    "mode": {"type": "string", "enum": ["fast", "exact"], "description": "search mode.", "default": "fast"},
                    "strict": {"type": "boolean", "description": "whether to be strict.", "default": None},
                },
                "required": ["query"],
            },
        },
    }


def test_call_coerces_json_ish_arguments():
    out = lookup.call({"query": 12, "k": "5", "strict": "true"})
    assert out.ok and out.text == "12|5|fast|True"


@pytest.mark.parametrize(
    "arguments, needle",
    [
        ({}, "missing required argument(s): query"),
        ({"query": "x", "color": 1}, "unknown argument(s) 'color'"),
        ({"query": "x", "k": "three"}, "argument 'k' must be integer"),
        ({"query": "x", "mode": "slow"}, "must be one of ['fast', 'exact']"),
    ],
)
def test_bad_arguments_become_observations(arguments, needle):
    out = lookup.call(arguments)
    assert not out.ok and out.error_kind == "bad_arguments" and needle in out.text


def test_tool_and_sandbox_errors_become_observations_but_bugs_propagate():
    @tool
    def flaky(what: str) -> str:
        """Fail on purpose.

        Args:
            what: which failure.
        """
        if what == "tool":
            raise ToolError("no such page")
        if what == "sandbox":
            raise SandboxError("container vanished")
        raise KeyError(what)

    assert flaky.call({"what": "tool"}).text == "Error: no such page"
    assert flaky.call({"what": "sandbox"}).error_kind == "sandbox_error"
    with pytest.raises(KeyError):
        flaky.call({"what": "bug"})


def test_tool_result_can_end_the_episode():
    @tool
    def buy(item: str) -> ToolResult:
        """Buy an item.

        Args:
            item: the item.
        """
        return ToolResult(text="bought", done=True, answer=item)

    out = buy.call({"item": "shoe"})
    assert out.done and out.answer == "shoe" and out.text == "bought"


def test_a_tool_without_docstring_is_refused():
    with pytest.raises(ValueError, match="needs a docstring"):
        tool(lambda x: x)
