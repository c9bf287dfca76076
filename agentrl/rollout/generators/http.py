"""One way every remote generator / agent sends a request: isolated, bounded, and fast to give up.

- Each request has its own timeout (a hard cap over the whole attempt, not only per socket read)
  and, optionally, an episode deadline it never outlives.
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
import random
import threading
import time
from collections.abc import Callable
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
    """Counters for observability and tests (retries sent, requests that failed for good)."""

    def __init__(self) -> None:
        self.requests = 0
        self.retries = 0
        self.failed = 0


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
) -> dict[str, Any]:
    """POST ``body`` and return the JSON answer, retrying this request alone (see module doc).

    Args:
        deadline: ``time.monotonic()`` value no attempt may run past (the episode's end).

    Raises:
        RequestFailed: retries spent, a 4xx answer, invalid JSON, or the circuit is open.
        DeadlineExceeded: the deadline came first.
    """
    stats.requests += 1
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
        timeout = policy.timeout_s
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
            if timeout <= 0:
                raise DeadlineExceeded(f"no time left for a request to {url} (last error: {last or '-'})")
        capped_by_deadline = timeout < policy.timeout_s
        try:
            async with semaphore:
                async with asyncio.timeout(timeout):
                    response = await client.post(
                        url,
                        json=body,
                        timeout=httpx.Timeout(timeout, connect=min(policy.connect_timeout_s, timeout)),
                    )
        except (TimeoutError, httpx.TimeoutException):
            if capped_by_deadline:
                raise DeadlineExceeded(f"the episode deadline passed during a request to {url}") from None
            last = f"{NO_ANSWER} {policy.timeout_s:g}s ({policy.timeout_setting})"
            if not policy.retry_timeouts:
                break
            continue
        except httpx.TransportError as exc:  # connection refused/dropped
            last = f"{type(exc).__name__}: {exc}"
            continue
        if response.status_code in RETRY_STATUS:
            last = f"HTTP {response.status_code}: {response.text[:200]}"
            continue
        if response.status_code >= 400:
            stats.failed += 1
            raise RequestFailed(
                f"{url} answered HTTP {response.status_code}: {response.text[:500]}",
                retryable=False,
                status=response.status_code,
                body=response.text,
            )
        try:
            payload = response.json()
        except ValueError:
            last = f"invalid JSON: {response.text[:200]!r}"
            continue
        if not isinstance(payload, dict):
            last = f"a JSON {type(payload).__name__}, not an object: {response.text[:200]!r}"
            continue
        breaker.record(True)
        return payload
    stats.failed += 1
    breaker.record(False, last)
    if last.startswith(NO_ANSWER) and not policy.retry_timeouts:
        raise RequestFailed(f"{url}: {last}; not retried (a hung request costs one timeout)")
    raise RequestFailed(f"{url} failed after {policy.max_retries + 1} attempts; last error: {last}")
