"""``train.reuse_sampler_hidden``: whether the learner starts at the lowest trained block from the
sampler's kept states (:mod:`agentrl.rollout.generators.hidden`), resolved once at start."""

from __future__ import annotations

import os
from typing import Any

from agentrl.errors import ConfigError


def blocks_of(model: Any) -> int:
    """Decoder blocks of ``model`` (0 where it has no ``get_decoder().layers``)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    return len(getattr(decoder, "layers", None) or ())


def why_not(config: Any, model: Any, *, lora: bool, sampler_dtype: str) -> str | None:
    """What stands in the way of starting from the sampler's states, or None (``sampler_dtype``: the
    resolved ``rollout.sampler_dtype``)."""
    from agentrl.kernels import prefix_attention

    train, rollout = config.train, config.rollout
    if lora:
        return "LoRA adapts every block"
    blocks = blocks_of(model)
    if not 0 < train.trainable_layers < blocks:
        return f"every block trains (train.trainable_layers={train.trainable_layers} of {blocks}): none is frozen"
    if rollout.backend != "hf":
        return f"the {rollout.backend} engine does not keep hidden states (rollout.backend=hf does)"
    if sampler_dtype != "model":
        return f"the rollouts sample from a {sampler_dtype} copy (rollout.sampler_dtype), not the learner's weights"
    if not rollout.prefix_cache_tokens:
        return (
            "the generator keeps the states in its prefix cache (rollout.prefix_cache_tokens=0 turns it off)"
        )
    if train.engine != "torch" or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return "it runs in one process with train.engine=torch"
    if not prefix_attention.supported(model.get_decoder()):
        return "the model's decoder is not one it was checked on (llama, qwen2, qwen3 families)"
    return None


def resolve(config: Any, model: Any, *, lora: bool, sampler_dtype: str) -> tuple[bool, str]:
    """``(on, the line to print)``; ``true`` that cannot hold is a ConfigError naming why."""
    asked = config.train.reuse_sampler_hidden
    if asked is False:
        return False, "learner: runs every block (train.reuse_sampler_hidden=false, as set)"
    reason = why_not(config, model, lora=lora, sampler_dtype=sampler_dtype)
    if reason is not None:
        if asked is True:
            raise ConfigError("train.reuse_sampler_hidden", f"true, but {reason}", "set it to auto or false")
        return False, f"learner: runs every block (train.reuse_sampler_hidden=false, auto: {reason})"
    blocks = blocks_of(model)
    first = blocks - config.train.trainable_layers
    said = "as set" if asked is True else "auto"
    return True, (f"learner: starts at block {first + 1} of {blocks} from the states the sampler computed there "
                  f"(blocks 1-{first} are frozen; train.reuse_sampler_hidden=true, {said})")  # fmt: skip


def start_layer(config: Any, model: Any) -> int | None:
    """The block index the learner starts at (resolved config), or None."""
    if config.train.reuse_sampler_hidden is not True:
        return None
    return blocks_of(model) - config.train.trainable_layers


__all__ = ["blocks_of", "resolve", "start_layer", "why_not"]
