"""The generator interface: token ids in, token ids + sampler log-probs (+ entropy) out.

Every backend (Hugging Face transformers, vLLM, an OpenAI-compatible server) implements
:meth:`Generator.generate`; backends that can run a teacher-forced pass also implement
:meth:`Generator.score` (IGPO's ground-truth confidence, ALGORITHMS.md §1.1).

Log-prob convention (all backends): ``logprobs[i]`` is ``log softmax(logits / T)`` of the taken
token ``ids[i]`` under the temperature-scaled distribution (before top-p/top-k truncation), with
``T = 1`` for greedy decoding. ``entropy[i]`` is the Shannon entropy of that same distribution.
This is what the learner recomputes, so an on-policy ratio is exactly 1 up to numerics.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.errors import ConfigError, GeneratorError

BALANCED = "agentrl.rollout.generators.balanced:BalancedGenerator"  # several base URLs (openai)


class ContextTooLong(GeneratorError):
    """One request's prompt plus its new tokens does not fit the model's positions.

    Raised for that request alone (the batcher checks each request before batching), so its
    batch-mates are never failed with it; ``agentrl serve`` answers it as a 400 with OpenAI's
    ``context_length_exceeded`` code."""

    def __init__(self, prompt_tokens: int, max_new_tokens: int, max_positions: int):
        self.prompt_tokens, self.max_new_tokens = prompt_tokens, max_new_tokens
        self.max_positions = max_positions
        super().__init__(
            f"prompt of {prompt_tokens} tokens + {max_new_tokens} new tokens exceeds the model's "
            f"{max_positions} positions; lower rollout.max_context_tokens (eval: --max-context-tokens)"
        )


def check_fits(prompt_tokens: int, max_new_tokens: int, max_positions: int | None) -> None:
    """Raise :class:`ContextTooLong` when ``prompt_tokens + max_new_tokens`` exceeds ``max_positions``."""
    if max_positions is not None and prompt_tokens + max_new_tokens > max_positions:
        raise ContextTooLong(prompt_tokens, max_new_tokens, max_positions)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one assistant turn."""

    max_new_tokens: int = 128
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    stop_ids: tuple[int, ...] = ()  # extra stop ids; the generator always stops on its EOS ids
    seed: int | None = None
    return_entropy: bool = True
    top_logprobs: int = 0  # also report the k most likely tokens at each step (0 = off)
    #: vLLM's extensions, in-process (hf) engine only: no stop id (EOS or ``stop_ids``) is sampled
    #: before this many tokens; ``ignore_eos``: the EOS ids do not end the turn (``stop_ids`` still do)
    min_tokens: int = 0
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError("rollout.max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")
        if not 0.0 <= self.temperature <= 5.0:
            raise ConfigError("rollout.temperature", f"must be in [0, 5], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError("rollout.top_p", f"must be in (0, 1], got {self.top_p}")
        if not 0 <= self.top_logprobs <= 20:
            raise ConfigError("top_logprobs", f"must be in [0, 20], got {self.top_logprobs}")
        if not 0 <= self.min_tokens <= self.max_new_tokens:
            bounds = f"[0, max tokens = {self.max_new_tokens}]"
            raise ConfigError("min_tokens", f"must be in {bounds}, got {self.min_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def scale(self) -> float:
        """The temperature that divides the logits (1 for greedy)."""
        return 1.0 if self.greedy else self.temperature


@dataclass
class GenerationOutput:
    """One sampled continuation."""

    ids: list[int]
    logprobs: list[float]
    entropy: list[float] | None = None
    finish_reason: str | None = "stop"  # "stop" (an EOS/stop id, included in ids) | "length"; None: text
    timings: dict[str, float] = field(default_factory=dict)
    #: per token, the ``SamplingParams.top_logprobs`` most likely ``(id, logprob)`` pairs
    top_logprobs: list[list[tuple[int, float]]] | None = None
    #: the reply as text, from agents without token ids (scripted and chat agents; ``ids`` empty)
    text: str | None = None
    #: with the HF generator's hidden-state tap on and asked for: what the lowest trained block
    #: received for the prompt and ``ids[:-1]``, as segments ``[T_i, H]`` (:mod:`.hidden`); never saved
    hidden: tuple[Any, ...] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.logprobs):
            raise GeneratorError(f"{len(self.ids)} ids but {len(self.logprobs)} logprobs")
        if self.entropy is not None and len(self.entropy) != len(self.ids):
            raise GeneratorError(f"{len(self.ids)} ids but {len(self.entropy)} entropies")


#: ``on_token(row, token_id, logprob, top)`` is called as each token is sampled (``row`` indexes the
#: prompts, ``top`` is the step's top-logprob pairs or None); returning True ends that row there
#: with finish_reason "stop" (the token is kept), e.g. when a stop string has appeared.
TokenCallback = Callable[[int, int, float, "list[tuple[int, float]] | None"], bool]


def replay_tokens(outputs: list[GenerationOutput], on_token: TokenCallback) -> None:
    """Feed finished outputs to ``on_token`` as if streamed; a row the callback stops is cut there.

    Generators that cannot call back during decoding get streaming and stop strings this way.
    """
    for row, out in enumerate(outputs):
        for j, token in enumerate(out.ids):
            top = out.top_logprobs[j] if out.top_logprobs is not None else None
            if on_token(row, token, out.logprobs[j], top):
                out.ids, out.logprobs = out.ids[: j + 1], out.logprobs[: j + 1]
                if out.entropy is not None:
                    out.entropy = out.entropy[: j + 1]
                if out.top_logprobs is not None:
                    out.top_logprobs = out.top_logprobs[: j + 1]
                out.finish_reason = "stop"
                break


class Generator(ABC):
    """A generation backend. Implementations must be safe to call from one thread at a time."""

    #: Registry name of the backend.
    name: str = "base"
    #: Whether ``generate`` can return per-token entropy.
    supports_entropy: bool = False
    #: Whether ``score`` is implemented.
    supports_score: bool = False
    #: Requests per batch the backend handles well (the runner batches up to this many).
    max_batch_size: int = 32
    #: Whether ``generate`` takes ``seeds=``: one independent sampling stream per prompt, so a
    #: prompt's continuation does not depend on its batch-mates (the runner then batches requests
    #: of different seeds together).
    supports_row_seeds: bool = False
    #: Whether ``generate`` takes ``on_token`` and calls it while decoding (else see :func:`replay_tokens`).
    supports_streaming: bool = False
    #: Whether ``generate`` honours ``SamplingParams.top_logprobs``.
    supports_top_logprobs: bool = False
    #: Whether ``generate`` honours ``SamplingParams.min_tokens`` and ``ignore_eos``.
    supports_min_tokens: bool = False
    #: Whether one in-process engine decodes every episode's requests together: an episode's wait
    #: for it then measures the whole wave's load, not the episode, and ``rollout.episode_timeout_s``
    #: does not count it. False for remote servers, whose requests are each an episode's own.
    shared_batches: bool = False
    #: Positions the model can attend over (prompt + new tokens); None when unknown (remote servers).
    max_positions: int | None = None

    @abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[GenerationOutput]:
        """Sample one continuation per prompt (a batch of token-id lists)."""

    async def agenerate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingParams,
        seeds: Sequence[int | None] | None = None,
    ) -> list[GenerationOutput]:
        """Async form; by default runs :meth:`generate` in a worker thread (``seeds`` only where
        :attr:`supports_row_seeds`)."""
        if seeds is None:
            return await asyncio.to_thread(self.generate, prompts, sampling)
        return await asyncio.to_thread(self.generate, prompts, sampling, seeds=seeds)  # type: ignore[call-arg]

    async def agenerate_streaming(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingParams,
        on_token: TokenCallback,
        seeds: Sequence[int | None] | None = None,
    ) -> list[GenerationOutput]:
        """:meth:`agenerate` calling ``on_token`` per sampled token: during decoding where the backend
        can (``supports_streaming``), else replayed from the finished outputs."""
        if self.supports_streaming:
            kwargs = {} if seeds is None else {"seeds": seeds}
            return await asyncio.to_thread(self.generate, prompts, sampling, on_token, **kwargs)  # type: ignore[call-arg]
        outputs = await (self.agenerate(prompts, sampling) if seeds is None else self.agenerate(prompts, sampling, seeds))
        replay_tokens(outputs, on_token)
        return outputs

    def score(
        self, contexts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], *, temperature: float = 1.0
    ) -> list[list[float]]:
        """Teacher-forced log-prob of each target token after its context (no gradient).

        Returns, per pair, ``log p(target[j] | context, target[:j])`` for every j.
        """
        raise GeneratorError(f"the {self.name} generator cannot score; use the hf backend for IGPO scoring")

    def score_mean(
        self, contexts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], *, temperature: float = 1.0
    ) -> list[float]:
        """Length-normalised target log-prob per pair (IGPO's ``s_{i,t}``)."""
        out = []
        for lp in self.score(contexts, targets, temperature=temperature):
            out.append(sum(lp) / len(lp) if lp else -math.inf)
        return out

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Load new policy weights (name, tensor) in place."""
        raise GeneratorError(f"the {self.name} generator cannot take weight updates")

    def reset_cache(self) -> None:
        """Drop cached state derived from the weights (prefix K/V); the runner calls it per run."""
        return None

    def release(self, ids: Sequence[int]) -> None:
        """An episode whose tokens are ``ids`` has ended: what is cached for it alone may go (the
        runner calls it for every episode no later one continues; a no-op where nothing is cached)."""
        return None

    def prefix_reuse(self) -> tuple[int, int]:
        """``(prompt tokens prefilled, of them read from a prefix cache)`` since the generator was
        made; ``(0, 0)`` where the backend keeps no prefix cache of its own."""
        return 0, 0

    def close(self) -> None:
        """Release resources (servers, clients); the default holds none."""
        return None


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from ``parts`` (e.g. run seed, step, task, sample index, turn).

    A keyed hash, not ``hash()``: the same parts give the same seed in every process (no
    ``PYTHONHASHSEED`` dependence), and nearby parts give unrelated streams (``seed + step +
    index`` would make step 1's first sample replay step 0's second).
    """
    text = "\x1f".join(f"{type(p).__name__}:{p}" for p in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int | None = None) -> None:
    """Raise a clear error on empty prompts or ids outside the vocabulary."""
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise GeneratorError(f"prompt {i} is empty")
        if vocab_size is not None:
            bad = [t for t in prompt if not 0 <= int(t) < vocab_size]
            if bad:
                raise GeneratorError(
                    f"prompt {i} has ids outside the vocabulary (size {vocab_size}): {bad[:5]}"
                )


def make_generator(
    backend: str = "hf",
    *,
    model: Any = None,
    tokenizer: Any = None,
    model_name: str = "smollm2-135m",
    dtype: str = "float32",
    adapter: str | None = None,
    base_url: str | None = None,
    **kwargs: Any,
) -> Generator:
    """Build a generator by backend name (``hf`` | ``vllm`` | ``openai``).

    ``hf`` uses ``model``/``tokenizer`` when given (e.g. the learner's live model), else loads
    ``model_name``. ``openai`` needs ``base_url``. ``vllm`` loads ``model_name`` itself.
    """
    import agentrl.rollout  # noqa: F401  (registers the backends)
    from agentrl.registry import GENERATORS, load_entry_point

    cls = GENERATORS.get(backend, field="rollout.backend")
    if backend == "hf":
        if model is None:
            from agentrl.rollout.model import load_model

            model, tokenizer = load_model(model_name, dtype=dtype, adapter=adapter)
        return cls(model, tokenizer, **kwargs)
    if backend == "openai":
        if not base_url:
            raise ConfigError("rollout.base_url", "is required with backend=openai", "set rollout.base_url")
        urls = [u.strip() for u in base_url.split(",")]
        if len(urls) > 1:  # several servers: balanced per episode (generators/balanced.py)
            if not all(urls):
                raise ConfigError(
                    "rollout.base_url", f"empty URL in {base_url!r}", "use URL1,URL2 with no empty items"
                )
            balanced = load_entry_point(BALANCED)  # by name: the balanced generator subclasses Generator
            return balanced([cls(url, model=model_name, **kwargs) for url in urls])
        return cls(base_url, model=model_name, **kwargs)
    return cls(model_name, dtype=dtype, **kwargs)
