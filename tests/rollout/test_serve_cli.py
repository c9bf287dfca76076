"""`agentrl serve` as a real subprocess + the openai backend over 127.0.0.1."""

from __future__ import annotations

import subprocess

import pytest
from processes import dies_with_tests

from agentrl.rollout.generators.base import SamplingParams
from agentrl.rollout.generators.hf import HFGenerator
from agentrl.rollout.generators.openai import OpenAIGenerator

from .test_serve_engines import CLI, _free_port, _wait


@pytest.mark.slow
def test_agentrl_serve_subprocess_with_a_tiny_model(tiny, tokenizer, tmp_path):
    model_dir = tmp_path / "tiny"
    tiny.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    port = _free_port()
    proc = subprocess.Popen(
        dies_with_tests([CLI, "serve", "--model", str(model_dir), "--port", str(port)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait(proc, port, timeout=120)
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

    from agentrl.rollout.model import peft_quietly

    model_dir, adapter_dir = tmp_path / "tiny", tmp_path / "step-000003"
    tiny.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    with peft_quietly():
        peft_model = get_peft_model(copy.deepcopy(tiny), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    peft_model.save_pretrained(adapter_dir)
    port = _free_port()
    proc = subprocess.Popen(
        dies_with_tests([CLI, "serve", "--model", str(model_dir), "--adapter", str(adapter_dir), "--port", str(port)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait(proc, port, timeout=180)
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


@pytest.mark.slow
def test_a_served_run_model_evaluates_with_openai_and_chat_without_renaming(tiny, tokenizer, tmp_path):
    """A trained run's `model/` folder (a LoRA adapter with its tokenizer, as `agentrl train` exports
    it) served by `agentrl serve --adapter`: both remote agents find the served id, the tokenizer
    (the adapter's folder) and the base without the user naming anything; naming the base is refused
    at once with the name to use."""
    import copy

    from peft import LoraConfig, get_peft_model

    from agentrl.errors import ConfigError
    from agentrl.eval.model_agent import ModelEvalConfig
    from agentrl.eval.runner import evaluate
    from agentrl.rollout.model import peft_quietly

    base_dir, run_model = tmp_path / "tiny", tmp_path / "run" / "model"
    tiny.save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    with peft_quietly():
        peft_model = get_peft_model(copy.deepcopy(tiny), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    peft_model.save_pretrained(run_model)
    tokenizer.save_pretrained(run_model)
    port = _free_port()
    proc = subprocess.Popen(
        dies_with_tests([CLI, "serve", "--model", str(base_dir), "--adapter", str(run_model), "--port", str(port)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/v1"
    settings = ModelEvalConfig.resolve(max_new_tokens=8, request_timeout_s=120)
    try:
        _wait(proc, port, timeout=180)
        for agent in (f"openai:{url}", f"chat:{url}"):
            result = evaluate("local-gaia:python=false,max_turns=2", agent, limit=2, concurrency=2, settings=settings)
            assert [r["error"] for r in result.records] == [None, None], agent
        with pytest.raises(ConfigError, match=f"serves 'model', an adapter of '{base_dir}'.*write #model"):
            evaluate("local-gaia:python=false", f"openai:{url}#{base_dir}", limit=1, settings=settings)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["auto", "bfloat16"])
def test_agentrl_serve_says_its_dtype_and_serves_in_it(tiny, tokenizer, tmp_path, dtype):
    """`--dtype auto`: the probe of train.bf16_autocast: auto decides (bfloat16 only where bf16 measures
    faster here), the start line says the value and why; in bfloat16 (chosen or given) the start also says
    that a completion depends on its batch (measured: 15 of 24 completions differed alone and in a batch
    of 8, none in float32) and how to serve repeatably. The server's greedy tokens are the in-process
    generator's over the model in that dtype."""
    import copy
    import re

    import torch

    model_dir = tmp_path / "tiny"
    tiny.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    port = _free_port()
    proc = subprocess.Popen(dies_with_tests([CLI, "serve", "--model", str(model_dir), "--port", str(port), "--dtype", dtype]),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        _wait(proc, port, timeout=120)
        prompts = [tokenizer.encode("served prompt", add_special_tokens=False)]
        sampling = SamplingParams(max_new_tokens=6, temperature=0.0)
        remote = OpenAIGenerator(f"http://127.0.0.1:{port}/v1", model=str(model_dir)).generate(prompts, sampling)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    said = re.search(r"dtype=(float32|bfloat16)(?: \(--dtype auto: (.*?)\))? served as", out)
    assert said, out[-2000:]
    bf16 = said.group(1) == "bfloat16"
    if dtype == "auto":
        # the probe's reason, as train prints it: "bf16 1.59x faster than float32" only where it chose bf16
        assert bool(re.fullmatch(r"bf16 [\d.]+x faster than float32", said.group(2))) == bf16, said.group(2)
    else:
        assert bf16 and said.group(2) is None
    said_batch = "depends on which requests share its batch" in out and "serve in float32 (the default)" in out
    assert said_batch == bf16  # said only when it serves in bfloat16
    local_model = copy.deepcopy(tiny).to(torch.bfloat16 if bf16 else torch.float32)
    local = HFGenerator(local_model, tokenizer).generate(prompts, sampling)
    assert remote[0].ids == local[0].ids
