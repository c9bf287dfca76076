"""``agentrl serve``: an OpenAI-compatible HTTP server over the Hugging Face generator (CPU default).

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions`` and
``POST /v1/chat/completions``, with streaming (server-sent events in OpenAI's chunk format, usage
with ``stream_options.include_usage``), ``n``, stop strings and stop token ids, ``seed``,
``logprobs``/``top_logprobs``, and tool calling through the model's own chat template
(:mod:`agentrl.serve.chat_request`). Errors use OpenAI's shape (404 for an unknown model).

Completions also follow vLLM's token-id conventions so that an RL client never re-tokenizes:
``prompt`` may be a list of token ids; ``return_tokens_as_token_ids`` spells tokens as
``"token_id:123"``; ``return_token_ids`` adds ``choices[i].token_ids``; ``stop_token_ids`` and
``top_k`` are accepted; the extra ``return_entropy`` adds ``choices[i].entropy``. Streamed, each
chunk's ``token_ids`` are its own tokens, and a completions choice's ``entropy`` (one per token)
comes in its finish chunk. Requests (and
the ``n`` samples of one) are batched continuously: a request that arrives while others decode
joins their batch at the next step (:mod:`agentrl.serve.continuous`); tokens reach a stream as
they are sampled. A request longer than the model's positions is refused alone (400). GPU serving is vLLM's own server: :mod:`agentrl.serve.vllm_server`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agentrl.errors import GeneratorError
from agentrl.rollout.batcher import Batcher
from agentrl.rollout.generators.base import GenerationOutput, Generator, derive_seed
from agentrl.serve.chat_request import ChatPrompt, chat_prompt
from agentrl.serve.openai_protocol import ApiError, LogprobFormatter, RequestParams, parse_params
from agentrl.serve.sockets import listen_socket
from agentrl.serve.textstream import ChoiceStream, Delta


def _tool_call_json(delta: Delta) -> list[dict[str, Any]]:
    return [
        {
            "index": delta.first_call + k,
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
        }
        for k, c in enumerate(delta.tool_calls)
    ]


#: seconds without a delta after which a stream sends a keep-alive comment (while its engine works)
KEEPALIVE_S = 5.0


class _Job:
    """The ``n`` choices per prompt of one request: streams, batcher submissions, an event queue."""

    def __init__(
        self, app: _Server, prompts: list[list[int]], params: RequestParams, chat: ChatPrompt | None
    ):
        self.params, self.prompts = params, prompts
        self.queue: asyncio.Queue[tuple[int, Delta | GenerationOutput | BaseException]] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        hidden = app.stop_ids | set(params.sampling.stop_ids)
        self.streams: list[ChoiceStream] = []
        for index in range(len(prompts) * params.n):

            def emit(delta: Delta, index: int = index) -> None:
                loop.call_soon_threadsafe(self.queue.put_nowait, (index, delta))

            self.streams.append(
                ChoiceStream(
                    app.tokenizer,
                    stop=params.stop,
                    hidden_ids=hidden,
                    tools=chat.tools if chat else None,
                    prefix_text=chat.prefix_text if chat else "",
                    max_calls=chat.max_calls if chat else None,
                    emit=emit if params.stream else None,
                    skip_special_tokens=params.skip_special_tokens,
                    min_tokens=params.sampling.min_tokens,
                )
            )
        self.tasks = [
            asyncio.ensure_future(self._run(app.batcher, i, prompts[i // params.n]))
            for i in range(len(self.streams))
        ]

    async def _run(self, batcher: Any, index: int, prompt: list[int]) -> GenerationOutput:
        stream = self.streams[index]
        sampling = self.params.sampling
        if sampling.seed is not None:  # choice i has its own stream: distinct, and the same in any batch
            sampling = dataclasses.replace(sampling, seed=derive_seed(sampling.seed, index))
        try:
            out = await batcher.submit(prompt, sampling, stream.feed)
        except BaseException as exc:
            self.queue.put_nowait((index, exc))
            raise
        stream.finish()  # the last delta goes through emit() before the output below
        await asyncio.sleep(0)
        self.queue.put_nowait((index, out))
        return out

    def abandon(self) -> None:
        """The client went away (or generation failed): end the rows at their next token."""
        for stream in self.streams:
            stream.abandoned.set()
        for task in self.tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: reported to the client already
            else:
                task.cancel()

    async def outputs(self) -> list[GenerationOutput]:
        try:
            return list(await asyncio.gather(*self.tasks))
        except GeneratorError as exc:
            raise ApiError(400, str(exc)) from exc

    def finish_reason(self, index: int, out: GenerationOutput, chat: bool) -> str:
        if chat and self.streams[index].calls and out.finish_reason == "stop":
            return "tool_calls"
        return out.finish_reason

    def usage(self, outputs: list[GenerationOutput]) -> dict[str, int]:
        prompt = sum(len(p) for p in self.prompts)
        completion = sum(len(o.ids) for o in outputs)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _unless_disconnected(request: Any, job: _Job) -> list[GenerationOutput] | None:
    """The job's outputs, or ``None`` once the client hangs up first (a client's request timeout):
    its rows end at their next token instead of decoding to ``max_tokens`` for nobody, as vLLM
    aborts them. Streams get the same from :meth:`_Server.events`."""

    async def hung_up() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    answer = asyncio.ensure_future(job.outputs())
    watch = asyncio.ensure_future(hung_up())
    try:
        await asyncio.wait({answer, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if answer.done():
        return answer.result()
    job.abandon()
    answer.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await answer
    return None


def request_engine(generator: Generator, batching: str = "continuous") -> Any:
    """What runs the server's requests: continuous batching over an in-process HF model
    (:mod:`agentrl.serve.continuous`: requests join the running batch between decode steps), else
    (``batching="static"``, other generators) the :class:`Batcher` (one batched call at a time)."""
    from agentrl.errors import ConfigError
    from agentrl.rollout.generators.hf import HFGenerator

    if batching not in ("continuous", "static"):
        raise ConfigError("--batching", f"must be continuous or static, got {batching!r}")
    if batching == "continuous" and isinstance(generator, HFGenerator):
        from agentrl.serve.continuous import ContinuousBatcher

        return ContinuousBatcher(generator)
    return Batcher(generator)


class _Server:
    def __init__(
        self, generator: Generator, tokenizer: Any, names: list[str], default_max_tokens: int, batching: str
    ):
        self.generator, self.tokenizer, self.names = generator, tokenizer, names
        self.default_max_tokens = default_max_tokens
        self.batcher = request_engine(generator, batching)
        self.stop_ids = set(getattr(generator, "stop_ids", ()))

    async def body(self, request: Any, kind: str) -> tuple[dict[str, Any], RequestParams, str]:
        try:
            body = await request.json()
        except ValueError as exc:
            raise ApiError(400, "the body is not valid JSON") from exc
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        model = body.get("model") or self.names[0]
        if model not in self.names:
            raise ApiError(
                404, f"The model `{model}` does not exist; this server serves {', '.join(self.names)}",
                "model", "model_not_found",
            )  # fmt: skip
        params = parse_params(body, kind, self.default_max_tokens)
        if params.top_logprobs and not self.generator.supports_top_logprobs:
            raise ApiError(
                400, f"the {self.generator.name} generator cannot return top_logprobs", "top_logprobs"
            )
        for key in ("min_tokens", "ignore_eos"):
            if getattr(params.sampling, key) and not getattr(self.generator, "supports_min_tokens", False):
                raise ApiError(400, f"the {self.generator.name} generator does not take {key}", key)
        return body, params, model

    def fit_context(
        self, body: dict[str, Any], params: RequestParams, prompts: list[list[int]], field: str
    ) -> RequestParams:
        """Check this request alone against the model's positions (as vLLM and OpenAI do): a request
        that names no max_tokens gets what room is left, up to the server's default; one that does
        not fit is a 400 ``context_length_exceeded`` that says what to shorten."""
        limit = self.generator.max_positions
        if limit is None:
            return params
        longest = max(len(p) for p in prompts)
        asked = body.get("max_completion_tokens", body.get("max_tokens"))
        new_tokens = params.sampling.max_new_tokens
        if asked is None and longest < limit:
            new_tokens = max(min(new_tokens, limit - longest), params.sampling.min_tokens)
        if longest + new_tokens > limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{longest + new_tokens} tokens ({longest} in the {field}, {new_tokens} in the completion). "
                f"Please reduce the length of the {field} or completion (max_tokens).",
                field,
                "context_length_exceeded",
            )
        if new_tokens == params.sampling.max_new_tokens:
            return params
        sampling = dataclasses.replace(params.sampling, max_new_tokens=new_tokens)
        return dataclasses.replace(params, sampling=sampling)

    def prompts(self, body: dict[str, Any]) -> list[list[int]]:
        prompt = body.get("prompt")
        encode = self.tokenizer.encode
        if isinstance(prompt, str):
            return [encode(prompt, add_special_tokens=False)]
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return [prompt]
        if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
            return prompt
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            return [encode(p, add_special_tokens=False) for p in prompt]
        raise ApiError(400, "prompt must be a string, a list of token ids, or a list of those", "prompt")

    # ------------------------------------------------------------------ responses
    def completion_choice(self, job: _Job, index: int, out: GenerationOutput, fmt: LogprobFormatter) -> dict:
        stream, params = job.streams[index], job.params
        entry: dict[str, Any] = {
            "index": index,
            "text": stream.content,
            "finish_reason": out.finish_reason,
            "logprobs": fmt.completion(stream.tokens),
        }
        if params.return_token_ids:
            entry["token_ids"] = list(out.ids)
        if params.return_entropy and out.entropy is not None:
            entry["entropy"] = list(out.entropy)
        return entry

    def chat_choice(self, job: _Job, index: int, out: GenerationOutput, fmt: LogprobFormatter) -> dict:
        stream = job.streams[index]
        message: dict[str, Any] = {"role": "assistant", "content": stream.content}
        if stream.calls:
            message["content"] = stream.content or None
            message["tool_calls"] = _tool_call_json(Delta(tool_calls=stream.calls))
        entry = {
            "index": index,
            "message": message,
            "logprobs": fmt.chat(stream.tokens),
            "finish_reason": job.finish_reason(index, out, chat=True),
        }
        if job.params.return_token_ids:
            entry["token_ids"] = list(out.ids)
        return entry

    async def respond(self, request: Any, kind: str) -> Any:
        from starlette.responses import JSONResponse, Response, StreamingResponse

        try:
            body, params, model = await self.body(request, kind)
            chat = chat_prompt(self.tokenizer, body) if kind == "chat" else None
            prompts = [chat.ids] if chat else self.prompts(body)
            params = self.fit_context(body, params, prompts, "messages" if chat else "prompt")
            job = _Job(self, prompts, params, chat)
            fmt = LogprobFormatter(self.tokenizer, params)
            head = {
                "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
                "created": int(time.time()),
                "model": model,
            }
            if params.stream:
                return StreamingResponse(
                    self.events(job, head, fmt, chat is not None), media_type="text/event-stream"
                )
            outputs = await _unless_disconnected(request, job)
            if outputs is None:  # the client went away (its timeout): nobody reads an answer
                return Response(status_code=499)
        except ApiError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        make = self.chat_choice if chat else self.completion_choice
        return JSONResponse(
            {
                **head,
                "object": "chat.completion" if chat else "text_completion",
                "choices": [make(job, i, o, fmt) for i, o in enumerate(outputs)],
                "usage": job.usage(outputs),
            }
        )

    async def events(
        self, job: _Job, head: dict[str, Any], fmt: LogprobFormatter, chat: bool
    ) -> AsyncIterator[str]:
        """Server-sent events: role deltas, content/tool-call deltas, a finish chunk per choice, usage, [DONE];
        a comment (``: decoding, N token(s) so far``) after :data:`KEEPALIVE_S` without a delta while
        the rows sample tokens whose text is held back, or the engine is in a (long) prefill or step."""
        obj = "chat.completion.chunk" if chat else "text_completion"
        usage = {"usage": None} if job.params.include_usage else {}

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
            return f"data: {json.dumps({**head, 'object': obj, 'choices': choices, **usage, **extra})}\n\n"

        texts = [0] * len(job.streams)  # characters sent per choice (completions text_offset)
        outputs: dict[int, GenerationOutput] = {}
        try:
            if chat:
                for i in range(len(job.streams)):
                    yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None}])  # fmt: skip
            sampled = 0
            while len(outputs) < len(job.streams):
                try:
                    index, item = await asyncio.wait_for(job.queue.get(), KEEPALIVE_S)
                except TimeoutError:
                    # no delta, yet the engine works: tokens sampled whose text is held back (a tool
                    # call until it closes, a possible stop string), or a long prefill (this request's
                    # or a batch-mate's) on a slow CPU. A comment says the stream is alive, so a
                    # client's timeout without a byte takes only a server that stopped for a hang
                    now = sum(len(stream.tokens) for stream in job.streams)
                    if now > sampled or getattr(self.batcher, "computing", False):
                        sampled = now
                        yield f": decoding, {now} token(s) so far\n\n"
                    continue
                if isinstance(item, BaseException):
                    message = (
                        str(item) if isinstance(item, GeneratorError) else f"generation failed: {item!r}"
                    )
                    yield f"data: {json.dumps(ApiError(400, message).body())}\n\n"
                    break
                if isinstance(item, GenerationOutput):
                    outputs[index] = item
                    reason = job.finish_reason(index, item, chat)
                    last = {"index": index, **({"delta": {}} if chat else {"text": ""}), "logprobs": None,
                            "finish_reason": reason}  # fmt: skip
                    if not chat and job.params.return_entropy and item.entropy is not None:
                        last["entropy"] = list(item.entropy)  # the choice's, one per token (see the doc)
                    yield chunk([last])
                    continue
                if not (item.content or item.tool_calls or item.tokens):
                    continue
                if chat:
                    delta: dict[str, Any] = {}
                    if item.content:
                        delta["content"] = item.content
                    if item.tool_calls:
                        delta["tool_calls"] = _tool_call_json(item)
                    choice = {
                        "index": index,
                        "delta": delta,
                        "logprobs": fmt.chat(item.tokens),
                        "finish_reason": None,
                    }
                else:
                    logprobs = fmt.completion(item.tokens, texts[index])
                    texts[index] += len(item.content)
                    choice = {
                        "index": index,
                        "text": item.content,
                        "logprobs": logprobs,
                        "finish_reason": None,
                    }
                if job.params.return_token_ids:  # vLLM's streamed token_ids: this chunk's tokens
                    choice["token_ids"] = [t.id for t in item.tokens]
                yield chunk([choice])
            else:
                if job.params.include_usage:
                    usage = {}
                    yield chunk([], usage=job.usage([outputs[i] for i in sorted(outputs)]))
            yield "data: [DONE]\n\n"
        finally:
            if len(outputs) < len(job.streams):
                job.abandon()  # the client went away (or generation failed): free the batch rows


def build_app(
    generator: Generator,
    tokenizer: Any,
    model_name: str | list[str],
    *,
    default_max_tokens: int = 256,
    model_info: dict[str, Any] | None = None,
    batching: str = "continuous",
) -> Any:
    """The Starlette app (separate from :func:`serve` so tests run it on a free port).

    ``batching``: ``continuous`` (default; in-process HF models) or ``static`` (see :func:`request_engine`).

    ``model_name``: the name(s) clients may ask for; the first is the one ``/v1/models`` lists first.
    ``model_info``: extra fields of each ``/v1/models`` entry (vLLM's ``root``: the weights,
    ``parent``: the base model of an adapter, whose tokenizer a client loads).
    """
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    names = [model_name] if isinstance(model_name, str) else list(model_name)
    server = _Server(generator, tokenizer, names, default_max_tokens, batching)

    async def completions(request: Request) -> Any:
        return await server.respond(request, "completions")

    async def chat(request: Request) -> Any:
        return await server.respond(request, "chat")

    async def models(request: Request) -> Any:
        created = int(time.time())
        card = {"object": "model", "created": created, "owned_by": "agentrl", **(model_info or {})}
        if generator.max_positions is not None:  # vLLM's field: clients bound their context with it
            card.setdefault("max_model_len", generator.max_positions)
        data = [{"id": n, **card} for n in names]
        return JSONResponse({"object": "list", "data": data})

    async def health(request: Request) -> Any:
        return JSONResponse({"status": "ok", "model": names[0], "requests": server.batcher.requests})

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> Any:
        yield
        await server.batcher.stop()

    app = Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ],
        lifespan=lifespan,
    )
    app.state.batcher = server.batcher
    return app


class BackgroundServer:
    """Runs an app with uvicorn in a daemon thread (tests, benchmarks, notebooks).

    ``port=0`` picks a free port; :attr:`url` is the ``/v1`` base URL once started.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        sockets = [listen_socket(host, port)]
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": sockets}, name="agentrl-serve",
                                       daemon=True)  # fmt: skip
        self.host = host

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise GeneratorError("the background server did not start")
            time.sleep(0.02)
        return self

    @property
    def port(self) -> int:
        return int(self.server.servers[0].sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def serve(
    model: str = "smollm2-135m",
    host: str = "127.0.0.1",
    port: int = 8000,
    adapter: str | None = None,
    dtype: str = "float32",
    *,
    engine: str = "hf",
    served_model_name: str | None = None,
    max_tokens: int | None = None,
    vllm_args: list[str] | None = None,
    batching: str = "continuous",
    threads: int | None = None,
) -> None:
    """Serve ``model`` (+ ``adapter``) over HTTP until interrupted (``agentrl serve``).

    ``engine="hf"``: this server over the HF generator (CPU, or one GPU without vLLM);
    ``engine="vllm"``: vLLM's own server (:mod:`agentrl.serve.vllm_server`). ``dtype="auto"``: with
    the hf engine, bfloat16 where the probe of ``train.bf16_autocast: auto`` measures bf16 faster on
    this machine (:func:`agentrl.train.precision.probe_bf16`), else float32; vLLM: bfloat16. The
    resolved value and why are printed at start. The model is listed
    as ``served_model_name``, else the adapter's folder name, else ``model``. ``batching``:
    continuous (default) or static (hf engine); ``threads``: torch's CPU threads (default: the CPUs
    this process may use), printed at start.
    """
    from agentrl.errors import ConfigError
    from agentrl.serve.vllm_server import adapter_name, run_vllm_server, vllm_command

    if engine == "vllm":
        if max_tokens is not None:
            raise ConfigError("--max-tokens", "applies to the hf engine only", "drop it with --engine vllm")
        vllm_dtype = "bfloat16" if dtype in ("float32", "auto") else dtype  # vLLM serves in half precision
        run_vllm_server(
            vllm_command(
                model,
                host=host,
                port=port,
                adapter=adapter,
                dtype=vllm_dtype,
                served_model_name=served_model_name,
                extra_args=vllm_args,
            )
        )
        return
    if engine != "hf":
        raise ConfigError("--engine", f"must be hf or vllm, got {engine!r}")
    if vllm_args:
        raise ConfigError("--vllm-arg", "only applies with --engine vllm", "drop it or add --engine vllm")
    import os

    import torch
    import uvicorn

    threads = threads or len(os.sched_getaffinity(0))
    if threads < 1:
        raise ConfigError("--threads", f"must be >= 1, got {threads}")
    torch.set_num_threads(threads)

    from agentrl.rollout.generators.hf import HFGenerator
    from agentrl.rollout.model import DTYPES, load_model

    max_tokens = max_tokens or 256

    name = served_model_name or (adapter_name(adapter) if adapter else model)
    if dtype not in (*DTYPES, "auto"):
        raise ConfigError("--dtype", f"must be {', '.join(DTYPES)} or auto, got {dtype!r}")
    lm, tokenizer = load_model(model, dtype="float32" if dtype == "auto" else dtype, adapter=adapter)
    resolved = ""
    if dtype == "auto":  # measured, as train.bf16_autocast: auto and train.eval_sampler_dtype: auto
        from agentrl.train.precision import probe_bf16

        decision = probe_bf16(lm)
        dtype = "bfloat16" if decision.bf16 else "float32"
        lm = lm.to(torch.bfloat16) if decision.bf16 else lm
        resolved = f" (--dtype auto: {decision.reason})"
    # the naming rule (see agentrl.rollout.generators.openai.pick_served_model): clients send `name`
    # and load the tokenizer from `root` (the adapter's folder) or `parent` (its base model)
    info = {"root": str(Path(adapter).resolve()) if adapter else model, "parent": model if adapter else None}
    app = build_app(
        HFGenerator(lm, tokenizer), tokenizer, name, default_max_tokens=max_tokens, model_info=info,
        batching=batching,
    )  # fmt: skip
    print(
        f"agentrl serve: engine=hf model={model} adapter={adapter} dtype={dtype}{resolved} served as {name!r} "
        f"(default max_tokens={max_tokens}, {batching} batching, {threads} torch thread(s)) on "
        f"http://{host}:{port}/v1",
        flush=True,
    )
    if dtype == "bfloat16":  # measured: docs/results/2026-11-29-serving.md (nineteenth session)
        print("agentrl serve: in bfloat16 a greedy completion depends on which requests share its batch (and on the "
              "prefix cache), so it is not repeatable; serve in float32 (the default) for repeatable evaluations",
              flush=True)  # fmt: skip
    uvicorn.Server(uvicorn.Config(app, log_level="info", lifespan="on")).run(
        sockets=[listen_socket(host, port)]
    )
