"""Supervised warm-up on oracle demonstrations: maximise the log-prob of the oracle's turns.

Demonstrations are ordinary :class:`agentrl.trajectory.Episode` records produced by
``agentrl.rollout.runner.run_oracle_episodes`` (the oracle's action text tokenized as model turns),
so the loss is the token-mean negative log-likelihood over exactly the tokens RL later trains.
It runs on the policy with its own AdamW before the RL engine takes over (on every rank alike),
so the RL optimizer state and schedule start clean.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch

from agentrl.errors import ConfigError
from agentrl.train.learner import Policy
from agentrl.trajectory import Episode, build_batch


def sft_warmup(policy: Policy, demos: Sequence[Episode], *, steps: int, lr: float, batch_size: int,
               micro_batch_size: int, seed: int = 0, pad_id: int = 0, max_grad_norm: float = 1.0,
               log: Any = None, temperature: float | None = None) -> list[float]:  # fmt: skip
    """``steps`` AdamW steps of token-mean NLL on random batches of demonstrations.

    The NLL is of ``logits / temperature`` (``None``: the policy's own, i.e. the sampler's
    temperature, as the RL loss uses); the policy's temperature is restored afterwards.

    Returns:
        The loss of each step.
    """
    usable = [ep for ep in demos if not ep.failed and ep.outcome > 0]
    if not usable:
        raise ConfigError(
            "train.oracle",
            f"none of the {len(demos)} oracle demonstrations succeeded",
            "check the oracle against the env, and that env.max_turns leaves room for its answer turn",
        )
    params = policy.trainable_parameters()
    optimizer = torch.optim.AdamW(params, lr=lr)
    rng = random.Random(seed)
    device = policy.lm.device
    policy.train()
    losses = []
    rl_temperature = policy.temperature
    if temperature is not None:
        policy.temperature = temperature
    try:
        for step in range(steps):
            chosen = rng.sample(usable, min(batch_size, len(usable)))
            tokens = build_batch(chosen, pad_id=pad_id)
            total_tokens = tokens.loss_mask.sum().clamp_min(1)
            loss_value = 0.0
            for start in range(0, len(chosen), micro_batch_size):
                rows = slice(start, start + micro_batch_size)
                length = int(tokens.attention_mask[rows].sum(1).max())
                ids = tokens.input_ids[rows, :length].to(device)
                mask = tokens.attention_mask[rows, :length].to(device)
                loss_mask = tokens.loss_mask[rows, :length].to(device)
                out = policy(ids, mask, loss_mask)
                loss = -(out.logp * loss_mask).sum() / total_tokens
                loss.backward()
                loss_value += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss_value)
            if log is not None:
                log(step, {"sft/loss": loss_value})
    finally:
        policy.temperature = rl_temperature
    return losses


__all__ = ["sft_warmup"]


def warn_long_turns(demos: list[Episode], budget: int, logger: Any) -> int:
    """Say so when demonstrations hold turns longer than the policy's per-turn budget
    (``rollout.max_new_tokens``; the oracle's own budget is larger): the warm-up teaches those turns,
    but the policy is cut off before it can finish one. Logged as ``sft/demos_over_budget``."""
    lengths = [max((len(t.output_ids) for s in d.segments for t in s.turns), default=0) for d in demos]
    over = [n for n in lengths if n > budget]
    logger.log(0, {"sft/demos_over_budget": float(len(over))})
    if over:
        logger.console.print(
            f"warm-up: {len(over)} of {len(demos)} demonstrations have a turn longer than rollout.max_new_tokens="
            f"{budget} (longest {max(over)} tokens); the policy is cut off before it can finish such a turn: "
            "raise rollout.max_new_tokens or shorten the oracle's actions"
        )  # fmt: skip
    return len(over)
