"""Named registries: config strings -> objects (advantage estimators, losses, KL estimators,
generators, sandbox backends, eval suites).

Entries may be registered eagerly (decorator) or lazily as ``"module:attr"`` strings, so looking a
name up never imports heavy modules that the run does not use. The trainer never branches on an
algorithm's name: it asks a registry.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

from agentrl.errors import ConfigError


def load_entry_point(target: str, *, field: str = "entry_point") -> Any:
    """The object a ``"module:attr"`` string names (``"pkg.mod:Class"``); the one loader of such strings.

    Raises:
        ConfigError: naming ``field``, when the string is malformed or the module/attribute is missing.
    """
    module, colon, attr = str(target).partition(":")
    if not module or not colon or not attr:
        raise ConfigError(
            field, f"{target!r} is not a 'module:attr' path", "write it like package.module:Name"
        )
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            field, f"cannot load {target!r}: {exc}", "check the module path and the name"
        ) from exc


class Registry:
    """A mapping from names to objects or lazy ``"module:attr"`` import paths."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Any] = {}

    def register(self, name: str, obj: Any = None, *, override: bool = False) -> Any:
        """Register ``obj`` (or a ``"module:attr"`` string) under ``name``; usable as a decorator."""

        def add(target: Any) -> Any:
            if name in self._entries and not override and self._entries[name] is not target:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            self._entries[name] = target
            return target

        if obj is None:
            return add
        return add(obj)

    def get(self, name: str, *, field: str | None = None) -> Any:
        """Return the object for ``name``, or for a ``"module:attr"`` path (your own estimator, loss,
        ...: importing the module may register more names); unknown names raise ConfigError listing
        the choices."""
        if name not in self._entries and ":" in str(name):
            self._entries[name] = load_entry_point(name, field=field or self.kind)
        if name not in self._entries:
            choices = ", ".join(sorted(self._entries)) or "(none registered)"
            raise ConfigError(field or self.kind, f"unknown {self.kind} '{name}'", f"use one of: {choices}")
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = load_entry_point(entry, field=field or self.kind)
            self._entries[name] = entry
        return entry

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def names(self) -> list[str]:
        return sorted(self._entries)


ADVANTAGES = Registry("advantage estimator")
LOSSES = Registry("policy loss")
KL_ESTIMATORS = Registry("KL estimator")
GENERATORS = Registry("generator backend")
SANDBOX_BACKENDS = Registry("sandbox backend")
EVAL_SUITES = Registry("eval suite")


def lazy(registry: Registry, name: str, target: str) -> None:
    """Register ``name`` lazily as ``"module:attr"`` (does not import anything)."""
    registry.register(name, target, override=True)
