"""``--agent chat:URL#MODEL``: any chat-completions model (hosted APIs, vLLM, ``agentrl serve`` ...)
as an eval agent, through the same scripted-agent episode path as the oracle (``reset`` / ``act``).

Native tool protocol (default): the env's tool JSON schemas go out as ``tools``; the assistant's
``tool_calls`` become the env's action (one ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``
per call); the env's results go back as ``role: "tool"`` messages, one per call id. A reply with no
tool calls is the action as written (e.g. ``FINAL ANSWER: 42``). Text protocol: no ``tools`` field;
the schemas are appended to the system prompt and the assistant's text is the action, for servers
without native tool calling.

With ``images`` (``--images``), an image attachment goes to the model with the task as an
``image_url`` content part (a data URI), for multimodal models; ``read_file`` still describes it.

Every request runs under the episode's deadline (``--episode-timeout-s``) and its own timeout
(``--request-timeout-s``); a hung request costs its own episode only. Answers are streamed, so the
request timeout is the time without a byte (before the first chunk, or between two): a slow server
that keeps sending is never taken for a hung one (:mod:`agentrl.rollout.generators.chat`).

Request fields are what hosted APIs take (:func:`chat_fields`): only what the user asked for is
sent (no ``temperature`` unless ``--chat-param temperature=0``; ``max_tokens`` only with
``--max-new-tokens``), OpenAI's reasoning models get ``max_completion_tokens`` instead of
``max_tokens`` and no ``temperature``, and ``--chat-param KEY=VALUE`` adds, changes or (``none``)
leaves out any field. A server that refuses a field stops the run at its first episode with the
parameter and the flag to change (:class:`~agentrl.rollout.generators.chat.ParameterRefused`).

The context is bounded like a token agent's: once the conversation reaches
``--max-context-tokens`` (when set; else the ``max_model_len`` the server lists), or the server
answers that it exceeds its context window, the episode ends truncated ("budget hit"), with the
reason in its transcript, never as a crash.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.actions import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, format_tool_call
from agentrl.env import Task
from agentrl.errors import ConfigError, EpisodeError
from agentrl.eval.model_agent import EVAL_ROLLOUT
from agentrl.rollout.agent import OutOfBudget
from agentrl.rollout.generators.chat import ChatClient, ChatReply, ContextWindowExceeded
from agentrl.rollout.generators.http import DeadlineExceeded

PROTOCOLS = ("native", "text")
#: OpenAI's reasoning models: no temperature, max_completion_tokens instead of max_tokens
REASONING_MODELS = re.compile(r"^(o\d|gpt-5)", re.IGNORECASE)
_NOT_PARAMS = ("model", "messages", "tools")


def parse_chat_params(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` items: VALUE as JSON when it parses (else a string); ``none``/``null`` is
    ``None`` (leave the field out); ``extra_body`` must be a JSON object."""
    params: dict[str, Any] = {}
    for item in items:
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ConfigError(
                "--chat-param", f"{item!r} is not KEY=VALUE", "e.g. --chat-param reasoning_effort=low"
            )
        if key in _NOT_PARAMS:
            raise ConfigError("--chat-param", f"{key} is not a parameter", "the agent sends it itself")
        raw = raw.strip()
        if raw.lower() in ("none", "null", ""):
            value: Any = None
        else:
            try:
                value = json.loads(raw)
            except json.JSONDecodeError:
                value = raw
        if key == "extra_body" and not isinstance(value, dict):
            raise ConfigError("--chat-param", f"extra_body must be a JSON object, got {raw!r}",
                              'e.g. --chat-param \'extra_body={"top_k": 20}\'')  # fmt: skip
        params[key] = value
    return params


def chat_fields(model: str, settings: Any) -> tuple[dict[str, Any], list[str]]:
    """The request fields a chat agent sends besides the conversation, and why (printed at start).

    Only what was asked for: ``max_tokens`` with ``--max-new-tokens`` (``max_completion_tokens``
    for OpenAI's reasoning models, or when ``--chat-param max_completion_tokens=...`` is given);
    no temperature unless given (the server's default applies); then ``--chat-param`` items, which
    win (``KEY=none`` leaves KEY out), and ``extra_body``'s fields on top."""
    reasoning = bool(REASONING_MODELS.match(model.rsplit("/", 1)[-1]))
    params = parse_chat_params(settings.chat_params)
    extra = params.pop("extra_body", None) or {}
    fields: dict[str, Any] = {}
    notes: list[str] = []
    if settings.explicit("max_new_tokens"):
        key = "max_completion_tokens" if reasoning or "max_completion_tokens" in params else "max_tokens"
        fields[key] = settings.max_new_tokens
        notes.append(
            f"{key}={settings.max_new_tokens} (--max-new-tokens"
            + (", a reasoning model)" if reasoning else ")")
        )
    if "temperature" not in params and "temperature" not in extra:
        notes.append(
            "temperature not sent: the server's default applies (--chat-param temperature=0 for greedy)"
        )
    for key, value in {**params, **extra}.items():
        if value is None:
            fields.pop(key, None)
            notes.append(f"{key} left out (--chat-param {key}=none)")
        else:
            fields[key] = value
            notes.append(f"{key}={json.dumps(value)} (--chat-param)")
    return fields, notes


SEE_FIRST = "(the results of this turn's tool calls are in the first tool message)"


def action_from_reply(message: dict[str, Any]) -> str:
    """The env action for an assistant message: its tool calls in the env's Hermes format, else its text."""
    calls = message.get("tool_calls") or []
    if not calls:
        return str(message.get("content") or "")
    blocks = []
    for call in calls:
        function = call.get("function") or {}
        name = str(function.get("name", ""))
        raw = function.get("arguments")
        try:
            arguments = raw if isinstance(raw, dict) else json.loads(str(raw or "{}"))
        except json.JSONDecodeError:
            arguments = None
        if isinstance(arguments, dict):
            blocks.append(format_tool_call(name, arguments))
        else:  # left as sent: the env reports the malformed arguments to the model
            blocks.append(
                f'{TOOL_CALL_OPEN}{{"name": {json.dumps(name)}, "arguments": {raw}}}{TOOL_CALL_CLOSE}'
            )
    return "\n".join(blocks)


def split_observation(observation: str, names: list[str]) -> list[str] | None:
    """The env's combined observation of several calls (``[name] result`` blocks joined by blank
    lines) cut back into one result per call; ``None`` when it is not in that shape."""
    if len(names) == 1:
        return [observation]
    starts: list[int] = []
    position = 0
    for name in names:
        head = f"[{name}] "
        at = observation.find(head, position) if not starts else observation.find("\n\n" + head, position)
        if at < 0:
            return None
        at += 2 if starts else 0
        starts.append(at)
        position = at + len(head)
    ends = [s - 2 for s in starts[1:]] + [len(observation)]
    parts = [observation[s + len(n) + 3 : e] for s, e, n in zip(starts, ends, names, strict=True)]
    preface = observation[: starts[0]].strip()
    if preface:
        parts[0] = f"{preface}\n\n{parts[0]}"
    return parts


def image_data_uri(path: str) -> str | None:
    """``data:image/...;base64,...`` of an image file, or ``None`` (not an image, absent, LFS pointer)."""
    import base64
    import mimetypes
    from pathlib import Path

    from agentrl.tools.files import IMAGE_SUFFIXES, is_lfs_pointer

    file = Path(path)
    if not path or file.suffix.lower() not in IMAGE_SUFFIXES or not file.is_file() or is_lfs_pointer(file):
        return None
    mime = mimetypes.guess_type(file.name)[0] or "image/png"
    return f"data:{mime};base64,{base64.b64encode(file.read_bytes()).decode('ascii')}"


def text_protocol_system(system_prompt: str, tools: list[dict[str, Any]]) -> str:
    """The system prompt with the tool schemas written out (text protocol)."""
    if not tools:
        return system_prompt
    schemas = "\n".join(json.dumps(t.get("function", t)) for t in tools)
    return f"{system_prompt}\n\nTools (JSON schemas):\n{schemas}"


class ChatAgent:
    """One episode's conversation with a chat model (see the module doc).

    Args:
        client: the shared :class:`ChatClient` (one connection pool for all episodes).
        system_prompt: the env's system prompt.
        tools: the env's tool schemas, or a function returning them (read at each reset).
        protocol: ``native`` or ``text``.
        episode_timeout_s: wall-clock budget of the whole episode, from ``reset``.
        timeout_setting: the setting that sets ``episode_timeout_s`` (named in the error).
        transcripts: where to keep the conversation (``{"episode_id", "task_id", "messages"}``;
            ``messages`` are exactly what was sent and received, with per-turn usage and latency).
        episode_id: this episode's id in ``transcripts``.
        images: send the task's image attachment (payload ``file_path``) with the task.
        max_context_tokens: end the episode (truncated) once the last turn's prompt + completion
            tokens (the server's usage) reach this; None: only the server's own limit.
        context_setting: where ``max_context_tokens`` came from (named in the truncation reason).
    """

    def __init__(
        self,
        client: ChatClient,
        *,
        system_prompt: str,
        tools: list[dict[str, Any]] | Callable[[], list[dict[str, Any]]],
        protocol: str = "native",
        episode_timeout_s: float = EVAL_ROLLOUT.episode_timeout_s,
        timeout_setting: str = "--episode-timeout-s",
        transcripts: list[dict[str, Any]] | None = None,
        episode_id: str = "",
        images: bool = False,
        max_context_tokens: int | None = None,
        context_setting: str = "--max-context-tokens",
    ):
        if protocol not in PROTOCOLS:
            raise ConfigError("tool_protocol", f"{protocol!r} is not a tool protocol", "use native or text")
        self.client = client
        self.system_prompt = system_prompt
        self._tools_source = tools
        self.protocol = protocol
        self.episode_timeout_s = episode_timeout_s
        self.timeout_setting = timeout_setting
        self.tools: list[dict[str, Any]] = []
        self.messages: list[dict[str, Any]] = []
        self.deadline = 0.0
        self.last_turn: dict[str, float] = {}
        self._pending_calls: list[dict[str, Any]] = []
        self.transcripts = transcripts
        self.episode_id = episode_id
        self.images = images
        self.max_context_tokens = max_context_tokens
        self.context_setting = context_setting
        self._image: str | None = None  # data URI of this task's image attachment
        self._transcript: dict[str, Any] | None = None

    def reset(self, task: Task) -> None:
        self.tools = list(self._tools_source() if callable(self._tools_source) else self._tools_source)
        system = self.system_prompt
        if self.protocol == "text":
            system = text_protocol_system(system, self.tools)
        self.messages = [{"role": "system", "content": system}]
        self.deadline = time.monotonic() + self.episode_timeout_s
        self._pending_calls = []
        self.last_turn = {}
        self._image = image_data_uri(task.payload.get("file_path") or "") if self.images else None
        self._transcript = {"episode_id": self.episode_id, "task_id": task.id, "messages": self.messages}
        if self.transcripts is not None:  # the list object grows as the episode goes on
            self.transcripts.append(self._transcript)

    def _add_observation(self, observation: str) -> None:
        calls, self._pending_calls = self._pending_calls, []
        if not calls:
            content: Any = observation
            if self._image is not None and len(self.messages) == 1:  # the task: text + its image
                content = [
                    {"type": "text", "text": observation},
                    {"type": "image_url", "image_url": {"url": self._image}},
                ]
            self.messages.append({"role": "user", "content": content})
            return
        names = [str((c.get("function") or {}).get("name", "")) for c in calls]
        parts = split_observation(observation, names) or [observation] + [SEE_FIRST] * (len(calls) - 1)
        for call, part in zip(calls, parts, strict=True):
            self.messages.append({"role": "tool", "tool_call_id": str(call.get("id", "")), "content": part})

    def _timeout(self) -> EpisodeError:
        return EpisodeError(f"episode timeout after {self.episode_timeout_s:g}s ({self.timeout_setting})")

    def _out_of_budget(self, reason: str) -> OutOfBudget:
        if self._transcript is not None:
            self._transcript["truncation"] = reason
        return OutOfBudget(reason)

    def act(self, observation: str) -> str:
        self._add_observation(observation)
        if time.monotonic() >= self.deadline:
            raise self._timeout()
        used = self.last_turn.get("prompt_tokens", 0) + self.last_turn.get("completion_tokens", 0)
        if self.max_context_tokens is not None and used >= self.max_context_tokens:
            raise self._out_of_budget(
                f"context budget ({self.context_setting} {self.max_context_tokens}: the last turn used {used:.0f} tokens)"
            )
        tools = self.tools if self.protocol == "native" else None
        try:
            sent = [{k: v for k, v in m.items() if k != "usage"} for m in self.messages]
            reply: ChatReply = self.client.chat(sent, tools, deadline=self.deadline)
        except DeadlineExceeded as exc:
            raise EpisodeError(f"{self._timeout()}: {exc}") from None
        except ContextWindowExceeded as exc:
            raise self._out_of_budget(f"context budget (the server's context window: {exc})") from None
        # content "" rather than null: some servers' chat templates cannot render a null content
        message = {"role": "assistant", "content": reply.message.get("content") or ""}
        if self.protocol == "native" and reply.message.get("tool_calls"):
            message["tool_calls"] = list(reply.message["tool_calls"])
            self._pending_calls = message["tool_calls"]
        self.last_turn = {"latency_s": reply.latency_s, **reply.usage}
        if reply.first_chunk_s is not None:  # streamed: the wait for the first byte of the answer
            self.last_turn["first_chunk_s"] = reply.first_chunk_s
        self.messages.append({**message, "usage": self.last_turn})  # "usage" is stripped when sent
        return action_from_reply(message) if self.protocol == "native" else str(message["content"] or "")


def build_chat_client(spec: Any, settings: Any, *, concurrency: int, k: int) -> ChatClient:
    """The shared client of a ``chat:`` agent spec under the resolved eval settings: the model the
    server lists (:func:`~agentrl.rollout.generators.openai.pick_served_model`: one naming rule for
    served adapters), its context window (``max_model_len``) and the request fields of
    :func:`chat_fields`, printed."""
    import os

    from agentrl.rollout.generators.http import RequestPolicy
    from agentrl.rollout.generators.openai import list_models, pick_served_model

    key = os.environ.get(settings.api_key_env) or None
    if key is None and settings.explicit("api_key_env"):
        raise ConfigError(
            settings.setting("api_key_env"),
            f"environment variable {settings.api_key_env} is not set",
            f"export {settings.api_key_env}=<your key>, or leave --api-key-env out for a server without keys",
        )
    try:
        cards = list_models(spec.url, api_key=key)
    except ConfigError:
        if not spec.model:
            raise
        cards = []  # a server that lists nothing may still answer chat requests
    card = pick_served_model(cards, spec.model or None, spec.url)
    if card is None and not spec.model:
        raise ConfigError("agent", f"{spec.url} serves no model", "name it explicitly: chat:URL#model")
    model = spec.model or str(card["id"])  # type: ignore[index]
    fields, notes = chat_fields(model, settings)
    print(f"[eval] chat requests to {model!r}: " + "; ".join(notes), file=sys.stderr)
    policy = RequestPolicy(
        timeout_s=settings.request_timeout_s,
        max_retries=settings.max_retries,
        timeout_setting=settings.setting("request_timeout_s"),
    )
    client = ChatClient(spec.url, model, api_key=key, policy=policy, concurrency=concurrency, sampling=fields)
    print(f"[eval] request timeout: {client.timeout_meaning()}", file=sys.stderr)
    window = (card or {}).get("max_model_len")
    client.context_window = int(window) if isinstance(window, int) else None
    return client


def context_bound(client: ChatClient, settings: Any) -> tuple[int | None, str]:
    """What ends a chat episode for its context: ``--max-context-tokens`` when set, else the
    server's listed ``max_model_len`` (None: only the server's answer), and where it came from."""
    if settings.explicit("max_context_tokens"):
        return settings.max_context_tokens, settings.setting("max_context_tokens").split(" or ")[0]
    return client.context_window, "the server's max_model_len"


def chat_requests(client: ChatClient, settings: Any) -> dict[str, Any]:
    """What a chat agent's requests were, as resolved (saved in ``metrics.json`` as ``chat``; the
    report shows it): the model sent, the request fields besides the conversation, the context bound."""
    bound, where = context_bound(client, settings)
    return {
        "model": client.model,
        "fields": dict(client.sampling),
        "context_bound": bound,
        "context_bound_from": where
        if bound is not None
        else "the server's answer (it lists no max_model_len)",
    }


def chat_factory(
    client: ChatClient, settings: Any, transcripts: list[dict[str, Any]] | None = None
) -> Callable[[Any, Any], ChatAgent]:
    """``make_agent(env, job)`` for the scripted-agent runner: one :class:`ChatAgent` per episode,
    its context bounded by ``--max-context-tokens`` when set, else by the server's listed window."""
    budget, where = context_bound(client, settings)
    return lambda env, job: ChatAgent(
        client,
        system_prompt=env.unwrapped.system_prompt,
        tools=lambda: env.unwrapped.tools,
        protocol=settings.tool_protocol,
        episode_timeout_s=settings.episode_timeout_s,
        timeout_setting=settings.setting("episode_timeout_s"),
        transcripts=transcripts,
        episode_id=f"{job.task.id}#{job.sample}",
        images=settings.images,
        max_context_tokens=budget,
        context_setting=where,
    )
