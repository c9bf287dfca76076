"""A run config from YAML and dotted CLI overrides: parsed, merged, built into the section
dataclasses (:mod:`agentrl.config.sections`) with each value's type checked, unset env budgets
resolved, and validated before anything runs.

``load_config("configs/quickstart.yaml", ["algo.advantage=igpo", "train.steps=20"])`` returns a
:class:`~agentrl.config.sections.RunConfig`; any unknown key, wrong type or bad value raises
:class:`~agentrl.errors.ConfigError` naming the dotted field and the fix.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from agentrl.config.sections import MIXTURE_ID, RunConfig
from agentrl.errors import ConfigError


def _convert(value: Any, annotation: Any, name: str) -> Any:
    origin = typing.get_origin(annotation)
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ConfigError(name, f"expected a mapping, got {type(value).__name__}")
        return _build(annotation, value, name + ".")
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, name)
            except ConfigError:
                continue
        raise ConfigError(name, f"{value!r} does not fit {annotation}")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(name, f"expected a list, got {value!r}")
        item = typing.get_args(annotation)[0] if typing.get_args(annotation) else None
        if dataclasses.is_dataclass(item):  # env.mixture: entries named env[i] in errors
            base = "env" if name == "env.mixture" else name
            return tuple(_convert(v, item, f"{base}[{i}]") for i, v in enumerate(value))
        return tuple(value)
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise ConfigError(name, f"expected a mapping, got {value!r}")
        return dict(value)
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(name, f"expected true/false, got {value!r}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(name, f"expected an integer, got {value!r}")
    if annotation is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(name, f"expected a number, got {value!r}")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ConfigError(name, f"expected a string, got {value!r}")
    return value


def _build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        import difflib

        key = unknown[0]
        close = difflib.get_close_matches(key, names, n=1)
        fix = f"did you mean '{prefix}{close[0]}'?" if close else f"known fields: {', '.join(sorted(names))}"
        raise ConfigError(prefix + key, "unknown field", fix)
    kwargs = {k: _convert(v, hints[k], prefix + k) for k, v in values.items()}
    return cls(**kwargs)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(dotted, f"'{key}' is not a section")
    node[keys[-1]] = value


def _scalar(raw: str) -> Any:
    if not raw.strip():
        return ""
    value = yaml.safe_load(raw)
    if isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
        try:
            return float(value)
        except ValueError:
            return value
    return value


class _Whole(dict):
    """A mapping given whole in an override (``env.kwargs={}``): it replaces the file's mapping
    instead of being merged into it, so ``key={}`` clears and ``key={a: 1}`` sets exactly that."""


def parse_overrides(overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["train.lr=1e-5", "rollout.group_size=8"]`` -> nested dict (values parsed as YAML scalars).
    Dotted keys merge into the config file's sections (``env.kwargs.hops=multi`` changes one key);
    a mapping given to a field replaces the file's mapping (``env.kwargs={}`` removes every key),
    while one given to a whole section merges (``train={steps: 3}`` changes only ``steps``)."""
    tree: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(item, "override must look like section.field=value", "e.g. train.steps=10")
        key, _, raw = item.partition("=")
        key, value = key.strip(), _scalar(raw)
        whole = isinstance(value, dict) and "." in key  # a field's mapping; a section (train={..}) merges
        _set_dotted(tree, key, _Whole(value) if whole else value)
    return tree


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, _Whole):
            out[key] = dict(value)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        elif (
            isinstance(value, dict)
            and isinstance(out.get(key), list)
            and all(str(k).isdigit() for k in value)
        ):
            items = list(out[key])  # env.mixture.1.weight=2 (or env.1.weight=2): one entry's field
            for index, part in value.items():
                if int(index) >= len(items):
                    where = "env" if key == "mixture" else key  # env.<i>.<field>: the mixture's entries
                    raise ConfigError(
                        f"{where}[{index}]",
                        f"there are {len(items)} entries",
                        f"use an index below {len(items)}",
                    )
                items[int(index)] = _merge(items[int(index)], part) if isinstance(part, dict) else part
            out[key] = items
        else:
            out[key] = value
    return out


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    cls: type = RunConfig,
    validate: bool = True,
) -> Any:
    """Load YAML (optional), apply dotted overrides, build and validate the config."""
    values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise ConfigError(
                "config", f"file {str(path)!r} does not exist", "pass a path such as configs/quickstart.yaml"
            )
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError("config", f"{path} is not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError("config", f"{path} must hold a mapping at the top level")
        values = loaded
    values = _merge(_mixture_form(values), _mixture_form(parse_overrides(list(overrides))))
    config = _build(cls, values)
    if isinstance(config, RunConfig):
        config = resolve_env_budgets(config)
    if validate:
        config.validate()
    return config


def resolve_env_budgets(config: RunConfig) -> RunConfig:
    """``env.max_turns`` / ``env.max_obs_chars`` (and each mixture entry's) left unset -> the env's
    registration (:func:`agentrl.env.register`), the one home of those defaults; values set are
    kept, and an unknown id is left for validation to name."""
    from agentrl.env import registered_obs_cap, registered_turn_budget

    def filled(part: Any) -> Any:
        kwargs = dict(part.kwargs)
        turns = part.max_turns if part.max_turns is not None else registered_turn_budget(part.id, kwargs)
        cap = part.max_obs_chars if part.max_obs_chars is not None else registered_obs_cap(part.id, kwargs)
        return dataclasses.replace(part, max_turns=turns, max_obs_chars=cap)

    env = config.env
    if env.mixture:
        return dataclasses.replace(
            config, env=dataclasses.replace(env, mixture=tuple(filled(e) for e in env.mixture))
        )
    return dataclasses.replace(config, env=filled(env))


def _mixture_form(values: dict[str, Any]) -> dict[str, Any]:
    """``env:`` given as a list of envs -> ``env: {id: mixture, mixture: [...]}``; an override's
    ``env.<i>.<field>`` -> ``env.mixture.<i>.<field>``; a mapping with ``mixture`` and no ``id`` gets
    ``id: mixture``. One env (a mapping with an id) is left as it is."""
    env = values.get("env")
    if isinstance(env, list | tuple):
        return {**values, "env": {"id": MIXTURE_ID, "mixture": list(env)}}
    if isinstance(env, dict) and not isinstance(env, _Whole):
        indexed = {k: v for k, v in env.items() if str(k).isdigit()}
        rest = {k: v for k, v in env.items() if not str(k).isdigit()}
        if indexed:
            mixture = rest.get("mixture", {})
            rest["mixture"] = {**indexed, **mixture} if isinstance(mixture, dict) else mixture
        if isinstance(rest.get("mixture"), list) and "id" not in rest:
            rest["id"] = MIXTURE_ID
        return {**values, "env": rest}
    return values


def to_dict(config: Any) -> dict[str, Any]:
    """Plain-dict view (for saving next to checkpoints)."""
    return dataclasses.asdict(config)
