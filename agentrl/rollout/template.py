"""Chat-template handling: render prompts, find the bridge between turns, check conformance.

The agent keeps a conversation as token ids. It renders the first prompt once; after each model
turn it appends only the *bridge*: the template's text between the end of the assistant message
and the start of the next one (end-of-turn if the model did not emit it, the observation wrapped
in its role header, the next generation prompt). :class:`ChatFormat` finds that text by rendering
a short conversation with a sentinel assistant message, so it works for any Hugging Face template.

:func:`check_template` renders multi-turn conversations both ways - a full re-render of the
history vs. the incremental token sequence - and reports, per model and turn, what differs. A
template that rewrites history (e.g. stripping earlier reasoning) cannot be trained on as one
concatenated row; the agent then falls back to one row per turn (Segment kind ``"turn"``).
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.errors import ConfigError
from agentrl.trajectory import Source

SENTINEL = "ZQXJ-assistant-sentinel"
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe",
        "description": "Probe tool.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}


def tools_system_block(tools: Sequence[dict[str, Any]]) -> str:
    """Hermes-style tool list for templates that do not render ``tools`` themselves."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        f"{lines}\n</tools>\n\nFor each function call, return a json object with function name and arguments "
        'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
        "<args-json-object>}\n</tool_call>"
    )


def model_name_of(tokenizer: Any) -> str:
    name = getattr(tokenizer, "agentrl_name", None) or getattr(tokenizer, "name_or_path", "")
    return str(name or type(tokenizer).__name__)


@dataclass
class Bridge:
    """Token ids appended after a model turn, with a Source code per id."""

    ids: list[int]
    source: list[int]
    text: str


class ChatFormat:
    """Renders prompts and bridges for one tokenizer + tool set.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        tools: JSON schemas (OpenAI function format) given to the template; templates that ignore
            ``tools`` get them as a Hermes block appended to the system prompt.
        obs_role: role of observation messages; default ``tool`` when the template renders tools
            natively, else ``user``.
        tool_schemas: render the tools' JSON schemas into the prompt; False when the env's system
            prompt already documents its tools (saves ~300 prompt tokens per episode).
    """

    def __init__(
        self,
        tokenizer: Any,
        tools: Sequence[dict[str, Any]] | None = None,
        obs_role: str | None = None,
        tool_schemas: bool = True,
    ):
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                "model.name",
                f"tokenizer of {model_name_of(tokenizer)!r} has no chat template",
                "use an instruct/chat model or set tokenizer.chat_template",
            )
        self.tokenizer = tokenizer
        self.tools = [_as_function_schema(t) for t in tools or []] if tool_schemas else []
        self.native_tools = template_renders_tools(tokenizer)
        self.obs_role = obs_role or ("tool" if self.native_tools else "user")
        self.eos_id = tokenizer.eos_token_id
        self.eos_text = tokenizer.convert_ids_to_tokens(self.eos_id) if self.eos_id is not None else ""

    # ------------------------------------------------------------------ rendering
    def system_text(self, system: str) -> str:
        if self.tools and not self.native_tools:
            return system + tools_system_block(self.tools)
        return system

    def render(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool) -> str:
        """Render messages to text (the system message gets the tool block when needed)."""
        messages = [dict(m) for m in messages]
        if messages and messages[0]["role"] == "system":
            messages[0]["content"] = self.system_text(messages[0]["content"])
        return self.tokenizer.apply_chat_template(
            messages,
            tools=self.tools if (self.tools and self.native_tools) else None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_messages(self, system: str, task: str) -> list[dict[str, Any]]:
        return [{"role": "system", "content": system}, {"role": "user", "content": task}]

    def prompt_ids(self, system: str, task: str) -> list[int]:
        """Ids of the first prompt (system + tools + task + generation prompt)."""
        return self.encode(self.render(self.prompt_messages(system, task), add_generation_prompt=True))

    def obs_message(self, text: str) -> dict[str, Any]:
        return {"role": self.obs_role, "content": text}

    # ------------------------------------------------------------------ bridges
    @functools.cached_property
    def _base(self) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": SENTINEL},
        ]

    def bridge_text(self, messages: Sequence[dict[str, Any]]) -> str:
        """Template text after an assistant message's content, through the next generation prompt."""
        full = self.render([*self._base, *messages], add_generation_prompt=True)
        at = full.rfind(SENTINEL)
        if at < 0:
            raise ConfigError(
                "model.name",
                f"the chat template of {model_name_of(self.tokenizer)!r} does not render assistant content verbatim",
                "use a standard chat template",
            )
        return full[at + len(SENTINEL) :]

    def bridge(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        ended_with_eos: bool,
        sources: Sequence[int] | None = None,
    ) -> Bridge:
        """Ids to append after a model turn, then ``messages`` (observations/instructions), then the
        next generation prompt. ``sources`` gives a Source per message (default TOOL)."""
        text = self.bridge_text(messages)
        if ended_with_eos and self.eos_text and text.startswith(self.eos_text):
            text = text[len(self.eos_text) :]  # the model already emitted the end-of-turn token
        sources = list(sources) if sources is not None else [int(Source.TOOL)] * len(messages)
        spans: list[tuple[int, int, int]] = []
        cursor = 0
        for message, src in zip(messages, sources, strict=True):
            content = str(message.get("content", ""))
            if not content:
                continue
            at = text.find(content, cursor)
            if at < 0:  # templates may trim contents
                content = content.strip()
                at = text.find(content, cursor) if content else -1
            if at >= 0:
                spans.append((at, at + len(content), src))
                cursor = at + len(content)
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(encoded["input_ids"])
        source = []
        for start, end in encoded["offset_mapping"]:
            code = int(Source.TEMPLATE)
            for s, e, src in spans:
                if s <= start < e or (start == end and s < start <= e):
                    code = src
                    break
            source.append(code)
        return Bridge(ids=ids, source=source, text=text)

    def observation_bridge(self, observation: str, *, ended_with_eos: bool) -> Bridge:
        return self.bridge([self.obs_message(observation)], ended_with_eos=ended_with_eos)


def _as_function_schema(tool: dict[str, Any]) -> dict[str, Any]:
    return tool if tool.get("type") == "function" else {"type": "function", "function": tool}


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders the ``tools`` argument (else tools go in the system prompt)."""
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    plain = tokenizer.apply_chat_template(messages, tokenize=False)
    try:
        with_tools = tokenizer.apply_chat_template(messages, tools=[_PROBE_TOOL], tokenize=False)
    except Exception:  # noqa: BLE001 - a template that chokes on tools does not support them
        return False
    return with_tools != plain and "probe" in with_tools


# --------------------------------------------------------------------------- conformance
SAMPLE_TURNS: tuple[tuple[str, str], ...] = (
    (
        '<think>I should look this up.</think>\n<tool_call>\n{"name": "search", "arguments": {"query": "Eiffel Tower"}}\n</tool_call>',
        "The Eiffel Tower is in Paris. It was completed in 1889.",
    ),
    (
        '<think>Now the year.</think>\n<tool_call>\n{"name": "search", "arguments": {"query": "1889 events"}}\n</tool_call>',
        "Error: no results for '1889 events'.",
    ),
    ("<think>I know enough.</think>\n<answer>1889</answer>", ""),
)


@dataclass
class TemplateReport:
    """Outcome of :func:`check_template`."""

    model: str
    ok: bool
    history_rewrite: bool = False
    first_bad_turn: int | None = None
    problems: list[str] = field(default_factory=list)
    native_tools: bool = False
    obs_role: str = "user"
    bridge: str = ""

    def summary(self) -> str:
        if self.ok:
            return f"chat template of {self.model}: incremental token ids match a full re-render"
        return f"chat template of {self.model}: " + "; ".join(self.problems)


def _diff(a: str, b: str, width: int = 60) -> str:
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    lo = max(0, at - width // 2)
    return f"at char {at}: {a[lo : at + width]!r} vs {b[lo : at + width]!r}"


def check_template(
    tokenizer: Any,
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    turns: Sequence[tuple[str, str]] = SAMPLE_TURNS,
    system: str = "You answer questions with the search tool.",
    task: str = "In which year was the Eiffel Tower completed?",
) -> TemplateReport:
    """Render a multi-turn conversation incrementally (as the agent does) and in full; compare.

    Returns a report naming the model, the first turn that differs and what differs. Problems:
    the template rewrites earlier turns when a turn is added (history rewrite); the incremental
    ids differ from the full re-render's ids (token drift); the EOS token is not the template's
    end-of-turn text.
    """
    fmt = ChatFormat(tokenizer, tools if tools is not None else [_PROBE_TOOL])
    report = TemplateReport(
        model=model_name_of(tokenizer), ok=True, native_tools=fmt.native_tools, obs_role=fmt.obs_role
    )
    messages = fmt.prompt_messages(system, task)
    ids = fmt.prompt_ids(system, task)
    report.bridge = fmt.bridge_text([fmt.obs_message("OBS")])
    if fmt.eos_text and not report.bridge.startswith(fmt.eos_text):
        report.problems.append(
            f"the template ends an assistant turn with {report.bridge[:20]!r}, not the EOS token {fmt.eos_text!r}"
        )
    for k, (action, observation) in enumerate(turns):
        action_ids = fmt.encode(action) + ([fmt.eos_id] if fmt.eos_id is not None else [])
        ids = ids + action_ids
        messages = [*messages, {"role": "assistant", "content": action}]
        if k == len(turns) - 1:
            break
        as_generated = fmt.render(messages, add_generation_prompt=False)
        bridge = fmt.observation_bridge(observation, ended_with_eos=True)
        ids = ids + bridge.ids
        messages = [*messages, fmt.obs_message(observation)]
        text = fmt.render(messages, add_generation_prompt=True)
        if not text.startswith(as_generated):
            report.history_rewrite = True
            report.problems.append(
                f"turn {k}: adding the next message re-renders earlier turns differently "
                f"({_diff(as_generated, text)})"
            )
        full_ids = fmt.encode(text)
        if full_ids != ids:
            at = next(
                (i for i, (x, y) in enumerate(zip(ids, full_ids, strict=False)) if x != y),
                min(len(ids), len(full_ids)),
            )
            report.problems.append(
                f"turn {k}: incremental ids differ from the full re-render at token {at}: "
                f"{tokenizer.decode(ids[max(0, at - 5) : at + 8])!r} vs "
                f"{tokenizer.decode(full_ids[max(0, at - 5) : at + 8])!r}"
            )
        if report.problems and report.first_bad_turn is None:
            report.first_bad_turn = k
    report.ok = not report.problems
    return report


@functools.lru_cache(maxsize=32)
def _cached_report(key: int, tokenizer_ref: Any) -> TemplateReport:
    return check_template(tokenizer_ref)


def conformance(tokenizer: Any) -> TemplateReport:
    """Cached :func:`check_template` per tokenizer object and template string."""
    key = hash((id(tokenizer), tokenizer.chat_template))
    return _cached_report(key, tokenizer)


def with_template(tokenizer: Any, template: str, **special: Any) -> Any:
    """A copy of ``tokenizer`` with another chat template (and optional special tokens), for tests."""
    clone = copy.deepcopy(tokenizer)
    clone.chat_template = template
    extra = special.pop("additional_special_tokens", None)
    if extra:
        clone.add_special_tokens({"additional_special_tokens": list(extra)})
    for key, value in special.items():
        setattr(clone, key, value)
    return clone
