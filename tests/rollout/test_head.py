"""The HF generator's prepacked LM head: the model's own logits, following the live weight."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from agentrl.rollout.generators.base import SamplingParams
from agentrl.rollout.generators.head import last_logits, packed_head_for
from agentrl.rollout.generators.hf import HFGenerator

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch build"
)


def test_packed_logits_are_the_models_own(tiny, tokenizer):
    head = packed_head_for(tiny)
    assert head is not None
    ids = torch.tensor([tokenizer.encode("The tool said: 42. So the answer is", add_special_tokens=False)])
    with torch.no_grad():
        want = tiny(input_ids=ids).logits[:, -1, :]
        got = last_logits(tiny, head, input_ids=ids)
    assert got.shape == want.shape == (1, tiny.config.vocab_size)
    assert torch.allclose(got, want, atol=1e-5)


def test_the_packed_head_follows_an_in_place_weight_update(tiny):
    """A generator sampling from the model being trained: an optimizer step changes the weight in
    place (same storage), and the next logits use the new weight."""
    model = copy.deepcopy(tiny)
    head = packed_head_for(model)
    hidden = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = head(hidden)
        model.get_output_embeddings().weight.mul_(-2.0)
        after = head(hidden)
    assert torch.allclose(after, -2.0 * before, atol=1e-5)
    assert torch.allclose(after, hidden @ model.get_output_embeddings().weight.t(), atol=1e-5)


def test_heads_the_packed_path_does_not_cover_use_the_models_forward(tiny):
    biased = copy.deepcopy(tiny)
    biased.lm_head = nn.Linear(tiny.config.hidden_size, tiny.config.vocab_size, bias=True)
    assert packed_head_for(biased) is None
    assert packed_head_for(copy.deepcopy(tiny).to(torch.bfloat16)) is None
    capped = copy.deepcopy(tiny)
    capped.config.final_logit_softcapping = 30.0
    assert packed_head_for(capped) is None


def test_sampling_with_and_without_the_packed_head_agrees(tiny, tokenizer):
    """Greedy ids and sampled log-probs through the generator, prepacked head or not."""
    packed, plain = HFGenerator(tiny, tokenizer), HFGenerator(tiny, tokenizer)
    plain.head = None
    prompts = [
        tokenizer.encode(t, add_special_tokens=False) for t in ("hi there", "a longer prompt than that")
    ]
    for sampling in (
        SamplingParams(max_new_tokens=8, temperature=0.0),
        SamplingParams(max_new_tokens=8, seed=3),
    ):
        for a, b in zip(packed.generate(prompts, sampling), plain.generate(prompts, sampling), strict=True):
            assert a.ids == b.ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
