"""agentrl.sandboxes: where everything a model writes (Python, shell, SQL) runs.

One small protocol (:class:`Sandbox`), two backends - Docker (hardened containers through the
Engine API, local or ``DOCKER_HOST``) and bubblewrap (namespaces, for hosts without Docker) - a
pool of warm sandboxes, and a stateful Python interpreter inside. Threat model: ``README.md`` here.

    from agentrl.sandboxes import make_sandbox
    with make_sandbox("auto", memory_mb=512) as sb:
        result = sb.exec("print(1)", timeout=5.0)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agentrl.errors import SandboxError, SandboxLost
from agentrl.sandboxes.backends import make_sandbox, resolve_backend
from agentrl.sandboxes.base import AgentSandbox, ExecResult, Limits, PythonSession, Sandbox, Usage
from agentrl.sandboxes.pool import PoolStats, SandboxPool

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


def build_image(force: bool = False) -> str:
    """Build (or find cached) the Docker sandbox image from ``sandboxes/images/``; return its tag."""
    from agentrl.sandboxes.docker_backend import docker_client
    from agentrl.sandboxes.image import build_image as build

    return build(docker_client(), force=force)


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
