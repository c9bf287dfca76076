"""Streamed chat answers: the request timeout is the time without a byte, so a slow but steady server
is never taken for a hung one, while a server that sends nothing, or stops mid-stream, costs about
one request timeout. Through the user's path (``agentrl eval --agent chat:URL#MODEL``) against real
local HTTP servers (chat_servers.py, ``agentrl serve``'s app); no timing assertions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from chat_servers import ScriptedChat, write_gaia_download

from agentrl.rollout.generators.chat import join_chunks
from agentrl.serve.server import BackgroundServer


def test_streamed_chunks_join_into_the_message_a_server_sends_in_one_piece() -> None:
    def chunk(delta: dict | None, finish: str | None = None, **extra) -> dict:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
        return {"object": "chat.completion.chunk", "choices": choices, **extra}

    call = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "read_file", "arguments": ""},
    }
    chunks = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "look at "}),
        chunk({"reasoning_content": "the file"}),
        chunk({"content": "Reading."}),
        chunk({"tool_calls": [call]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"file_name": '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"a.csv"}'}}]}),
        chunk({}, "tool_calls"),
        chunk(None, usage={"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49}),
    ]
    payload = join_chunks(chunks)
    (choice,) = payload["choices"]
    assert choice["finish_reason"] == "tool_calls" and payload["usage"]["completion_tokens"] == 9
    assert choice["message"] == {
        "role": "assistant",
        "content": "Reading.",
        "reasoning_content": "look at the file",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"file_name": "a.csv"}'},
            }
        ],
    }


def test_agentrl_eval_slow_stream_hang_and_stall(tmp_path: Path) -> None:
    """`agentrl eval` against a server that streams each answer in 9 to 15 chunks 1.5 s apart, with a
    10 s request timeout: the slow answers complete; a task the server never answers (no byte) and
    one whose stream stops after two chunks each crash once with a clear message, not retried and
    not replayed. (Generous times: this machine's CPU is shared and these processes run niced.)"""
    records = write_gaia_download(tmp_path / "gaia", hang=True, stall=True)
    keep = {"t-stall", "t-hang", "t-plain", "t-csv"}
    records = [r for r in records if r["task_id"] in keep]
    (tmp_path / "gaia" / "validation" / "metadata.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records)
    )
    server = ScriptedChat(records, stream="yes", chunk_delay_s=1.5)
    agentrl_bin = str(Path(sys.executable).parent / "agentrl")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRL_EVAL_")}
    out = tmp_path / "out"
    with BackgroundServer(server.app) as http:
        done = subprocess.run(
            [agentrl_bin, "eval", "--suite", "gaia:python=false", "--suite-option", f"data_dir={tmp_path / 'gaia'}",
             "--agent", f"chat:{http.url}#scripted", "--concurrency", "4",
             "--request-timeout-s", "10", "--episode-timeout-s", "120", "--max-failed", "0.5", "--out", str(out)],
            capture_output=True, text=True, timeout=600, env=env,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "answers are streamed: a request gives up when no byte has come for 10 s" in done.stderr
    by_id = {r["task_id"]: r for r in map(json.loads, (out / "records.jsonl").read_text().splitlines())}
    hang, stall = by_id.pop("t-hang"), by_id.pop("t-stall")
    # t-plain's answer (9 chunks) and t-csv's two (10 and 15) each took longer than the request timeout
    assert set(by_id) == {"t-plain", "t-csv"}
    assert all(r["error"] is None and r["success"] == 1.0 for r in by_id.values())
    assert (
        "no answer within 10s (--request-timeout-s" in hang["error"]
        and "nothing came for 10s" in hang["error"]
    )
    assert "no answer within 10s (--request-timeout-s" in stall["error"]
    assert "the stream stopped after 2 chunk(s) and nothing came for 10s" in stall["error"]
    assert hang["replayed_errors"] == [] and stall["replayed_errors"] == []
    assert (server.hung, server.stalled) == (1, 1)  # one request each: not retried, not replayed
    assert all(b["stream"] and b["stream_options"] == {"include_usage": True} for b in server.bodies)
    # what a turn recorded is what a server answering in one piece gives, plus the wait for the first byte
    (transcript,) = [
        json.loads(t) for t in (out / "transcripts.jsonl").read_text().splitlines() if '"t-csv"' in t
    ]
    first, last = transcript["messages"][2], transcript["messages"][4]
    assert first["tool_calls"][0]["function"] == {
        "name": "read_file",
        "arguments": '{"file_name": "t-csv.csv"}',
    }
    assert last["content"].endswith("FINAL ANSWER: 17")
    assert last["usage"]["completion_tokens"] == 7 and last["usage"]["first_chunk_s"] > 0
    report = (out / "report.md").read_text()
    assert "the stream stopped after 2 chunk(s)" in report


@pytest.mark.parametrize("mode", ["no", "refuse", "no-options"])
def test_servers_that_do_not_stream_still_work(tmp_path: Path, mode: str, capsys) -> None:
    """A server that answers `stream: true` in one piece, one that refuses `stream` (400) and one that
    refuses `stream_options`: every task is solved, and a note says what the timeout now bounds."""
    from agentrl.eval.runner import run_eval

    records = write_gaia_download(tmp_path / "gaia")
    server = ScriptedChat(records, stream=mode)
    out = tmp_path / "out"
    with BackgroundServer(server.app) as http:
        code = run_eval(
            suite="gaia", agent=f"chat:{http.url}#scripted", suite_options=[f"data_dir={tmp_path / 'gaia'}", "python=false"],
            concurrency=2, out=out, limit=4, settings={"request_timeout_s": 30, "episode_timeout_s": 120},
        )  # fmt: skip
    assert code == 0
    records_out = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(records_out) == 4 and all(r["error"] is None and r["success"] == 1.0 for r in records_out)
    err = capsys.readouterr().err
    if mode == "no":
        assert "it answered a streamed request in one piece (it does not stream)" in err
        assert server.streamed == 0
    elif mode == "refuse":
        assert "it refuses stream (Unrecognized request argument supplied: stream); not streaming" in err
        assert server.streamed == 0 and not any("stream" in b for b in server.bodies[2:])
    else:
        assert "it refuses stream_options; streaming without usage in the stream" in err
        assert "its stream holds no usage" in err
        assert server.streamed > 0 and not any("stream_options" in b for b in server.bodies[2:])


def test_streamed_and_whole_answers_of_agentrl_serve_agree(tmp_path: Path) -> None:
    """`agentrl serve`'s app (a random-init tiny model): a streamed chat answer joins into the same
    message, finish reason and usage as the same request answered in one piece."""
    from agentrl.rollout.generators.chat import ChatClient
    from agentrl.rollout.generators.hf import HFGenerator
    from agentrl.rollout.model import load_tokenizer, tiny_model
    from agentrl.serve.server import build_app

    tokenizer = load_tokenizer("smollm2-135m")
    app = build_app(HFGenerator(tiny_model(tokenizer), tokenizer), tokenizer, "smollm2-135m")
    messages = [{"role": "user", "content": "What is 6 times 7?"}]
    tools = [{"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}]
    sampling = {"temperature": 0, "max_tokens": 12}
    with BackgroundServer(app) as http:
        replies = {}
        for stream in (True, False):
            client = ChatClient(http.url, "smollm2-135m", sampling=sampling, stream=stream)
            try:
                replies[stream] = client.chat(messages, tools)
            finally:
                client.close()
            assert client.stats.not_streamed == 0 and client.notes == []
    streamed, whole = replies[True], replies[False]
    assert streamed.first_chunk_s is not None and whole.first_chunk_s is None
    assert streamed.message == whole.message and streamed.finish_reason == whole.finish_reason
    assert streamed.usage == whole.usage and 1 <= streamed.usage["completion_tokens"] <= 12


def test_agentrl_serve_keeps_a_stream_alive_while_it_holds_back_a_tool_call() -> None:
    """`agentrl serve` sends a tool call once it is complete; while a slow model writes one (here
    ~40 tokens 0.4 s apart, the pace of a busy CPU), the stream's keep-alive comments keep a client
    with an 8 s timeout without a byte from taking it for a hung server, and the call arrives whole."""
    import time as clock

    from agentrl.rollout.generators.chat import ChatClient
    from agentrl.rollout.generators.http import RequestPolicy
    from agentrl.rollout.generators.scripted import ScriptedGenerator
    from agentrl.rollout.model import load_tokenizer
    from agentrl.serve.server import KEEPALIVE_S, build_app

    class SlowModel(ScriptedGenerator):
        """The scripted reply, its tokens sampled 0.4 s apart as a slow model's would be."""

        supports_streaming = True

        def generate(self, prompts, sampling, on_token=None):  # type: ignore[override]
            outputs = super().generate(prompts, sampling)
            for row, out in enumerate(outputs):
                for token, logprob in zip(out.ids, out.logprobs, strict=True):
                    clock.sleep(0.4)
                    if on_token is not None:
                        on_token(row, token, logprob, None)
            return outputs

    code = "print(sum(range(10)))  # " + "counting " * 20
    call = json.dumps({"name": "python", "arguments": {"code": code}})
    tokenizer = load_tokenizer("smollm2-135m")
    model = SlowModel(tokenizer, lambda prompt, index: f"<tool_call>\n{call}\n</tool_call>")
    tools = [{"type": "function", "function": {"name": "python", "parameters": {
        "type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]  # fmt: skip
    assert len(tokenizer.encode(call)) * 0.4 > 2 * KEEPALIVE_S + 8  # longer than the client's timeout
    with BackgroundServer(build_app(model, tokenizer, "slow")) as http:
        client = ChatClient(
            http.url, "slow", policy=RequestPolicy(timeout_s=8, max_retries=0), sampling={"max_tokens": 200}
        )
        try:
            reply = client.chat([{"role": "user", "content": "Sum 0..9 with python."}], tools)
        finally:
            client.close()
    (sent,) = reply.message["tool_calls"]
    assert sent["function"]["name"] == "python" and json.loads(sent["function"]["arguments"]) == {
        "code": code
    }
    assert reply.finish_reason == "tool_calls" and reply.usage["completion_tokens"] > 0
