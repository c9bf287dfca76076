"""Fixtures of the SQL-env tests: the sandbox backend (skips only when no backend works here)."""

from __future__ import annotations

import pytest

from agentrl.errors import SandboxError


@pytest.fixture(scope="session")
def backend() -> str:
    """The backend ``auto`` picks (Docker when an engine answers, else bubblewrap)."""
    from agentrl.sandboxes import resolve_backend

    try:
        return resolve_backend("auto")
    except SandboxError as exc:
        pytest.skip(f"no sandbox backend here: {exc}")
