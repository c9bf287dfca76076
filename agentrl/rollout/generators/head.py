"""Next-token logits for the HF generator: the decoder's last hidden state times the LM head, with the
head's weight prepacked for oneDNN on CPU.

A decode step's LM head is one ``[B, H] x [H, V]`` product with a small batch ``B`` and a large
vocabulary ``V`` (SmolLM2: 576 x 49,152, a fifth of the model's weights). On CPU it was half of a
rollout's decode time (py-spy over one quickstart RL step, 2026-11-28): ``F.linear`` streams the
float32 weight at a fraction of the memory bandwidth the decoder's smaller matrices reach. A weight
reordered once into oneDNN's blocked layout (``torch.utils.mkldnn``) gives the same product in float32
(within ~1e-6 of ``F.linear``) faster; ``benchmarks/bench_decode.py --head`` measures both.

The packed copy follows the live weight: it is rebuilt when the weight's version counter moves (an
optimizer step updates the weight in place) or its storage changes, so a generator sampling from
the model being trained never samples from stale weights. It is used only where it computes what
the model's own forward computes: a plain ``nn.Linear`` head without bias (not a LoRA-wrapped head),
no logit soft-capping or scaling in the config, float32 on CPU with oneDNN available, not partitioned
by ZeRO-3; anywhere else the model's forward (``logits_to_keep=1``) gives the logits.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from agentrl.rollout.generators.kv_cache import with_cache

#: config attributes that make a causal LM's logits more than ``lm_head(hidden)``
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


class PackedHead:
    """The LM head's weight in oneDNN's layout, rebuilt when the weight changes."""

    def __init__(self, head: nn.Linear):
        self.head = head
        self._key: tuple[int, int] | None = None
        self._packed: Any = None

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, H]`` float32 hidden states -> ``[B, V]`` float32 logits."""
        weight = self.head.weight
        key = (weight.data_ptr(), weight._version)
        if key != self._key:
            self._packed = weight.detach().to_mkldnn()
            self._key = key
        out = torch._C._nn.mkldnn_linear(hidden.contiguous().to_mkldnn(), self._packed, None)
        return out.to_dense()


def packed_head_for(model: Any) -> PackedHead | None:
    """A :class:`PackedHead` for ``model``'s LM head, or None where the model's own forward must
    compute the logits (see the module docstring)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    config = getattr(model, "config", None)
    if type(head) is not nn.Linear or head.bias is not None or not hasattr(model, "get_decoder"):
        return None
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return None
    weight = head.weight
    if (
        weight.device.type != "cpu"
        or weight.dtype != torch.float32
        or not torch.backends.mkldnn.is_available()
    ):
        return None
    return PackedHead(head)


def last_logits(model: Any, head: PackedHead | None, **inputs: Any) -> torch.Tensor:
    """Logits ``[B, V]`` at the last position of a cached forward of ``model`` over ``inputs``
    (its cache given as ``past_key_values``, passed under the name the model's forward takes)."""
    if head is None or hasattr(head.head.weight, "ds_id"):  # a ZeRO-3 partition: the model's forward gathers it
        return model(**with_cache(model, inputs), use_cache=True, logits_to_keep=1).logits[:, -1, :]
    decoder = model.get_decoder()
    hidden = decoder(**with_cache(decoder, inputs), use_cache=True).last_hidden_state[:, -1, :]  # [B, H]
    return head(hidden)
