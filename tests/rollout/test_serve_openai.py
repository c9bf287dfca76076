"""`agentrl serve` through the official `openai` client over real HTTP (a uvicorn server on a free
port), with a tiny random model over the real SmolLM2 tokenizer: streaming, stop strings and ids,
n, seed, max tokens, logprobs, errors."""

from __future__ import annotations

import httpx
import openai
import pytest

from agentrl.rollout.generators.hf import HFGenerator
from agentrl.serve.server import BackgroundServer, build_app

MSGS = [{"role": "user", "content": "Count from 1 to 10."}]


@pytest.fixture(scope="module")
def server(tiny, tokenizer):
    with BackgroundServer(build_app(HFGenerator(tiny, tokenizer), tokenizer, "tiny")) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)


def test_chat_stream_concatenates_to_the_non_streamed_answer(client):
    plain = client.chat.completions.create(model="tiny", messages=MSGS, temperature=0, max_tokens=12)
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=MSGS, temperature=0, max_tokens=12, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    with_choices = [c for c in chunks if c.choices]
    assert len(with_choices) > 3  # role, several content deltas, finish
    assert with_choices[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text == plain.choices[0].message.content and text
    assert (
        [c.choices[0].finish_reason for c in with_choices][-1] == plain.choices[0].finish_reason == "length"
    )
    assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == plain.usage
    assert plain.usage.completion_tokens == 12


def test_completions_stream_and_raw_sse_framing(client, server):
    prompt = "1, 2, 3,"
    plain = client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=10)
    chunks = list(
        client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=10, stream=True)
    )
    assert len(chunks) > 2
    assert "".join(c.choices[0].text for c in chunks) == plain.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    with httpx.stream(
        "POST", server.url + "/completions",
        json={"model": "tiny", "prompt": prompt, "max_tokens": 3, "temperature": 0, "stream": True}, timeout=60,
    ) as response:  # fmt: skip
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"


def _spanning_stop(tokenizer, ids: list[int], text: str) -> str:
    """A 4-character piece of ``text`` that crosses a token boundary, first seen there."""
    offset = 0
    for k, token in enumerate(ids[:-1]):
        offset += len(tokenizer.decode([token]))
        if k < 2 or offset < 2:
            continue
        stop = text[offset - 2 : offset + 2]
        if len(stop) == 4 and text.find(stop) == offset - 2 and "\ufffd" not in stop:
            return stop
    raise AssertionError(f"no token-spanning stop string in {text!r}")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_spanning_tokens_is_cut_with_finish_reason_stop(client, tokenizer, stream):
    body = {"model": "tiny", "prompt": "The answer is", "temperature": 1.0, "seed": 5, "max_tokens": 16}
    full = client.completions.create(**body, extra_body={"return_token_ids": True}).choices[0]
    stop = _spanning_stop(tokenizer, full.model_extra["token_ids"], full.text)
    if stream:
        chunks = list(client.completions.create(**body, stop=[stop, "never-seen-zz"], stream=True))
        text, reason = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
    else:
        choice = client.completions.create(**body, stop=[stop, "never-seen-zz"]).choices[0]
        text, reason = choice.text, choice.finish_reason
    assert text == full.text[: full.text.find(stop)]
    assert reason == "stop"


def test_stop_token_ids_end_the_answer_and_stay_out_of_the_text(client, tokenizer):
    body = {"model": "tiny", "prompt": "The answer is", "temperature": 1.0, "seed": 5, "max_tokens": 12}
    full = client.completions.create(**body, extra_body={"return_token_ids": True}).choices[0]
    ids = full.model_extra["token_ids"]
    stop_id = ids[4]
    cut = client.completions.create(
        **body, extra_body={"return_token_ids": True, "stop_token_ids": [stop_id]}
    )
    choice = cut.choices[0]
    assert choice.model_extra["token_ids"] == ids[: ids.index(stop_id) + 1]  # the stop id is kept in ids
    assert choice.text == tokenizer.decode(ids[: ids.index(stop_id)], skip_special_tokens=True)
    assert choice.finish_reason == "stop"


def test_n_samples_seed_and_max_completion_tokens(client):
    def ask(seed: int):
        return client.chat.completions.create(
            model="tiny", messages=MSGS, n=3, seed=seed, temperature=1.0, top_p=0.9, max_completion_tokens=6
        )

    first, again, other = ask(7), ask(7), ask(8)
    assert [c.index for c in first.choices] == [0, 1, 2]
    contents = [c.message.content for c in first.choices]
    assert len(set(contents)) > 1  # three samples, not one copied
    assert [c.message.content for c in again.choices] == contents  # seeded
    assert [c.message.content for c in other.choices] != contents
    assert first.usage.completion_tokens == 18 and all(c.finish_reason == "length" for c in first.choices)
    streamed = list(
        client.chat.completions.create(
            model="tiny", messages=MSGS, n=3, seed=7, temperature=1.0, top_p=0.9, max_completion_tokens=6,
            stream=True,
        )
    )  # fmt: skip
    by_index = ["", "", ""]
    for chunk in streamed:
        for c in chunk.choices:
            by_index[c.index] += c.delta.content or ""
    assert by_index == contents


def test_chat_and_completion_logprobs(client):
    chat = client.chat.completions.create(
        model="tiny", messages=MSGS, temperature=0, max_tokens=5, logprobs=True, top_logprobs=3
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens == 5
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token  # greedy: the sampled token is the top one
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob >= entry.top_logprobs[2].logprob
        assert entry.logprob < 0
    assert "".join(e.token for e in content) == chat.choices[0].message.content
    plain = client.chat.completions.create(model="tiny", messages=MSGS, temperature=0, max_tokens=5)
    assert plain.choices[0].logprobs is None
    completion = client.completions.create(
        model="tiny", prompt="Hello", temperature=0, max_tokens=4, logprobs=2
    )
    lp = completion.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(
        len(top) == 2 and max(top.values()) == pytest.approx(t)
        for top, t in zip(lp.top_logprobs, lp.token_logprobs, strict=True)
    )
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]
    streamed = list(
        client.chat.completions.create(
            model="tiny",
            messages=MSGS,
            temperature=0,
            max_tokens=5,
            logprobs=True,
            top_logprobs=3,
            stream=True,
        )
    )
    tokens = [
        e.token
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert tokens == [e.token for e in content]


def test_unknown_model_is_404_and_models_lists_the_served_name(client, server):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=MSGS, max_tokens=2)
    assert info.value.status_code == 404
    assert info.value.body["code"] == "model_not_found" and "gpt-4o" in info.value.body["message"]
    assert [m.id for m in client.models.list()] == ["tiny"]
    raw = httpx.post(server.url + "/completions", json={"model": "nope", "prompt": "x"}, timeout=60)
    assert raw.status_code == 404 and set(raw.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"temperature": 3.0}, "temperature"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"stop": [""]}, "stop"),
        ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
        ({"tool_choice": "required"}, "tool_choice"),  # without tools
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ],
)
def test_bad_parameters_are_400_naming_the_field(client, kwargs, param):
    args = {"model": "tiny", "messages": MSGS, "max_tokens": 2, **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**args)
    assert info.value.body["param"] == param
    assert param in info.value.body["message"] or param == "messages"


def test_concurrent_streams_are_batched_and_each_gets_its_own_answer(server, tokenizer):
    import asyncio

    async def main() -> list[str]:
        aclient = openai.AsyncOpenAI(base_url=server.url, api_key="unused", max_retries=0)

        async def one(prompt: str) -> str:
            stream = await aclient.completions.create(
                model="tiny", prompt=prompt, temperature=0, max_tokens=8, stream=True
            )
            return "".join([c.choices[0].text async for c in stream])

        prompts = [f"Question {i}: what is {i} + {i}?" for i in range(6)]
        try:
            return await asyncio.gather(*(one(p) for p in prompts)), prompts
        finally:
            await aclient.close()

    texts, prompts = asyncio.run(main())
    client = openai.OpenAI(base_url=server.url, api_key="unused")
    for prompt, text in zip(prompts, texts, strict=True):
        assert (
            text
            == client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=8)
            .choices[0]
            .text
        )


def test_a_client_that_goes_away_ends_its_generation(server, tiny, tokenizer):
    import time

    batcher = server.server.config.app.state.batcher
    before = batcher.generated_tokens
    body = {
        "model": "tiny",
        "prompt": "Once upon a time",
        "max_tokens": 3000,
        "temperature": 0,
        "stream": True,
    }
    with httpx.stream("POST", server.url + "/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        while not next(lines).startswith("data: "):
            pass  # one chunk arrived: the generation is under way; then hang up
    deadline = time.monotonic() + 60
    while batcher.generated_tokens == before and time.monotonic() < deadline:
        time.sleep(0.1)  # the counter moves when the batch call returns
    assert 0 < batcher.generated_tokens - before < 3000


def test_an_over_long_request_is_rejected_alone(server, tokenizer):
    """One prompt longer than the model's 8192 positions, sent with three short ones: it alone gets a
    400 (OpenAI's context_length_exceeded, saying what to shorten), its batch-mates their answers; a
    request that names no max_tokens gets the room that is left."""
    from concurrent.futures import ThreadPoolExecutor

    long_prompt = " ".join(["word"] * 9000)
    assert len(tokenizer.encode(long_prompt)) > 8192

    def post(prompt: str, **extra) -> httpx.Response:
        body = {"model": "tiny", "prompt": prompt, "temperature": 0, **extra}
        return httpx.post(server.url + "/completions", json=body, timeout=120)

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(post, p, max_tokens=8) for p in (long_prompt, "one", "two", "three")]
        long_answer, *short = [f.result() for f in futures]
    assert long_answer.status_code == 400
    error = long_answer.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert error["message"].startswith(
        "This model's maximum context length is 8192 tokens. However, you requested"
    )
    assert "Please reduce the length of the prompt or completion (max_tokens)" in error["message"]
    assert [r.status_code for r in short] == [200, 200, 200]
    near_full = tokenizer.decode(tokenizer.encode(long_prompt)[:8186])
    n_prompt = len(tokenizer.encode(near_full, add_special_tokens=False))
    answer = post(near_full).json()  # no max_tokens: what is left of the 8192 positions
    assert answer["usage"]["completion_tokens"] <= 8192 - n_prompt
    assert httpx.get(server.url + "/models").json()["data"][0]["max_model_len"] == 8192


def test_the_batcher_fails_only_the_request_that_does_not_fit(tiny, tokenizer):
    import asyncio

    from agentrl.rollout.batcher import Batcher
    from agentrl.rollout.generators.base import ContextTooLong, SamplingParams

    batcher = Batcher(HFGenerator(tiny, tokenizer))
    sampling = SamplingParams(max_new_tokens=4, temperature=0.0)

    async def run() -> list:
        prompts = [[5] * 8190, [5, 6, 7], [8, 9], [10]]
        try:
            return await asyncio.gather(
                *(batcher.submit(p, sampling) for p in prompts), return_exceptions=True
            )
        finally:
            await batcher.stop()

    too_long, *fine = asyncio.run(run())
    assert isinstance(too_long, ContextTooLong) and "8190 tokens + 4 new tokens" in str(too_long)
    assert all(not isinstance(out, BaseException) and 1 <= len(out.ids) <= 4 for out in fine)


def test_a_request_joins_the_batch_that_is_decoding(server):
    """Continuous batching: a short request sent while a long stream decodes joins its batch at the
    next step and answers while the long one is still streaming (static batching made it wait for
    the whole long generation)."""
    import threading

    batcher = server.server.config.app.state.batcher
    joined_before = batcher.joined
    # greedy, the tiny model repeats "," after this prompt: no early EOS
    long_body = {"model": "tiny", "prompt": "1, 2, 3,", "max_tokens": 400, "temperature": 0, "stream": True}
    short_done = threading.Event()
    chunks_after_short: list[str] = []
    with httpx.stream("POST", server.url + "/completions", json=long_body, timeout=120) as response:
        lines = response.iter_lines()
        while not next(lines).startswith("data: "):
            pass  # the long generation is decoding

        def short() -> None:
            answer = httpx.post(
                server.url + "/completions",
                json={"model": "tiny", "prompt": "Hi", "max_tokens": 3, "temperature": 0},
                timeout=120,
            )
            assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] <= 3
            short_done.set()

        thread = threading.Thread(target=short)
        thread.start()
        for line in lines:
            if short_done.is_set() and line.startswith("data: {"):
                chunks_after_short.append(line)
        thread.join(timeout=120)
    assert short_done.is_set() and chunks_after_short  # the long stream went on after the short answer
    assert batcher.joined > joined_before


def test_a_non_streamed_request_whose_client_hangs_up_stops_decoding(server):
    """A client whose own timeout fires (here: a socket closed once decoding is under way) frees its
    row: the server ends it at its next token instead of decoding 3000 tokens for nobody."""
    import json
    import socket
    import time

    batcher = server.server.config.app.state.batcher
    before, steps = batcher.generated_tokens, batcher.steps
    body = json.dumps({"model": "tiny", "prompt": "1, 2, 3,", "max_tokens": 3000, "temperature": 0}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {server.host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection((server.host, server.port))
    sock.sendall(head + body)
    deadline = time.monotonic() + 60
    while batcher.steps < steps + 3 and time.monotonic() < deadline:
        time.sleep(0.01)  # decoding is under way
    sock.close()
    while batcher.generated_tokens == before and time.monotonic() < deadline:
        time.sleep(0.05)  # the counter moves when the row ends
    generated = batcher.generated_tokens - before
    assert 3 <= generated < 3000
