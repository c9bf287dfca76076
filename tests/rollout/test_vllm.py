"""vLLM backend against the HF reference (GPU machines with vLLM installed)."""

from __future__ import annotations

import pytest

from agentrl.rollout.generators.base import SamplingParams

pytestmark = pytest.mark.gpu


def test_vllm_greedy_matches_hf_and_scores_and_updates():
    pytest.importorskip("vllm")
    import torch

    from agentrl.rollout.generators.hf import HFGenerator
    from agentrl.rollout.generators.vllm import VLLMGenerator
    from agentrl.rollout.model import load_model

    model, tokenizer = load_model("smollm2-135m", device="cuda")
    hf = HFGenerator(model, tokenizer)
    vllm = VLLMGenerator("smollm2-135m", dtype="float32", gpu_memory_utilization=0.3, enforce_eager=True)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    sampling = SamplingParams(max_new_tokens=12, temperature=0.0)
    a, b = hf.generate([prompt], sampling)[0], vllm.generate([prompt], sampling)[0]
    assert a.ids[:6] == b.ids[:6]
    assert max(abs(x - y) for x, y in zip(a.logprobs[:6], b.logprobs[:6], strict=True)) < 5e-2
    target = tokenizer.encode(" Paris", add_special_tokens=False)
    assert abs(hf.score([prompt], [target])[0][0] - vllm.score([prompt], [target])[0][0]) < 5e-2
    with torch.no_grad():
        zeroed = [
            (name, torch.zeros_like(p))
            for name, p in model.named_parameters()
            if "lm_head" in name or "embed" in name
        ]
    vllm.update_weights(iter(zeroed))
    flat = vllm.generate([prompt], sampling)[0]
    assert flat.ids != b.ids or abs(flat.logprobs[0] - b.logprobs[0]) > 1e-3
