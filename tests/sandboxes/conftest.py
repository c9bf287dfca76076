"""Fixtures for the sandbox tests: every containment case runs against Docker and bubblewrap.

Docker cases carry the ``docker`` marker (skipped by the top-level conftest when no engine answers);
bubblewrap cases skip when ``bwrap`` is missing or cannot create namespaces here.
"""

from __future__ import annotations

import functools

import pytest
from sandbox_helpers import TEST_LIMITS

from agentrl.sandboxes import make_sandbox

BACKENDS = [pytest.param("docker", marks=pytest.mark.docker), pytest.param("bwrap", marks=pytest.mark.bwrap)]


@functools.cache
def bwrap_reason() -> str | None:
    from agentrl.sandboxes.bwrap_backend import bwrap_available

    return None if bwrap_available() else "bubblewrap is missing or cannot create namespaces here"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "bwrap: needs bubblewrap (skipped when it is missing)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "bwrap" in item.keywords and bwrap_reason():
            item.add_marker(pytest.mark.skip(reason=bwrap_reason()))


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    # docker cases carry the docker marker: the top-level conftest skips them (or, under
    # AGENTRL_REQUIRE_DOCKER=1, lets them fail) when no engine answers or the image is not built
    return request.param


@pytest.fixture(scope="module")
def sandbox(backend: str):
    """One sandbox per backend and module; every test must leave it usable (and checks that)."""
    with make_sandbox(backend, **TEST_LIMITS) as box:
        yield box
