"""Small fixtures for learner tests: a random tiny Llama and synthetic multi-turn episodes."""

from __future__ import annotations

import dataclasses
import random

import torch

from agentrl.config import RunConfig, load_config
from agentrl.train.engines import TorchEngine
from agentrl.trajectory import Episode, Segment, Turn, build_batch

VOCAB = 96


def tiny_lm(seed: int = 0, hidden: int = 32, layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True,
        pad_token_id=0,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model


def config(*overrides: str) -> RunConfig:
    # float32 unless a test asks: `auto` would measure the machine, and exact comparisons need one answer
    return load_config(None, ["train.bf16_autocast=false", *overrides], validate=False)


def episodes(n_groups: int = 2, group_size: int = 3, seed: int = 0, max_turns: int = 3) -> list[Episode]:
    """Multi-turn episodes with random ids, rewards in {0, 1}, per-turn rewards and observations."""
    rng = random.Random(seed)
    out = []
    for g in range(n_groups):
        for i in range(group_size):
            turns = []
            for k in range(rng.randint(1, max_turns)):
                n_out = rng.randint(2, 6)
                turns.append(
                    Turn(
                        index=k,
                        output_ids=[rng.randrange(1, VOCAB) for _ in range(n_out)],
                        output_logprobs=[-rng.random() * 3 for _ in range(n_out)],
                        obs_ids=[rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 4))],
                        reward=rng.choice([0.0, 0.5]),
                        observation=f"obs {rng.randrange(3)}",
                    )
                )
            prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(3, 8))]
            out.append(
                Episode(
                    episode_id=f"e{g}-{i}",
                    env_id="test",
                    task_id=f"t{g}",
                    segments=[Segment(prompt, turns)],
                    group_id=f"g{g}",
                    outcome=float(rng.random() < 0.5) if i else 1.0,
                    terminated=True,
                )  # fmt: skip
            )
        out[-1].outcome = 0.0  # every group has both outcomes
    return out


def step_data(policy_engine, eps, cfg, **kw):
    from agentrl.train.fields import StepData
    from agentrl.train.plan import objective_plan
    from agentrl.train.update import score_tokens

    tokens = build_batch(eps)
    old = score_tokens(policy_engine, tokens, cfg.train.micro_batch_size)
    return StepData(
        episodes=eps, tokens=tokens, old=old, config=cfg, plan=objective_plan(cfg), engine=policy_engine, **kw
    )


class GradCapture(TorchEngine):
    """A TorchEngine that records the accumulated gradient at each optimizer step (``grads``)."""

    def step(self):
        self.grads = torch.cat([p.grad.flatten() for p in self.params])
        return super().step()


def replace(cfg: RunConfig, section: str, **values) -> RunConfig:
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **values)})
