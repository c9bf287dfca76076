"""One way every remote generator / agent sends a request: isolated, bounded, and fast to give up.

- Each request has its own timeout and, optionally, an episode deadline it never outlives. A
  streamed request (``stream: true``, read chunk by chunk) gives up after the timeout *without a
  byte* (before the first chunk or between two), so a slow server that keeps producing tokens is
  never taken for a hung one; a request answered in one piece gives up after the timeout in all.
- Transport errors, 429 and 5xx answers are retried *for that request only*, with jittered
  exponential backoff, at most ``max_retries`` times; a 4xx answer fails at once. A request that
  got no answer within its timeout is not retried unless ``retry_timeouts`` (a server that hangs
  on a request usually hangs on it again: one hang should cost one timeout, not ``max_retries + 1``).
- A semaphore caps requests in flight; a request waiting out its backoff holds no slot.
- A :class:`CircuitBreaker` shared by all requests to one server opens after ``breaker_failures``
  requests in a row have failed for good (retries spent) with no success in between: later
  requests then fail at once with one clear message instead of each waiting out its retries, so a
  server that is down costs seconds, not (tasks x retries x backoff). After a cooldown one request
  probes the server again.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from agentrl.errors import GeneratorError

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
#: how a request that never answered is described (eval does not replay such episodes: see runner)
NO_ANSWER = "no answer within"


@dataclass(frozen=True)
class RequestPolicy:
    """Timeouts, retries and the circuit breaker of remote requests.

    ``timeout_setting`` is the name of the setting the user changes to raise ``timeout_s`` where
    they are (``--request-timeout-s`` in eval; training's openai backend leaves the default, which
    has no setting); error messages name it.
    """

    timeout_s: float = 120.0
    connect_timeout_s: float = 10.0
    max_retries: int = 2
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    breaker_failures: int = 8
    timeout_setting: str = "timeout_s"
    retry_timeouts: bool = False

    def backoff(self, attempt: int) -> float:
        """Seconds before retry ``attempt`` (1-based): exponential, capped, with +-25% jitter."""
        base = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        return base * (0.75 + 0.5 * random.random())


class RequestFailed(GeneratorError):
    """A request failed for good; ``retryable`` says whether the last cause was a transient one;
    ``status`` and ``body``: the server's answer when it answered with an error (4xx)."""

    def __init__(self, message: str, retryable: bool = True, status: int | None = None, body: str = ""):
        super().__init__(message)
        self.retryable = retryable
        self.status = status
        self.body = body


class DeadlineExceeded(GeneratorError):
    """The episode deadline passed while a request was in flight or waiting to retry."""


class CircuitBreaker:
    """Counts requests that failed for good in a row; opens at ``threshold`` (thread-safe).

    While open, requests fail at once; after ``cooldown_s`` one request at a time may probe the
    server again (a success closes the breaker, a failure keeps it open for another cooldown), so
    a long run survives a server restart.
    """

    def __init__(self, threshold: int, cooldown_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.failures = 0
        self.last_error = ""
        self.opened_at: float | None = None
        self._lock = threading.Lock()

    @property
    def opened(self) -> bool:
        return self.opened_at is not None

    def check(self, url: str) -> None:
        with self._lock:
            if self.opened_at is None:
                return
            if self.clock() - self.opened_at >= self.cooldown_s:
                self.opened_at = self.clock()  # this request probes; the others keep failing fast
                return
        raise RequestFailed(
            f"{url} is failing: the last {self.failures} requests all failed after their retries "
            f"(last error: {self.last_error}); not sending more for now. Check that the server runs "
            "and answers, then run again",
            retryable=False,
        )

    def record(self, ok: bool, error: str = "") -> None:
        with self._lock:
            if ok:
                self.failures, self.opened_at = 0, None
                return
            self.failures += 1
            self.last_error = error
            if self.threshold > 0 and self.failures >= self.threshold:
                self.opened_at = self.clock()


class RequestStats:
    """Counters for observability and tests (retries sent, requests that failed for good, streamed
    requests the server answered in one piece)."""

    def __init__(self) -> None:
        self.requests = 0
        self.retries = 0
        self.failed = 0
        self.not_streamed = 0


@dataclass
class StreamProgress:
    """What one streamed request has received so far (read by the caller after the request):
    events, and when the first one came (seconds from the request's start)."""

    events: int = 0
    first_event_s: float | None = None
    done: bool = False  # the stream's ``data: [DONE]`` came
    _t0: float = 0.0


class _StreamError(Exception):
    """The stream held something that is not a chunk (invalid JSON); retried as an invalid answer."""


def _stream_error(url: str, text: str, error: Any) -> RequestFailed:
    """An error event in the stream (vLLM, ``agentrl serve``: ``data: {"error": {...}}``) as the
    HTTP error the server would have answered before streaming: the same message and status."""
    status = 400
    if isinstance(error, dict):
        code = error.get("code")
        if isinstance(code, int) and 400 <= code < 600:
            status = code
        elif error.get("type") == "server_error":
            status = 500
    return RequestFailed(
        f"{url} answered HTTP {status} in its stream: {text[:500]}", retryable=False, status=status, body=text
    )


async def _events(
    response: httpx.Response, url: str, progress: StreamProgress
) -> AsyncIterator[dict[str, Any]]:
    """The JSON chunks of a server-sent-events answer, up to ``data: [DONE]`` (comments and other
    fields skipped; a ``data:`` field spread over several lines joined)."""
    data: list[str] = []

    def event() -> dict[str, Any] | None:
        text = "\n".join(data)
        data.clear()
        if text.strip() == "[DONE]":
            progress.done = True
            return None
        try:
            chunk = json.loads(text)
        except ValueError:
            raise _StreamError(f"invalid JSON in the stream: {text[:200]!r}") from None
        if not isinstance(chunk, dict):
            raise _StreamError(f"a JSON {type(chunk).__name__} in the stream, not an object: {text[:200]!r}")
        if chunk.get("error") is not None:
            raise _stream_error(url, text, chunk["error"])
        return chunk

    async for line in response.aiter_lines():
        if progress.first_event_s is None:
            progress.first_event_s = time.monotonic() - progress._t0
        if line.startswith("data:"):
            data.append(line[6:] if line.startswith("data: ") else line[5:])
            continue
        if line.strip() or not data:  # a comment, an event/id field, or a blank line between events
            continue
        chunk = event()
        if progress.done:
            return
        if chunk is not None:
            progress.events += 1
            yield chunk
    if data:  # the last event had no blank line after it
        chunk = event()
        if chunk is not None:
            progress.events += 1
            yield chunk


@dataclass
class _Answer:
    status: int
    text: str = ""
    payload: dict[str, Any] | None = None  # the joined stream


async def _exchange(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    timeout: httpx.Timeout,
    join: Callable[[list[dict[str, Any]]], dict[str, Any]] | None,
    progress: StreamProgress,
    stats: RequestStats,
) -> _Answer:
    """One attempt: the status and text of a plain answer, or the joined chunks of a streamed one."""
    progress.events, progress.first_event_s, progress.done = 0, None, False
    progress._t0 = time.monotonic()
    async with client.stream("POST", url, json=body, timeout=timeout) as response:
        kind = response.headers.get("content-type", "")
        if join is None or response.status_code != 200 or not kind.startswith("text/event-stream"):
            await response.aread()
            if join is not None and response.status_code == 200:
                stats.not_streamed += 1  # a server that does not stream answers in one piece
            return _Answer(response.status_code, response.text)
        return _Answer(200, payload=join([chunk async for chunk in _events(response, url, progress)]))


async def post_json(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    *,
    policy: RequestPolicy,
    semaphore: asyncio.Semaphore,
    breaker: CircuitBreaker,
    stats: RequestStats,
    deadline: float | None = None,
    join: Callable[[list[dict[str, Any]]], dict[str, Any]] | None = None,
    progress: StreamProgress | None = None,
) -> dict[str, Any]:
    """POST ``body`` and return the JSON answer, retrying this request alone (see module doc).

    With ``join`` (``body`` asks for ``stream: true``), a server-sent-events answer is read chunk by
    chunk and ``join(chunks)`` is the answer (a server that answers in one piece is read as such).
    The request timeout then bounds the time *without a byte* (before the first, and between two),
    not the whole answer: a server that produces tokens slowly is never taken for a hung one, and
    only the deadline bounds the whole. Without ``join`` the timeout bounds the whole attempt.

    Args:
        deadline: ``time.monotonic()`` value no attempt may run past (the episode's end).
        progress: filled with what the stream delivered (events, time to the first).

    Raises:
        RequestFailed: retries spent, a 4xx answer, invalid JSON, an error in the stream, or the
            circuit is open.
        DeadlineExceeded: the deadline came first.
    """
    stats.requests += 1
    progress = progress if progress is not None else StreamProgress()
    last = ""
    for attempt in range(policy.max_retries + 1):
        breaker.check(url)
        if attempt:
            stats.retries += 1
            pause = policy.backoff(attempt)
            if deadline is not None and time.monotonic() + pause >= deadline:
                raise DeadlineExceeded(f"no time left to retry {url} (last error: {last})")
            await asyncio.sleep(pause)
            breaker.check(url)
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise DeadlineExceeded(f"no time left for a request to {url} (last error: {last or '-'})")
        idle = policy.timeout_s if left is None else min(policy.timeout_s, left)
        # streamed: the deadline bounds the whole answer, the request timeout each silence
        total = left if join is not None else idle
        try:
            async with semaphore:
                async with asyncio.timeout(total):
                    answer = await _exchange(
                        client,
                        url,
                        body,
                        httpx.Timeout(idle, connect=min(policy.connect_timeout_s, idle)),
                        join,
                        progress,
                        stats,
                    )
        except (TimeoutError, httpx.TimeoutException) as exc:
            silence = isinstance(exc, httpx.TimeoutException)
            if (not silence and join is not None) or idle < policy.timeout_s:
                raise DeadlineExceeded(f"the episode deadline passed during a request to {url}") from None
            last = f"{NO_ANSWER} {policy.timeout_s:g}s ({policy.timeout_setting})"
            if progress.events:
                last += (
                    f": the stream stopped after {progress.events} chunk(s) and nothing came for "
                    f"{policy.timeout_s:g}s"
                )
            elif join is not None:
                last += f": nothing came for {policy.timeout_s:g}s"
            if not policy.retry_timeouts:
                break
            continue
        except httpx.TransportError as exc:  # connection refused/dropped (also mid-stream)
            last = f"{type(exc).__name__}: {exc}"
            continue
        except _StreamError as exc:
            last = str(exc)
            continue
        except RequestFailed:  # an error event in the stream: the server's answer, not retried
            stats.failed += 1
            raise
        if answer.payload is not None:
            breaker.record(True)
            return answer.payload
        if answer.status in RETRY_STATUS:
            last = f"HTTP {answer.status}: {answer.text[:200]}"
            continue
        if answer.status >= 400:
            stats.failed += 1
            raise RequestFailed(
                f"{url} answered HTTP {answer.status}: {answer.text[:500]}",
                retryable=False,
                status=answer.status,
                body=answer.text,
            )
        try:
            payload = json.loads(answer.text)
        except ValueError:
            last = f"invalid JSON: {answer.text[:200]!r}"
            continue
        if not isinstance(payload, dict):
            last = f"a JSON {type(payload).__name__}, not an object: {answer.text[:200]!r}"
            continue
        breaker.record(True)
        return payload
    stats.failed += 1
    breaker.record(False, last)
    if last.startswith(NO_ANSWER) and not policy.retry_timeouts:
        raise RequestFailed(f"{url}: {last}; not retried (a hung request costs one timeout)")
    raise RequestFailed(f"{url} failed after {policy.max_retries + 1} attempts; last error: {last}")
