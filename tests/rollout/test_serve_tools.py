"""Tool calling in `agentrl serve` through the official `openai` client over real HTTP.

The model side is a ScriptedGenerator (real tokenizer ids of a fixed reply; the 135M built-in
model does not write tool calls reliably), so each test knows what the model "said"; everything
else is the real server: the chat template rendering the tools, the Hermes parser of
agentrl.actions, streaming deltas, tool_choice. Also: ChoiceStream on the real tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from agentrl.actions import format_tool_call
from agentrl.rollout.generators.scripted import ScriptedGenerator
from agentrl.rollout.template import with_template
from agentrl.serve.server import BackgroundServer, build_app
from agentrl.serve.textstream import ChoiceStream

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
QWEN = (Path(__file__).parents[1] / "fixtures" / "templates" / "qwen2_5.jinja").read_text()


class Served:
    """A server over a scripted model that replies ``reply``; ``prompts`` are the decoded prompts."""

    def __init__(self, tokenizer, reply: str):
        self.tokenizer = tokenizer
        self.generator = ScriptedGenerator(tokenizer, lambda prompt, _i: reply)
        self.server = BackgroundServer(build_app(self.generator, tokenizer, "m"))

    def __enter__(self) -> openai.OpenAI:
        self.server.__enter__()
        return openai.OpenAI(base_url=self.server.url, api_key="unused", max_retries=0)

    def __exit__(self, *exc) -> None:
        self.server.__exit__(*exc)

    @property
    def last_prompt(self) -> str:
        return self.tokenizer.decode(self.generator.calls[-1][0])


def test_tools_are_rendered_and_calls_parsed(tokenizer):
    served = Served(tokenizer, CALL)
    with served as client:
        plain = client.chat.completions.create(model="m", messages=ASK)
        result = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS)
    assert result.usage.prompt_tokens > plain.usage.prompt_tokens + 50  # the tool block is in the prompt
    assert "<tools>" in served.last_prompt and '"name": "get_weather"' in served.last_prompt
    message = result.choices[0].message
    assert message.content == "Let me check."
    (call,) = message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert result.choices[0].finish_reason == "tool_calls"
    assert plain.choices[0].message.content == CALL and plain.choices[0].message.tool_calls is None


def test_tool_calls_stream_as_deltas(tokenizer):
    with Served(tokenizer, CALL + "\n" + CALL.split("\n", 1)[1].replace("Paris", "Oslo")) as client:
        chunks = list(client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            entry["name"] += delta.function.name or ""
            entry["arguments"] += delta.function.arguments or ""
    assert content == "Let me check."
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Oslo"}),
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_leaves_the_text_and_malformed_calls_stay_content(tokenizer):
    with Served(tokenizer, CALL) as client:
        result = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="none")
    assert result.choices[0].message.content == CALL and result.choices[0].message.tool_calls is None
    bad = '<tool_call>{"name": "get_weather", "arguments": {city: Paris}}</tool_call>'
    unknown = '<tool_call>{"name": "launch_rocket", "arguments": {}}</tool_call>'
    for reply in (bad, unknown):
        with Served(tokenizer, reply) as client:
            result = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS)
        assert result.choices[0].message.content == reply and result.choices[0].message.tool_calls is None
        assert result.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("native", [False, True])
def test_tool_results_and_earlier_calls_are_rendered(tokenizer, native):
    tok = with_template(tokenizer, QWEN) if native else tokenizer
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"},
    ]
    served = Served(tok, "It is 18 C and sunny in Paris.")
    with served as client:
        result = client.chat.completions.create(model="m", messages=history, tools=TOOLS)
    assert result.choices[0].message.content == "It is 18 C and sunny in Paris."
    prompt = served.last_prompt
    assert (
        format_tool_call("get_weather", {"city": "Paris"}) in prompt
    )  # arguments as an object, not a string
    if native:  # the template's own tool-result rendering
        assert "<tool_response>\n18 C and sunny\n</tool_response>" in prompt
    else:  # the rollouts' observation role for templates without tool support
        assert "<|im_start|>user\n18 C and sunny<|im_end|>" in prompt


def test_named_and_required_tool_choice_open_the_call_in_the_prompt(tokenizer):
    served = Served(tokenizer, '{"city": "Rome"}}\n</tool_call>\nAnd some chatter after the call.')
    with served as client:
        named = {"type": "function", "function": {"name": "get_weather"}}
        result = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=named)
    assert served.last_prompt.endswith('<tool_call>\n{"name": "get_weather", "arguments": ')
    (call,) = result.choices[0].message.tool_calls
    assert (
        json.loads(call.function.arguments) == {"city": "Rome"} and result.choices[0].message.content is None
    )
    assert result.choices[0].finish_reason == "tool_calls"
    full = len(tokenizer.encode('{"city": "Rome"}}\n</tool_call>\nAnd some chatter after the call.'))
    assert result.usage.completion_tokens < full  # the answer ended with the call
    served = Served(tokenizer, 'get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    with served as client:
        result = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required")
    assert served.last_prompt.endswith('<tool_call>\n{"name": "')
    assert json.loads(result.choices[0].message.tool_calls[0].function.arguments) == {"city": "Oslo"}
    with Served(tokenizer, "x") as client, pytest.raises(openai.BadRequestError, match="not in tools"):
        other = {"type": "function", "function": {"name": "nope"}}
        client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=other)


# ---------------------------------------------------------------------- ChoiceStream
def _feed_all(stream: ChoiceStream, ids: list[int]) -> int | None:
    """Feed ids one by one; the index at which the stream asked to stop."""
    for k, token in enumerate(ids):
        if stream.feed(token, -0.1):
            return k
    return None


def test_stream_holds_back_incomplete_utf8_and_partial_stop_strings(tokenizer):
    text = "héllo wörld ✓ 🙂 done. STOP after"
    ids = tokenizer.encode(text, add_special_tokens=False)
    seen: list[str] = []
    stream = ChoiceStream(tokenizer, stop=["STOP"], emit=lambda d: seen.append(d.content))
    stopped_at = _feed_all(stream, ids)
    stream.finish()
    assert stopped_at is not None and stopped_at < len(ids) - 1
    assert "".join(seen) == stream.content == "héllo wörld ✓ 🙂 done. "
    assert all("\ufffd" not in s and "ST" not in s for s in seen)
    assert stream.stopped_by_string
    no_stop = ChoiceStream(tokenizer)
    assert _feed_all(no_stop, ids) is None
    no_stop.finish()
    assert no_stop.content == tokenizer.decode(ids)


def test_stream_parses_a_call_split_across_tokens(tokenizer):
    ids = tokenizer.encode(CALL + " Done.", add_special_tokens=False)
    deltas = []
    stream = ChoiceStream(tokenizer, tools={"get_weather": ["city"]}, emit=deltas.append)
    _feed_all(stream, ids)
    stream.finish()
    with_call = [d for d in deltas if d.tool_calls]
    assert len(with_call) == 1 and with_call[0].tool_calls[0].arguments == {"city": "Paris"}
    before = "".join(d.content for d in deltas[: deltas.index(with_call[0])])
    assert before + with_call[0].content == "Let me check."
    assert stream.content == "Let me check. Done."
    assert sum(len(d.tokens) for d in deltas) == len(ids)  # every token's logprob is reported once
