"""The fast build_batch equals the row-by-row reference (pre-#15 code) on random episodes."""

from __future__ import annotations

import random

import pytest
import torch

from agentrl.trajectory import Episode, Segment, Source, Turn, build_batch, reference_batch


def random_episodes(seed: int, n: int = 12) -> list[Episode]:
    """Episodes with every shape build_batch meets: branches, summaries, missing entropy or process
    rewards, empty outputs/observations, custom prompt sources, failed episodes, turn-less segments."""
    rng = random.Random(seed)
    episodes = []
    for e in range(n):
        segments = []
        index = 0
        for fold in range(rng.randint(1, 3)):
            n_prompt = rng.randint(0, 12)
            prompt_source = [rng.choice([0, 4]) for _ in range(n_prompt)] if rng.random() < 0.3 else None
            turns = []
            for _ in range(rng.randint(0 if fold else 1, 4)):
                n_out, n_obs = rng.randint(0, 9), rng.choice([0, rng.randint(1, 9)])
                turns.append(
                    Turn(
                        index=index,
                        output_ids=[rng.randrange(50000) for _ in range(n_out)],
                        output_logprobs=[-rng.random() * 5 for _ in range(n_out)],
                        obs_ids=[rng.randrange(50000) for _ in range(n_obs)],
                        obs_source=[
                            rng.choice([int(Source.TOOL), int(Source.TEMPLATE), 0]) for _ in range(n_obs)
                        ],
                        kind=rng.choice(["action", "action", "summary", "branch", "return"]),
                        output_entropy=None if rng.random() < 0.05 else [rng.random() for _ in range(n_out)],
                        process_reward=None
                        if rng.random() < 0.5
                        else [rng.choice([0.0, -1.0, -0.2, -1.2]) for _ in range(n_out)],
                    )
                )
                index += 1
            segments.append(
                Segment(
                    prompt_ids=[rng.randrange(50000) for _ in range(n_prompt)],
                    turns=turns,
                    fold_id=fold,
                    kind="main" if fold == 0 else "branch",
                    prompt_source=prompt_source,
                )
            )
        episodes.append(
            Episode(
                episode_id=f"e{e}",
                env_id="x",
                task_id="t",
                segments=segments,
                error="boom" if rng.random() < 0.1 else None,
            )  # fmt: skip
        )
    return episodes


@pytest.mark.parametrize("seed", range(20))
def test_build_batch_equals_the_reference(seed):
    episodes = random_episodes(seed)
    if all(ep.failed for ep in episodes):
        pytest.skip("every episode failed")
    fast, slow = build_batch(episodes, pad_id=7), reference_batch(episodes, pad_id=7)
    for name in ("input_ids", "attention_mask", "loss_mask", "turn_id", "old_logprobs", "source",
                 "fold_id", "row_episode", "process_reward", "entropy"):  # fmt: skip
        a, b = getattr(fast, name), getattr(slow, name)
        if b is None:
            assert a is None, name
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), name  # bit for bit, float32 rounding included


def test_entropy_is_kept_only_when_every_turn_has_it():
    episodes = random_episodes(3)
    for ep in episodes:
        for turn in ep.turns:
            turn.output_entropy = [0.5] * len(turn.output_ids)
    assert build_batch(episodes).entropy is not None
    next(t for ep in episodes if not ep.failed for t in ep.turns).output_entropy = None
    assert build_batch(episodes).entropy is None and reference_batch(episodes).entropy is None


def test_both_refuse_the_same_bad_input():
    episodes = random_episodes(1)
    longest = max(len(s.token_ids()) for ep in episodes if not ep.failed for s in ep.segments if s.turns)
    for fn in (build_batch, reference_batch):
        with pytest.raises(ValueError, match=f"a row has {longest} tokens, over max_len=3"):
            fn(episodes, max_len=3)
        with pytest.raises(ValueError, match="no trainable rows"):
            fn([Episode("e", "x", "t", [], error="boom")])
