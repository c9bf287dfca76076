"""One home per setting (issue #45): each default is defined once.

A run setting (a field of a ``RunConfig`` section or a mixture entry) gets its default in its
section's dataclass and nowhere else: another dataclass or function that restates the value as a
literal is a second home, which drifts (``RaySettings`` once restated all eight ``env.ray_*``
defaults; ``EnvConfig.max_turns=6`` sat beside ``register(max_turns=10)``, so WebShop's 15 turns
never applied in training). A class or function that needs the value refers to the home
(``EnvConfig.ray_call_timeout_s``, ``SamplingParams.top_p``), takes it from the caller, or leaves it
unset (``env.max_turns: None`` = the env's registration). The scan below fails on a new literal
default under a setting's name; ``OTHER_MEANING`` lists the same names that mean something else,
each with why, and ``LEFT`` the duplicates known and not yet merged.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("agentrl", "envs")

# the settings whose defaults are scanned in function signatures too (the families issue #45 found
# spread over several homes); every setting is scanned in dataclass fields
FUNCTION_WATCHED = ("max_turns", "max_obs_chars", "concurrency", "max_new_tokens", "max_context_tokens",
                    "episode_timeout_s", "request_timeout_s", "num_cpus_per_env", "envs_per_actor",
                    "ray_call_timeout_s", "ray_start_timeout_s", "ray_lost_retries", "ray_services")  # fmt: skip
# module constants whose name says they hold one of these settings' defaults
CONSTANT_WORDS = (
    "MAX_TURNS",
    "OBS_CHARS",
    "CONCURRENCY",
    "EPISODE_TIMEOUT",
    "REQUEST_TIMEOUT",
    "MAX_NEW_TOKENS",
    "CONTEXT_TOKENS",
)

#: (file, class or function, name) -> why this literal is not a second default of the setting
OTHER_MEANING = {
    ("agentrl/rollout/generators/http.py", "RequestPolicy", "max_retries"):
        "retries of one HTTP request (eval's --max-retries refers to it), not rollout.max_retries (watchdog re-runs)",
    ("agentrl/rollout/generators/openai.py", "__init__", "concurrency"):
        "HTTP requests in flight to one server (its connection pool), not episodes in flight",
    ("agentrl/rollout/generators/chat.py", "__init__", "concurrency"): "as the openai generator's",
    ("agentrl/env.py", "Task", "split"): "the split a task record came from, not the run's env.split",
    ("agentrl/eval/suites.py", "Suite", "split"): "an eval suite's split (agentrl eval), not a training run's",
    ("agentrl/rollout/process_rewards.py", "over_generator", "max_new_tokens"): "a scope judge's answer budget",
    ("agentrl/study/orchestrator.py", "Run", "steps"): "a study run's record of the steps it ran",
    ("agentrl/eval/suites.py", "Part", "name"): "a suite part's name",
    ("agentrl/rollout/generators/base.py", "Generator", "name"): "a generator backend's name",
    ("agentrl/rollout/agent.py", "<module>", "DEFAULT_MAX_TURNS"):
        "the cap of an env built outside the registry (no TurnBudget, so no turn budget applies at all); "
        "a registered env's budget is its registration's",
    ("agentrl/cluster/services.py", "<module>", "SERVICE_CONCURRENCY"): "requests a shared tool service serves at once",
}  # fmt: skip
#: duplicates found and not merged yet, each with why; the scan fails when one is gone (remove it here)
LEFT: dict[tuple[str, str, str], str] = {}


def _setting_names() -> set[str]:
    from agentrl.config import EnvEntry, RunConfig

    hints = typing.get_type_hints(RunConfig)
    names = {
        f.name for section in dataclasses.fields(RunConfig) for f in dataclasses.fields(hints[section.name])
    }
    return names | {f.name for f in dataclasses.fields(EnvEntry)}


def _homes() -> list[tuple[str, str, str, object]]:
    """Every literal default under a setting's name: (file, owner, name, value)."""
    names = _setting_names()
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    for item in node.body:
                        if (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                                and item.target.id in names and _literal(item.value)):  # fmt: skip
                            found.append((rel, node.name, item.target.id, item.value.value))  # type: ignore[union-attr]
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    args = node.args
                    positional = args.posonlyargs + args.args
                    pairs = list(
                        zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True)
                    )
                    pairs += [
                        (a, d)
                        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                        if d is not None
                    ]
                    found += [(rel, node.name, a.arg, d.value) for a, d in pairs  # type: ignore[union-attr]
                              if a.arg in FUNCTION_WATCHED and _literal(d)]  # fmt: skip
            for item in tree.body:
                if isinstance(item, ast.Assign | ast.AnnAssign) and _literal(item.value):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    for target in targets:
                        if isinstance(target, ast.Name) and any(w in target.id for w in CONSTANT_WORDS):
                            found.append((rel, "<module>", target.id, item.value.value))  # type: ignore[union-attr]
    return found


def _literal(node: ast.expr | None) -> bool:
    """A number or string written out (None = unset, and a name refers to a home: neither is a copy)."""
    return isinstance(node, ast.Constant) and node.value is not None and not isinstance(node.value, bool)


#: where defaults live: the sections' dataclasses, and the homes the sections refer to
HOMES = {
    **{("agentrl/config/sections.py", c): "a run config section" for c in ("ModelConfig", "EnvConfig", "EnvEntry",
                                                                   "AlgoConfig", "TrainConfig", "RunConfig")},
    ("agentrl/rollout/settings.py", "RolloutConfig"): "the rollout: section",
    ("agentrl/rollout/generators/base.py", "SamplingParams"):
        "the sampler's request: RolloutConfig's max_new_tokens/temperature/top_p/top_k refer to it",
    ("agentrl/cluster/remote_env.py", "RaySettings"): "env placement: EnvConfig's ray_* settings refer to it",
    ("agentrl/env.py", "<module>"): "MAX_OBS_CHARS, register()'s observation cap, which env.max_obs_chars unset means",
    ("agentrl/eval/runner.py", "<module>"): "CONCURRENCY, agentrl eval's episodes at once (evaluate, run_eval)",
}  # fmt: skip


def _home_of(rel: str, owner: str) -> bool:
    return (rel, owner) in HOMES


def test_every_setting_default_has_one_home():
    """A literal default under a setting's name outside its section's dataclass fails, unless it
    means something else (OTHER_MEANING) or is a known duplicate (LEFT); both lists must be current."""
    found = _homes()
    seen = {(rel, owner, name) for rel, owner, name, _ in found}
    second = [f"{rel}: {owner}.{name} = {value!r}" for rel, owner, name, value in found
              if not _home_of(rel, owner) and (rel, owner, name) not in OTHER_MEANING | LEFT]  # fmt: skip
    assert not second, ("a second default for a setting (refer to its home, e.g. EnvConfig.ray_call_timeout_s, "
                        "take it from the caller, or list it in OTHER_MEANING with why): " + "; ".join(second))  # fmt: skip
    stale = sorted((set(OTHER_MEANING) | set(LEFT)) - seen)
    assert not stale, f"listed here but no longer a literal default (remove them): {stale}"


def test_the_same_setting_has_one_default_across_the_sections():
    """A mixture entry's per-env fields (split, eval_split, max_turns, ...) default as env's do."""
    from agentrl.config import PER_ENTRY, EnvConfig, EnvEntry

    env = {f.name: f.default for f in dataclasses.fields(EnvConfig)}
    for f in dataclasses.fields(EnvEntry):
        if f.name in PER_ENTRY and f.default is not dataclasses.MISSING:
            assert f.default == env[f.name], (
                f"env[i].{f.name} defaults to {f.default!r}, env.{f.name} to {env[f.name]!r}"
            )


def test_ray_settings_take_the_env_sections_defaults():
    from agentrl.cluster.remote_env import RaySettings
    from agentrl.config import EnvConfig

    assert RaySettings() == RaySettings.from_env(EnvConfig())


@pytest.mark.parametrize(("env_id", "turns"), [("agentrl/WebShop-v0", 15), ("agentrl/GAIA-v0", 30),
                                                ("agentrl/Search-v0", 16)])  # fmt: skip
def test_an_unset_turn_budget_is_the_envs_registration(env_id, turns):
    """``env.max_turns`` unset: the env's own registration, resolved when the config loads (so it is
    printed and saved as the value used); a value set is kept."""
    import gymnasium as gym

    from agentrl.config import load_config

    config = load_config(None, [f"env.id={env_id}"])
    assert config.env.max_turns == turns
    assert config.env.max_obs_chars == gym.spec(env_id).kwargs["max_obs_chars"]
    assert load_config(None, [f"env.id={env_id}", "env.max_turns=3"]).env.max_turns == 3


def test_a_mixture_entry_without_a_turn_budget_gets_its_envs():
    from agentrl.config import load_config

    config = load_config(None, ["env=[{id: agentrl/SQL-v0}, {id: agentrl/Search-v0, max_turns: 4}]"])
    assert [e.max_turns for e in config.env.mixture] == [10, 4]


def test_a_registration_states_its_turn_budget():
    """``register`` has no default turn budget (the env's own is stated where the env is registered);
    ``build_env`` none at all (gymnasium passes the registration's)."""
    import inspect

    from agentrl.env import build_env, register

    assert inspect.signature(register).parameters["max_turns"].default is inspect.Parameter.empty
    assert inspect.signature(build_env).parameters["max_turns"].default is inspect.Parameter.empty
    assert inspect.signature(build_env).parameters["max_obs_chars"].default is inspect.Parameter.empty
