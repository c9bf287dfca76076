"""Client of any OpenAI-compatible ``/v1/chat/completions`` server (hosted APIs, vLLM, SGLang,
llama.cpp, Ollama, ``agentrl serve``): messages in, one assistant message out, no tokenizer.

Requests go through :func:`agentrl.rollout.generators.http.post_json` (per-request timeout,
per-request retries with jittered backoff, concurrency cap, circuit breaker). They are streamed
(``stream: true``, ``stream_options.include_usage``) and the chunks joined into one message
(:func:`join_chunks`), so the request timeout bounds the time without a byte, not the whole answer:
a slow server that keeps producing tokens is never taken for a hung one. A server that does not
stream (it answers in one piece, or refuses ``stream``/``stream_options``) is served as it is, with a
note; the request timeout then bounds each whole answer. The client owns one
event loop in a daemon thread, so synchronous callers on many worker threads share one connection
pool and one concurrency cap: :meth:`ChatClient.chat` is thread-safe.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import httpx

from agentrl.errors import GeneratorError
from agentrl.rollout.generators.http import (
    CircuitBreaker,
    DeadlineExceeded,
    RequestFailed,
    RequestPolicy,
    RequestStats,
    StreamProgress,
    post_json,
)

#: body fields that are the conversation, not parameters a server could refuse
_CONVERSATION = frozenset({"model", "messages", "tools"})
_CONTEXT_WORDS = re.compile(
    r"context[ _]length|context window|maximum context|too many tokens|prompt is too long|"
    r"exceeds the model's \d+ positions",
    re.IGNORECASE,
)


class ContextWindowExceeded(RequestFailed):
    """The server answered that the conversation no longer fits the model's context window."""


class ParameterRefused(RequestFailed):
    """The server refuses one of the parameters sent (a reasoning model and ``temperature``, or
    ``max_tokens``); every later request would be refused the same way, so the client stops."""

    def __init__(self, message: str, param: str):
        super().__init__(message, retryable=False)
        self.param = param


def server_error(body: str) -> tuple[str, str | None, str | None]:
    """``(message, param, code)`` of an error answer in OpenAI's shape (else the text itself)."""
    try:
        payload = json.loads(body)
    except ValueError:
        return body.strip()[:500], None, None
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or body)[:500], error.get("param"), error.get("code")
    if isinstance(error, str):
        return error[:500], None, None
    return body.strip()[:500], None, None


def _fix(param: str) -> str:
    if param == "max_tokens":
        return (
            "send the limit as max_completion_tokens instead: --chat-param max_completion_tokens=N "
            "(max_tokens is then left out), or leave --max-new-tokens out"
        )
    return f"leave it out with --chat-param {param}=none, or send another value: --chat-param {param}=VALUE"


def classify_refusal(exc: RequestFailed, body: dict[str, Any]) -> RequestFailed:
    """A 400 answer read as what the user can act on: the context window is full
    (:class:`ContextWindowExceeded`), a parameter is refused (:class:`ParameterRefused`, naming the
    parameter and the flag), or ``exc`` as it was."""
    if exc.status is None or not 400 <= exc.status < 500 or exc.status in (401, 403, 404, 429):
        return exc
    message, param, code = server_error(exc.body)
    if code == "context_length_exceeded" or _CONTEXT_WORDS.search(message):
        return ContextWindowExceeded(f"the conversation exceeds the server's context window: {message}",
                                     retryable=False, status=exc.status, body=exc.body)  # fmt: skip
    sent = [key for key in body if key not in _CONVERSATION]
    if param not in sent:
        param = next((key for key in sent if re.search(rf"\b{re.escape(key)}\b", message)), None)
    if param is None:
        return exc
    return ParameterRefused(
        f"the chat server refuses the parameter {param}={json.dumps(body[param])}: {message} "
        f"(fix: {_fix(param)})",
        param,
    )


@dataclass
class ChatReply:
    """One assistant message and what it cost."""

    message: dict[str, Any]  # role, content, tool_calls (as the server sent them)
    finish_reason: str | None
    usage: dict[str, float] = field(default_factory=dict)  # prompt_tokens, completion_tokens, ...
    latency_s: float = 0.0
    first_chunk_s: float | None = None  # streamed: seconds to the first byte of the answer


def parse_reply(payload: dict[str, Any], latency_s: float) -> ChatReply:
    """The first choice of a chat-completions answer; a clear error for anything else."""
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise GeneratorError(f"the chat server answered without choices: {str(payload)[:300]}")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise GeneratorError(f"the chat server's choice has no message: {str(choices[0])[:300]}")
    usage = {k: float(v) for k, v in (payload.get("usage") or {}).items() if isinstance(v, int | float)}
    return ChatReply(dict(message), choices[0].get("finish_reason"), usage, latency_s)


def _merge_calls(calls: list[dict[str, Any]], deltas: list[Any]) -> None:
    """Add streamed tool-call deltas to ``calls`` (by ``index``: the id, type and name as they first
    come, the arguments' text appended)."""
    for delta in deltas:
        if not isinstance(delta, dict):
            continue
        index = delta.get("index", len(calls))
        index = index if isinstance(index, int) and index >= 0 else len(calls)
        while len(calls) <= index:
            calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        call = calls[index]
        for key in ("id", "type"):
            if delta.get(key):
                call[key] = delta[key]
        function = delta.get("function") or {}
        if function.get("name") and function["name"] != call["function"]["name"]:
            call["function"]["name"] += function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, dict):  # some servers send the arguments whole, as an object
            arguments = json.dumps(arguments)
        if arguments:
            call["function"]["arguments"] += arguments


def join_chunks(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Streamed ``chat.completion.chunk`` s joined into the ``chat.completion`` a server answers in
    one piece: choice 0's message (content and any other text field appended, tool calls merged by
    index), its finish reason and log-probs, and the usage chunk's usage."""
    message: dict[str, Any] = {"role": "assistant"}
    calls: list[dict[str, Any]] = []
    finish: str | None = None
    logprobs: list[Any] = []
    usage: dict[str, Any] | None = None
    seen = False
    for chunk in chunks:
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            seen = True
            for key, value in (choice.get("delta") or {}).items():
                if key == "tool_calls" and isinstance(value, list):
                    _merge_calls(calls, value)
                elif key == "role" and value:
                    message["role"] = value
                elif isinstance(value, str):
                    message[key] = message.get(key, "") + value
                elif value is not None:
                    message[key] = value
            finish = choice.get("finish_reason") or finish
            content = (choice.get("logprobs") or {}).get("content")
            if isinstance(content, list):
                logprobs.extend(content)
    if not seen:
        return {"chunks": chunks[:3]}  # parse_reply names what came instead of choices
    message.setdefault("content", None)
    if calls:
        message["tool_calls"] = calls
    choice = {"index": 0, "message": message, "finish_reason": finish,
              "logprobs": {"content": logprobs} if logprobs else None}  # fmt: skip
    return {"object": "chat.completion", "choices": [choice], "usage": usage}


def _about_stream(exc: RequestFailed) -> str | None:
    """``stream_options`` or ``stream`` when a 4xx answer refuses streaming (a server that does not
    stream, or not with usage); None for any other refusal."""
    if exc.status not in (400, 422):
        return None
    message, param, _ = server_error(exc.body)
    for key in ("stream_options", "stream"):
        if param == key or re.search(rf"\b{key}\b", message):
            return key
    return None


class ChatClient:
    """Chat completions over HTTP.

    Args:
        base_url: the ``/v1`` base URL, e.g. ``https://api.openai.com/v1`` or ``http://host:8000/v1``.
        model: the model name the server expects.
        api_key: sent as ``Authorization: Bearer ...`` when given.
        policy: timeouts, retries and the circuit breaker threshold.
        concurrency: requests in flight at most.
        sampling: extra body fields (``temperature``, ``max_tokens``, ``seed`` ...); ``stream``
            there (``--chat-param stream=false``) decides whether requests are streamed.
        stream: stream requests (default; see the module doc).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        policy: RequestPolicy | None = None,
        concurrency: int = 8,
        sampling: dict[str, Any] | None = None,
        stream: bool = True,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.policy = policy or RequestPolicy(timeout_setting="request timeout")
        self.concurrency = max(1, concurrency)
        self.sampling = dict(sampling or {})
        self.stream = bool(self.sampling.pop("stream", stream))  # False once the server refuses it
        self.stream_usage = "stream_options" not in self.sampling  # ask for usage in the stream
        self.notes: list[str] = []  # what was learnt about the server (printed once each)
        self.breaker = CircuitBreaker(self.policy.breaker_failures)
        self.stats = RequestStats()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: httpx.AsyncClient | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self.refused: ParameterRefused | None = None  # once a parameter is refused, nothing more is sent
        self.context_window: int | None = None  # the model's positions, when the server lists them

    def body(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": list(messages), **self.sampling}
        if tools:
            body["tools"] = list(tools)
        if self.stream:
            body["stream"] = True
            if self.stream_usage:
                body["stream_options"] = {"include_usage": True}
        elif "stream_options" in body:
            del body["stream_options"]
        return body

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
            print(f"[chat] note: {self.base_url}: {text}", file=sys.stderr)

    def timeout_meaning(self) -> str:
        """What the request timeout bounds for this client (printed at start)."""
        timeout = f"{self.policy.timeout_s:g} s ({self.policy.timeout_setting})"
        if self.stream:
            return (
                f"answers are streamed: a request gives up when no byte has come for {timeout}, before "
                "the first chunk or between two; a slow server that keeps sending is never taken for a "
                "hung one, and only the episode timeout bounds a whole answer"
            )
        return f"answers are not streamed: a request gives up after {timeout} in all"

    async def achat(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        deadline: float | None = None,
    ) -> ChatReply:
        """One assistant message for ``messages`` (``tools``: OpenAI function schemas)."""
        if self._client is None or self._semaphore is None:
            limits = httpx.Limits(
                max_connections=self.concurrency, max_keepalive_connections=self.concurrency
            )
            self._client = httpx.AsyncClient(headers=self.headers, limits=limits)
            self._semaphore = asyncio.Semaphore(self.concurrency)
        if self.refused is not None:
            raise self.refused
        t0 = time.perf_counter()
        for _ in range(3):  # at most: without stream_options, then without stream
            body = self.body(messages, tools)
            progress = StreamProgress()
            try:
                payload = await post_json(
                    self._client,
                    f"{self.base_url}/chat/completions",
                    body,
                    policy=self.policy,
                    semaphore=self._semaphore,
                    breaker=self.breaker,
                    stats=self.stats,
                    deadline=deadline,
                    join=join_chunks if body.get("stream") else None,
                    progress=progress,
                )
            except RequestFailed as exc:
                refused = _about_stream(exc) if body.get("stream") else None
                if refused == "stream_options" and "stream_options" in body:
                    self.stream_usage = False
                    self._note("it refuses stream_options; streaming without usage in the stream")
                    continue
                if refused is not None:
                    self.stream = False
                    self._note(
                        f"it refuses stream ({server_error(exc.body)[0][:200]}); not streaming: the "
                        f"request timeout ({self.policy.timeout_s:g} s) now bounds each whole answer"
                    )
                    continue
                refusal = classify_refusal(exc, body)
                if isinstance(refusal, ParameterRefused):
                    self.refused = refusal
                if refusal is exc:
                    raise
                raise refusal from None
            break
        if body.get("stream") and self.stats.not_streamed:
            self._note(
                "it answered a streamed request in one piece (it does not stream): the request "
                f"timeout ({self.policy.timeout_s:g} s) bounds each whole answer"
            )
        elif body.get("stream") and not payload.get("usage"):
            self._note("its stream holds no usage (token counts): turns are recorded without them")
        reply = parse_reply(payload, time.perf_counter() - t0)
        reply.first_chunk_s = progress.first_event_s if progress.events else None
        return reply

    def chat(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        deadline: float | None = None,
    ) -> ChatReply:
        """Blocking form of :meth:`achat`, safe to call from many threads at once."""
        future: Future[ChatReply] = asyncio.run_coroutine_threadsafe(
            self.achat(messages, tools, deadline=deadline), self._ensure_loop()
        )
        # the coroutine enforces the deadline itself; this wait is a backstop, never the first limit
        wait = None if deadline is None else max(0.0, deadline - time.monotonic()) + 5.0
        try:
            return future.result(timeout=wait)
        except FutureTimeout:
            future.cancel()
            raise DeadlineExceeded(f"the episode deadline passed waiting for {self.base_url}") from None

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name="agentrl-chat", daemon=True)
                self._thread.start()
                self._loop = loop
            return self._loop

    def close(self) -> None:
        """Close the connection pool and stop the loop thread (the client can start again later)."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None:
            return

        async def shutdown() -> None:
            if self._client is not None:
                await self._client.aclose()
            self._client, self._semaphore = None, None

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        loop.close()
