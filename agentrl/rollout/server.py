"""``agentrl serve``: an OpenAI-compatible HTTP server over the Hugging Face generator.

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions`` and
``POST /v1/chat/completions``. Completions follow vLLM's token-id conventions so that an RL
client never re-tokenizes: ``prompt`` may be a list of token ids; ``logprobs: 0`` returns the
sampled token's log-prob; ``return_tokens_as_token_ids`` spells tokens as ``"token_id:123"``;
``return_token_ids`` adds ``choices[i].token_ids``; ``stop_token_ids`` and ``top_k`` are accepted.
The extra ``return_entropy`` adds ``choices[i].entropy`` (per-token sampler entropy).
Concurrent requests are batched into one generate call.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from typing import Any

from agentrl.errors import ConfigError, GeneratorError
from agentrl.rollout.batcher import Batcher
from agentrl.rollout.generators.base import GenerationOutput, Generator, SamplingParams
from agentrl.serving import listen_socket


def _error(status: int, message: str, kind: str = "invalid_request_error") -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def _sampling(body: dict[str, Any], default_max: int) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=int(body.get("max_tokens") or default_max),
        temperature=float(body.get("temperature", 1.0)),
        top_p=float(body.get("top_p", 1.0)),
        top_k=max(0, int(body.get("top_k", 0) or 0)),
        stop_ids=tuple(int(t) for t in body.get("stop_token_ids") or ()),
        seed=body.get("seed"),
        return_entropy=bool(body.get("return_entropy", False)),
    )


def build_app(generator: Generator, tokenizer: Any, model_name: str, *, default_max_tokens: int = 256) -> Any:
    """The Starlette app (separate from :func:`serve` so tests run it on a free port)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    batcher = Batcher(generator)

    def piece(token_id: int, as_ids: bool) -> str:
        return f"token_id:{token_id}" if as_ids else tokenizer.decode([token_id])

    def choice(index: int, out: GenerationOutput, body: dict[str, Any]) -> dict[str, Any]:
        visible = [t for t in out.ids if t not in generator_stop]  # text omits the EOS, like vLLM
        entry: dict[str, Any] = {
            "index": index,
            "text": tokenizer.decode(visible),
            "finish_reason": out.finish_reason,
            "logprobs": None,
        }
        if body.get("logprobs") is not None:
            as_ids = bool(body.get("return_tokens_as_token_ids"))
            entry["logprobs"] = {
                "tokens": [piece(t, as_ids) for t in out.ids],
                "token_logprobs": list(out.logprobs),
                "top_logprobs": None,
                "text_offset": None,
            }
        if body.get("return_token_ids"):
            entry["token_ids"] = list(out.ids)
        if body.get("return_entropy") and out.entropy is not None:
            entry["entropy"] = list(out.entropy)
        return entry

    generator_stop = set(getattr(generator, "stop_ids", ()))

    async def parse(request: Request) -> dict[str, Any] | Any:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        if int(body.get("n", 1)) != 1:
            return _error(400, "only n=1 is supported; send several requests instead")
        return body

    async def run(prompts: list[list[int]], body: dict[str, Any]) -> list[GenerationOutput] | Any:
        try:
            sampling = _sampling(body, default_max_tokens)
        except (ConfigError, TypeError, ValueError) as exc:
            return _error(400, f"bad sampling parameters: {exc}")
        try:
            return list(await asyncio.gather(*(batcher.submit(p, sampling) for p in prompts)))
        except GeneratorError as exc:
            return _error(400, str(exc))

    async def completions(request: Request) -> Any:
        body = await parse(request)
        if not isinstance(body, dict):
            return body
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompts = [tokenizer.encode(prompt, add_special_tokens=False)]
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompts = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
            prompts = prompt
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            prompts = [tokenizer.encode(p, add_special_tokens=False) for p in prompt]
        else:
            return _error(400, "prompt must be a string, a list of token ids, or a list of those")
        outputs = await run(prompts, body)
        if not isinstance(outputs, list):
            return outputs
        completion_tokens = sum(len(o.ids) for o in outputs)
        prompt_tokens = sum(len(p) for p in prompts)
        return JSONResponse(
            {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": model_name,
                "choices": [choice(i, o, body) for i, o in enumerate(outputs)],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
        )

    async def chat(request: Request) -> Any:
        body = await parse(request)
        if not isinstance(body, dict):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error(400, "messages must be a non-empty list")
        try:
            prompt = tokenizer.apply_chat_template(
                messages,
                tools=body.get("tools"),
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        except Exception as exc:  # noqa: BLE001 - jinja errors on user input become a 400
            return _error(400, f"cannot render messages with the chat template: {exc}")
        outputs = await run([list(prompt)], body)
        if not isinstance(outputs, list):
            return outputs
        out = outputs[0]
        visible = [t for t in out.ids if t not in generator_stop]
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model_name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": tokenizer.decode(visible)},
                        "finish_reason": out.finish_reason,
                        "token_ids": list(out.ids) if body.get("return_token_ids") else None,
                    }
                ],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(out.ids),
                    "total_tokens": len(prompt) + len(out.ids),
                },
            }
        )

    async def models(request: Request) -> Any:
        return JSONResponse(
            {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "agentrl"}]}
        )

    async def health(request: Request) -> Any:
        return JSONResponse({"status": "ok", "model": model_name, "requests": batcher.requests})

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> Any:
        yield
        await batcher.stop()

    app = Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ],
        lifespan=lifespan,
    )
    app.state.batcher = batcher
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
                                       daemon=True)
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
) -> None:
    """Load ``model`` (+ ``adapter``) and serve it over HTTP until interrupted (``agentrl serve``)."""
    import uvicorn

    from agentrl.rollout.generators.hf import HFGenerator
    from agentrl.rollout.model import load_model

    lm, tokenizer = load_model(model, dtype=dtype, adapter=adapter)
    app = build_app(HFGenerator(lm, tokenizer), tokenizer, model)
    print(f"agentrl serve: {model} on http://{host}:{port}/v1 (completions with token ids; chat completions)")
    uvicorn.Server(uvicorn.Config(app, log_level="info", lifespan="on")).run(sockets=[listen_socket(host, port)])
