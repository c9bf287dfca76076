"""The K/V cache keyword: ``cache`` where transformers renamed it, ``past_key_values`` before; a
forward through the old name warns (pyproject's filterwarnings turns that warning into a failure)."""

from __future__ import annotations

import warnings

import torch

from agentrl.rollout.generators.base import SamplingParams
from agentrl.rollout.generators.hf import HFGenerator
from agentrl.rollout.generators.kv_cache import cache_arg, with_cache


class _Old(torch.nn.Module):
    def forward(self, input_ids=None, past_key_values=None, use_cache=None, **kwargs):
        return input_ids


class _New(torch.nn.Module):
    def forward(self, input_ids=None, cache=None, use_cache=None, **kwargs):
        return input_ids


class _Wrapped(torch.nn.Module):  # a PEFT model: forward(*args, **kwargs), the wrapped model decides
    def __init__(self, base):
        super().__init__()
        self.base = base

    def get_base_model(self):
        return self.base

    def forward(self, *args, **kwargs):
        return self.base(*args, **kwargs)


def test_the_keyword_follows_the_models_forward():
    assert cache_arg(_Old()) == "past_key_values"
    assert cache_arg(_New()) == "cache"
    assert cache_arg(_Wrapped(_New())) == "cache"
    assert cache_arg(_Wrapped(_Old())) == "past_key_values"
    inputs = {"input_ids": 1, "past_key_values": "kv"}
    assert with_cache(_New(), inputs) == {"input_ids": 1, "cache": "kv"}
    assert with_cache(_Old(), inputs) is inputs  # nothing to rename
    assert inputs == {"input_ids": 1, "past_key_values": "kv"}  # the caller's dict is not changed


def test_generating_across_turns_raises_no_deprecation_warning(tiny, tokenizer):
    """Prefill, decode and a prefix-cache hit (the second prompt extends the first) on the installed
    transformers: the cache reaches the model under the name it takes, so nothing warns."""
    gen = HFGenerator(tiny, tokenizer)
    prompt = tokenizer.encode("The tool said: 42. So the answer is", add_special_tokens=False) * 3
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        (first,) = gen.generate([prompt], params)
        (second,) = gen.generate([prompt + list(first.ids) + prompt[:5]], params)
    assert len(first.ids) == len(second.ids) == 4
    asked, reused = gen.prefix_reuse()
    assert reused > 0  # the second prompt's prefix came from the cache
