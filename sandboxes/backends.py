"""Choosing and creating a sandbox backend (``make_sandbox``, ``resolve_backend``): the package's
factory, in a module of its own so the pool and the package both import it and neither the other."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from agentrl.errors import ConfigError, SandboxError
from agentrl.registry import SANDBOX_BACKENDS, lazy
from agentrl.sandboxes.base import AgentSandbox, Limits

lazy(SANDBOX_BACKENDS, "docker", "agentrl.sandboxes.docker_backend:DockerSandbox")
lazy(SANDBOX_BACKENDS, "bwrap", "agentrl.sandboxes.bwrap_backend:BwrapSandbox")

_auto_choice: tuple[float, str] | None = None


def resolve_backend(backend: str = "auto") -> str:
    """Turn ``"auto"`` into ``"docker"`` when an engine answers, else ``"bwrap"`` when it works here."""
    global _auto_choice
    if backend != "auto":
        SANDBOX_BACKENDS.get(backend, field="sandbox.backend")  # unknown name -> ConfigError
        return backend
    if _auto_choice is not None and time.monotonic() - _auto_choice[0] < 30.0:
        return _auto_choice[1]
    from agentrl.sandboxes.bwrap_backend import bwrap_available
    from agentrl.sandboxes.docker_backend import engine_available

    if engine_available():
        choice = "docker"
    elif bwrap_available():
        choice = "bwrap"
    else:
        raise SandboxError(
            "no sandbox backend works here: no Docker engine answers (start dockerd or set DOCKER_HOST) "
            "and bubblewrap is missing or cannot create namespaces (apt-get install -y bubblewrap)"
        )
    _auto_choice = (time.monotonic(), choice)
    return choice


def make_sandbox(backend: str = "auto", *, image: str | None = None, **limits: Any) -> AgentSandbox:
    """Create (not yet start) a sandbox. Use it as a context manager, or call ``start``/``close``.

    Args:
        backend: ``"docker"``, ``"bwrap"`` or ``"auto"`` (Docker when an engine answers).
        image: Docker image tag (default: the recipe-built ``agentrl-sandbox:<hash>``).
        **limits: :class:`Limits` fields: ``memory_mb=512, pids=64, cpus=1.0, work_tmpfs_mb=64,
            output_limit=65536, network=None, ro_mounts={host: container}, reset_budget_s=2.0``.

    Raises:
        ConfigError: unknown backend or limit.
        SandboxError: ``auto`` found no usable backend.
    """
    fields = {f.name for f in dataclasses.fields(Limits)}
    for name in limits:
        if name not in fields:
            raise ConfigError(
                f"sandbox.{name}", "unknown sandbox limit", f"use one of: {', '.join(sorted(fields))}"
            )
    try:
        parsed = Limits(**limits)
    except ValueError as exc:
        raise ConfigError("sandbox", str(exc), "use a positive number") from exc
    name = resolve_backend(backend)
    cls = SANDBOX_BACKENDS.get(name, field="sandbox.backend")
    if name == "docker":
        return cls(parsed, image=image)
    return cls(parsed)
