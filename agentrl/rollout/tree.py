"""Tree rollouts: fork an episode at a turn boundary and continue it several ways (Tree-GRPO, ARPO).

With ``rollout.branches = N`` each root episode, once it has ended, gets N branches. A branch is a
new episode of the same task, with the same env reset seed, that **replays** the root's turns before
the branch point (the recorded token ids and sampler log-probs go back into the env through the one
episode loop; the generator is not asked) and then samples on its own. Replay is the fork: any env
whose observations are a function of (task, seed, actions) reaches the same state, whatever it
holds (a search session, a SQL history, a sandbox's files, a shop session over HTTP), through its
normal ``reset``/``step`` and a fresh lease of its own. A branch whose replayed tokens differ from
the root's (an env that is not deterministic under replay) fails with an error saying where, and
is dropped from training like any failed episode.

A root and its branches form one group (``group_id``): GRPO's group-relative advantage compares
the continuations. The turns before the branch point are the same in every member, so their
advantage sums to zero over the group: they are marked ``Turn.shared`` (source ``SHARED``) and
left out of the loss, in the root and in the branches, and a branch's replayed tokens are not
counted as generated. With the in-process HF generator the root's K/V is still in the prefix cache
when its branches ask, so a branch prefills only the last observation.

Where to branch (``rollout.branch_at``): ``last`` forks before the root's last turn (a search
agent's answer); ``uniform`` draws a turn boundary uniformly from the root's own seed (Tree-GRPO's
random expansion). Tree-GRPO's inter-tree term (comparing roots of one task) is not computed: each
tree is its own group.
"""

from __future__ import annotations

import random
from typing import Any

from agentrl.errors import EpisodeError
from agentrl.rollout.generators.base import GenerationOutput, SamplingParams, derive_seed
from agentrl.trajectory import Episode, Turn


def branch_turn(root: Episode, rule: str, seed: int) -> int:
    """How many of ``root``'s turns its branches replay (0 = they start from the reset)."""
    turns = len(root.turns)
    if rule == "last":
        return max(turns - 1, 0)
    if rule == "uniform":
        return random.Random(derive_seed(seed, "branch_at")).randrange(turns)
    raise ValueError(f"unknown branch rule {rule!r}")


def mark_shared(episode: Episode, turns: int) -> None:
    """Mark the first ``turns`` turns as the group's shared prefix (left out of the loss)."""
    for turn in episode.turns[:turns]:
        turn.shared = True
    episode.branch_turn = turns


def prefix_ids(episode: Episode, turns: int) -> list[int]:
    """The token ids of ``episode`` up to the end of its ``turns``-th turn's observation."""
    segment = episode.segments[0]
    ids = list(segment.prompt_ids)
    for turn in segment.turns[:turns]:
        ids += turn.output_ids + turn.obs_ids
    return ids


class ReplayPolicy:
    """Answers the first ``len(turns)`` generate calls with the recorded turns, then asks ``policy``."""

    def __init__(self, turns: list[Turn], policy: Any):
        self.outputs = [
            GenerationOutput(ids=list(t.output_ids), logprobs=list(t.output_logprobs),
                             entropy=list(t.output_entropy) if t.output_entropy is not None else None,
                             finish_reason=t.finish_reason, timings={"replayed": 1.0})  # fmt: skip
            for t in turns
        ]
        self.policy = policy
        self.calls = 0

    async def start(self, task: Any) -> None:
        await self.policy.start(task)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, observation: str) -> GenerationOutput:
        index, self.calls = self.calls, self.calls + 1
        if index < len(self.outputs):
            return self.outputs[index]
        return await self.policy.generate(prompt_ids, sampling, observation)


def finish_branch(branch: Episode, root: Episode, turns: int) -> None:
    """Check that ``branch`` replayed ``root``'s first ``turns`` turns token for token, then mark them
    shared and link the branch to its root. Raises EpisodeError where the two differ."""
    if len(branch.segments) != 1 or len(branch.turns) < turns:
        raise EpisodeError(f"fork by replay of episode {root.episode_id}: the branch ended after "
                           f"{len(branch.turns)} of the {turns} replayed turns")  # fmt: skip
    mine, theirs = prefix_ids(branch, turns), prefix_ids(root, turns)
    if mine != theirs:
        at = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        turn = next((t.index for t in root.turns[:turns] if t.observation != _turn(branch, t.index).observation), None)
        where = f"the observation of turn {turn}" if turn is not None else f"token {at}"
        raise EpisodeError(f"fork by replay of episode {root.episode_id} diverged at {where}: the env does not "
                           f"give the same observations for the same actions, so it cannot be forked by replay "
                           f"(use rollout.branches=0)")  # fmt: skip
    mark_shared(branch, turns)
    branch.parent_id = root.episode_id


def _turn(episode: Episode, index: int) -> Turn:
    return next(t for t in episode.turns if t.index == index)
