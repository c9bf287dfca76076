"""Crashed episodes replayed: the one loop behind ``agentrl eval --replays`` (bounded by
``--max-failed``) and the trainer's held-out eval (bounded by ``train.eval_max_failed``).

Kept light (no torch, no runner): :mod:`agentrl.train.heldout` imports it too."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from agentrl.trajectory import Episode

R = TypeVar("R")  # a result: an Episode, or whatever the caller keeps per episode (eval: (Episode, seconds))


def is_hang(error: str) -> bool:
    """Whether an episode error is a wait that ran out (a request or the episode timed out)."""
    from agentrl.rollout.generators.http import NO_ANSWER

    return NO_ANSWER in error or "episode timeout after" in error


def replay_crashed(
    results: list[R],
    rerun: Callable[[list[int]], list[R]],
    rounds: int,
    *,
    episode: Callable[[R], Episode],
    on_round: Callable[[int, list[Episode], int], None],
    replay_hangs: bool,
    replay_all_failed: bool,
    groups: Callable[[list[int]], list[int]] | None = None,
) -> tuple[list[R], list[list[str]]]:
    """Re-run the failed (crashed) episodes among ``results`` up to ``rounds`` times, each from the
    start of its own task (and seed): ``rerun(positions)`` returns fresh results for those positions,
    in order. An episode that fails every time stays failed (the caller scores it unsolved and bounds
    how many may). ``episode(result)`` is a result's Episode.

    The two callers' policies differ, and are these parameters (each caller passes all of them):

    - ``replay_hangs``: whether a hang is replayed, an episode whose request got no answer within its
      timeout or whose deadline passed (:func:`is_hang`). ``agentrl eval``: no (one hang should cost
      one request timeout, not one per replay); the trainer's held-out eval: yes.
    - ``replay_all_failed``: whether anything is replayed when every episode failed. ``agentrl
      eval``: no (a server that is down or a bad setting: replaying would only repeat it); the
      trainer: yes.
    - ``groups``: maps the positions to replay to the positions to re-run. ``agentrl eval`` with the
      rollout engine runs a task's samples as one group, so a crashed sample re-runs its whole group;
      only the failed ones are replaced. ``None``: each replays alone (the trainer, text agents).

    ``on_round(attempt, replayed episodes, hangs left alone)`` is called once per round before its
    replays (attempt counts from 1; the episodes list may be empty when only hangs failed, and then
    nothing is replayed); the caller says what happens in its own words.

    Returns ``(results, the earlier errors of each position)``: the number of replays that ran is the
    total length of those error lists."""
    results, errors = list(results), [[] for _ in results]
    for attempt in range(1, rounds + 1):
        failed = [i for i, result in enumerate(results) if episode(result).failed]
        if not failed or (len(failed) == len(results) and not replay_all_failed):
            break
        crashed = (
            failed if replay_hangs else [i for i in failed if not is_hang(str(episode(results[i]).error))]
        )
        on_round(attempt, [episode(results[i]) for i in crashed], len(failed) - len(crashed))
        if not crashed:
            break
        positions = groups(crashed) if groups is not None else crashed
        for i, result in zip(positions, rerun(positions), strict=True):
            if episode(results[i]).failed:
                errors[i].append(str(episode(results[i]).error))
                results[i] = result
    return results, errors
