"""Replay fixed actions through the agent: ``agentrl play --script --folding ...``.

The actions go through the same runner, agent and context strategy as a model's would (scripted
by :class:`~agentrl.rollout.oracle_agent.ReplayOracle`), so folding and process rewards show
exactly as training sees them; :func:`turn_records` flattens the episode for printing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agentrl.rollout.oracle_agent import ReplayOracle
from agentrl.rollout.runner import run_oracle_episodes


def replay_through_agent(
    env_id: str, actions: list[str], task: Any, rollout: Any, tokenizer: Any, *, seed: int | None = None
) -> Any:
    """One episode of ``actions`` through the agent (folding, process rewards) as the rollout config says.

    The turn budget is the number of actions, so a script that ends early ends the episode
    (truncated); the per-turn token budget is raised so scripted text is never cut.
    """
    settings = dataclasses.replace(
        rollout,
        concurrency=1,
        group_size=1,
        branches=0,
        max_turns=min(rollout.max_turns or len(actions), len(actions)),  # a --set max_turns cuts it shorter
        max_new_tokens=max(rollout.max_new_tokens, min(1024, rollout.max_context_tokens // 2)),
    )
    (episode,) = run_oracle_episodes(
        env_id, [task], lambda: ReplayOracle(actions), tokenizer, settings, seeds=[seed], progress=False
    )
    return episode


def turn_records(episode: Any) -> list[dict[str, Any]]:
    """Per turn, in order: thread, kind, action, observation, error, reward parts, per-token process reward."""
    rows = []
    for seg in episode.segments:
        thread = "main" if seg.fold_id == 0 else f"{seg.kind} {seg.fold_id}"
        for turn in seg.turns:
            rows.append(
                {
                    "turn": turn.index,
                    "thread": thread,
                    "kind": turn.kind,
                    "action": turn.action_text,
                    "observation": turn.observation,
                    "error": turn.error,
                    "reward_parts": turn.reward_parts,
                    "process_reward": turn.process_reward,
                }
            )
    return sorted(rows, key=lambda r: r["turn"])
