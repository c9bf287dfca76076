"""agentrl.sandboxes: where everything a model writes (Python, shell, SQL) runs.

One small protocol (:class:`Sandbox`), two backends - Docker (hardened containers through the
Engine API, local or ``DOCKER_HOST``) and bubblewrap (namespaces, for hosts without Docker) - a
pool of warm sandboxes, and a stateful Python interpreter inside. Threat model: ``README.md`` here.

    from agentrl.sandboxes import make_sandbox
    with make_sandbox("auto", memory_mb=512) as sb:
        result = sb.exec("print(1)", timeout=5.0)
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError, SandboxError, SandboxLost
from agentrl.registry import SANDBOX_BACKENDS, lazy
from agentrl.sandboxes.base import AgentSandbox, ExecResult, Limits, PythonSession, Sandbox, Usage
from agentrl.sandboxes.pool import PoolStats, SandboxPool

lazy(SANDBOX_BACKENDS, "docker", "agentrl.sandboxes.docker_backend:DockerSandbox")
lazy(SANDBOX_BACKENDS, "bwrap", "agentrl.sandboxes.bwrap_backend:BwrapSandbox")

__all__ = [
    "AgentSandbox",
    "ExecResult",
    "Limits",
    "PoolStats",
    "PythonSession",
    "Sandbox",
    "SandboxError",
    "SandboxLost",
    "SandboxPool",
    "Usage",
    "build_image",
    "make_sandbox",
    "resolve_backend",
    "run_file",
]

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
            output_limit=65536, network=None, ro_mounts={host: container}``.

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


def build_image(force: bool = False) -> str:
    """Build (or find cached) the Docker sandbox image from ``sandboxes/images/``; return its tag."""
    from agentrl.sandboxes.image import build_image as build

    return build(force=force)


# How `run_file` runs a file by its suffix; anything else must be an executable (shebang).
RUNNERS = {".py": ["python3"], ".sh": ["sh"], ".sql": ["sqlite3", "-bail", ":memory:"]}


def run_file(
    path: str | os.PathLike, backend: str = "auto", timeout: float = 10.0, **limits: Any
) -> ExecResult:
    """Run a host file in a fresh sandbox and return its result (``agentrl sandbox run FILE``).

    ``.py`` runs under python3, ``.sh`` under sh, ``.sql`` is fed to ``sqlite3 :memory:`` on stdin;
    any other file is made executable and run directly.
    """
    source = Path(path)
    data = source.read_bytes()
    name = source.name
    with make_sandbox(backend, **limits) as sandbox:
        sandbox.put_file(name, data)
        suffix = source.suffix.lower()
        if suffix == ".sql":
            return sandbox.exec(RUNNERS[suffix], timeout=timeout, stdin=data)
        if suffix in RUNNERS:
            return sandbox.exec([*RUNNERS[suffix], name], timeout=timeout)
        chmod = sandbox.exec(["chmod", "+x", name], timeout=timeout)
        if chmod.exit_code != 0:
            return chmod
        return sandbox.exec([f"./{name}"], timeout=timeout)
