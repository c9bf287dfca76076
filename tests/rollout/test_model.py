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
    assert tokenizer.agentrl_fixed == []  # the converted copy's special tokens are the GGUF file's
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


def test_the_builtin_special_tokens_are_the_gguf_files_before_and_after_conversion(tmp_path, monkeypatch):
    """BOS / EOS / PAD read from the GGUF metadata (before the first conversion) and from the converted
    copy's config.json are the same ids: SmolLM2's <|im_start|> = 1, <|im_end|> = 2 (EOS and PAD)."""
    from agentrl.rollout.model import _builtin_special_ids

    want = {"bos_token": 1, "eos_token": 2, "pad_token": 2}
    assert (builtin_cache_path("smollm2-135m") / "config.json").exists()  # the session fixture converted it
    assert _builtin_special_ids("smollm2-135m") == want
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))  # no converted copy here: the GGUF file's metadata
    assert not (builtin_cache_path("smollm2-135m") / "config.json").exists()
    assert _builtin_special_ids("smollm2-135m") == want


def test_a_tokenizer_whose_eos_differs_from_the_model_is_set_to_the_models_and_says_so(tokenizer):
    """transformers 5.17's GGUF converter named <|im_start|> the EOS; the loader sets the model's."""
    import copy

    from agentrl.rollout.model import match_special_tokens

    wrong = copy.deepcopy(tokenizer)
    wrong.eos_token = "<|im_start|>"
    assert wrong.eos_token_id == 1
    with pytest.warns(UserWarning, match=r"eos_token '<\|im_start\|>' -> '<\|im_end\|>' \(id 2\)"):
        changed = match_special_tokens(wrong, {"eos_token": 2, "bos_token": 1}, "smollm2-135m")
    assert changed == ["eos_token '<|im_start|>' -> '<|im_end|>' (id 2)"]
    assert (wrong.eos_token_id, wrong.bos_token_id) == (2, 1)
    assert match_special_tokens(wrong, {"eos_token": 2, "bos_token": 1}, "smollm2-135m") == []  # nothing to change
