"""Real HTTP test servers for remote agents (starlette + uvicorn in a thread), and GAIA "as downloaded".

:class:`ScriptedChat` is an OpenAI-compatible chat-completions server that plays a model which
knows GAIA's answers: on the first turn of a task with an attachment it calls ``read_file`` (a
native ``tool_calls`` entry when the request has ``tools``, a ``<tool_call>`` text otherwise); when
the tool result comes back it answers with the ``ANSWER=...`` found in it, or else with the gold
answer (the attachment was unreadable). Modes: ``answer`` (default), ``500`` (always HTTP 500),
``garbage`` (HTTP 200 with a body that is not JSON). A question containing ``HANG`` never gets an
answer (the server waits until the client gives up; with ``flaky="500"`` it fails at once with HTTP
500 instead). ``refuse`` makes it answer as OpenAI's reasoning models do: 400 for a ``temperature``
other than 1 and for ``max_tokens``; ``context_window`` answers 400 ``context_length_exceeded`` once
the conversation (~4 characters a token) is longer. Everything it saw is kept for assertions.

``stream`` says what it does with ``stream: true``: ``no`` (default) answers in one piece as a
server that does not stream does; ``yes`` streams server-sent events as OpenAI and vLLM do (a role
chunk, the content a few characters a chunk, tool calls as deltas, a finish chunk, a usage chunk
when ``stream_options.include_usage``, ``[DONE]``), ``chunk_delay_s`` apart (a slow but steady
server); ``refuse`` answers 400 to ``stream``; ``no-options`` answers 400 to ``stream_options``. A
question containing ``STALL`` gets two chunks of a streamed answer, then nothing more (a server that
hangs mid-stream).

:func:`write_gaia_download` writes a split in GAIA's layout the way people download it: readable
attachments of many types, one absent file, one Git-LFS pointer, one audio file.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import zipfile
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

LFS_POINTER = (
    "version https://git-lfs.github.com/spec/v1\n"
    "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 12345\n"
)
PPTX_SLIDE = (
    '<p:sld xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main" '
    'xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main"><p:cSld><p:spTree><p:sp>'
    "<p:txBody><a:p><a:r><a:t>{text}</a:t></a:r></a:p></p:txBody></p:sp></p:spTree></p:cSld></p:sld>"
)


def _record(task_id: str, question: str, level: int, answer: str, file_name: str = "") -> dict[str, Any]:
    return {
        "task_id": task_id,
        "Question": question,
        "Level": level,
        "Final answer": answer,
        "file_name": file_name,
        "Annotator Metadata": {"Steps": "secret steps", "Number of steps": "1"},
    }


def write_gaia_download(
    root: Path, *, hang: bool = False, extra: int = 0, stall: bool = False
) -> list[dict[str, Any]]:
    """Write ``root/validation/metadata.jsonl`` and its attachments; return the records.

    ``hang``: add a task whose question makes :class:`ScriptedChat` hang (first in the split);
    ``stall``: one whose streamed answer stops mid-way (first, before the hang). ``extra``: add that
    many plain tasks (no attachment) to make a larger split.
    """
    from PIL import Image, PngImagePlugin

    split = root / "validation"
    split.mkdir(parents=True, exist_ok=True)
    records = [
        _record("t-plain", "What is 6 times 7?", 1, "42"),
        _record("t-csv", "Which value does the table hold?", 1, "17", "t-csv.csv"),
        _record("t-pdb", "Which chain is named in the structure file?", 2, "alpha", "t-pdb.pdb"),
        _record("t-zip", "What does the archive's note say?", 2, "zip42", "t-zip.zip"),
        _record("t-pptx", "What is written on the slide?", 2, "slide7", "t-pptx.pptx"),
        _record("t-png", "What colour does the picture's caption give?", 3, "blue", "t-png.png"),
        _record("t-missing", "What is the sum of the sheet's column B?", 1, "311", "t-missing.xlsx"),
        _record("t-lfs", "How many rows does the document's table have?", 2, "9", "t-lfs.docx"),
        _record("t-mp3", "Which page numbers does the recording mention?", 1, "132, 133", "t-mp3.mp3"),
    ]
    records += [
        _record(f"t-extra-{i:03d}", f"What is {i} plus 1?", 1 + i % 3, str(i + 1)) for i in range(extra)
    ]
    if hang:
        records.insert(0, _record("t-hang", "HANG: what is the answer?", 1, "7"))
    if stall:
        records.insert(0, _record("t-stall", "STALL: what is the answer?", 1, "8"))
    (split / "t-csv.csv").write_text("key,value\nANSWER=17,x\n")
    (split / "t-pdb.pdb").write_text(
        "HEADER    TEST STRUCTURE\nREMARK   1 ANSWER=alpha\nATOM      1  N   ALA A   1\n"
    )
    with zipfile.ZipFile(split / "t-zip.zip", "w") as archive:
        archive.writestr("notes/inner.txt", "The note says ANSWER=zip42\n")
        archive.writestr("data.json", json.dumps({"rows": [1, 2]}))
    with zipfile.ZipFile(split / "t-pptx.pptx", "w") as archive:
        archive.writestr("ppt/slides/slide1.xml", PPTX_SLIDE.format(text="Title slide"))
        archive.writestr("ppt/slides/slide2.xml", PPTX_SLIDE.format(text="ANSWER=slide7"))
    info = PngImagePlugin.PngInfo()
    info.add_text("Description", "a caption: ANSWER=blue")
    Image.new("RGB", (8, 4), "blue").save(split / "t-png.png", pnginfo=info)
    (split / "t-lfs.docx").write_text(LFS_POINTER)
    (split / "t-mp3.mp3").write_bytes(b"ID3\x03\x00\x00\x00\x00\x00\x00" + bytes(range(256)) * 4)
    (split / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def _hang_now(server: Any) -> bool:
    """Whether this request of a HANG task hangs (``hang_times`` None: every one)."""
    if server.hang_times is not None and server.hung >= server.hang_times:
        return False
    server.hung += 1
    return True


def _refusal(message: str, param: str | None, code: str) -> Response:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return JSONResponse({"error": error}, status_code=400)


class ScriptedChat:
    """The scripted chat server's state and app (see the module doc)."""

    def __init__(
        self,
        records: list[dict[str, Any]],
        mode: str = "answer",
        hang_times: int | None = None,
        *,
        flaky: str = "hang",
        refuse: tuple[str, ...] = (),
        context_window: int | None = None,
        stream: str = "no",
        chunk_delay_s: float = 0.0,
    ):
        self.records = records
        self.mode = mode
        self.requests = 0
        self.hang_times = hang_times  # a HANG task hangs this many times, then answers (None: always)
        self.hung = 0
        self.flaky = flaky
        self.refuse = refuse
        self.context_window = context_window
        self.stream = stream
        self.chunk_delay_s = chunk_delay_s
        self.stalled = 0  # streams of STALL tasks that stopped mid-way
        self.streamed = 0  # answers sent as server-sent events
        self.tool_results: dict[str, str] = {}  # task id -> the tool / observation content it got
        self.bodies: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
            ]
        )

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    def _task(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        first_user = next(m["content"] for m in messages if m["role"] == "user")
        if isinstance(first_user, list):  # content parts: text + image
            first_user = " ".join(part.get("text", "") for part in first_user)
        return next(r for r in self.records if r["Question"] in first_user)

    @staticmethod
    def _completion(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "model": "scripted",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 7, "total_tokens": 57},
        }

    def _reply(self, message: dict[str, Any], finish: str = "stop") -> Response:
        return JSONResponse(self._completion(message, finish))

    def _chunks(self, body: dict[str, Any], message: dict[str, Any], finish: str) -> list[dict[str, Any]]:
        """A reply as the chunks of a streamed answer (see the module doc)."""

        def chunk(delta: dict[str, Any] | None, reason: str | None = None, **extra: Any) -> dict[str, Any]:
            choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": reason}]
            return {"id": "chatcmpl-test", "object": "chat.completion.chunk", "model": "scripted",
                    "choices": choices, **extra}  # fmt: skip

        chunks = [chunk({"role": "assistant", "content": ""})]
        text = message.get("content") or ""
        chunks += [chunk({"content": text[i : i + 3]}) for i in range(0, len(text), 3)]
        for k, call in enumerate(message.get("tool_calls") or []):
            head = {"index": k, "id": call["id"], "type": "function"}
            chunks.append(
                chunk(
                    {
                        "tool_calls": [
                            {**head, "function": {"name": call["function"]["name"], "arguments": ""}}
                        ]
                    }
                )
            )
            arguments = call["function"]["arguments"]
            chunks += [chunk({"tool_calls": [{"index": k, "function": {"arguments": arguments[i : i + 5]}}]})
                       for i in range(0, len(arguments), 5)]  # fmt: skip
        chunks.append(chunk({}, finish))
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append(chunk(None, usage=self._completion(message)["usage"]))
        return chunks

    def _answer(self, body: dict[str, Any], message: dict[str, Any], finish: str = "stop") -> Response:
        if not body.get("stream") or self.stream == "no":
            return self._reply(message, finish)
        chunks = self._chunks(body, message, finish)
        stall = "STALL" in json.dumps(body["messages"])
        self.streamed += 1

        async def events():
            for i, chunk in enumerate(chunks):
                if stall and i == 2:
                    self.stalled += 1
                    await asyncio.sleep(60)  # until the client gives up and the response is cancelled
                yield f"data: {json.dumps(chunk)}\n\n"
                await asyncio.sleep(self.chunk_delay_s)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def chat(self, request: Request) -> Response:
        with self._lock:
            self.requests += 1
        if self.mode == "500":
            return PlainTextResponse("internal error", status_code=500)
        if self.mode == "garbage":
            return PlainTextResponse("<html>not json</html>", status_code=200)
        body = await request.json()
        self.bodies.append(body)
        messages = body["messages"]
        if self.stream == "refuse" and "stream" in body:
            return _refusal(
                "Unrecognized request argument supplied: stream", "stream", "unsupported_parameter"
            )
        if self.stream == "no-options" and "stream_options" in body:
            return _refusal(
                "Unrecognized request argument supplied: stream_options", None, "unsupported_parameter"
            )
        temperature = body.get("temperature")
        if "temperature" in self.refuse and temperature is not None and temperature != 1:
            return _refusal(f"Unsupported value: 'temperature' does not support {temperature} with this model. "
                            "Only the default (1) value is supported.", "temperature", "unsupported_value")  # fmt: skip
        if "max_tokens" in self.refuse and "max_tokens" in body:
            return _refusal("Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                            "'max_completion_tokens' instead.", "max_tokens", "unsupported_parameter")  # fmt: skip
        tokens = len(json.dumps(messages)) // 4
        if self.context_window is not None and tokens > self.context_window:
            return _refusal(f"This model's maximum context length is {self.context_window} tokens. However, your "
                            f"messages resulted in {tokens} tokens. Please reduce the length of the messages.",
                            "messages", "context_length_exceeded")  # fmt: skip
        task = self._task(messages)
        if "HANG" in task["Question"] and _hang_now(self):
            if self.flaky == "500":
                return PlainTextResponse("sporadic failure", status_code=500)
            for _ in range(600):  # until the client gives up (then the server can shut down)
                if await request.is_disconnected():
                    break
                await asyncio.sleep(0.05)
            return PlainTextResponse("too late", status_code=504)
        native = bool(body.get("tools"))
        last = messages[-1]
        call_id = f"call_{task['task_id']}"
        if last["role"] == "user" and len([m for m in messages if m["role"] == "user"]) == 1:
            if not task["file_name"]:
                return self._answer(
                    body, {"role": "assistant", "content": f"FINAL ANSWER: {task['Final answer']}"}
                )
            arguments = {"file_name": task["file_name"]}
            if not native:
                call = json.dumps({"name": "read_file", "arguments": arguments})
                return self._answer(body, {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"})
            if "read_file" not in {t["function"]["name"] for t in body["tools"]}:
                return PlainTextResponse("read_file is not among the tools", status_code=400)
            function = {"name": "read_file", "arguments": json.dumps(arguments)}
            return self._answer(
                body,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": call_id, "type": "function", "function": function}],
                },
                finish="tool_calls",
            )
        if native and (last["role"] != "tool" or last.get("tool_call_id") != call_id):
            return PlainTextResponse(f"expected a tool message for {call_id}, got {last}", status_code=400)
        self.tool_results[task["task_id"]] = last["content"]
        found = re.search(r"ANSWER=(\w+)", last["content"])
        answer = found.group(1) if found else task["Final answer"]
        return self._answer(
            body, {"role": "assistant", "content": f"The file gives it.\nFINAL ANSWER: {answer}"}
        )


class ScriptedCompletions:
    """A token-id completions server (vLLM's ``return_token_ids`` convention) that answers GAIA
    questions with their gold answer; modes and ``HANG`` as :class:`ScriptedChat`."""

    def __init__(
        self,
        records: list[dict[str, Any]],
        tokenizer: Any,
        mode: str = "answer",
        hang_times: int | None = None,
        *,
        flaky: str = "hang",
    ):
        self.records = records
        self.tokenizer = tokenizer
        self.mode = mode
        self.requests = 0
        self.hang_times = hang_times
        self.hung = 0
        self.flaky = flaky
        self.app = Starlette(routes=[Route("/v1/completions", self.complete, methods=["POST"])])

    async def complete(self, request: Request) -> Response:
        self.requests += 1
        if self.mode == "500":
            return PlainTextResponse("internal error", status_code=500)
        body = await request.json()
        prompt = self.tokenizer.decode(body["prompt"])
        task = next(r for r in self.records if r["Question"] in prompt)
        if "HANG" in task["Question"] and _hang_now(self):
            if self.flaky == "500":
                return PlainTextResponse("sporadic failure", status_code=500)
            for _ in range(600):
                if await request.is_disconnected():
                    break
                await asyncio.sleep(0.05)
            return PlainTextResponse("too late", status_code=504)
        ids = self.tokenizer.encode(f"FINAL ANSWER: {task['Final answer']}", add_special_tokens=False)
        ids = [*ids, self.tokenizer.eos_token_id]
        choice = {"token_ids": ids, "logprobs": {"token_logprobs": [0.0] * len(ids)}, "finish_reason": "stop"}
        return JSONResponse({"choices": [choice]})
