"""Shared fixtures: the real SmolLM2 tokenizer and a tiny random model over its vocabulary."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tokenizer():
    from agentrl.rollout.model import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="session")
def tiny(tokenizer):
    from agentrl.rollout.model import tiny_model

    return tiny_model(tokenizer, layers=2, hidden=64, seed=0)
