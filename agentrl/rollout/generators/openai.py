"""Generator over any OpenAI-compatible completions server (vLLM, ``agentrl serve``) via httpx.

Token ids go in (``prompt`` as a list of ids) and come back (``return_token_ids`` /
``return_tokens_as_token_ids``, vLLM's conventions), so nothing is re-tokenized. Each prompt is
one request, independent of the others (``independent_requests``: the batcher sends each on its
own, so one hung or failing request never holds up its batch-mates); timeouts, retries with
jittered backoff, the concurrency cap and the circuit breaker are :mod:`.http`'s.

``stream=True`` (eval's ``openai:`` agent) asks for server-sent events and joins the chunks into the
choice a server answers in one piece (:func:`join_completion_chunks`: the same ids, log-probs and
entropy), so the request timeout bounds the time without a byte, not the whole answer.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

import httpx

from agentrl.errors import ConfigError, GeneratorError
from agentrl.rollout.generators.base import GenerationOutput, Generator, SamplingParams, check_prompts
from agentrl.rollout.generators.http import (
    CircuitBreaker,
    RequestFailed,
    RequestPolicy,
    RequestStats,
    post_json,
)


def parse_choice(choice: dict[str, Any]) -> GenerationOutput:
    """Token ids, log-probs (and entropy when given) of one completion choice."""
    logprobs = choice.get("logprobs") or {}
    token_logprobs = logprobs.get("token_logprobs")
    ids = choice.get("token_ids")
    if ids is None:
        tokens = logprobs.get("tokens") or []
        if not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            raise GeneratorError(
                "the server returned tokens as text, not ids; it must support return_token_ids or "
                "return_tokens_as_token_ids (vLLM >= 0.5, agentrl serve)"
            )
        ids = [int(t.split(":", 1)[1]) for t in tokens]
    if token_logprobs is None or len(token_logprobs) != len(ids):
        raise GeneratorError(
            f"the server returned {len(ids)} token ids but "
            f"{'no' if token_logprobs is None else len(token_logprobs)} log-probs; request logprobs=0"
        )
    return GenerationOutput(
        ids=[int(t) for t in ids],
        logprobs=[float(x) if x is not None else 0.0 for x in token_logprobs],
        entropy=[float(x) for x in choice["entropy"]] if choice.get("entropy") is not None else None,
        finish_reason=choice.get("finish_reason") or "stop",
    )


def join_completion_chunks(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Streamed ``text_completion`` chunks joined into the answer a server gives in one piece: choice
    0's text, ``token_ids``, ``logprobs`` (tokens and token log-probs), ``entropy`` (agentrl serve
    sends it in the finish chunk) and finish reason, concatenated in order."""
    text, ids, tokens, token_logprobs, entropy = "", [], [], [], []
    ids_complete, finish, seen = True, None, False
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            seen = True
            text += choice.get("text") or ""
            logprobs = choice.get("logprobs") or {}
            part = logprobs.get("tokens") or []
            tokens += part
            token_logprobs += logprobs.get("token_logprobs") or []
            if choice.get("token_ids") is not None:
                ids += choice["token_ids"]
            elif part:  # a server that sends ids in some chunks only: read them from the tokens
                ids_complete = False
            entropy += choice.get("entropy") or []
            finish = choice.get("finish_reason") or finish
    if not seen:
        return {"chunks": chunks[:3]}
    joined: dict[str, Any] = {"index": 0, "text": text, "finish_reason": finish,
                              "logprobs": {"tokens": tokens, "token_logprobs": token_logprobs}}  # fmt: skip
    if ids and ids_complete:
        joined["token_ids"] = ids
    if entropy:
        joined["entropy"] = entropy
    return {"object": "text_completion", "choices": [joined]}


class OpenAIGenerator(Generator):
    """Completions client with token ids in and out."""

    name = "openai"
    supports_entropy = False  # only when the server sends it (agentrl serve does)
    supports_score = False
    independent_requests = True  # one HTTP request per prompt: the batcher never groups them

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = RequestPolicy.timeout_s,
        connect_timeout_s: float = RequestPolicy.connect_timeout_s,
        max_retries: int = 4,
        backoff_s: float = RequestPolicy.backoff_s,
        concurrency: int = 32,
        extra_body: dict[str, Any] | None = None,
        breaker_failures: int = RequestPolicy.breaker_failures,
        timeout_setting: str = "OpenAIGenerator(timeout_s=...)",
        stream: bool = False,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.policy = RequestPolicy(
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            max_retries=max_retries,
            backoff_s=backoff_s,
            breaker_failures=breaker_failures,
            timeout_setting=timeout_setting,
        )
        self.breaker = CircuitBreaker(breaker_failures)
        self.stats = RequestStats()
        self.concurrency = concurrency
        self.max_batch_size = concurrency
        self.extra_body = dict(extra_body or {})
        self.stream = stream  # server-sent events (see the module doc); off when the server refuses them
        self._clients: dict[int, tuple[httpx.AsyncClient, asyncio.Semaphore]] = {}

    def _client(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        key = id(loop)
        if key not in self._clients:
            limits = httpx.Limits(
                max_connections=self.concurrency, max_keepalive_connections=self.concurrency
            )
            timeout = httpx.Timeout(self.policy.timeout_s, connect=self.policy.connect_timeout_s)
            client = httpx.AsyncClient(timeout=timeout, limits=limits, headers=self.headers)
            self._clients[key] = (client, asyncio.Semaphore(self.concurrency))
        return self._clients[key]

    def _body(self, prompt: Sequence[int], sampling: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": [int(t) for t in prompt],
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "return_entropy": sampling.return_entropy,
            **self.extra_body,
        }
        if self.stream:
            body["stream"] = True
        if self.model:
            body["model"] = self.model
        if sampling.top_k:
            body["top_k"] = sampling.top_k
        if sampling.stop_ids:
            body["stop_token_ids"] = list(sampling.stop_ids)
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return body

    @property
    def retries(self) -> int:
        """Retried attempts so far (observability, tests)."""
        return self.stats.retries

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        client, semaphore = self._client()
        try:
            return await post_json(
                client,
                f"{self.base_url}/completions",
                body,
                policy=self.policy,
                semaphore=semaphore,
                breaker=self.breaker,
                stats=self.stats,
                join=join_completion_chunks if body.get("stream") else None,
            )
        except RequestFailed as exc:
            if (
                not body.get("stream")
                or exc.status not in (400, 422)
                or not re.search(r"\bstream\b", exc.body)
            ):
                raise
            self.stream = False  # a server that refuses to stream: answers in one piece from now on
            return await self._post({k: v for k, v in body.items() if k != "stream"})

    async def _one(self, prompt: Sequence[int], sampling: SamplingParams) -> GenerationOutput:
        payload = await self._post(self._body(prompt, sampling))
        choices = payload.get("choices") or []
        if not choices:
            raise GeneratorError(f"the server answered without choices: {str(payload)[:200]}")
        return parse_choice(choices[0])

    async def agenerate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[GenerationOutput]:
        check_prompts(prompts)
        return list(await asyncio.gather(*(self._one(p, sampling) for p in prompts)))

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[GenerationOutput]:
        async def once() -> list[GenerationOutput]:
            try:
                return await self.agenerate(prompts, sampling)
            finally:
                await self._aclose_current()

        return asyncio.run(once())

    async def _aclose_current(self) -> None:
        entry = self._clients.pop(id(asyncio.get_running_loop()), None)
        if entry is not None:
            await entry[0].aclose()

    async def aclose(self) -> None:
        await self._aclose_current()


def list_models(url: str, timeout: float = 10.0, api_key: str | None = None) -> list[dict[str, Any]]:
    """The model cards an OpenAI-compatible server lists at ``/models`` (``id``; vLLM and
    ``agentrl serve`` add ``root``: the weights, ``parent``: an adapter's base, ``max_model_len``)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{url}/models", timeout=timeout, headers=headers)
        response.raise_for_status()
        models = response.json().get("data", [])
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        raise ConfigError(
            "agent", f"cannot list models at {url}/models: {exc}", "check the URL and that the server runs"
        ) from exc
    return [m for m in models if isinstance(m, dict) and "id" in m]


def served_model_name(url: str, timeout: float = 10.0, api_key: str | None = None) -> str:
    """The first model id an OpenAI-compatible server lists at ``/models``."""
    models = list_models(url, timeout, api_key)
    if not models:
        raise ConfigError("agent", f"{url} serves no model", "name it explicitly: URL#model")
    return str(models[0]["id"])


def pick_served_model(cards: list[dict[str, Any]], name: str | None, url: str) -> dict[str, Any] | None:
    """The card of the model an ``openai:``/``chat:`` agent asks for: one naming rule for served adapters.

    The agent sends the id the server lists: the first one when the spec names none (``agentrl serve
    --adapter DIR`` lists only the adapter, under its folder name). Naming the base of a served
    adapter where the server serves only the adapter is refused at once (it would be 404 on every
    request); where it serves both (vLLM with LoRA modules) the base is what gets evaluated, and a
    line says so. A name the server does not list is sent as given (servers such as llama.cpp
    answer to any name). None when the server lists nothing.
    """
    import sys

    if not cards:
        return None
    if not name:
        return cards[0]
    ids = [str(c["id"]) for c in cards]
    adapters = [c for c in cards if c.get("parent") and name in (c.get("parent"), c.get("root"))]
    if name in ids:
        for card in adapters:
            if card["id"] != name:
                print(f"[eval] note: {url} also serves {card['id']!r}, an adapter of {name!r}; this run "
                      f"evaluates the base {name!r} (write #{card['id']} for the adapter)", file=sys.stderr)  # fmt: skip
        return cards[ids.index(name)]
    if adapters:
        served = adapters[0]["id"]
        raise ConfigError(
            "agent",
            f"{url} serves {served!r}, an adapter of {name!r}, not {name!r} itself",
            f"write #{served} or leave #model out (the tokenizer then comes from the adapter's folder or base)",
        )
    print(f"[eval] note: {url} does not list {name!r} (it lists {', '.join(ids[:5])}); sending it as given",
          file=sys.stderr)  # fmt: skip
    return None


def tokenizer_sources(name: str, card: dict[str, Any] | None) -> list[str]:
    """Where an ``openai:`` agent loads the served model's tokenizer from, in order: the card's
    ``root`` when it is a folder here (an adapter or checkpoint folder holds its tokenizer), the
    ``parent`` (an adapter's base model), then the served name itself."""
    from pathlib import Path

    sources: list[str] = []
    if card is not None:
        root = card.get("root")
        if isinstance(root, str) and Path(root).is_dir():
            sources.append(root)
        parent = card.get("parent")
        if isinstance(parent, str) and parent:
            sources.append(parent)
    if name not in sources:
        sources.append(name)
    return sources
