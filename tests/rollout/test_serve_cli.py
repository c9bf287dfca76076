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
