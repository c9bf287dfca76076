"""Rollout settings: the one class the runner, the agent (episode loop) and the sampler read.

:class:`RolloutConfig` is a run config's ``rollout:`` section (``agentrl.config`` builds it from
YAML and dotted overrides) and what code passes to :func:`agentrl.rollout.runner.run_episodes`:
there is no second copy of these fields. :meth:`RolloutConfig.validate` is their one check (the
sampler's ranges through :meth:`RolloutConfig.sampling`, and FoldGRPO's process-reward settings,
included); every error names the field and the fix.
The sampler's fields (max_new_tokens, temperature, top_p, top_k) take their defaults from
:class:`SamplingParams`, the request they become: one home per default.
What is not a setting - a progress bar, callbacks, the env's constructor arguments, lockstep
batching - is a keyword argument of the runner.

    settings = RolloutConfig(max_new_tokens=64, concurrency=4, group_size=1)
    episodes = run_episodes("agentrl/Search-v0", tasks, generator, tokenizer, settings)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from agentrl.errors import ConfigError, check_choice
from agentrl.rollout.generators.base import SamplingParams
from agentrl.setting import WHEN_SAMPLED, setting

#: who judges a FoldGRPO branch's scope (``rollout.scope_judge``)
JUDGES = ("rule", "policy", "openai", "none")
#: the process-reward settings, which have effect only with ``folding=branch``
PROCESS_REWARD_SETTINGS = ("unfolded_penalty", "unfolded_threshold", "failure_penalty", "scope_penalty",
                           "scope_judge", "scope_judge_url", "scope_judge_model", "scope_judge_timeout_s")  # fmt: skip


@dataclass(frozen=True)
class RolloutConfig:
    backend: str = setting("hf", eval=True)
    """Generator backend: hf | vllm | openai."""
    base_url: str | None = setting(None, eval=True)
    """Server URL for the openai backend (e.g. http://127.0.0.1:8000/v1)."""
    group_size: int = setting(4, eval="training samples per task (evals run one per task)")
    """Rollouts per task (G) for group-relative advantages; with branches > 0, the roots (trees) per task."""
    branches: int = setting(0, eval="training tree rollouts (evals run chains)")
    """Tree rollouts (Tree-GRPO / ARPO style): after each root episode ends, this many more episodes fork from it at a turn boundary (branch_at) and continue on their own; a root and its branches form one group, and the turns they share are left out of the loss. 0 = chains (group_size independent episodes per task)."""
    branch_at: str = setting("last", eval="training tree rollouts")
    """With branches > 0: where a branch forks from its root: last (before the root's last turn: the answer, for a search agent) | uniform (a turn boundary drawn uniformly, seeded) | entropy (ARPO: after the tool result whose next turn starts with the highest first-token entropy; last when the root has no such turn or no entropies)."""
    branch_temperature: float | None = setting(None, eval="training tree rollouts: the branches' sampling (evals run chains)")
    """With branches > 0: the sampling temperature of the turns a branch generates after its branch point (the root's turns keep temperature): more exploration exactly where a group is decided, e.g. 1.0 for answers the policy gets confidently wrong at 0.6; recorded per turn (Turn.temperature). The learner's log-probs stay at temperature, so a different value needs algo.old_logprobs=recompute. Unset = temperature."""
    fork: str = setting("replay", eval="training tree rollouts: how a branch reaches its branch point (the same state either way)")
    """With branches > 0: how a branch reaches its branch point: replay (each branch replays the root's turns into an env of its own) | env (the turns are replayed once into one env, which the env's fork() copies for each branch: fewer tool calls and sandbox cells; an env that cannot fork is an error) | auto (env where the env forks, else replay)."""
    tasks_per_step: int = setting(4, eval="training batch")
    """Tasks sampled per training step."""
    concurrency: int = setting(8, eval="episodes in flight: the same episodes, batched otherwise (float sums may differ in their last bits)")
    """Episodes run at once."""
    branch_concurrency: int | None = setting(None, eval="training tree rollouts: the same branches, batched otherwise (evals run chains)")
    """With branches > 0: branches run at once, once every root has ended. A branch holds only its own tokens' K/V (its trunk's is held once per tree, backend=hf), so many more fit than whole episodes: with branch_at=last and a CPU, a decode batch of several trees' answers costs little more than one tree's. Unset = concurrency."""
    max_new_tokens: int = setting(SamplingParams.max_new_tokens, eval=True)
    """Token budget of one assistant turn."""
    max_context_tokens: int = setting(2048, eval=True)
    """Token budget of a whole episode context; the episode is truncated past it."""
    temperature: float = setting(SamplingParams.temperature, eval="training sampling (evals use train.eval_temperature)")
    """Sampling temperature."""
    top_p: float = setting(SamplingParams.top_p, eval=WHEN_SAMPLED)
    """Nucleus sampling threshold."""
    episode_timeout_s: float = setting(300.0, eval="failure handling: failed eval episodes are replayed and counted (train.eval_max_failed)")
    """Budget of one episode's own time: wall-clock, less its waits for an in-process generator that decodes the whole wave together (hf, vllm), so a loaded machine does not time out a whole wave; env and tool calls always count. With a remote server (openai), wall-clock."""
    watchdog_s: float = setting(120.0, eval="as episode_timeout_s")
    """An episode with no progress for this long is named, then cancelled."""
    folding: str = setting("none", eval=True)
    """Context folding: none | branch (FoldGRPO branch/return) | summary (SUPO/FoldAct)."""
    summary_threshold: int = setting(1536, eval=True)
    """With folding=summary: summarize when the working context passes this many tokens."""
    max_summaries: int = setting(4, eval=True)
    """With folding=summary: at most this many summaries (context restarts) per episode."""
    max_branches: int = setting(10, eval=True)
    """With folding=branch: at most this many branches per episode."""
    branch_max_turns: int = setting(8, eval=True)
    """With folding=branch: a branch that runs this many env turns without return is closed."""
    top_k: int = setting(SamplingParams.top_k, eval=WHEN_SAMPLED)
    """Top-k sampling (0 = off)."""
    template_mode: str = setting("auto", eval=True)
    """Token bookkeeping: auto (concat if the chat template passes the conformance check, else one row per turn) | concat | per_turn."""
    tool_schemas: bool = setting(True, eval=True)
    """Render the tools' JSON schemas into the system prompt; false when the env's system prompt already documents its tools (fewer prompt tokens; with folding=branch, branch/return are then documented in text)."""
    watchdog_action: str = setting("cancel", eval="as episode_timeout_s")
    """What the watchdog does with a stalled episode: cancel (record it as failed) | retry (fresh env, up to max_retries)."""
    max_retries: int = setting(1, eval="as episode_timeout_s")
    """With watchdog_action=retry: re-runs of a stalled episode."""
    unfolded_penalty: float = setting(-1.0, eval="training reward shaping (success is the env's own metric)")
    """With folding=branch: FoldGRPO process reward Q on each main-thread token generated once the main context is past unfolded_threshold (branch-creating turns exempt); paper: -1."""
    unfolded_threshold: float = setting(0.5, eval="as unfolded_penalty")
    """With folding=branch: fraction of max_context_tokens past which main-thread tokens get unfolded_penalty; paper: 0.5."""
    failure_penalty: float = setting(-1.0, eval="as unfolded_penalty")
    """With folding=branch: Q on each token of a turn whose tool call failed (tool error, malformed call, misplaced branch/return); paper: -1."""
    scope_penalty: float = setting(-0.2, eval="as unfolded_penalty")
    """With folding=branch: Q on each token of a branch the scope judge finds went beyond its sub-task; paper: -0.2."""
    scope_judge: str = setting("rule", eval="as unfolded_penalty")
    """With folding=branch: who judges branch scope: rule (content-word rules, no model) | policy (the rollout's own generator) | openai (an OpenAI-compatible server at scope_judge_url; the paper used GPT-5-nano) | none."""
    scope_judge_url: str | None = setting(None, eval="as unfolded_penalty")
    """With scope_judge=openai: the server's base URL (e.g. http://127.0.0.1:8000/v1)."""
    scope_judge_model: str = setting("", eval="as unfolded_penalty")
    """With scope_judge=openai: model name to request ("" = the first one the server lists)."""
    scope_judge_timeout_s: float = setting(30.0, eval="as unfolded_penalty")
    """Timeout of one scope-judge call (an LLM judge that fails or times out fails its episode)."""
    prefix_cache_tokens: int | None = setting(None, eval="K/V reuse: the same tokens, computed once")
    """With backend=hf: K/V tokens the generator keeps between turns, so a turn prefills only what is new (~45 KiB a token for SmolLM2 in float32); unset = every episode in flight (concurrency x max_context_tokens, at least 65,536), capped at a quarter of the machine's memory (RAM, or the GPU's) (the resolved number is printed and saved); 0 = off."""
    sampler_dtype: str = setting("model", eval=True)
    """With backend=hf: the precision the generator samples in (training's rollouts and evals): model (the learner's live weights, in model.dtype) | bfloat16 (a bfloat16 copy of the model, given the learner's weights after the warm-up and after every update, +2 bytes a parameter; its K/V take half the memory; its log-probs differ from the learner's, so the learner measures them before each update: mismatch/abs_mean, mismatch/kl_k3) | auto (bfloat16 where train.bf16_autocast resolved to bf16, else model, and model with LoRA or ZeRO-3, whose partitioned weights only the live model's forward gathers; bfloat16 with ZeRO-3 is refused; the choice is printed and saved)."""
    max_turns: int | None = setting(None, eval=True)
    """Cap on generated turns per episode (branch, return and summary turns count); unset = from the env's own turn budget (env.max_turns) and the context strategy."""

    @property
    def episodes_per_task(self) -> int:
        """Training episodes per task: ``group_size`` chains, or trees of 1 + ``branches`` episodes."""
        return self.group_size * (1 + self.branches)

    def validate(self, prefix: str = "rollout") -> None:
        """Raise ConfigError naming the field (``prefix.name``) and the fix for any bad value: the one
        check of these settings, whether they come from YAML or are built in code."""
        check_choice(f"{prefix}.backend", self.backend, ("hf", "vllm", "openai"))
        if self.backend == "openai" and not self.base_url:
            raise ConfigError(
                f"{prefix}.base_url",
                "is required with backend=openai",
                "set rollout.base_url=http://HOST:PORT/v1",
            )
        check_choice(f"{prefix}.watchdog_action", self.watchdog_action, ("cancel", "retry"))
        for name in (
            "tasks_per_step",
            "concurrency",
            "branch_concurrency",
            "group_size",
            "max_new_tokens",
            "max_context_tokens",
            "max_turns",
        ):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{prefix}.{name}", f"must be >= 1, got {getattr(self, name)}")
        if self.prefix_cache_tokens is not None:
            if self.prefix_cache_tokens < 0:
                raise ConfigError(
                    f"{prefix}.prefix_cache_tokens", f"must be >= 0 (0 = off), got {self.prefix_cache_tokens}"
                )
            if self.backend != "hf":
                raise ConfigError(f"{prefix}.prefix_cache_tokens", f"has effect only with backend=hf, not {self.backend}",
                                  "remove it, or pass rollout.prefix_cache_tokens=null (the server keeps its own cache)")  # fmt: skip
        check_choice(f"{prefix}.sampler_dtype", self.sampler_dtype, ("model", "bfloat16", "auto"))
        if self.sampler_dtype != "model" and self.backend != "hf":
            raise ConfigError(f"{prefix}.sampler_dtype", f"has effect only with backend=hf, not {self.backend}",
                              "remove it (a vLLM or remote engine samples in its own dtype)")  # fmt: skip
        self._check_process_rewards(prefix)
        check_choice(f"{prefix}.folding", self.folding, ("none", "branch", "summary"))
        check_choice(f"{prefix}.template_mode", self.template_mode, ("auto", "concat", "per_turn"))
        self._check_tree(prefix)
        if self.max_new_tokens >= self.max_context_tokens:
            raise ConfigError(
                f"{prefix}.max_new_tokens",
                f"{self.max_new_tokens} leaves no room in max_context_tokens={self.max_context_tokens}",
                "lower max_new_tokens or raise max_context_tokens",
            )
        self.sampling()  # temperature / top_p ranges: the sampler's own check

    def _check_tree(self, prefix: str) -> None:
        """Tree rollouts: branches >= 0, branch_at a known rule, and a context a branch can replay."""
        if self.branches < 0:
            raise ConfigError(f"{prefix}.branches", f"must be >= 0 (0 = chains), got {self.branches}")
        check_choice(f"{prefix}.branch_at", self.branch_at, ("last", "uniform", "entropy"))
        check_choice(f"{prefix}.fork", self.fork, ("replay", "env", "auto"))
        # (that it needs branches > 0 is checked on the run's config, train/plan.py: evals and
        # demonstrations derive chain settings from it)
        if self.branch_temperature is not None and not (math.isfinite(self.branch_temperature) and self.branch_temperature > 0):
            raise ConfigError(f"{prefix}.branch_temperature", f"must be > 0, got {self.branch_temperature}",
                              "leave it unset to sample branches at rollout.temperature")  # fmt: skip
        if self.branches and self.folding != "none":
            raise ConfigError(f"{prefix}.branches", f"tree rollouts replay a root's turns in order, which "
                              f"folding={self.folding} does not keep", "set rollout.folding=none or rollout.branches=0")  # fmt: skip

    def _check_process_rewards(self, prefix: str) -> None:
        """FoldGRPO's process rewards: penalties finite and <= 0, the threshold in (0, 1], the judge
        one of :data:`JUDGES` (``openai`` needs a URL), its timeout > 0; and a setting changed from
        its default has effect only with ``folding=branch``."""
        for name in ("unfolded_penalty", "failure_penalty", "scope_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value <= 0):
                raise ConfigError(f"{prefix}.{name}", f"must be a finite penalty <= 0, got {value}")
        if not 0.0 < self.unfolded_threshold <= 1.0:
            raise ConfigError(
                f"{prefix}.unfolded_threshold",
                f"must be a fraction of max_context_tokens in (0, 1], got {self.unfolded_threshold}",
            )
        check_choice(f"{prefix}.scope_judge", self.scope_judge, JUDGES)
        if self.scope_judge == "openai" and not self.scope_judge_url:
            raise ConfigError(
                f"{prefix}.scope_judge_url",
                "is required with scope_judge=openai",
                f"set {prefix}.scope_judge_url=http://HOST:PORT/v1",
            )
        if not self.scope_judge_timeout_s > 0:
            raise ConfigError(
                f"{prefix}.scope_judge_timeout_s", f"must be > 0, got {self.scope_judge_timeout_s}"
            )
        if self.folding != "branch":
            defaults = {f.name: f.default for f in dataclasses.fields(self)}
            changed = [name for name in PROCESS_REWARD_SETTINGS if getattr(self, name) != defaults[name]]
            if changed:
                raise ConfigError(
                    f"{prefix}.{changed[0]}",
                    f"process rewards are computed only with {prefix}.folding=branch (folding is {self.folding!r})",
                    f"set {prefix}.folding=branch or leave {prefix}.{changed[0]} at its default",
                )

    def sampling(self, **request: object) -> SamplingParams:
        """The sampler's request for one turn under these settings (``request``: per-call fields such
        as ``seed`` or a ``max_new_tokens`` cut to the context left)."""
        base = {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "top_k": self.top_k}  # fmt: skip
        return SamplingParams(**{**base, **request})  # type: ignore[arg-type]
