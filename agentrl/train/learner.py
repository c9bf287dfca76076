"""The policy as the learner sees it: per-token log-probs, entropies and values of a TokenBatch.

:class:`Policy` wraps a Hugging Face causal LM (optionally with PEFT LoRA adapters) and an optional
value head on the same backbone (the critic of PPO / ST-PPO's GAE). Its forward pass runs the
decoder to the final hidden states and hands only the positions that predict a trainable token
to :func:`agentrl.kernels.token_logprobs_entropy`, so no ``[B, T, V]`` logits exist.

Alignment follows :class:`agentrl.trajectory.TokenBatch`: the value stored at position ``t``
describes token ``t`` (it comes from the hidden state at ``t - 1``); position 0 and untrained
positions hold 0.

The reference policy (KL) is the same weights with the adapters switched off when LoRA is on, so
no second model lives in memory; with full fine-tuning it is a frozen copy taken at start.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from agentrl.kernels import token_logprobs_entropy
from agentrl.rollout.model import is_peft, peft_quietly


@dataclass
class PolicyOutput:
    """Per-token outputs, each ``[B, L]`` float32 (0 where ``loss_mask`` is 0)."""

    logp: Tensor
    entropy: Tensor
    values: Tensor | None = None


def shared_prefix_length(input_ids: Tensor, attention_mask: Tensor) -> int:
    """Length of the token prefix every row shares (all real tokens), leaving each row >= 1 more token."""
    same = (input_ids == input_ids[:1]).all(dim=0) & attention_mask.bool().all(dim=0)  # [L]
    if same.all():
        return max(0, input_ids.shape[1] - 1)
    return int(same.long().argmin())


def add_lora(model: nn.Module, *, rank: int, alpha: int, targets: tuple[str, ...]) -> nn.Module:
    """Wrap ``model`` with LoRA adapters; only adapter weights stay trainable."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, bias="none")
    with peft_quietly():
        return get_peft_model(model, config)


class Policy(nn.Module):
    """Causal LM (+ LoRA) + optional value head, computing TokenBatch-aligned outputs.

    Args:
        model: a ``transformers`` causal LM or a PEFT model around one.
        critic: add a value head ``Linear(hidden, 1)`` on the final hidden states.
        logprob_impl: ``auto | chunked | triton | naive`` (see :mod:`agentrl.kernels`).
        temperature: the sampler's temperature; logits are divided by it so ratios compare like
            with like.
        autocast: run the decoder blocks under bfloat16 autocast (weights, LM head, log-probs and
            entropies stay float32).
    """

    def __init__(
        self, model: nn.Module, *, critic: bool = False, logprob_impl: str = "auto", temperature: float = 1.0,
        autocast: bool = False,
    ):  # fmt: skip
        super().__init__()
        self.model = model
        self.logprob_impl = logprob_impl
        self.autocast = autocast
        self.temperature = temperature if temperature > 0 else 1.0  # greedy sampling: T = 1
        hidden = self.lm.config.hidden_size
        self.value_head = nn.Linear(hidden, 1) if critic else None
        if self.value_head is not None:
            # start near V = 0 so early GAE advantages are close to the plain returns
            nn.init.normal_(self.value_head.weight, std=1e-3)
            nn.init.zeros_(self.value_head.bias)
            self.value_head.to(next(model.parameters()).device)
        self._reference: nn.Module | None = None

    @property
    def lm(self) -> nn.Module:
        """The underlying ``transformers`` model (PEFT unwrapped; LoRA layers stay injected)."""
        return self.model.get_base_model() if is_peft(self.model) else self.model

    @property
    def uses_lora(self) -> bool:
        return is_peft(self.model)

    #: A shared prefix shorter than this is not worth a separate pass.
    min_shared_prefix: int = 32
    #: Tails attend to the shared prefix held once (False: the prefix's cache is copied per row).
    prefix_attention: bool = True
    #: The shared-prefix attention runs where it pays: at least this many rows, each with a tail no
    #: longer than the prefix (a tree). Measured on 2 CPU cores (bf16, top 10 blocks trained, forward +
    #: backward): 16 rows x (600 + 40) tokens 3.15 s / 2.05 GiB against 3.99 s / 2.78 GiB copying the
    #: prefix's cache; 2 rows x (250 + 400) 4.07 s against 3.14 s, so a warm-up's pairs of
    #: demonstrations keep the copying path.
    min_shared_rows: int = 4
    #: With gradients, the tails' decoder layers are recomputed in the backward pass instead of
    #: keeping their activations (a tree's rows x tail tokens x layers; the prefix pass, at batch 1,
    #: keeps its own).
    checkpoint_tails: bool = True

    #: The lowest trained block where the learner may start from the sampler's kept states
    #: (``train.reuse_sampler_hidden``; :mod:`agentrl.rollout.generators.hidden`); None: never.
    start_layer: int | None = None

    def hidden_states(
        self, model: nn.Module, input_ids: Tensor, attention_mask: Tensor, start: Tensor | None = None
    ) -> Tensor:
        """Final (normed) hidden states ``[B, L, H]`` of ``model``'s decoder.

        ``start`` (``[B, L, H]``): what block :attr:`start_layer` receives for these tokens (the
        sampler's kept states of frozen blocks); the blocks below it are then not run.

        Rows of one batch usually start with the same system prompt and tool list (the rows of a
        tree share everything before their branch point). That common prefix runs once (batch 1);
        where that pays (:attr:`min_shared_rows`: a tree) the rows' tails then attend to its keys
        and values held once, without a copy per row (:mod:`agentrl.kernels.prefix_attention`), and
        with gradients their layers are recomputed in the backward pass (:attr:`checkpoint_tails`);
        elsewhere the prefix's cache is copied for every row. Gradients reach the prefix through both
        paths, so the result is the same as the plain batched pass. Models whose attention layers do
        not take a ``transformers`` attention function repeat the prefix's cache for every row
        instead, or run the plain pass where the model checkpoints its layers (which drops caches).
        """
        from agentrl.kernels import prefix_attention
        from agentrl.rollout.generators.kv_cache import cache_arg

        decoder = model.get_decoder()
        first = 0 if start is None else self.start_layer
        if first is None:
            raise ValueError("hidden states to start from, but Policy.start_layer is not set")
        run = _from_block(decoder, first)  # the decoder itself at block 0

        def feed(rows: slice, cols: slice) -> dict[str, Tensor]:  # token ids, or the kept states
            return {"input_ids": input_ids[rows, cols]} if start is None else {"inputs_embeds": start[rows, cols]}

        everything = slice(None)
        prefix = shared_prefix_length(input_ids, attention_mask)
        batch, length = input_ids.shape
        attend = (
            self.prefix_attention
            and batch >= self.min_shared_rows
            and length - prefix <= prefix
            and prefix_attention.supported(decoder)
        )
        if prefix < self.min_shared_prefix or input_ids.shape[0] == 1 or (_checkpoints(decoder) and not attend):
            out = run(**feed(everything, everything), attention_mask=attention_mask, use_cache=False)
            return out.last_hidden_state
        cache = _cache_from(first)
        with _layer_checkpointing(decoder, False):  # the prefix pass fills its cache
            head = run(**feed(slice(0, 1), slice(0, prefix)), **{cache_arg(decoder): cache}, use_cache=True)
        positions = torch.arange(prefix, length, device=input_ids.device)
        if attend:
            layers = torch.is_grad_enabled() and decoder.training and (self.checkpoint_tails or _checkpoints(decoder))
            prefixes = prefix_attention.Prefixes.of_cache(cache, batch, first=first)
            prefixes.recompute_scores = not layers  # a recomputed layer keeps no scores anyway
            recompute = functools.partial(prefix_attention.shared_prefix_attention, decoder)
            with prefix_attention.shared_prefix_attention(decoder), _layer_checkpointing(decoder, layers, recompute):
                tail = run(
                    **feed(everything, slice(prefix, None)),
                    attention_mask=prefix_attention.tail_mask(attention_mask, prefix),
                    position_ids=positions[None, :].expand(batch, -1),
                    use_cache=False,
                    shared_prefix=prefixes,
                )
        else:
            cache.batch_repeat_interleave(batch)
            tail = run(
                **feed(everything, slice(prefix, None)),
                attention_mask=attention_mask,
                **{cache_arg(decoder): cache},
                position_ids=positions[None, :].expand(batch, -1),
                cache_position=positions,
                use_cache=True,
            )
        return torch.cat([head.last_hidden_state.expand(batch, -1, -1), tail.last_hidden_state], dim=1)

    def _outputs(
        self, lm: nn.Module, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor, *, values: bool,
        start: Tensor | None = None,
    ) -> PolicyOutput:
        batch, length = input_ids.shape
        with torch.autocast(input_ids.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            hidden = self.hidden_states(lm, input_ids, attention_mask, start)  # [B, L, H]
        hidden = hidden.to(lm.get_output_embeddings().weight.dtype)
        select = loss_mask[:, 1:] > 0  # [B, L-1] positions t-1 that predict a trained token t
        rows = hidden[:, :-1][select]  # [N, H]
        targets = input_ids[:, 1:][select]  # [N]
        logp, entropy = self._through_head(lm.get_output_embeddings(), rows, targets)

        def place(flat: Tensor) -> Tensor:  # [N] -> [B, L], shifted right by one
            out = torch.zeros(batch, length - 1, dtype=flat.dtype, device=flat.device).masked_scatter(
                select, flat
            )
            return nn.functional.pad(out, (1, 0))

        value = None
        if values and self.value_head is not None:
            value = place(self.value_head(rows.to(self.value_head.weight.dtype)).squeeze(-1).float())
        return PolicyOutput(logp=place(logp), entropy=place(entropy), values=value)

    def _through_head(self, head: nn.Module, rows: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """Run the fused log-prob kernel *as the LM head module's forward*.

        Engines that shard parameters (DeepSpeed ZeRO-3) gather a module's weights in hooks
        around its forward and backward; the head weight is often tied to the embedding, so
        reading it anywhere else would see an empty shard.
        """

        def fused(hidden: Tensor) -> tuple[Tensor, Tensor]:
            return token_logprobs_entropy(
                hidden, head.weight, targets, impl=self.logprob_impl, temperature=self.temperature
            )

        head.forward = fused  # instance attribute shadows the class forward for this one call
        try:
            return head(rows)
        finally:
            del head.forward

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor, reference: bool = False,
        start: Tensor | None = None,
    ) -> PolicyOutput:
        """Log-probs, entropies (and values with a critic) of the batch's trained tokens.

        With ``reference=True`` the reference policy is used (no values); call it under
        ``torch.no_grad``. Going through ``forward`` either way lets engines (DeepSpeed ZeRO-3)
        gather parameters for both passes. ``start``: see :meth:`hidden_states` (not with ``reference``).
        """
        if reference:
            with self._reference_lm() as lm:
                return self._outputs(lm, input_ids, attention_mask, loss_mask, values=False)
        return self._outputs(self.lm, input_ids, attention_mask, loss_mask, values=True, start=start)

    @torch.no_grad()
    def continuation_logprobs(self, sequence: Tensor, boundaries: list[int], continuation: Tensor) -> Tensor:
        """Log-probs ``[K, S]`` of ``continuation`` (``[S]``) placed after each prefix ``sequence[:b]``.

        The sequence runs once; each of the K prefixes reuses its keys/values and only feeds its
        last token plus the continuation (IGPO's gold-answer confidence after every turn costs
        about one forward per episode instead of one per turn). Same values as scoring each
        ``sequence[:b] + continuation`` row on its own.
        """
        from transformers import DynamicCache

        from agentrl.rollout.generators.kv_cache import cache_arg, left_padded_cache

        if not boundaries or min(boundaries) < 1 or max(boundaries) > sequence.numel():
            raise ValueError(f"boundaries must lie in [1, {sequence.numel()}], got {boundaries}")
        lm, device = self.lm, sequence.device
        decoder = lm.get_decoder()
        width = max(boundaries) - 1  # cached positions of the longest prefix
        kept = [b - 1 for b in boundaries]  # each row re-feeds its prefix's last token
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.autocast):
            cache = None
            if width > 0:
                full = DynamicCache()
                decoder(input_ids=sequence[None, :width], **{cache_arg(decoder): full}, use_cache=True)
                cache = left_padded_cache(  # row r: the first kept[r] positions, left-padded to `width`
                    [[(layer.keys[:, :, :n], layer.values[:, :, :n]) for layer in full.layers] for n in kept]
                )
            feed = torch.stack([torch.cat([sequence[n : n + 1], continuation]) for n in kept])  # [K, S+1]
            attention = torch.zeros(len(kept), width + feed.shape[1], dtype=torch.long, device=device)
            for row, n in enumerate(kept):
                attention[row, width - n :] = 1
            positions = torch.tensor(kept, device=device)[:, None] + torch.arange(feed.shape[1], device=device)
            hidden = decoder(
                input_ids=feed, attention_mask=attention, position_ids=positions, **{cache_arg(decoder): cache},
                use_cache=cache is not None,
            ).last_hidden_state[:, :-1]  # [K, S, H]: predictions of the continuation
        head = lm.get_output_embeddings()
        rows = hidden.reshape(-1, hidden.shape[-1]).to(head.weight.dtype)
        logp, _ = self._through_head(head, rows, continuation.repeat(len(kept)))
        return logp.view(len(kept), continuation.numel())

    # ------------------------------------------------------------------ reference policy
    def prepare_reference(self) -> None:
        """Make a frozen reference available (a copy only without LoRA); call before training."""
        if self.uses_lora or self._reference is not None:
            return
        reference = copy.deepcopy(self.lm)
        reference.requires_grad_(False)
        reference.eval()
        # stored outside the module tree so it is not trained, saved or wrapped by engines
        object.__setattr__(self, "_reference", reference)

    @contextlib.contextmanager
    def _reference_lm(self) -> Iterator[nn.Module]:
        if self.uses_lora:
            with self.model.disable_adapter():
                yield self.lm
            return
        if self._reference is None:
            raise RuntimeError("no reference policy: call prepare_reference() before training starts")
        yield self._reference

    @torch.no_grad()
    def reference_logprobs(self, input_ids: Tensor, attention_mask: Tensor, loss_mask: Tensor) -> Tensor:
        """``[B, L]`` log-probs under the reference policy (adapters off, or the frozen copy)."""
        return self.forward(input_ids, attention_mask, loss_mask, reference=True).logp

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]


def _from_block(decoder: nn.Module, first: int) -> nn.Module:
    """``decoder``'s forward from block ``first`` on, taking that block's input as ``inputs_embeds``:
    a shallow copy, made per call (so its flags are the decoder's now), whose ``layers`` are the
    blocks from ``first``, the same modules and parameters; the decoder the generator samples from
    is not touched. ``first=0``: the decoder itself."""
    if first == 0:
        return decoder
    top = copy.copy(decoder)
    top._modules = {**decoder._modules, "layers": nn.ModuleList(list(decoder.layers)[first:])}
    return top


def _cache_from(first: int) -> Any:
    """A ``transformers`` ``DynamicCache`` for blocks ``first..``: block ``first + i`` keeps its K/V in
    slot ``i``, so lengths and masks read the first block run, as the decoder's own forward does."""
    from transformers import DynamicCache

    if first == 0:
        return DynamicCache()

    class Shifted(DynamicCache):
        def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
            return super().update(key_states, value_states, layer_idx - first, *args, **kwargs)

    return Shifted()


def _checkpoints(decoder: nn.Module) -> bool:
    """Whether the model checkpoints its decoder layers (``model.gradient_checkpointing``)."""
    return any(getattr(layer, "gradient_checkpointing", False) for layer in getattr(decoder, "layers", ()))


@contextlib.contextmanager
def _layer_checkpointing(
    decoder: nn.Module, on: bool, recompute_in: Callable[[], contextlib.AbstractContextManager] | None = None
) -> Iterator[None]:
    """Within the context the decoder's layers are (``on``) or are not recomputed in the backward
    pass (``transformers``' ``GradientCheckpointingLayer``, non-reentrant), whatever they were.
    ``recompute_in``: a context the recomputation runs in (the backward pass runs after this
    context has closed, so anything the forward relied on must be entered again)."""
    from torch.utils.checkpoint import checkpoint

    layers = [layer for layer in getattr(decoder, "layers", ()) if hasattr(layer, "gradient_checkpointing")]
    before = [(layer.gradient_checkpointing, layer.__dict__.get("_gradient_checkpointing_func")) for layer in layers]
    func = functools.partial(checkpoint, use_reentrant=False)
    if recompute_in is not None:
        func = functools.partial(func, context_fn=lambda: (contextlib.nullcontext(), recompute_in()))
    for layer in layers:
        layer.gradient_checkpointing = on
        if on:
            layer._gradient_checkpointing_func = func
    try:
        yield
    finally:
        for layer, (was_on, func) in zip(layers, before, strict=True):
            layer.gradient_checkpointing = was_on
            if func is not None:
                layer._gradient_checkpointing_func = func
            else:
                layer.__dict__.pop("_gradient_checkpointing_func", None)


def freeze_below(model: nn.Module, top_layers: int) -> None:
    """Train only the top ``top_layers`` decoder blocks and the final norm (embeddings/head frozen).

    Backpropagation then stops at the lowest trainable block, which is most of the saving.
    """
    decoder = model.get_decoder()
    blocks = list(decoder.layers)
    model.requires_grad_(False)
    for block in blocks[max(0, len(blocks) - top_layers) :]:
        block.requires_grad_(True)
    if getattr(decoder, "norm", None) is not None:
        decoder.norm.requires_grad_(True)


def build_policy(model: nn.Module, config: Any) -> Policy:
    """A :class:`Policy` from a RunConfig: LoRA when ``model.lora_rank > 0``, critic when asked.

    ``train.bf16_autocast: auto`` is measured here unless the caller resolved it already (the
    trainer does, to print and save the decision: :mod:`agentrl.train.precision`)."""
    autocast = config.train.bf16_autocast
    if not isinstance(autocast, bool):
        from agentrl.train.precision import resolve_bf16

        autocast = resolve_bf16(autocast, model, rows=config.train.micro_batch_size).bf16
    if config.model.lora_rank > 0 and not is_peft(model):
        model = add_lora(
            model,
            rank=config.model.lora_rank,
            alpha=config.model.lora_alpha,
            targets=config.model.lora_targets,
        )
    if config.train.trainable_layers > 0 and not is_peft(model):
        freeze_below(model, config.train.trainable_layers)
    if config.model.gradient_checkpointing:
        # transformers 5.x renamed it (the old name warns); earlier releases have only the old one
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
        if is_peft(model):
            model.enable_input_require_grads()
    return Policy(
        model,
        critic=config.algo.critic,
        logprob_impl=config.train.logprob_impl,
        temperature=config.rollout.temperature,
        autocast=autocast,
    )


__all__ = ["Policy", "PolicyOutput", "add_lora", "build_policy", "freeze_below", "is_peft"]
