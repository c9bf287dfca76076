"""``agentrl serve --engine vllm``: vLLM's own OpenAI-compatible server on a checkpoint (GPU).

agentrl does not re-implement GPU serving: it resolves the model (a built-in name becomes its
de-quantized folder), turns ``--adapter`` into a vLLM LoRA module (a PEFT folder) or the model
itself (a full checkpoint folder), turns on vLLM's Hermes tool-call parser (the ``<tool_call>``
format of :mod:`agentrl.actions`) and runs ``python -m vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from agentrl.errors import ConfigError


def adapter_name(adapter: str) -> str:
    """The name a served adapter is listed under: its folder name (``step-000040``)."""
    return Path(adapter).resolve().name


def vllm_command(
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    adapter: str | None = None,
    dtype: str = "bfloat16",
    served_model_name: str | None = None,
    extra_args: list[str] | None = None,
) -> list[str]:
    """The argv that runs vLLM's OpenAI-compatible server for ``model`` (+ ``adapter``)."""
    from agentrl.rollout.model import resolve_model_path

    model_path = resolve_model_path(model)
    lora: list[str] = []
    if adapter is not None:
        folder = Path(adapter)
        if (folder / "adapter_config.json").exists():
            rank = json.loads((folder / "adapter_config.json").read_text()).get("r", 16)
            lora = [
                "--enable-lora",
                "--lora-modules",
                f"{served_model_name or adapter_name(adapter)}={folder.resolve()}",
                "--max-lora-rank",
                str(max(8, int(rank))),
            ]
        elif (folder / "config.json").exists():
            model_path = str(folder.resolve())  # a full checkpoint replaces the base weights
        else:
            raise ConfigError(
                "--adapter",
                f"{adapter!r} has neither adapter_config.json nor config.json",
                "point it at a PEFT adapter folder or a saved checkpoint folder",
            )
    if lora:  # vLLM lists the base under its own name and the adapter under the served name
        base_name = model
    else:
        base_name = served_model_name or (adapter_name(adapter) if adapter is not None else model)
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_path,
        "--served-model-name",
        base_name,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        *lora,
        *(extra_args or []),
    ]


def run_vllm_server(command: list[str]) -> None:
    """Replace this process with vLLM's server (its logs, signals and exit code are vLLM's)."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            "--engine",
            "vllm is not installed",
            "pip install 'agentrl[gpu]' on a CUDA machine, or use --engine hf",
        ) from exc
    print("agentrl serve --engine vllm: " + " ".join(command), flush=True)
    os.execv(command[0], command)
