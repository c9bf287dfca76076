"""Several generation engines behind one generator: least outstanding requests, sticky per episode.

``rollout.backend: openai`` with a comma-separated ``rollout.base_url`` builds one
:class:`~agentrl.rollout.generators.openai.OpenAIGenerator` per URL behind a
:class:`BalancedGenerator`; any list of generators works the same way in Python.

An episode's identity here is its first prompt (system prompt + task): every later prompt of the
episode starts with it, so it goes to the engine that served the first one and that engine's prefix
cache is reused. A new first prompt goes to the engine with the fewest requests in flight (ties: the
one that served fewest so far). Episodes of one group share their first prompt, hence one engine.
Weight updates and cache resets go to every engine.

    gen = BalancedGenerator([make_generator("openai", base_url=u) for u in urls])
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agentrl.errors import GeneratorError
from agentrl.rollout.generators.base import GenerationOutput, Generator, SamplingParams, check_prompts


class BalancedGenerator(Generator):
    """Routes each prompt to one of ``backends`` (sticky per first prompt, else least outstanding)."""

    name = "balanced"

    def __init__(self, backends: Sequence[Generator]):
        if not backends:
            raise GeneratorError("BalancedGenerator needs at least one backend")
        self.backends = list(backends)
        self.supports_entropy = all(b.supports_entropy for b in self.backends)
        self.supports_score = self.backends[0].supports_score
        self.shared_batches = all(b.shared_batches for b in self.backends)
        self.max_batch_size = sum(b.max_batch_size for b in self.backends)
        self.outstanding = [0] * len(self.backends)  # requests in flight per backend
        self.served = [0] * len(self.backends)  # requests sent per backend (this run)
        self._sticky: dict[int, dict[int, int]] = {}  # first-prompt length -> {hash: backend}
        self._lock = threading.Lock()

    # -- routing
    def _route(self, prompt: Sequence[int]) -> int:
        """The backend of the episode this prompt extends, else (a new episode) the least busy one."""
        ids = tuple(int(t) for t in prompt)
        for length, table in self._sticky.items():
            if length <= len(ids):
                backend = table.get(hash(ids[:length]))
                if backend is not None:
                    return backend
        n = len(self.backends)
        backend = min(range(n), key=lambda i: (self.outstanding[i], self.served[i], i))
        self._sticky.setdefault(len(ids), {})[hash(ids)] = backend
        return backend

    def _split(self, prompts: Sequence[Sequence[int]]) -> dict[int, list[int]]:
        check_prompts(prompts)
        parts: dict[int, list[int]] = {}
        with self._lock:
            for index, prompt in enumerate(prompts):
                backend = self._route(prompt)
                parts.setdefault(backend, []).append(index)
                self.outstanding[backend] += 1
                self.served[backend] += 1
        return parts

    def _done(self, backend: int, count: int) -> None:
        with self._lock:
            self.outstanding[backend] -= count

    @staticmethod
    def _merge(n: int, parts: dict[int, list[int]], outputs: dict[int, list[GenerationOutput]]) -> list:
        merged: list[GenerationOutput | None] = [None] * n
        for backend, indices in parts.items():
            for index, out in zip(indices, outputs[backend], strict=True):
                merged[index] = out
        return merged

    # -- generation
    async def agenerate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[GenerationOutput]:
        parts = self._split(prompts)

        async def one(backend: int, indices: list[int]) -> list[GenerationOutput]:
            try:
                return await self.backends[backend].agenerate([prompts[i] for i in indices], sampling)
            finally:
                self._done(backend, len(indices))

        results = await asyncio.gather(*(one(b, idx) for b, idx in parts.items()))
        return self._merge(len(prompts), parts, dict(zip(parts, results, strict=True)))

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[GenerationOutput]:
        parts = self._split(prompts)

        def one(backend: int) -> list[GenerationOutput]:
            try:
                return self.backends[backend].generate([prompts[i] for i in parts[backend]], sampling)
            finally:
                self._done(backend, len(parts[backend]))

        with ThreadPoolExecutor(max_workers=len(parts)) as pool:
            results = dict(zip(parts, pool.map(one, parts), strict=True))
        return self._merge(len(prompts), parts, results)

    # -- everything else goes to every engine (scores: to the first)
    def score(
        self, contexts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], *, temperature: float = 1.0
    ) -> list[list[float]]:
        return self.backends[0].score(contexts, targets, temperature=temperature)

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        tensors = list(named_tensors)  # an iterator would be used up by the first engine
        for backend in self.backends:
            backend.update_weights(tensors)

    def reset_cache(self) -> None:
        with self._lock:
            self._sticky.clear()
            self.served = [0] * len(self.backends)
        for backend in self.backends:
            backend.reset_cache()

    def close(self) -> None:
        for backend in self.backends:
            backend.close()
