"""Run configuration: frozen dataclasses, YAML in, dotted CLI overrides, validated before anything runs.

``load_config("configs/quickstart.yaml", ["algo.advantage=igpo", "train.steps=20"])`` returns a
:class:`RunConfig`; any unknown key, wrong type or bad value raises :class:`ConfigError` naming the
dotted field and the fix. Each field's docstring is its help text (``agentrl train --help-config``).

One job per module:

- :mod:`~agentrl.config.sections`: the sections' dataclasses (model, env and a mixture's entries,
  algo, train, the whole run), each field's default and help, and each section's checks;
- :mod:`~agentrl.config.load`: YAML and overrides parsed, merged and built into those classes, with
  unset env budgets resolved (``load_config``, ``parse_overrides``, ``resolve_env_budgets``);
- :mod:`~agentrl.config.eval_classes`: which settings shape a held-out eval (``EVAL_SETTINGS``),
  read from the fields' declarations;
- :mod:`~agentrl.config.docs`: the fields' help (``help_text``, ``field_docs``).

Everything is importable from ``agentrl.config`` as well.
"""

from agentrl.config.docs import field_docs, help_text
from agentrl.config.eval_classes import (
    EVAL_SETTINGS,
    NOT_EVAL_SETTINGS,
    SAMPLED_EVAL_SETTINGS,
    eval_differences,
    eval_settings,
)
from agentrl.config.load import load_config, parse_overrides, resolve_env_budgets, to_dict
from agentrl.config.sections import (
    MIXTURE_ID,
    MIXTURE_ONLY,
    AlgoConfig,
    EnvConfig,
    EnvEntry,
    ModelConfig,
    RolloutConfig,
    RunConfig,
    TrainConfig,
)
from agentrl.errors import ConfigError
from agentrl.train.mixture import PER_ENTRY  # the EnvConfig fields a mixture sets per entry

__all__ = [
    "EVAL_SETTINGS",
    "MIXTURE_ID",
    "MIXTURE_ONLY",
    "NOT_EVAL_SETTINGS",
    "PER_ENTRY",
    "SAMPLED_EVAL_SETTINGS",
    "AlgoConfig",
    "ConfigError",
    "EnvConfig",
    "EnvEntry",
    "ModelConfig",
    "RolloutConfig",
    "RunConfig",
    "TrainConfig",
    "eval_differences",
    "eval_settings",
    "field_docs",
    "help_text",
    "load_config",
    "parse_overrides",
    "resolve_env_budgets",
    "to_dict",
]
