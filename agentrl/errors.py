"""Errors by boundary, all under one base class.

Every error agentrl raises on purpose derives from :class:`AgentRLError`, so callers can tell
platform errors (bad config, lost sandbox, unreachable server) from bugs. Messages say what went
wrong *and* how to fix it.
"""

from __future__ import annotations


class AgentRLError(Exception):
    """Base class of every error agentrl raises on purpose."""


class ConfigError(AgentRLError, ValueError):
    """A config value is invalid. Raised before anything runs; names the field and the fix."""

    def __init__(self, field: str, problem: str, fix: str | None = None):
        self.field = field
        self.problem = problem
        self.fix = fix
        msg = f"config field '{field}': {problem}"
        if fix:
            msg += f" (fix: {fix})"
        super().__init__(msg)


def check_choice(name: str, value: object, choices: tuple[object, ...]) -> None:
    """Raise :class:`ConfigError` naming ``name`` unless ``value`` is one of ``choices`` (None: unset)."""
    if value not in choices:
        allowed = ", ".join(str(c) for c in choices if c is not None)
        raise ConfigError(name, f"{value!r} is not allowed", f"use one of: {allowed}")


class EnvError(AgentRLError):
    """An environment cannot do what was asked (unknown task id, bad split, env not reset)."""


class ActionError(AgentRLError):
    """Model output could not be parsed into an action. Envs turn it into an observation."""


class ToolError(AgentRLError):
    """A tool call failed (bad arguments, tool-side failure). Becomes an observation at the tool boundary."""


class SandboxError(AgentRLError):
    """A sandbox failed or was lost (container killed, daemon hiccup, image missing)."""


class SandboxLost(SandboxError):
    """The sandbox died under an episode; its state is gone and a fresh one replaces it."""


class GeneratorError(AgentRLError):
    """A generation backend failed (server unreachable, bad response, model cannot load)."""


class EpisodeError(AgentRLError):
    """An episode failed; recorded on its trajectory, never fatal to its siblings."""


class RolloutError(AgentRLError):
    """An RL step cannot stand: too many of its sampled episodes failed (``train.rollout_max_failed``)."""


class EvalError(AgentRLError):
    """A held-out evaluation cannot stand: too many of its episodes failed even when replayed."""
