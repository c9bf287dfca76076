"""Test-wide settings: offline hub, Triton interpreter on CPU, marker handling.

Markers: ``docker`` (needs a Docker Engine), ``gpu`` (needs CUDA), ``slow`` (> ~20 s; CI runs it).
GPU tests skip without CUDA. Docker tests skip when no engine answers, unless
``AGENTRL_REQUIRE_DOCKER=1`` (set by .ci/run), where a missing engine is a failure.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("AGENTRL_TRITON_INTERPRET", "1") == "1":
    # Must be set before any @triton.jit decorator runs (MACHINE-NOTES §4).
    os.environ.setdefault("TRITON_INTERPRET", "1")

import functools  # noqa: E402

import pytest  # noqa: E402


@functools.cache
def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@functools.cache
def _docker() -> str | None:
    """None when an engine answers, else the reason."""
    try:
        import docker

        docker.from_env(timeout=5).ping()
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means "no engine here"
        return f"no Docker engine answers ({type(exc).__name__}: {exc})"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "gpu" in item.keywords and not _cuda():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "docker" in item.keywords:
            reason = _docker()
            if reason and os.environ.get("AGENTRL_REQUIRE_DOCKER") != "1":
                item.add_marker(pytest.mark.skip(reason=reason))
