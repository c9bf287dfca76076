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
random expansion); ``entropy`` forks after the tool result whose next turn's first token had the
highest entropy (ARPO's trigger: uncertainty spikes right after a tool result).

How a branch reaches the branch point (``rollout.fork``): ``replay`` (each branch replays the
prefix into an env of its own, as above) or ``env``: a :class:`Trunk` replays the prefix once into
one env and hands each branch a :func:`agentrl.env.fork_env` copy of it (the last branch gets the
trunk itself), behind a :class:`PrefixedEnv` that answers the replayed steps from the trunk's
record, so the episode loop and the token check are the same. Tool calls and sandbox cells of the
prefix then run once per tree instead of once per branch. ``auto`` picks ``env`` where the env forks.

Tree-GRPO's inter-tree term (comparing the trees of one task) is an estimator
(``algo.advantage: tree_grpo``, :func:`agentrl.algos.advantages.tree_grpo`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import gymnasium as gym

from agentrl.errors import EnvError, EpisodeError
from agentrl.rollout.generators.base import GenerationOutput, SamplingParams, derive_seed
from agentrl.trajectory import Episode, Turn


def branch_turn(root: Episode, rule: str, seed: int) -> int:
    """How many of ``root``'s turns its branches replay (0 = they start from the reset)."""
    turns = len(root.turns)
    if rule == "last":
        return max(turns - 1, 0)
    if rule == "uniform":
        return random.Random(derive_seed(seed, "branch_at")).randrange(turns)
    if rule == "entropy":
        return entropy_branch_turn(root)
    raise ValueError(f"unknown branch rule {rule!r}")


def entropy_branch_turn(root: Episode) -> int:
    """ARPO's trigger: the turn boundary right after a tool result whose next turn's first token had
    the highest entropy (the earliest on a tie). Candidates are turns k >= 1 whose previous turn
    called a tool; without one, or without entropies, the ``last`` rule."""
    turns = root.turns
    best, best_h = None, float("-inf")
    for k in range(1, len(turns)):
        entropy = turns[k].output_entropy
        if not turns[k - 1].tool_calls or not entropy:
            continue
        if entropy[0] > best_h:
            best, best_h = k, entropy[0]
    return best if best is not None else max(len(turns) - 1, 0)


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
        at = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), min(len(mine), len(theirs)))
        turn = next((t.index for t in root.turns[:turns] if t.observation != _turn(branch, t.index).observation), None)
        where = f"the observation of turn {turn}" if turn is not None else f"token {at}"
        raise EpisodeError(f"fork by replay of episode {root.episode_id} diverged at {where}: the env does not "
                           f"give the same observations for the same actions, so it cannot be forked by replay "
                           f"(use rollout.branches=0)")  # fmt: skip
    mark_shared(branch, turns)
    branch.parent_id = root.episode_id


def _turn(episode: Episode, index: int) -> Turn:
    return next(t for t in episode.turns if t.index == index)


class PrefixedEnv(gym.Wrapper):
    """A forked env (already at the branch point) that answers ``reset`` and the first replayed
    ``step`` calls from the trunk's record, then steps the fork itself. An action that differs from
    the recorded one is an error (the branch's replay must be the root's)."""

    def __init__(self, env: gym.Env, reset: tuple[str, dict[str, Any]], steps: list[tuple[str, tuple[Any, ...]]]):
        super().__init__(env)
        self._reset, self._steps, self._next = reset, steps, 0

    def reset(self, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        self._next = 0
        return self._reset[0], dict(self._reset[1])

    def step(self, action: str) -> tuple[Any, ...]:
        if self._next < len(self._steps):
            recorded, result = self._steps[self._next]
            self._next += 1
            if action != recorded:
                raise EnvError(f"forked branch: replayed action {self._next - 1} differs from the trunk's")
            obs, reward, terminated, truncated, info = result
            return obs, reward, terminated, truncated, dict(info)
        return self.env.step(action)


class Trunk:
    """One root's branch point, reached once (``rollout.fork: env``): the root's reset and first
    ``turns`` actions are replayed into one env, which each branch then gets a fork of; the last
    branch to ask takes the trunk env itself, so a tree holds at most one env (and sandbox lease)
    more than its running branches. A branch that asks again (a retry) gets a fresh trunk."""

    def __init__(self, root: Episode, turns: int, branches: int, seed: int | None, options: dict[str, Any] | None):
        self.root, self.turns, self.left = root, turns, branches
        self.seed, self.options = seed, options
        self.env: gym.Env | None = None
        self._record: tuple[tuple[str, dict[str, Any]], list[tuple[str, tuple[Any, ...]]]] | None = None
        self._lock = asyncio.Lock()

    async def take(self, call: Callable[..., Awaitable[Any]], make_env: Callable[[], Any]) -> gym.Env:
        """An env at the branch point for one branch (a fork, or the trunk itself for the last)."""
        from agentrl.env import fork_env

        async with self._lock:
            if self.env is None:
                env = await call(make_env)
                try:
                    reset = await call(env.reset, seed=self.seed, options=self.options)
                    steps = []
                    for turn in self.root.turns[: self.turns]:
                        steps.append((turn.action_text, await call(env.step, turn.action_text)))
                        if steps[-1][1][2] or steps[-1][1][3]:
                            raise EpisodeError(f"fork of episode {self.root.episode_id}: the trunk's episode ended "
                                               f"at replayed turn {len(steps) - 1}, before the branch point")  # fmt: skip
                except BaseException:
                    await call(env.close)
                    raise
                self.env, self._record = env, (reset, steps)
            assert self._record is not None
            self.left -= 1
            if self.left > 0:
                env = await call(fork_env, self.env)
            else:
                env, self.env = self.env, None
            return PrefixedEnv(env, *self._record)

    def close(self) -> None:
        """Close the trunk env if no branch took it (a run cancelled or failed part-way)."""
        env, self.env = self.env, None
        if env is not None:
            env.close()
