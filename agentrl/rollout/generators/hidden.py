"""What one decoder block receives, kept by the HF generator so the learner can start there.

With ``train.trainable_layers: N`` the learner trains only the top N blocks; the blocks below are
frozen, so their output for every token of a training episode is what the sampler computed when it
prefilled and decoded that token (the same weights, the same float32 arithmetic up to the batch's
shape). :class:`HiddenTap` keeps that output, the input of the lowest trained block (``H`` floats a
token: 2.3 KB for SmolLM2 in float32, against 46 KB of K/V), as one more layer of the generator's
K/V caches: keys ``[B, 1, T, H]``, values ``[B, 1, T, 0]``, in the cache slot past the model's own
layers. It then follows every cached prefix, left-padded batch, dropped row and shared tree prompt
exactly as the K/V do, with no code of its own there. A finished row's states come out with its
generation (:attr:`~agentrl.rollout.generators.base.GenerationOutput.hidden`), the agent keeps its
last call's (:class:`SamplerHidden`), and the learner runs only the trained blocks from them
(:meth:`agentrl.train.learner.Policy.hidden_states`).

The tap acts only while the generator is asked for the states (:func:`returned`: the trainer's
rollouts, not its evals, which then hold no extra memory) and only in the thread the generator
marked (:meth:`HiddenTap.active`): the learner, which runs the same model object, never adds to its
own caches through it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch


class HiddenTap:
    """A forward pre-hook on decoder block ``layer`` of ``model`` that appends the block's input to
    the forward's cache, in slot ``len(decoder.layers)``."""

    def __init__(self, model: Any, layer: int):
        decoder = model.get_decoder()
        blocks = decoder.layers
        if not 0 < layer < len(blocks):
            raise ValueError(f"hidden-state tap at block {layer}: the model has blocks 0..{len(blocks) - 1}")
        self.layer = layer
        self.slot = len(blocks)
        self._owner: int | None = None

        # a closure, not a bound method: a deep copy of the model (a bfloat16 eval sampler) shares this
        # tap, inactive there (evals do not ask for the states), instead of copying it
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if self._owner != threading.get_ident():
                return
            cache = next(
                (
                    kwargs[k]
                    for k in ("cache", "past_key_values", "past_key_value")
                    if kwargs.get(k) is not None
                ),
                None,
            )
            if cache is None:
                return
            hidden = (args[0] if args else kwargs["hidden_states"]).detach()[:, None]  # [B, 1, S, H]
            cache.update(hidden, hidden[..., :0], self.slot)

        self.handle = blocks[layer].register_forward_pre_hook(hook, with_kwargs=True)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Inside the block, forwards run by this thread keep the states."""
        self._owner = threading.get_ident()
        try:
            yield
        finally:
            self._owner = None

    def remove(self) -> None:
        self.handle.remove()


def row_hidden(kv: list[tuple[torch.Tensor, torch.Tensor]], base: Any, slot: int) -> tuple[torch.Tensor, ...]:
    """A cached row's kept states as segments ``[T_i, H]`` in token order: its shared prompt's
    (``base``, a :class:`~agentrl.rollout.generators.kv_cache.SharedPrefix`) then its own."""
    parts = []
    if base is not None and len(base.kv) > slot:
        parts.append(base.kv[slot][0][0, 0])
    if len(kv) > slot:
        parts.append(kv[slot][0][0, 0])
    return tuple(parts)


@dataclass
class SamplerHidden:
    """What the lowest trained block received for ``ids`` (an episode's last prompt and the tokens
    sampled after it but the last, which was never fed), as segments ``[T_i, H]`` (a tree's trunk,
    held once for all its branches, then the row's own)."""

    ids: tuple[int, ...]
    parts: tuple[torch.Tensor, ...]

    def __post_init__(self) -> None:
        covered = sum(int(p.shape[0]) for p in self.parts)
        if covered != len(self.ids):
            raise ValueError(f"kept states cover {covered} tokens, the sequence has {len(self.ids)}")

    def covers(self, row_ids: Sequence[int] | torch.Tensor) -> bool:
        """True when ``row_ids`` starts with :attr:`ids`."""
        n = len(self.ids)
        if len(row_ids) < n:
            return False
        head = row_ids[:n]
        head = head.tolist() if isinstance(head, torch.Tensor) else list(head)
        return tuple(head) == self.ids

    def rows(self, length: int) -> torch.Tensor:
        """``[length, H]``: the states, zeros past them (positions whose outputs no trained token reads)."""
        first = self.parts[0]
        out = first.new_zeros((length, first.shape[-1]))
        at = 0
        for part in self.parts:
            take = min(int(part.shape[0]), length - at)
            if take <= 0:
                break
            out[at : at + take] = part[:take]
            at += take
        return out


@contextlib.contextmanager
def returned(generator: Any) -> Iterator[None]:
    """Inside the block, ``generator``'s generations carry their kept states where it keeps them (an
    HF generator with a tap): the trainer's rollouts, whose episodes the learner trains on."""
    if getattr(generator, "tap", None) is None:
        yield
        return
    generator.reset_cache()  # cached K/V either all have the states' slot or none has
    generator.return_hidden = True
    try:
        yield
    finally:
        generator.return_hidden = False
        generator.reset_cache()


__all__ = ["HiddenTap", "SamplerHidden", "returned", "row_hidden"]
