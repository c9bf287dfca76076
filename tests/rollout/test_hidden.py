"""The HF generator's kept hidden states (generators/hidden.py): what a decoder block received for
every token, compared with the same block's input in one plain forward over the whole sequence."""

from __future__ import annotations

import threading

import pytest
import torch

from agentrl.rollout.generators.base import SamplingParams
from agentrl.rollout.generators.hf import HFGenerator
from agentrl.rollout.generators.hidden import SamplerHidden, returned
from agentrl.rollout.generators.kv_cache import cache_arg


@pytest.fixture(scope="module")
def model(tokenizer):
    from agentrl.rollout.model import tiny_model

    return tiny_model(tokenizer, layers=4, hidden=64, seed=0).eval()


def block_input(model, ids, layer: int = 2, attention=None) -> torch.Tensor:
    """What block ``layer`` receives in one forward over ``ids`` (no cache): ``[T, H]`` for a list of
    ids, ``[B, T, H]`` for a ``[B, T]`` tensor (with its ``attention`` mask)."""
    seen = {}

    def hook(module, args, kwargs):
        seen["h"] = (args[0] if args else kwargs["hidden_states"]).detach()

    batch = torch.as_tensor(ids if torch.is_tensor(ids) else [ids])
    handle = model.get_decoder().layers[layer].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model.get_decoder()(input_ids=batch, attention_mask=attention, use_cache=False)
    finally:
        handle.remove()
    return seen["h"] if torch.is_tensor(ids) else seen["h"][0]


def assert_kept(model, prompt: list[int], out) -> None:
    ids = prompt + out.ids[:-1]  # the last sampled token was never fed
    kept = torch.cat(out.hidden)
    assert kept.shape == (len(ids), 64)
    torch.testing.assert_close(kept, block_input(model, ids), atol=1e-6, rtol=1e-5)


def test_a_multi_turn_episode_and_its_branches_keep_every_tokens_block_input(model, tokenizer):
    """Turn 1 prefilled from nothing; turn 2 read from the prefix cache and prefilled its suffix alone
    (a long one) or with others (short ones); then two trees' branches decoded from their shared
    prompts (held once): every row's states equal the plain forward's, and a branch's trunk part is
    one tensor for all its branches."""
    gen = HFGenerator(model, tokenizer, prefix_cache_tokens=8192, hidden_layer=2, seed=0)
    sampling = SamplingParams(max_new_tokens=10, temperature=1.0, seed=1)
    system = list(range(100, 160))
    first = [system + [5, 6, 7], system + [8, 9], system + [5, 6, 7, 10]]
    with returned(gen):
        outs = gen.generate(first, sampling)
        for prompt, out in zip(first, outs, strict=True):
            assert_kept(model, prompt, out)
        second = [first[0] + outs[0].ids + [11, 12], first[1] + outs[1].ids + list(range(300, 380))]
        outs2 = gen.generate(second, sampling)
        for prompt, out in zip(second, outs2, strict=True):
            assert_kept(model, prompt, out)
        trunks = [second[0] + outs2[0].ids, second[1] + outs2[1].ids]
        branches = [trunks[0]] * 4 + [trunks[1]] * 4
        outs3 = gen.generate(branches, SamplingParams(max_new_tokens=6, temperature=1.0, seed=3))
    for prompt, out in zip(branches, outs3, strict=True):
        assert_kept(model, prompt, out)
    trunk_parts = {out.hidden[0].untyped_storage().data_ptr() for out in outs3}
    assert len(trunk_parts) == 2  # one trunk tensor per tree (views of it), not a copy per branch
    assert all(out.hidden[0].shape[0] == len(prompt) for prompt, out in zip(branches, outs3, strict=True))


def test_states_come_out_only_while_asked_and_only_from_the_generators_thread(model, tokenizer):
    gen = HFGenerator(model, tokenizer, prefix_cache_tokens=8192, hidden_layer=2, seed=0)
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0, seed=1)
    assert gen.generate([list(range(100, 140))], sampling)[0].hidden is None  # an eval: not returned
    # a forward of the same model outside a generate call (the learner's) adds nothing to its cache
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=torch.tensor([list(range(100, 120))]), **{cache_arg(model): cache}, use_cache=True)
    assert len(cache.layers) == 4
    # nor one in another thread while this thread generates
    with gen.tap.active():
        other = DynamicCache()
        thread = threading.Thread(
            target=lambda: model(input_ids=torch.tensor([[1, 2, 3]]), **{cache_arg(model): other}, use_cache=True)
        )
        thread.start()
        thread.join()
        assert len(other.layers) == 4


def test_kept_states_check_the_row_they_stand_for():
    parts = (torch.zeros(3, 2), torch.ones(2, 2))
    kept = SamplerHidden((1, 2, 3, 4, 5), parts)
    assert kept.covers(torch.tensor([1, 2, 3, 4, 5, 9, 9]))
    assert not kept.covers([1, 2, 3, 4, 6, 9]) and not kept.covers([1, 2, 3])
    rows = kept.rows(7)  # zeros past the kept states
    assert rows[:3].eq(0).all() and rows[3:5].eq(1).all() and rows[5:].eq(0).all()
    assert kept.rows(4).shape == (4, 2)
    with pytest.raises(ValueError, match="cover 5 tokens, the sequence has 4"):
        SamplerHidden((1, 2, 3, 4), parts)


def test_keeping_states_needs_the_prefix_cache(model, tokenizer):
    from agentrl.errors import GeneratorError

    with pytest.raises(GeneratorError, match="prefix_cache_tokens > 0"):
        HFGenerator(model, tokenizer, prefix_cache_tokens=0, hidden_layer=2)
