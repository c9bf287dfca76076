"""vLLM's ``min_tokens`` and ``ignore_eos`` through `agentrl serve` (real HTTP, the official client),
over both engines of the hf generator (continuous and static batching): no EOS / stop token id /
stop string ends a choice before ``min_tokens``; ``ignore_eos`` decodes past EOS to ``max_tokens``;
leaving them out (or at their defaults) answers exactly as before; bad values are a 400 naming
the field.

The model is the tiny random one over the real SmolLM2 tokenizer; its generation config names one
more end-of-turn id (as chat models' configs do), an id the greedy continuation reaches early, so
EOS is actually sampled."""

from __future__ import annotations

import copy

import openai
import pytest

from agentrl.rollout.generators.base import SamplingParams
from agentrl.rollout.generators.hf import HFGenerator
from agentrl.serve.server import BackgroundServer, build_app

PROMPT = "1, 2, 3,"  # the tiny model answers it greedily with one id 13 times, then another


@pytest.fixture(scope="module")
def eos_model(tiny, tokenizer):
    """``tiny`` whose generation config also ends turns on the id its greedy answer has at step 3 or
    later (first seen there); returns ``(model, that id, its step)``."""
    prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
    sampling = SamplingParams(max_new_tokens=16, temperature=0.0)
    ids = HFGenerator(tiny, tokenizer, prefix_cache_tokens=0).generate([prompt], sampling)[0].ids
    step = next(k for k in range(3, len(ids)) if ids[k] not in ids[:k])
    model = copy.deepcopy(tiny)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, ids[step]]
    return model, ids[step], step


@pytest.fixture(scope="module", params=["continuous", "static"])
def client(request, eos_model, tokenizer):
    model, _, _ = eos_model
    app = build_app(HFGenerator(model, tokenizer), tokenizer, "tiny", batching=request.param)
    with BackgroundServer(app) as server:
        yield openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)


def _complete(client, **extra):
    body = {"model": "tiny", "prompt": PROMPT, "temperature": 0, "max_tokens": 16, "logprobs": 1}
    return client.completions.create(**body, extra_body={"return_token_ids": True, **extra}).choices[0]


def test_eos_ends_the_answer_by_default_and_the_defaults_change_nothing(client, eos_model):
    _, eos, step = eos_model
    plain = _complete(client)
    assert plain.finish_reason == "stop"
    assert plain.model_extra["token_ids"][-1] == eos and len(plain.model_extra["token_ids"]) == step + 1
    same = _complete(client, min_tokens=0, ignore_eos=False)
    assert same.model_extra["token_ids"] == plain.model_extra["token_ids"]
    assert same.logprobs.token_logprobs == plain.logprobs.token_logprobs
    assert same.text == plain.text


def test_ignore_eos_decodes_to_max_tokens_through_eos(client, eos_model):
    _, eos, step = eos_model
    plain = _complete(client)
    through = _complete(client, ignore_eos=True)
    ids = through.model_extra["token_ids"]
    assert through.finish_reason == "length" and len(ids) == 16
    assert ids[: step + 1] == plain.model_extra["token_ids"]  # greedy: EOS is sampled, and passed
    assert ids[step] == eos
    assert through.logprobs.token_logprobs[: step + 1] == pytest.approx(plain.logprobs.token_logprobs)


def test_min_tokens_holds_eos_back(client, eos_model):
    _, eos, step = eos_model
    plain = _complete(client)
    held = _complete(client, min_tokens=step + 2)
    ids = held.model_extra["token_ids"]
    assert eos not in ids[: step + 2] and len(ids) > step + 2
    assert ids[:step] == plain.model_extra["token_ids"][:step]  # the same until EOS would come
    assert ids[step] != eos  # the next-best token instead
    # log-probs are of the distribution sampled from: EOS's mass is gone, every other token gains
    before, after = plain.logprobs.token_logprobs[:step], held.logprobs.token_logprobs[:step]
    assert all(a >= b for a, b in zip(after, before, strict=True)) and after != before
    assert held.finish_reason == ("stop" if ids[-1] == eos else "length")


def test_min_tokens_holds_stop_token_ids_and_stop_strings_back(client, tokenizer):
    body = {"model": "tiny", "prompt": PROMPT, "temperature": 1.0, "seed": 5, "max_tokens": 12}
    full = client.completions.create(**body, extra_body={"return_token_ids": True, "ignore_eos": True})
    ids = full.choices[0].model_extra["token_ids"]
    stop_id = ids[2]
    cut = client.completions.create(
        **body, extra_body={"return_token_ids": True, "ignore_eos": True, "stop_token_ids": [stop_id]}
    ).choices[0]
    assert cut.finish_reason == "stop" and len(cut.model_extra["token_ids"]) <= 3
    held = client.completions.create(
        **body,
        extra_body={
            "return_token_ids": True,
            "ignore_eos": True,
            "stop_token_ids": [stop_id],
            "min_tokens": 8,
        },
    ).choices[0]
    assert stop_id not in held.model_extra["token_ids"][:8] and len(held.model_extra["token_ids"]) > 8
    # a stop string in the first tokens' text does not end the choice before min_tokens
    text = full.choices[0].text
    stop = text[: max(2, len(text) // 4)].strip() or text[:2]
    cut_text = client.completions.create(**body, stop=[stop], extra_body={"ignore_eos": True}).choices[0]
    assert cut_text.finish_reason == "stop" and len(cut_text.text) < len(text)
    kept = client.completions.create(
        **body, stop=[stop], extra_body={"ignore_eos": True, "min_tokens": 12}
    ).choices[0]
    assert kept.text == text and kept.finish_reason == "length"


def test_chat_takes_them_too_streamed_and_not(client):
    messages = [{"role": "user", "content": "Count from 1 to 10."}]
    args = {"model": "tiny", "messages": messages, "temperature": 0, "max_tokens": 20}
    plain = client.chat.completions.create(**args, extra_body={"ignore_eos": True})
    assert plain.choices[0].finish_reason == "length" and plain.usage.completion_tokens == 20
    chunks = list(
        client.chat.completions.create(
            **args, stream=True, stream_options={"include_usage": True}, extra_body={"min_tokens": 20}
        )
    )
    assert chunks[-1].usage.completion_tokens == 20
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 1.5}, "min_tokens"),
        ({"min_tokens": 3}, "min_tokens"),  # more than max_tokens = 2
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"ignore_eos": 1}, "ignore_eos"),
    ],
)
def test_bad_values_are_400_naming_the_field(client, extra, param):
    for create, args in (
        (client.chat.completions.create, {"messages": [{"role": "user", "content": "hi"}]}),
        (client.completions.create, {"prompt": "hi"}),
    ):
        with pytest.raises(openai.BadRequestError) as info:
            create(model="tiny", max_tokens=2, extra_body=extra, **args)
        assert info.value.body["param"] == param and param in info.value.body["message"]
