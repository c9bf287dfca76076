"""Where agentrl finds data it does not ship: the real benchmark files and caches."""

from __future__ import annotations

import os
from pathlib import Path

from agentrl.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_data_dir(required: bool = True) -> Path | None:
    """The folder with the real benchmark data (math/, search_qa/, webshop/).

    ``AGENTRL_DATA`` wins; otherwise ``../shared/data`` beside a source checkout.
    """
    env = os.environ.get("AGENTRL_DATA")
    candidates = [Path(env)] if env else [REPO_ROOT.parent / "shared" / "data", REPO_ROOT / "data"]
    for path in candidates:
        if path.is_dir():
            return path
    if required:
        raise ConfigError(
            "AGENTRL_DATA",
            f"no benchmark data folder found (looked in {', '.join(map(str, candidates))})",
            "set AGENTRL_DATA to the folder holding math/, search_qa/ and webshop/",
        )
    return None


def cache_dir() -> Path:
    """Per-user cache (generated corpora, converted databases); ``AGENTRL_CACHE`` overrides."""
    path = Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl"))
    path.mkdir(parents=True, exist_ok=True)
    return path
