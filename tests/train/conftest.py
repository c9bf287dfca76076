"""Shared fixtures of the training tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A saved one-block random model over the SmolLM2 tokenizer (``model.name=<dir>``)."""
    from agentrl.rollout.model import load_tokenizer, tiny_model

    path = tmp_path_factory.mktemp("tiny-model")
    tokenizer = load_tokenizer("smollm2-135m")
    tiny_model(tokenizer, layers=1, hidden=32, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
