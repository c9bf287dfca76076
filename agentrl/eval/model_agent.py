"""Model agents for eval: the rollout engine's runner, agent and generators, exactly as in training.

A model name / HF id / path (``+ADAPTER``) loads an in-process HF generator; ``openai:URL[#model]``
talks to any OpenAI-compatible server (token ids in, token ids + log-probs out, streamed: the
request timeout bounds the time without a byte), with the served model's tokenizer rendering the
chat template here. Decoding is greedy for k = 1 and sampled at
temperature 1 for pass@k.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentrl.errors import ConfigError, GeneratorError
from agentrl.rollout.generators.http import RequestPolicy
from agentrl.rollout.settings import RolloutConfig

if TYPE_CHECKING:
    from agentrl.eval.agents import AgentSpec
    from agentrl.eval.records import Job
    from agentrl.eval.suites import Suite
    from agentrl.trajectory import Episode


#: setting -> (CLI option, environment variable); the CLI beats the variable, which beats the default
SETTING_SOURCES: dict[str, tuple[str, str]] = {
    "max_new_tokens": ("--max-new-tokens", "AGENTRL_EVAL_MAX_NEW_TOKENS"),
    "max_context_tokens": ("--max-context-tokens", "AGENTRL_EVAL_MAX_CONTEXT"),
    "episode_timeout_s": ("--episode-timeout-s", "AGENTRL_EVAL_EPISODE_TIMEOUT_S"),
    "request_timeout_s": ("--request-timeout-s", "AGENTRL_EVAL_REQUEST_TIMEOUT_S"),
    "max_retries": ("--max-retries", "AGENTRL_EVAL_MAX_RETRIES"),
    "api_key_env": ("--api-key-env", "AGENTRL_EVAL_API_KEY_ENV"),
    "tool_protocol": ("--tool-protocol", "AGENTRL_EVAL_TOOL_PROTOCOL"),
    "images": ("--images", "AGENTRL_EVAL_IMAGES"),
    "chat_params": ("--chat-param", "AGENTRL_EVAL_CHAT_PARAMS"),
}


def _parse(kind: type, raw: Any) -> Any:
    if kind is tuple:  # repeated CLI option, or "a=1;b=2" in the environment variable
        items = raw.split(";") if isinstance(raw, str) else list(raw)
        return tuple(str(item).strip() for item in items if str(item).strip())
    if kind is bool and isinstance(raw, str):
        if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
            raise ValueError(raw)
        return raw.lower() in ("1", "true", "yes")
    return kind(raw)


#: eval's budgets as a preset over the rollout settings (:class:`RolloutConfig`, their one home):
#: an eval episode gets more room than the rollout defaults give a training one (a larger model, a
#: GAIA task); ``run_model_jobs`` builds its RolloutConfig from these
EVAL_ROLLOUT = RolloutConfig(max_new_tokens=192, max_context_tokens=4096, episode_timeout_s=900.0)


@dataclass(frozen=True)
class ModelEvalConfig:
    """Budgets and remote-request settings of model agents (env turn budgets come from the env
    registration, or a suite option such as ``local-gaia:max_turns=6``).

    ``max_new_tokens`` is sent to chat servers only when set explicitly (hosted models then use
    their own limit); ``sources`` says where each value came from (``default``, an environment
    variable or a CLI option), and :meth:`describe` prints it.
    """

    # the budgets: eval's preset over the rollout settings (EVAL_ROLLOUT), not a second set of defaults
    max_new_tokens: int = EVAL_ROLLOUT.max_new_tokens
    max_context_tokens: int = EVAL_ROLLOUT.max_context_tokens
    episode_timeout_s: float = EVAL_ROLLOUT.episode_timeout_s
    #: a hung request costs this once: timeouts are not retried and their episodes not replayed
    request_timeout_s: float = 90.0
    max_retries: int = RequestPolicy.max_retries  # of a remote request: the request policy's own
    api_key_env: str = "OPENAI_API_KEY"
    tool_protocol: str = "native"
    images: bool = False  # chat agents: send image attachments as image content parts
    #: chat agents: ``KEY=VALUE`` request fields (JSON values; ``KEY=none`` leaves a field out;
    #: ``extra_body={...}`` merges an object), see :func:`agentrl.eval.chat_agent.chat_fields`
    chat_params: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    @classmethod
    def resolve(cls, **cli: Any) -> ModelEvalConfig:
        """CLI values (``None``: not given) over ``AGENTRL_EVAL_*`` variables over the defaults."""
        unknown = set(cli) - set(SETTING_SOURCES)
        if unknown:
            raise ConfigError(
                "eval", f"unknown setting(s) {sorted(unknown)}", f"use {sorted(SETTING_SOURCES)}"
            )
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for name, (option, variable) in SETTING_SOURCES.items():
            kind = type(getattr(cls, name))
            if cli.get(name) is not None:
                raw, sources[name] = cli[name], option
            elif os.environ.get(variable):
                raw, sources[name] = os.environ[variable], variable
            else:
                sources[name] = "default"
                continue
            try:
                values[name] = _parse(kind, raw)
            except ValueError as exc:
                raise ConfigError(option, f"{raw!r} is not a valid {kind.__name__} ({variable})") from exc
        config = cls(**values, sources=sources)
        config.validate()
        return config

    @classmethod
    def from_env(cls) -> ModelEvalConfig:
        """Defaults overridden by the ``AGENTRL_EVAL_*`` variables only."""
        return cls.resolve()

    def validate(self) -> None:
        for name in ("episode_timeout_s", "request_timeout_s", "max_new_tokens", "max_context_tokens"):
            if getattr(self, name) <= 0:
                raise ConfigError(self.setting(name), f"must be > 0, got {getattr(self, name)}")
        if self.max_retries < 0:
            raise ConfigError(self.setting("max_retries"), f"must be >= 0, got {self.max_retries}")
        if self.tool_protocol not in ("native", "text"):
            raise ConfigError(self.setting("tool_protocol"), f"{self.tool_protocol!r}", "use native or text")

    def setting(self, name: str) -> str:
        """How the user sets ``name`` here: ``--episode-timeout-s (or AGENTRL_EVAL_EPISODE_TIMEOUT_S)``."""
        option, variable = SETTING_SOURCES[name]
        return f"{option} or {variable}"

    def explicit(self, name: str) -> bool:
        return self.sources.get(name, "default") != "default"

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in SETTING_SOURCES} | {"sources": dict(self.sources)}

    def unused(self, kind: str) -> dict[str, str]:
        """Settings the agent ``kind`` does not use, with why (printed, so none is silently ignored)."""
        if kind == "chat":
            notes = {}
            if not self.explicit("max_context_tokens"):
                notes["max_context_tokens"] = (
                    "not set: the server's context window (its max_model_len, or its answer) ends the episode"
                )
            if not self.explicit("max_new_tokens"):
                notes["max_new_tokens"] = "not sent: the server's own limit applies"
            return notes
        remote_only = {
            name: "chat agents only" for name in ("api_key_env", "tool_protocol", "images", "chat_params")
        }
        if kind == "model":
            remote_only |= {"request_timeout_s": "remote agents only", "max_retries": "remote agents only"}
        return remote_only

    def describe(self, kind: str = "chat") -> str:
        """One line per setting with its value and where it came from (printed before a run)."""
        notes = {name: f"unused: {why}" for name, why in self.unused(kind).items()}
        if kind == "chat":
            has_key = bool(os.environ.get(self.api_key_env))
            notes["api_key_env"] = "set" if has_key else "not set: requests go without an API key"
        lines = [
            f"  {name} = {getattr(self, name)}  ({self.sources.get(name, 'default')})"
            + (f"  [{notes[name]}]" if name in notes else "")
            for name in SETTING_SOURCES
        ]
        if kind != "model":
            lines.append(f"  {self.hang_cost()}")
        return "\n".join(lines)

    def hang_cost(self) -> str:
        """What one request that never answers costs with these settings (printed at start)."""
        cost = min(self.request_timeout_s, self.episode_timeout_s)
        return (
            f"a request that never answers costs about {cost:g} s: its episode crashes after "
            f"{self.setting('request_timeout_s').split(' or ')[0]} {self.request_timeout_s:g} (a timeout is not "
            "retried, and its episode is not replayed)"
        )


def build_generator(
    spec: AgentSpec, seed: int, settings: ModelEvalConfig, concurrency: int, loaded: dict | None = None
) -> tuple[Any, Any]:
    """(generator, tokenizer) for a model or openai agent spec; a local model decodes up to
    ``concurrency`` episodes in one batch and keeps their K/V between turns (within a quarter of the
    machine's memory, printed). ``loaded``: a dict that keeps the local model and tokenizer for the
    next call (replays of crashed episodes reuse them instead of loading the weights again; each call
    still builds its own generator, so a replay samples as a first run does)."""
    from agentrl.rollout.generators.base import make_generator
    from agentrl.rollout.generators.openai import list_models, pick_served_model, tokenizer_sources
    from agentrl.rollout.model import load_model, load_tokenizer

    if spec.kind == "openai":
        try:
            cards = list_models(spec.url)
        except ConfigError:
            if not spec.model:
                raise
            cards = []
        card = pick_served_model(cards, spec.model or None, spec.url)
        if card is None and not spec.model:
            raise ConfigError("agent", f"{spec.url} serves no model", "name it explicitly: openai:URL#model")
        name = spec.model or str(card["id"])  # type: ignore[index]
        tokenizer, tried = None, []
        for source in tokenizer_sources(name, card):
            try:
                tokenizer = load_tokenizer(source)
                break
            except (OSError, ValueError) as exc:  # ConfigError is a ValueError
                tried.append(f"{source}: {str(exc).splitlines()[0][:200]}")
        if tokenizer is None:
            raise ConfigError(
                "agent",
                f"no local tokenizer for served model {name!r} (tried {'; '.join(tried)})",
                "serve with agentrl serve (its /v1/models names the adapter's folder and base), "
                "or write openai:URL#<a name the server lists> with its tokenizer available here",
            )
        generator = make_generator(
            "openai",
            base_url=spec.url,
            model_name=name,
            timeout_s=settings.request_timeout_s,
            max_retries=settings.max_retries,
            timeout_setting=settings.setting("request_timeout_s"),
            stream=True,  # the request timeout then bounds silence, not a long answer (as chat: does)
        )
        return generator, tokenizer
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        # on a shared CPU one thread beats oversubscription by far (see api-rollout.md)
        torch.set_num_threads(int(os.environ.get("AGENTRL_EVAL_THREADS", "1")))
    key = (spec.model, spec.adapter, device)
    if loaded is not None and key in loaded:
        model, tokenizer = loaded[key]
    else:
        try:
            model, tokenizer = load_model(spec.model, adapter=spec.adapter, device=device)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                "agent", f"cannot load model {spec.label!r}: {exc}", "use smollm2-135m, an HF id or a folder"
            ) from exc
        if loaded is not None:
            loaded[key] = (model, tokenizer)
    from agentrl.rollout.generators.kv_cache import prefix_cache_budget

    tokens, why = prefix_cache_budget(model, concurrency * settings.max_context_tokens)
    print(f"[eval] prefix cache: {why}", file=sys.stderr)
    generator = make_generator("hf", model=model, tokenizer=tokenizer, seed=seed,
                               max_batch_size=max(32, concurrency), prefix_cache_tokens=tokens)  # fmt: skip
    return generator, tokenizer


def run_model_jobs(
    suite: Suite,
    jobs: Sequence[Job],
    spec: AgentSpec,
    *,
    concurrency: int,
    seed: int,
    settings: ModelEvalConfig | None = None,
    remote: dict[str, Any] | None = None,
    loaded: dict | None = None,
) -> tuple[list[tuple[Episode, float]], float]:
    """Run the jobs (task-major, ``suite.k`` samples each) part by part through ``run_episodes``
    (``loaded``: see :func:`build_generator`).

    Returns:
        ``(episode, seconds)`` per job, and the setup seconds (loading the model or tokenizer).
    """
    from agentrl.rollout.runner import run_episodes

    budgets = settings or ModelEvalConfig.from_env()
    start = time.perf_counter()
    generator, tokenizer = build_generator(spec, seed, budgets, max(1, concurrency), loaded)
    setup_s = time.perf_counter() - start
    rollout = RolloutConfig(
        max_new_tokens=budgets.max_new_tokens,
        max_context_tokens=budgets.max_context_tokens,
        temperature=0.0 if suite.k == 1 else 1.0,
        concurrency=max(1, concurrency),
        group_size=suite.k,
        episode_timeout_s=budgets.episode_timeout_s,
    )
    results: list[tuple[Episode, float]] = []
    try:
        for part in suite.parts:
            part_jobs = [j for j in jobs if j.part == part]
            if not part_jobs:
                continue
            first = [j for j in part_jobs if j.sample == 0]  # one entry per task; the group repeats it
            episodes = run_episodes(
                part.env_id if remote is None else remote[part.env_id],  # --ray: envs in Ray actors
                [j.task for j in first],
                generator,
                tokenizer,
                rollout,
                seeds=[j.seed for j in first],
                timeout_setting=budgets.setting("episode_timeout_s"),
                progress=False,
                env_kwargs={"split": suite.split, **{k: v for k, v in part.kwargs.items() if v is not None}},
            )
            if len(episodes) != len(part_jobs):
                raise GeneratorError(f"rollout returned {len(episodes)} episodes for {len(part_jobs)} jobs")
            for episode in episodes:
                results.append((episode, float(episode.timings.get("wall_s", 0.0))))
    finally:
        generator.close()
    return results, setup_s
