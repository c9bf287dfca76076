"""The trained weights leaving the learner: to a separate generator each step (vLLM; the HF
generator samples from the live model) and, at the end, to a folder ``agentrl serve`` loads; the
generator's sampling stream saved with checkpoints."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from agentrl.train.learner import is_peft


def export_weights(policy: Any) -> list[tuple[str, torch.Tensor]]:
    """Full-model weights under Hugging Face names (LoRA merged in) for an external generator."""
    model = policy.model
    if is_peft(model):
        model.merge_adapter()
        try:
            return [
                (name.replace(".base_layer.", "."), p.detach().clone())
                for name, p in policy.lm.named_parameters()
                if "lora_" not in name
            ]
        finally:
            model.unmerge_adapter()
    return [(name, p.detach()) for name, p in policy.lm.named_parameters()]


def shares_model(engine: Any, generator: Any) -> bool:
    """Whether the generator samples from the very module being trained (the HF generator)."""
    return getattr(generator, "model", None) is engine.policy.model


def generating(engine: Any, generator: Any) -> contextlib.AbstractContextManager:
    """Around a rollout or eval phase: the engine's generation context (ZeRO-3: weights gathered once,
    hooks off) where the generator samples from the live model; else nothing."""
    context = getattr(engine, "generation_context", None)
    if context is None or not shares_model(engine, generator):
        return contextlib.nullcontext()
    return context()


def sync_generator(engine: Any, generator: Any) -> None:
    """New weights to the generator: nothing when it shares the live model, else a copy (vLLM)."""
    if shares_model(engine, generator):
        return
    gather = getattr(engine, "gathered_parameters", None)
    if gather is not None:
        with gather():
            generator.update_weights(export_weights(engine.policy))
    else:
        generator.update_weights(export_weights(engine.policy))


def export_model(engine: Any, tokenizer: Any, directory: Path, *, write: bool = True) -> Path:
    """The trained policy as a folder ``agentrl serve --adapter DIR`` and ``model.adapter`` load:
    the PEFT adapter under LoRA, else the full model (``save_pretrained``), plus the tokenizer.
    Every rank calls it (ZeRO-3 gathers the weights collectively); only ``write`` ranks save."""
    gather = getattr(engine, "gathered_parameters", None)
    with gather() if gather is not None else contextlib.nullcontext():
        if write:
            engine.policy.model.save_pretrained(directory)
            tokenizer.save_pretrained(directory)
    return directory


def generator_rng_state(generator: Any) -> Any:
    """The generator's sampling RNG state (None when it keeps none)."""
    # HFGenerator keeps a private torch.Generator for sampling; saved so a resumed run samples alike
    rng = getattr(generator, "_rng", None)
    return rng.get_state() if isinstance(rng, torch.Generator) else None


def restore_generator_rng(generator: Any, state: Any) -> None:
    rng = getattr(generator, "_rng", None)
    if state is not None and isinstance(rng, torch.Generator):
        rng.set_state(state)
