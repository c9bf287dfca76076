"""Fixtures of the code-env tests: the sandbox backend (skips only when no backend works here)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def backend(sandbox_backend: str) -> str:
    """The backend ``auto`` picks (skips when none works here or the Docker image is not built)."""
    return sandbox_backend
