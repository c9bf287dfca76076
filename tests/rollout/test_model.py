"""Model loading: built-in SmolLM2 (GGUF -> cached safetensors), tiny random models."""

from __future__ import annotations

import pytest
import torch

from agentrl.errors import ConfigError
from agentrl.rollout.model import builtin_cache_path, load_model, tiny_model


def test_tokenizer_is_smollm2(tokenizer):
    assert len(tokenizer) == 49152
    assert tokenizer.padding_side == "left"
    assert tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id) == "<|im_end|>"
    ids = tokenizer.encode("Paris is the capital of France.", add_special_tokens=False)
    assert tokenizer.decode(ids) == "Paris is the capital of France."


def test_tiny_model_is_seeded_and_uses_the_vocab(tokenizer):
    a = tiny_model(tokenizer, seed=3)
    b = tiny_model(tokenizer, seed=3)
    c = tiny_model(tokenizer, seed=4)
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        la, lb, lc = a(x).logits, b(x).logits, c(x).logits
    assert la.shape == (1, 4, 49152)
    assert torch.equal(la, lb)
    assert not torch.equal(la, lc)
    assert tiny_model(tokenizer, arch="qwen2").config.model_type == "qwen2"


def test_bad_dtype_names_the_field():
    with pytest.raises(ConfigError, match="model.dtype"):
        load_model("smollm2-135m", dtype="int3")


@pytest.mark.slow
def test_builtin_smollm2_loads_from_cache_and_answers():
    model, tokenizer = load_model("smollm2-135m")
    assert (builtin_cache_path("smollm2-135m") / "model.safetensors").exists()
    assert "quantization_config" not in model.config.to_dict()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, len(prompt) :])
