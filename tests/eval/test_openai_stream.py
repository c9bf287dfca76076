"""The ``openai:`` eval agent streams its completions (as ``chat:`` does) against a real
`agentrl serve` (the app on a free port, a tiny random model over SmolLM2's tokenizer): the same
token ids, log-probs, entropy and finish reason as an answer in one piece (so the request timeout
bounds silence, not a long answer: :mod:`agentrl.rollout.generators.http`), and a server that does
not stream still read whole."""

from __future__ import annotations

import dataclasses

import pytest

from agentrl.rollout.generators.base import SamplingParams
from agentrl.rollout.generators.openai import OpenAIGenerator


@pytest.fixture(scope="module")
def tokenizer():
    from agentrl.rollout.model import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def served(tokenizer):
    from agentrl.rollout.generators.hf import HFGenerator
    from agentrl.rollout.model import tiny_model
    from agentrl.serve.server import BackgroundServer, build_app

    app = build_app(HFGenerator(tiny_model(tokenizer), tokenizer), tokenizer, "smollm2-135m")
    with BackgroundServer(app) as server:
        yield server.url


def _prompts(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(text, add_special_tokens=False) for text in ("The answer is", "1, 2, 3,", "Hi")]


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_new_tokens=40, temperature=1.0, seed=3),
        SamplingParams(max_new_tokens=24, temperature=0.0),
        SamplingParams(max_new_tokens=40, temperature=0.7, top_p=0.9, seed=11, return_entropy=False),
    ],
)
def test_streamed_answers_equal_answers_in_one_piece(served, tokenizer, sampling):
    # one request at a time: rows batched together differ in their last bits from rows alone
    plain_gen = OpenAIGenerator(served, model="smollm2-135m")
    streaming = OpenAIGenerator(served, model="smollm2-135m", stream=True)
    prompts = _prompts(tokenizer)
    assert streaming._body(prompts[0], sampling)["stream"] is True
    for prompt in prompts:
        (a,) = plain_gen.generate([prompt], sampling)
        (b,) = streaming.generate([prompt], sampling)
        assert (a.ids, a.logprobs, a.entropy, a.finish_reason) == (
            b.ids,
            b.logprobs,
            b.entropy,
            b.finish_reason,
        )
        assert a.ids and (a.entropy is None) == (not sampling.return_entropy)
    assert streaming.stats.not_streamed == 0 and streaming.stats.requests == len(prompts)  # SSE read


def test_a_stop_id_ends_the_streamed_answer_as_in_one_piece(served, tokenizer):
    prompt = _prompts(tokenizer)[:1]
    sampling = SamplingParams(max_new_tokens=20, temperature=1.0, seed=5)
    full = OpenAIGenerator(served, stream=True).generate(prompt, sampling)[0]
    cut = dataclasses.replace(sampling, stop_ids=(full.ids[6],))
    plain = OpenAIGenerator(served).generate(prompt, cut)[0]
    streamed = OpenAIGenerator(served, stream=True).generate(prompt, cut)[0]
    assert streamed.finish_reason == plain.finish_reason == "stop"
    assert streamed.ids == plain.ids == full.ids[: full.ids.index(full.ids[6]) + 1]
    assert streamed.logprobs == plain.logprobs


def test_a_server_that_answers_in_one_piece_is_read_whole(tokenizer, tmp_path):
    """The scripted token-id server of the eval tests ignores ``stream`` and answers JSON."""
    from chat_servers import ScriptedCompletions

    from agentrl.serve.server import BackgroundServer

    records = [{"task_id": "t1", "Question": "What is two plus five?", "Final answer": "7"}]
    server = ScriptedCompletions(records, tokenizer)
    with BackgroundServer(server.app) as http:
        generator = OpenAIGenerator(http.url, model="m", stream=True)
        prompt = tokenizer.encode("Q: What is two plus five?", add_special_tokens=False)
        (out,) = generator.generate([prompt], SamplingParams(max_new_tokens=16))
    assert tokenizer.decode(out.ids, skip_special_tokens=True) == "FINAL ANSWER: 7"
    assert generator.stats.not_streamed == 1


def test_the_openai_agent_streams_end_to_end(served, tokenizer, monkeypatch):
    from agentrl.eval.agents import parse_agent
    from agentrl.eval.model_agent import ModelEvalConfig, build_generator
    from agentrl.eval.runner import evaluate

    generator, _ = build_generator(parse_agent(f"openai:{served}"), 0, ModelEvalConfig.resolve(), 1)
    assert generator.stream
    monkeypatch.setenv("AGENTRL_EVAL_MAX_NEW_TOKENS", "16")
    result = evaluate("search-qa:max_turns=1", f"openai:{served}", limit=1, concurrency=1)
    (record,) = result.records
    assert record["error"] is None
    turn = result.episodes[0].segments[0].turns[0]
    assert turn.output_ids and len(turn.output_ids) == len(turn.output_logprobs)
