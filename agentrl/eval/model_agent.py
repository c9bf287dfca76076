"""Model agents for eval: the rollout engine's runner, agent and generators, exactly as in training.

A model name / HF id / path (``+ADAPTER``) loads an in-process HF generator; ``openai:URL[#model]``
talks to any OpenAI-compatible server (token ids in, token ids + log-probs out), with the served
model's tokenizer rendering the chat template here. Decoding is greedy for k = 1 and sampled at
temperature 1 for pass@k.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl.errors import ConfigError, GeneratorError

if TYPE_CHECKING:
    from agentrl.eval.agents import AgentSpec
    from agentrl.eval.runner import Job
    from agentrl.eval.suites import Suite
    from agentrl.trajectory import Episode


@dataclass(frozen=True)
class ModelEvalConfig:
    """Generation budgets for model agents (env turn budgets come from the env registration, or a
    suite option such as ``local-gaia:max_turns=6``)."""

    max_new_tokens: int = 192
    max_context_tokens: int = 4096
    episode_timeout_s: float = 900.0

    @classmethod
    def from_env(cls) -> ModelEvalConfig:
        """Defaults, overridden by AGENTRL_EVAL_MAX_NEW_TOKENS / _MAX_CONTEXT / _EPISODE_TIMEOUT_S."""
        env = os.environ
        return cls(
            max_new_tokens=int(env.get("AGENTRL_EVAL_MAX_NEW_TOKENS", cls.max_new_tokens)),
            max_context_tokens=int(env.get("AGENTRL_EVAL_MAX_CONTEXT", cls.max_context_tokens)),
            episode_timeout_s=float(env.get("AGENTRL_EVAL_EPISODE_TIMEOUT_S", cls.episode_timeout_s)),
        )


def served_model_name(url: str, timeout: float = 10.0) -> str:
    """The first model id an OpenAI-compatible server lists at ``/models``."""
    import httpx

    try:
        response = httpx.get(f"{url}/models", timeout=timeout)
        response.raise_for_status()
        models = response.json().get("data", [])
    except (httpx.HTTPError, ValueError) as exc:
        raise ConfigError(
            "agent", f"cannot list models at {url}/models: {exc}", "check the URL and that the server runs"
        ) from exc
    if not models:
        raise ConfigError("agent", f"{url} serves no model", "name it explicitly: openai:URL#model")
    return str(models[0]["id"])


def build_generator(spec: AgentSpec, seed: int) -> tuple[Any, Any]:
    """(generator, tokenizer) for a model or openai agent spec."""
    from agentrl.rollout.generators.base import make_generator
    from agentrl.rollout.model import load_model, load_tokenizer

    if spec.kind == "openai":
        name = spec.model or served_model_name(spec.url)
        try:
            tokenizer = load_tokenizer(name)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                "agent",
                f"no local tokenizer for served model {name!r}: {exc}",
                "write openai:URL#<local name or path>",
            ) from exc
        return make_generator("openai", base_url=spec.url, model_name=name), tokenizer
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        # on a shared CPU one thread beats oversubscription by far (see api-rollout.md)
        torch.set_num_threads(int(os.environ.get("AGENTRL_EVAL_THREADS", "1")))
    try:
        model, tokenizer = load_model(spec.model, adapter=spec.adapter, device=device)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            "agent", f"cannot load model {spec.label!r}: {exc}", "use smollm2-135m, an HF id or a folder"
        ) from exc
    return make_generator("hf", model=model, tokenizer=tokenizer, seed=seed), tokenizer


def run_model_jobs(
    suite: Suite, jobs: Sequence[Job], spec: AgentSpec, *, concurrency: int, seed: int,
    remote: dict[str, Any] | None = None,
) -> tuple[list[tuple[Episode, float]], float]:  # fmt: skip
    """Run the jobs (task-major, ``suite.k`` samples each) part by part through ``run_episodes``.

    Returns:
        ``(episode, seconds)`` per job, and the setup seconds (loading the model or tokenizer).
    """
    from agentrl.rollout.agent import AgentConfig
    from agentrl.rollout.runner import RunnerConfig, run_episodes

    budgets = ModelEvalConfig.from_env()
    start = time.perf_counter()
    generator, tokenizer = build_generator(spec, seed)
    setup_s = time.perf_counter() - start
    agent = AgentConfig(
        max_new_tokens=budgets.max_new_tokens,
        max_context_tokens=budgets.max_context_tokens,
        temperature=0.0 if suite.k == 1 else 1.0,
        seed=seed,
    )
    results: list[tuple[Episode, float]] = []
    try:
        for part in suite.parts:
            part_jobs = [j for j in jobs if j.part == part]
            if not part_jobs:
                continue
            first = [j for j in part_jobs if j.sample == 0]  # one entry per task; the group repeats it
            config = RunnerConfig(
                agent=agent,
                concurrency=max(1, concurrency),
                group_size=suite.k,
                episode_timeout_s=budgets.episode_timeout_s,
                progress=False,
                env_kwargs={"split": suite.split, **{k: v for k, v in part.kwargs.items() if v is not None}},
            )
            episodes = run_episodes(
                part.env_id if remote is None else remote[part.env_id],  # --ray: envs in Ray actors
                [j.task for j in first],
                generator,
                tokenizer,
                config,
                seeds=[j.seed for j in first],
            )
            if len(episodes) != len(part_jobs):
                raise GeneratorError(f"rollout returned {len(episodes)} episodes for {len(part_jobs)} jobs")
            for episode in episodes:
                results.append((episode, float(episode.timings.get("wall_s", 0.0))))
    finally:
        generator.close()
    return results, setup_s
