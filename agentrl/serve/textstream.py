"""Token ids → text deltas for one served choice: detokenization, stop strings, tool calls.

``agentrl serve`` feeds each sampled token to a :class:`ChoiceStream` (from the generator's worker
thread, as it is sampled); the stream turns tokens into :class:`Delta` s of visible text and parsed
tool calls, and tells the generator to end the row when a stop string has appeared (or the forced
tool call is complete). Streamed and non-streamed answers are both the concatenation of these
deltas, so they agree by construction.

- Detokenization is incremental (vLLM's prefix/read offsets): each step decodes a few tokens, and
  text ending in an incomplete UTF-8 sequence waits for the next token.
- Stop strings may span tokens; the text from the stop string on is cut, and text that could still
  become a stop string is held back until it cannot.
- Tool calls use the format of :mod:`agentrl.actions` (``<tool_call>{json}</tool_call>``, parsed by
  :func:`agentrl.actions.parse_tool_call`); text from ``<tool_call>`` on is held back until the call
  closes. A call that does not parse stays in the content, as the model wrote it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.actions import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolCall, parse_tool_call


@dataclass
class TokenInfo:
    """One sampled token, for logprobs."""

    id: int
    logprob: float
    top: list[tuple[int, float]] | None = None


@dataclass
class Delta:
    """Text and tool calls that became final, with the tokens sampled since the previous delta."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tokens: list[TokenInfo] = field(default_factory=list)
    first_call: int = 0  # index of tool_calls[0] among the choice's calls


def _held_suffix(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``markers``."""
    best = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:size]):
                best = size
                break
    return best


class ChoiceStream:
    """Incremental state of one choice.

    Args:
        tokenizer: decodes ids to text.
        stop: stop strings (excluded from the text; the row ends when one appears).
        hidden_ids: ids that end the turn and are not text (EOS, the request's stop token ids).
        tools: tool name -> parameter names, to parse tool calls; None leaves tool-call text as content.
        prefix_text: text already in the answer before the first sampled token (a forced
            ``<tool_call>`` opening), part of the parsed text but never of the sampled ids.
        max_calls: end the row once this many tool calls are complete (``tool_choice`` naming a
            function, ``parallel_tool_calls: false``).
        emit: called with each :class:`Delta` as it becomes final (streaming); may be None.
        skip_special_tokens: leave special tokens out of the text (vLLM's default).
        min_tokens: stop strings are looked for once the choice has this many tokens (vLLM's rule).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        stop: Sequence[str] = (),
        hidden_ids: Collection[int] = (),
        tools: Mapping[str, Sequence[str]] | None = None,
        prefix_text: str = "",
        max_calls: int | None = None,
        emit: Callable[[Delta], None] | None = None,
        skip_special_tokens: bool = True,
        min_tokens: int = 0,
    ):
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.hidden_ids = set(hidden_ids)
        self.tools = tools
        self.max_calls = max_calls
        self.emit = emit
        self.skip_special_tokens = skip_special_tokens
        self.min_tokens = min_tokens
        self.text = prefix_text
        self.generated_from = len(prefix_text)  # stop strings are searched from here on
        self.tokens: list[TokenInfo] = []
        self.calls: list[ToolCall] = []
        self.deltas: list[Delta] = []
        self.stopped_by_string = False
        self.abandoned = threading.Event()  # the client went away: end the row
        self._visible: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._resolved = 0  # text[:_resolved] has been turned into deltas
        self._pending: list[TokenInfo] = []
        self._ws = ""  # whitespace held back around tool calls
        self._content_started = False
        self._done = False

    # ------------------------------------------------------------------ feeding
    def feed(self, token: int, logprob: float, top: list[tuple[int, float]] | None = None) -> bool:
        """Take one sampled token; True when the row should end here (stop string, forced call done,
        client gone)."""
        info = TokenInfo(int(token), float(logprob), top)
        self.tokens.append(info)
        self._pending.append(info)
        if self._done:
            return True
        if int(token) not in self.hidden_ids:
            self._visible.append(int(token))
            self._decode(final=False)
            self._resolve(final=False)
        return self._done or self.abandoned.is_set()

    def finish(self) -> Delta:
        """Flush what was held back (the generation ended); the last delta, possibly empty."""
        if not self._done:
            self._decode(final=True)
        self._done = True
        return self._resolve(final=True) or self._record(Delta(tokens=self._take_pending()))

    # ------------------------------------------------------------------ results
    @property
    def content(self) -> str:
        return "".join(d.content for d in self.deltas)

    # ------------------------------------------------------------------ internals
    def _decode(self, *, final: bool) -> None:
        ids, skip = self._visible, self.skip_special_tokens
        before = self.tokenizer.decode(ids[self._prefix_offset : self._read_offset], skip_special_tokens=skip)
        after = self.tokenizer.decode(ids[self._prefix_offset :], skip_special_tokens=skip)
        if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
            return  # nothing new, or an incomplete UTF-8 sequence that the next token completes
        start = len(self.text)
        self.text += after[len(before) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(ids)
        if self.stop and len(self.tokens) >= self.min_tokens:
            longest = max(len(s) for s in self.stop)
            window = max(self.generated_from, start - longest + 1)
            hits = [at for at in (self.text.find(s, window) for s in self.stop) if at >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped_by_string = True
                self._done = True

    def _take_pending(self) -> list[TokenInfo]:
        pending, self._pending = self._pending, []
        return pending

    def _record(self, delta: Delta) -> Delta:
        self.deltas.append(delta)
        if self.emit is not None:
            self.emit(delta)
        return delta

    def _content(self, piece: str) -> str:
        if self.tools is None:
            return piece
        piece = self._ws + piece  # around tool calls, whitespace waits to see what follows
        kept = piece.rstrip()
        self._ws = piece[len(kept) :]
        if not self._content_started:
            kept = kept.lstrip()
        self._content_started = self._content_started or bool(kept)
        return kept

    def _resolve(self, *, final: bool) -> Delta | None:
        end = len(self.text)
        final = final or self._done
        if not final:
            markers = [*self.stop, *([TOOL_CALL_OPEN] if self.tools is not None else [])]
            end -= _held_suffix(self.text[self._resolved :], markers)
        content, calls, pos = "", [], self._resolved
        while pos < end:
            at = self.text.find(TOOL_CALL_OPEN, pos, end) if self.tools is not None else -1
            if at < 0:
                content += self._content(self.text[pos:end])
                pos = end
                break
            content += self._content(self.text[pos:at])
            close = self.text.find(TOOL_CALL_CLOSE, at + len(TOOL_CALL_OPEN), end)
            if close < 0:
                if final:  # never closed: the model's text, as written
                    content += self._content(self.text[at:end])
                    pos = end
                break
            after = close + len(TOOL_CALL_CLOSE)
            parsed = parse_tool_call(self.text[at + len(TOOL_CALL_OPEN) : close], self.tools)
            if isinstance(parsed, ToolCall):
                calls.append(parsed)
                self._ws = ""
            else:
                content += self._content(self.text[at:after])
            pos = after
            if self.max_calls is not None and len(self.calls) + len(calls) >= self.max_calls:
                self._done = True
                self.text = self.text[:after]
                end = after
                break
        self._resolved = pos
        if not content and not calls and not final:
            return None
        delta = Delta(content, calls, self._take_pending(), first_call=len(self.calls))
        self.calls.extend(calls)
        return self._record(delta)
