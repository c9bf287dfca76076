"""`agentrl serve` as a user runs it: the CLI process on the built-in model with the official openai
client, and `--engine vllm` (the command line it builds; the real vLLM server on a GPU)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from processes import dies_with_tests

from agentrl.errors import ConfigError
from agentrl.serve.vllm_server import vllm_command

CLI = str(Path(sys.executable).with_name("agentrl"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(proc: subprocess.Popen, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else "server exited"
        assert time.monotonic() < deadline, "the server did not come up"
        time.sleep(0.5)


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_vllm_command_for_a_model_a_lora_adapter_and_a_full_checkpoint(tmp_path):
    argv = vllm_command(str(tmp_path), port=8123, dtype="bfloat16", served_model_name="agent")
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert _arg(argv, "--model") == str(tmp_path) and _arg(argv, "--served-model-name") == "agent"
    assert _arg(argv, "--port") == "8123" and _arg(argv, "--dtype") == "bfloat16"
    assert "--enable-auto-tool-choice" in argv and _arg(argv, "--tool-call-parser") == "hermes"
    assert "--enable-lora" not in argv

    lora = tmp_path / "step-000040"
    lora.mkdir()
    (lora / "adapter_config.json").write_text(json.dumps({"r": 32, "peft_type": "LORA"}))
    argv = vllm_command(str(tmp_path), adapter=str(lora), extra_args=["--max-model-len", "4096"])
    assert "--enable-lora" in argv and _arg(argv, "--max-lora-rank") == "32"
    assert _arg(argv, "--lora-modules") == f"step-000040={lora.resolve()}"
    assert _arg(argv, "--served-model-name") == str(tmp_path)  # the base keeps its own name
    assert argv[-2:] == ["--max-model-len", "4096"]

    full = tmp_path / "merged"
    full.mkdir()
    (full / "config.json").write_text("{}")
    argv = vllm_command("smollm2-135m", adapter=str(full))
    assert _arg(argv, "--model") == str(full.resolve()) and _arg(argv, "--served-model-name") == "merged"

    with pytest.raises(ConfigError, match="adapter_config.json"):
        vllm_command(str(tmp_path), adapter=str(tmp_path / "missing"))


def test_cli_engine_vllm_without_vllm_fails_clearly():
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401

        pytest.skip("vllm is installed here")
    except ImportError:
        pass
    result = subprocess.run(
        [CLI, "serve", "--engine", "vllm", "--model", "smollm2-135m"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "vllm is not installed" in result.stderr
    bad = subprocess.run([CLI, "serve", "--engine", "tgi"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--engine" in bad.stderr


@pytest.mark.slow
def test_agentrl_serve_builtin_model_with_the_openai_client():
    port = _free_port()
    proc = subprocess.Popen(
        dies_with_tests([CLI, "serve", "--port", str(port)]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        _wait(proc, port, timeout=300)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list()] == ["smollm2-135m"]
        ask = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
        full = client.chat.completions.create(
            model="smollm2-135m", messages=ask, temperature=0, max_tokens=40
        )
        assert full.choices[0].message.content.startswith("1, 2, 3, 4, 5, 6")
        cut = client.chat.completions.create(
            model="smollm2-135m", messages=ask, temperature=0, max_tokens=40, stop=["5"]
        )
        assert cut.choices[0].message.content == "1, 2, 3, 4, " and cut.choices[0].finish_reason == "stop"
        chunks = list(
            client.chat.completions.create(
                model="smollm2-135m", messages=ask, temperature=0, max_tokens=40, stream=True
            )
        )
        assert len(chunks) > 10
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == full.choices[0].message.content
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="gpt-4o", messages=ask, max_tokens=2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.gpu
def test_engine_vllm_serves_streaming_and_tool_calls_on_a_gpu():
    pytest.importorskip("vllm")
    port = _free_port()
    proc = subprocess.Popen(
        dies_with_tests([CLI, "serve", "--engine", "vllm", "--port", str(port), "--vllm-arg=--gpu-memory-utilization=0.3"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait(proc, port, timeout=600)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        assert "smollm2-135m" in [m.id for m in client.models.list()]
        ask = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
        chunks = list(
            client.chat.completions.create(
                model="smollm2-135m", messages=ask, temperature=0, max_tokens=30, stream=True, stop=["5"]
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert len(chunks) > 3 and "5" not in text and text.startswith("1, 2")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
