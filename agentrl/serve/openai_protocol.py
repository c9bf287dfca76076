"""The OpenAI API's request parameters and response pieces, as ``agentrl serve`` implements them.

:func:`parse_params` validates a chat or completions body into :class:`RequestParams` and raises
:class:`ApiError` (OpenAI's error shape, with the offending field as ``param``) on anything it
cannot honour: an unknown field, a value out of range, or a feature this server does not implement
(penalties, ``logit_bias``, ``response_format``, ``echo``, ``suffix``, ``best_of``) - never
silently ignored. vLLM's extensions are accepted: ``top_k``, ``stop_token_ids``,
``skip_special_tokens``, ``return_token_ids``, ``return_tokens_as_token_ids``, ``min_tokens`` (no
EOS, stop token id or stop string ends a choice before it has that many tokens) and ``ignore_eos``
(EOS does not end it; stop token ids and strings still do); agentrl adds ``return_entropy``.

Log-probs are the sampler's: ``log_softmax(logits / T)`` of each token (T = 1 when greedy), the
convention of :mod:`agentrl.rollout.generators.base`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.errors import ConfigError
from agentrl.rollout.generators.base import SamplingParams
from agentrl.serve.textstream import TokenInfo

MAX_N = 16
MAX_TOP_LOGPROBS = 20

_COMMON = {
    "model", "n", "stream", "stream_options", "stop", "stop_token_ids", "seed", "temperature", "top_p",
    "top_k", "max_tokens", "logprobs", "user", "presence_penalty", "frequency_penalty", "logit_bias",
    "return_token_ids", "return_tokens_as_token_ids", "return_entropy", "skip_special_tokens",
    "metadata", "store", "service_tier", "min_tokens", "ignore_eos",
}  # fmt: skip
KNOWN = {
    "chat": _COMMON | {
        "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
        "response_format",
    },
    "completions": _COMMON | {"prompt", "echo", "suffix", "best_of"},
}  # fmt: skip


class ApiError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        kind = "server_error" if self.status >= 500 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class RequestParams:
    """What one request asks for, validated."""

    sampling: SamplingParams
    n: int
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    logprobs: bool
    top_logprobs: int
    skip_special_tokens: bool
    return_token_ids: bool
    return_tokens_as_token_ids: bool
    return_entropy: bool


def _int(
    body: dict[str, Any], key: str, default: int | None, low: int, high: int | None = None
) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{key} must be an integer, got {value!r}", key)
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ApiError(400, f"{key} must be {bounds}, got {value}", key)
    return value


def _float(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(400, f"{key} must be a number, got {value!r}", key)
    if not low <= value <= high:
        raise ApiError(400, f"{key} must be in [{low}, {high}], got {value}", key)
    return float(value)


def _unsupported(body: dict[str, Any], kind: str) -> None:
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise ApiError(
                400, f"{key} is not supported by agentrl serve; leave it at 0 (or use --engine vllm)", key
            )
    if body.get("logit_bias"):
        raise ApiError(400, "logit_bias is not supported by agentrl serve (use --engine vllm)", "logit_bias")
    response_format = body.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise ApiError(
            400,
            "response_format other than text is not supported by agentrl serve (use --engine vllm)",
            "response_format",
        )
    if kind == "completions":
        if body.get("echo"):
            raise ApiError(400, "echo is not supported by agentrl serve", "echo")
        if body.get("suffix"):
            raise ApiError(400, "suffix is not supported by agentrl serve", "suffix")
        best_of = body.get("best_of")
        if best_of is not None and best_of != body.get("n", 1):
            raise ApiError(400, "best_of is not supported by agentrl serve; use n", "best_of")


def parse_params(body: dict[str, Any], kind: str, default_max_tokens: int) -> RequestParams:
    """Validate the sampling-related fields of a ``kind`` ("chat" | "completions") request body."""
    unknown = sorted(set(body) - KNOWN[kind])
    if unknown:
        raise ApiError(400, f"unknown parameter(s) {', '.join(unknown)} for /v1/{kind}", unknown[0])
    _unsupported(body, kind)
    n = _int(body, "n", 1, 1, MAX_N)
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, f"stop must be a non-empty string or a list of them, got {stop!r}", "stop")
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and t >= 0 for t in stop_ids):
        raise ApiError(400, f"stop_token_ids must be a list of token ids, got {stop_ids!r}", "stop_token_ids")
    if kind == "chat":
        logprobs_value = body.get("logprobs")
        if logprobs_value is not None and not isinstance(logprobs_value, bool):
            raise ApiError(
                400, f"logprobs must be true or false for chat, got {logprobs_value!r}", "logprobs"
            )
        logprobs = bool(logprobs_value)
        top = _int(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS) or 0
        if top and not logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    else:
        value = _int(body, "logprobs", None, 0, MAX_TOP_LOGPROBS)
        logprobs, top = value is not None, value or 0
        max_key = "max_tokens"
    max_tokens = _int(body, max_key, default_max_tokens, 1)
    stream = bool(body.get("stream", False))
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict)):
        raise ApiError(400, "stream_options needs stream: true and must be an object", "stream_options")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise ApiError(400, f"ignore_eos must be true or false, got {ignore_eos!r}", "ignore_eos")
    min_tokens = _int(body, "min_tokens", 0, 0) or 0
    if min_tokens > int(max_tokens or default_max_tokens):
        raise ApiError(
            400, f"min_tokens must be <= {max_key} ({max_tokens or default_max_tokens}), got {min_tokens}",
            "min_tokens",
        )  # fmt: skip
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ApiError(400, f"seed must be an integer, got {seed!r}", "seed")
    try:
        sampling = SamplingParams(
            max_new_tokens=int(max_tokens or default_max_tokens),
            temperature=_float(body, "temperature", 1.0, 0.0, 2.0),
            top_p=_float(body, "top_p", 1.0, 0.0, 1.0),
            top_k=max(0, _int(body, "top_k", 0, -1) or 0),
            stop_ids=tuple(stop_ids),
            seed=seed,
            return_entropy=bool(body.get("return_entropy", False)),
            top_logprobs=top,
            min_tokens=min_tokens,
            ignore_eos=ignore_eos,
        )
    except ConfigError as exc:
        raise ApiError(400, str(exc), exc.field.rsplit(".", 1)[-1]) from exc
    return RequestParams(
        sampling=sampling,
        n=int(n or 1),
        stop=stops,
        stream=stream,
        include_usage=bool((options or {}).get("include_usage", False)),
        logprobs=logprobs,
        top_logprobs=top,
        skip_special_tokens=bool(body.get("skip_special_tokens", True)),
        return_token_ids=bool(body.get("return_token_ids", False)),
        return_tokens_as_token_ids=bool(body.get("return_tokens_as_token_ids", False)),
        return_entropy=bool(body.get("return_entropy", False)),
    )


class LogprobFormatter:
    """Turns :class:`TokenInfo` lists into the chat and completions ``logprobs`` objects."""

    def __init__(self, tokenizer: Any, params: RequestParams):
        self.tokenizer = tokenizer
        self.params = params

    def piece(self, token_id: int) -> str:
        if self.params.return_tokens_as_token_ids:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id])

    def chat(self, tokens: list[TokenInfo]) -> dict[str, Any] | None:
        if not self.params.logprobs:
            return None

        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            piece = self.piece(token_id)
            return {"token": piece, "logprob": logprob, "bytes": list(piece.encode("utf-8"))}

        return {
            "content": [
                {**entry(t.id, t.logprob), "top_logprobs": [entry(i, lp) for i, lp in t.top or []]}
                for t in tokens
            ],
            "refusal": None,
        }

    def completion(self, tokens: list[TokenInfo], offset: int = 0) -> dict[str, Any] | None:
        """``offset``: characters of the choice's text before these tokens (``text_offset``)."""
        if not self.params.logprobs:
            return None
        pieces = [self.piece(t.id) for t in tokens]
        offsets = []
        for piece in pieces:
            offsets.append(offset)
            offset += len(piece)
        return {
            "tokens": pieces,
            "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [{self.piece(i): lp for i, lp in t.top or []} for t in tokens]
            if self.params.top_logprobs
            else None,
            "text_offset": offsets,
        }
