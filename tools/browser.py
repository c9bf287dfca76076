"""Browser tools: ``search`` and ``click`` over any object with ``search(keywords)`` and ``click(element)``.

The web env binds them to its per-episode :class:`agentrl.envs.web.browser.Browser`; the ReAct
forms ``search[keywords]`` and ``click[element]`` reach the same functions (one parameter each).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from agentrl.tools.base import Tool, ToolResult, tool


class BrowserLike(Protocol):
    def search(self, keywords: str) -> ToolResult: ...

    def click(self, element: str) -> ToolResult: ...


def make_browser_tools(get_browser: Callable[[], BrowserLike]) -> list[Tool]:
    """The ``search`` and ``click`` tools, calling whatever browser ``get_browser()`` returns now."""

    @tool
    def search(keywords: str) -> ToolResult:
        """Type keywords into the page's search box and submit it (only where the page has one).

        Args:
            keywords: what to search for, e.g. "gluten free dark chocolate".
        """
        return get_browser().search(keywords)

    @tool
    def click(element: str) -> ToolResult:
        """Click a link or button of the current page, named by its text as shown in [brackets].

        Args:
            element: the text of the element, e.g. "Buy Now", "Next >" or a product id.
        """
        return get_browser().click(element)

    return [search, click]
