"""A chat completions request → prompt ids, through the model's own chat template.

Tools go to ``apply_chat_template(tools=...)`` when the template renders them (Qwen, Llama 3, ...),
else into the system prompt as the Hermes block of :func:`agentrl.rollout.template.tools_system_block`
- exactly as :class:`agentrl.rollout.template.ChatFormat` renders prompts for rollouts, so a trained
agent sees the prompt it was trained on. Earlier assistant ``tool_calls`` and ``role: "tool"``
results are passed to templates that render them; for the others they become the Hermes
``<tool_call>`` text the model writes and observation messages in the rollouts' observation role.

``tool_choice``: ``none`` renders the tools but parses no calls; ``auto`` parses calls;
``required`` and a named function open the answer with ``<tool_call>`` (and the name) in the
prompt, so the model continues a call - the named one ends after that call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentrl.actions import TOOL_CALL_OPEN, format_tool_call
from agentrl.rollout.template import ChatFormat
from agentrl.serve.openai_protocol import ApiError

ROLES = {"system", "developer", "user", "assistant", "tool"}


@dataclass
class ChatPrompt:
    """What to generate from, and how to read the answer."""

    ids: list[int]
    tools: dict[str, list[str]] | None  # name -> parameter names, to parse calls; None: no parsing
    prefix_text: str = ""  # answer text forced into the prompt (tool_choice required / named)
    max_calls: int | None = None


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise ApiError(400, f"{where}: only text content parts are supported, got {part!r}", where)
            parts.append(part["text"])
        return "".join(parts)
    raise ApiError(
        400, f"{where} must be a string or a list of text parts, got {type(content).__name__}", where
    )


def _arguments(raw: Any, where: str) -> dict[str, Any]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            raise ApiError(400, f"{where} is not valid JSON: {exc.msg}", where) from exc
    if not isinstance(raw, dict):
        raise ApiError(400, f"{where} must be a JSON object", where)
    return raw


def _tool_specs(tools: Any) -> dict[str, list[str]]:
    if not isinstance(tools, list) or not tools:
        raise ApiError(400, "tools must be a non-empty list of function tools", "tools")
    specs: dict[str, list[str]] = {}
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ApiError(
                400, f'tools[{i}] must be {{"type": "function", "function": {{"name": ...}}}}', "tools"
            )
        properties = (function.get("parameters") or {}).get("properties") or {}
        specs[function["name"]] = list(properties)
    return specs


def _messages(messages: Any, fmt: ChatFormat) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            raise ApiError(400, f"{where}.role must be one of {sorted(ROLES)}, got {role!r}", "messages")
        content = _text(message.get("content"), f"{where}.content")
        if role == "developer":
            role = "system"
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for j, call in enumerate(message["tool_calls"]):
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise ApiError(400, f"{where}.tool_calls[{j}] needs function.name", "messages")
                args = _arguments(
                    function.get("arguments", {}), f"{where}.tool_calls[{j}].function.arguments"
                )
                calls.append((call.get("id"), function["name"], args))
            if fmt.native_tools:  # templates read arguments as objects (vLLM does the same)
                native = [
                    {"id": c, "type": "function", "function": {"name": n, "arguments": a}}
                    for c, n, a in calls
                ]
                out.append({"role": "assistant", "content": content, "tool_calls": native})
            else:
                text = "\n".join(
                    [content, *(format_tool_call(n, a) for _, n, a in calls)]
                    if content
                    else [format_tool_call(n, a) for _, n, a in calls]
                )
                out.append({"role": "assistant", "content": text})
        elif role == "tool":
            if fmt.native_tools:
                out.append({"role": "tool", "content": content, "tool_call_id": message.get("tool_call_id")})
            else:
                out.append(fmt.obs_message(content))
        else:
            out.append({"role": role, "content": content})
    return out


def chat_prompt(tokenizer: Any, body: dict[str, Any]) -> ChatPrompt:
    """Render a chat request's messages and tools; how to parse its answer. Raises :class:`ApiError`."""
    tools = body.get("tools")
    specs = _tool_specs(tools) if tools is not None else None
    choice = body.get("tool_choice") or ("auto" if specs else "none")
    named = None
    if isinstance(choice, dict):
        named = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if not isinstance(named, str):
            raise ApiError(
                400, 'tool_choice must be {"type": "function", "function": {"name": ...}}', "tool_choice"
            )
    elif choice not in ("none", "auto", "required"):
        raise ApiError(
            400, f"tool_choice must be none, auto, required or a function, got {choice!r}", "tool_choice"
        )
    if choice != "none" and specs is None:
        raise ApiError(400, "tool_choice other than none needs tools", "tool_choice")
    if named is not None and specs is not None and named not in specs:
        raise ApiError(
            400, f"tool_choice names {named!r}, which is not in tools ({', '.join(specs)})", "tool_choice"
        )
    try:
        fmt = ChatFormat(tokenizer, tools)
    except Exception as exc:  # noqa: BLE001 - a tokenizer without a template is the request's problem here
        raise ApiError(400, f"cannot use the chat template: {exc}", "messages") from exc
    messages = _messages(body.get("messages"), fmt)
    if fmt.tools and not fmt.native_tools and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": ""})  # render() puts the tool block here
    try:
        text = fmt.render(messages, add_generation_prompt=True)
    except Exception as exc:  # noqa: BLE001 - jinja errors on user input become a 400
        raise ApiError(400, f"cannot render messages with the chat template: {exc}", "messages") from exc
    prefix = ""
    if named is not None:
        prefix = f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(named)}, "arguments": '
    elif choice == "required":
        prefix = f'{TOOL_CALL_OPEN}\n{{"name": "'
    parallel = body.get("parallel_tool_calls", True)
    return ChatPrompt(
        ids=fmt.encode(text + prefix),
        tools=specs if choice != "none" else None,
        prefix_text=prefix,
        max_calls=1 if named is not None or parallel is False else None,
    )
