"""agentrl.tools — the Tool protocol and built-in tools (search, python, sql, browser, file reader)."""

from agentrl.tools.base import Tool, ToolOutcome, ToolResult, parse_google_docstring, tool

__all__ = ["Tool", "ToolOutcome", "ToolResult", "parse_google_docstring", "tool"]
