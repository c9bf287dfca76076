"""vLLM generator (GPU; ``pip install agentrl[gpu]``): token ids in, ids + sampler log-probs out.

vLLM is imported lazily, so this module loads (and its errors are clear) without it. Weight
updates from the learner go in place through the model's ``load_weights`` (vLLM's own loader,
which handles fused/sharded parameters). Log-probs are requested in vLLM's ``processed_logprobs``
mode where the installed version has it, i.e. under the temperature-scaled distribution like the
other backends; older versions report raw (T = 1) log-probs, which differ when T != 1.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from agentrl.errors import GeneratorError
from agentrl.rollout.generators.base import GenerationOutput, Generator, SamplingParams, check_prompts


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise GeneratorError(
            "the vllm backend needs vLLM on a CUDA machine: pip install 'agentrl[gpu]' "
            "(or use rollout.backend=hf on CPU)"
        ) from exc
    return vllm


class VLLMGenerator(Generator):
    """In-process vLLM engine (``vllm.LLM``)."""

    name = "vllm"
    shared_batches = True
    supports_entropy = False
    supports_score = True

    def __init__(
        self,
        model_name: str,
        *,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = None,
        seed: int = 0,
        enforce_eager: bool = False,
        **engine_kwargs: Any,
    ):
        vllm = _import_vllm()
        from agentrl.rollout.model import resolve_model_path

        # In-process engine core, so update_weights can reach the model object.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        kwargs: dict[str, Any] = dict(
            model=resolve_model_path(model_name),
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            enforce_eager=enforce_eager,
            **engine_kwargs,
        )
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        try:
            self.llm = vllm.LLM(logprobs_mode="processed_logprobs", **kwargs)
            self.processed_logprobs = True
        except TypeError:  # older vLLM without logprobs_mode
            self.llm = vllm.LLM(**kwargs)
            self.processed_logprobs = False
        self._vllm = vllm
        self.max_batch_size = 256

    def _params(self, sampling: SamplingParams, **extra: Any) -> Any:
        return self._vllm.SamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,
            stop_token_ids=list(sampling.stop_ids) or None,
            seed=sampling.seed,
            skip_special_tokens=False,
            **extra,
        )

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[GenerationOutput]:
        check_prompts(prompts)
        requests = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        results = self.llm.generate(requests, sampling_params=self._params(sampling), use_tqdm=False)
        outputs = []
        for result in results:
            completion = result.outputs[0]
            ids = list(completion.token_ids)
            logprobs = [
                float(step[tok].logprob) for step, tok in zip(completion.logprobs or [], ids, strict=True)
            ]
            outputs.append(
                GenerationOutput(ids=ids, logprobs=logprobs, finish_reason=completion.finish_reason or "stop")
            )
        return outputs

    def score(
        self, contexts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], *, temperature: float = 1.0
    ) -> list[list[float]]:
        if temperature != 1.0:
            raise GeneratorError("vLLM prompt log-probs are raw (T = 1); score with temperature=1.0")
        requests = [
            {"prompt_token_ids": [int(t) for t in c] + [int(t) for t in g]}
            for c, g in zip(contexts, targets, strict=True)
        ]
        params = self._params(SamplingParams(max_new_tokens=1, temperature=0.0), prompt_logprobs=0)
        results = self.llm.generate(requests, sampling_params=params, use_tqdm=False)
        scores = []
        for result, target in zip(results, targets, strict=True):
            prompt_ids = result.prompt_token_ids
            entries = result.prompt_logprobs  # [None, {id: Logprob}, ...]
            n = len(target)
            scores.append(
                [
                    float(entries[i][prompt_ids[i]].logprob)
                    for i in range(len(prompt_ids) - n, len(prompt_ids))
                ]
            )
        return scores

    def _model(self) -> Any:
        engine = self.llm.llm_engine
        for path in (
            "model_executor.driver_worker.worker.model_runner.model",
            "model_executor.driver_worker.model_runner.model",
            "engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model",
        ):
            node = engine
            try:
                for attr in path.split("."):
                    node = getattr(node, attr)
                return node
            except AttributeError:
                continue
        raise GeneratorError(
            "cannot reach the vLLM model for in-place weight updates; run with VLLM_ENABLE_V1_MULTIPROCESSING=0"
        )

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        self._model().load_weights(weights=named_tensors)
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if reset is not None:
            reset()  # cached KV blocks were computed with the old weights
