"""`agentrl serve` as a real subprocess + the openai backend over 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agentrl.rollout.generators.base import SamplingParams
from agentrl.rollout.generators.hf import HFGenerator
from agentrl.rollout.generators.openai import OpenAIGenerator


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_agentrl_serve_subprocess_with_a_tiny_model(tiny, tokenizer, tmp_path):
    model_dir = tmp_path / "tiny"
    tiny.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    port = _free_port()
    cli = Path(sys.executable).with_name("agentrl")
    proc = subprocess.Popen(
        [str(cli), "serve", "--model", str(model_dir), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "agentrl serve did not come up"
            time.sleep(0.3)
        prompts = [
            tokenizer.encode(t, add_special_tokens=False) for t in ("served prompt", "another one here")
        ]
        sampling = SamplingParams(max_new_tokens=6, temperature=0.0)
        remote = OpenAIGenerator(f"http://127.0.0.1:{port}/v1", model=str(model_dir)).generate(
            prompts, sampling
        )
        local = HFGenerator(tiny, tokenizer).generate(prompts, sampling)
        for a, b in zip(local, remote, strict=True):
            assert a.ids == b.ids
            assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_agentrl_serve_lists_a_lora_adapter_under_its_folder_name(tiny, tokenizer, tmp_path):
    import copy

    import openai
    from peft import LoraConfig, get_peft_model

    model_dir, adapter_dir = tmp_path / "tiny", tmp_path / "step-000003"
    tiny.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    peft_model = get_peft_model(copy.deepcopy(tiny), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    peft_model.save_pretrained(adapter_dir)
    port = _free_port()
    cli = Path(sys.executable).with_name("agentrl")
    proc = subprocess.Popen(
        [str(cli), "serve", "--model", str(model_dir), "--adapter", str(adapter_dir), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "agentrl serve did not come up"
            time.sleep(0.3)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        (card,) = client.models.list().data
        assert card.id == "step-000003" and card.model_extra["parent"] == str(model_dir)
        answer = client.completions.create(model="step-000003", prompt="hi", max_tokens=3, temperature=0)
        assert answer.usage.completion_tokens == 3
        with pytest.raises(openai.NotFoundError):  # the base weights are not what this server serves
            client.completions.create(model=str(model_dir), prompt="hi", max_tokens=3)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
