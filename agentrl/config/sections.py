"""The run config's sections: one frozen dataclass each (model, env, algo, train; rollout's is
:class:`agentrl.rollout.settings.RolloutConfig`), their fields' defaults and help, and their checks.

Each field's docstring (the string literal under it) is its help text: ``agentrl train --help-config``
prints them. Each field is declared with :func:`agentrl.setting.setting`, which also says whether
it shapes a held-out eval (:mod:`agentrl.config.eval_classes`). Building these from YAML and
overrides is :mod:`agentrl.config.load`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrl.cluster.remote_env import RaySettings  # the placement defaults' home
from agentrl.errors import ConfigError
from agentrl.errors import check_choice as _choice
from agentrl.rollout.settings import RolloutConfig as RolloutConfig  # the one rollout settings class
from agentrl.setting import setting
from agentrl.train.mixture import MIXTURE_ID  # env.id of a run whose envs are listed in env.mixture

# EnvConfig fields that only a mixture reads (a single env refuses them rather than ignore them)
MIXTURE_ONLY = ("normalize_rewards", "filter_window", "filter_solved", "filter_failed", "filter_cooldown")


@dataclass(frozen=True)
class ModelConfig:
    name: str = setting("smollm2-135m", eval=True)
    """Built-in name (smollm2-135m), a Hugging Face id, or a local path."""
    dtype: str = setting("float32", eval=True)
    """Parameter dtype: float32 | bfloat16 | float16."""
    lora_rank: int = setting(0, eval="a fresh adapter starts at zero (B = 0): the weights are the warm-up's")
    """LoRA rank; 0 trains all weights. With LoRA the reference policy is the base (adapters off)."""
    lora_alpha: int = setting(16, eval="as lora_rank")
    """LoRA alpha."""
    lora_targets: tuple[str, ...] = setting(("q_proj", "k_proj", "v_proj", "o_proj"), eval="as lora_rank")
    """Module names that get LoRA adapters."""
    adapter: str | None = setting(
        None, eval="the weights themselves: every arm of a study starts from its warm-up's"
    )
    """Path of a LoRA adapter or agentrl checkpoint to load on top of the model."""
    gradient_checkpointing: bool = setting(False, eval="training memory only")
    """Recompute activations in backward to save memory."""

    def validate(self, prefix: str) -> None:
        _choice(f"{prefix}.dtype", self.dtype, ("float32", "bfloat16", "float16"))
        if self.lora_rank < 0:
            raise ConfigError(
                f"{prefix}.lora_rank", f"must be >= 0, got {self.lora_rank}", "use 0 for full fine-tuning"
            )


@dataclass(frozen=True)
class EnvConfig:
    id: str = setting("agentrl/Search-v0", eval=True)
    """Registered env id (see `agentrl envs`)."""
    split: str = setting("train", eval="the training tasks")
    """Task split used for training rollouts."""
    eval_split: str = setting("test", eval=True)
    """Task split used for held-out evaluation."""
    max_turns: int | None = setting(None, eval=True)
    """Turn budget per episode (truncated when hit); unset = the env's own registration (`agentrl envs`: Search 16, WebShop 15, GAIA 30), resolved when the config loads (the value used is printed and saved)."""
    max_obs_chars: int | None = setting(None, eval=True)
    """Observations longer than this are cut with a note; unset = the env's registration (8192 characters unless it states another: agentrl.env.MAX_OBS_CHARS), resolved when the config loads."""
    kwargs: dict[str, Any] = setting(default_factory=dict, eval=True)
    """Extra keyword arguments for the env constructor."""
    placement: str = setting("local", eval="where envs run, not what they do")
    """Where episodes' envs live: local (this process) | ray (Ray actors; needs agentrl[ray])."""
    ray_address: str | None = setting(RaySettings.address, eval="as placement")
    """With placement ray: a cluster address (auto, host:port, ray://...) or null for a local Ray."""
    num_cpus_per_env: float = setting(RaySettings.num_cpus_per_env, eval="as placement")
    """With placement ray: CPUs Ray reserves per env (an actor reserves envs_per_actor times this)."""
    envs_per_actor: int = setting(RaySettings.envs_per_actor, eval="as placement")
    """With placement ray: envs one actor hosts at once (its sandbox pool/tool clients are shared)."""
    ray_resources: dict[str, float] = setting(default_factory=dict, eval="as placement")
    """With placement ray: custom resource labels each env actor needs, e.g. {envnode: 1}."""
    ray_call_timeout_s: float = setting(RaySettings.call_timeout_s, eval="as placement")
    """With placement ray: timeout of each remote env call (reset/step); past it the episode fails."""
    ray_start_timeout_s: float = setting(RaySettings.start_timeout_s, eval="as placement")
    """With placement ray: how long an episode waits for its env to start (an actor on a node with room, the env built on it); the rollout watchdog and episode timeout do not count this wait."""
    ray_lost_retries: int = setting(RaySettings.lost_retries, eval="as placement")
    """With placement ray: times an episode whose env actor died is rerun on a new actor (0: recorded failed)."""
    ray_services: str = setting(RaySettings.services, eval="as placement")
    """With placement ray: shared tool services: node (one sandbox pool and shop server per node) | cluster
    (one shop for the cluster; sandbox pools stay per node) | actor (each env actor its own)."""
    mixture: tuple[EnvEntry, ...] = setting((), eval=True)
    """Several environments in one run: a list of entries (id, name, weight, split, eval_split, max_turns, max_obs_chars, kwargs, train_tasks, eval_episodes, oracle, horizon_start/every/by, ray_resources; see the entry fields below). `env:` given as a YAML list is this list; env.id and the other per-env fields are then set per entry. Empty: one env (env.id)."""
    normalize_rewards: str = setting("none", eval="training reward scaling (success is the env's own metric)")
    """With a mixture: none | env_std (each step, an env's episode rewards are divided by their standard deviation over that env's kept episodes, so envs whose rewards live on different scales weigh alike in the loss; success and eval are untouched)."""
    filter_window: int = setting(0, eval="which training tasks are drawn")
    """With a mixture: online difficulty filter. A task whose last filter_window groups all had a pass rate >= filter_solved (too easy) or <= filter_failed (too hard) is skipped by the sampler for filter_cooldown steps; 0 = off."""
    filter_solved: float = setting(1.0, eval="as filter_window")
    """With filter_window > 0: a group's pass rate (share of its episodes that solved the task by the env's success metric) at or above which it counts as all solved."""
    filter_failed: float = setting(0.0, eval="as filter_window")
    """With filter_window > 0: a group's pass rate at or below which it counts as all failed."""
    filter_cooldown: int = setting(4, eval="as filter_window")
    """With filter_window > 0: RL steps a filtered task is skipped before it may be drawn again."""

    def validate(self, prefix: str) -> None:
        from agentrl.env import registered_ids

        ids = registered_ids()
        if self.mixture or self.id == MIXTURE_ID:
            from agentrl.train.mixture import validate_mixture

            validate_mixture(self, prefix)
            return
        for name in MIXTURE_ONLY:
            if getattr(self, name) != getattr(EnvConfig, name):
                raise ConfigError(f"{prefix}.{name}", "applies to a mixture of envs; this run has one env",
                                  f"give env as a list of envs, or leave {prefix}.{name} at "
                                  f"{getattr(EnvConfig, name)!r}")  # fmt: skip
        if self.id not in ids:
            raise ConfigError(f"{prefix}.id", f"unknown env {self.id!r}", f"use one of: {', '.join(ids)}")
        for name in ("max_turns", "max_obs_chars"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{prefix}.{name}", f"must be >= 1, got {getattr(self, name)}",
                                  "or leave it unset for the env's registration")  # fmt: skip
        from agentrl.cluster.remote_env import validate_placement

        validate_placement(self, prefix)


@dataclass(frozen=True)
class EnvEntry:
    """One environment of a mixture (``env`` given as a list, or ``env.mixture``)."""

    id: str = ""
    """Registered env id (see `agentrl envs`)."""
    name: str = ""
    """Short name in metrics (env/<name>/reward), task ids and the summary; unset = from the id (agentrl/SQLShop-v0 -> sqlshop)."""
    weight: float = 1.0
    """Share of each step's tasks (apportioned: weights 2:1:1 and 4 tasks per step give 2, 1, 1 every step)."""
    split: str = EnvConfig.split
    """Task split used for training rollouts."""
    eval_split: str = EnvConfig.eval_split
    """Task split used for held-out evaluation."""
    max_turns: int | None = None
    """Turn budget per episode (the horizon curriculum's end point; held-out evals always use it); unset = the env's own registration (resolved when the config loads; printed and saved)."""
    max_obs_chars: int | None = None
    """Observations longer than this are cut with a note; unset = the env's registration."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for the env constructor."""
    train_tasks: int = 0
    """Train on the first N tasks of the split only (0: all); a small pool lets the difficulty filter see tasks again."""
    eval_episodes: int | None = None
    """Held-out tasks of this env per evaluation (the first N of eval_split); unset = train.eval_episodes."""
    oracle: str = ""
    """Scripted oracle "module:Class" for this env's warm-up demonstrations (with train.sft_warmup_steps > 0); empty: no demonstrations from this env."""
    horizon_start: int = 0
    """Horizon curriculum (AgentGym-RL's ScalingInter-RL): the turn budget of training rollouts starts here and grows by horizon_by every horizon_every RL steps up to max_turns; 0 = off (max_turns throughout)."""
    horizon_every: int = 1
    """With horizon_start > 0: RL steps between two growths of the turn budget."""
    horizon_by: int = 1
    """With horizon_start > 0: turns added at each growth."""
    ray_resources: dict[str, float] = field(default_factory=dict)
    """With env.placement ray: custom resource labels this env's actors need (e.g. {sqlnode: 1}) in place of env.ray_resources: families on different nodes."""

    def short_name(self) -> str:
        if self.name:
            return self.name
        tail = self.id.rsplit("/", 1)[-1].lower()
        head, _, version = tail.rpartition("-v")
        return head if head and version.isdigit() else tail

    def turn_budget(self, step: int) -> int:
        """The training turn budget at RL step ``step`` (0-based): the curriculum's, else max_turns."""
        if not self.horizon_start:
            return self.max_turns
        return min(self.max_turns, self.horizon_start + self.horizon_by * (step // self.horizon_every))


@dataclass(frozen=True)
class AlgoConfig:
    advantage: str = setting("grpo", eval="the objective: training only")
    """Advantage estimator name (agentrl.algos registry): grpo, igpo, empg, gae, foldgrpo, gigpo, ..."""
    loss: str = setting("ppo_clip", eval="the objective: training only")
    """Policy loss name (agentrl.algos registry): ppo_clip, foldact, ..."""
    ratio: str | None = setting(None, eval="the objective: training only")
    """Importance ratio level for PPO-clip losses: token | turn (ST-PPO) | sequence (GSPO); unset = the loss's preset (token)."""
    agg: str | None = setting(None, eval="the objective: training only")
    """Loss aggregation: token-mean | seq-mean-token-mean | seq-mean-token-sum | constant; unset = the loss's preset (token-mean)."""
    agg_unit: str | None = setting(None, eval="the objective: training only")
    """What a "sequence" is in seq-mean / constant aggregation: row | rollout (all rows of a rollout: SUPO segments, fold branches); unset = row."""
    clip_low: float | None = setting(None, eval="the objective: training only")
    """Lower PPO clip epsilon; unset = the loss's preset (0.2)."""
    clip_high: float | None = setting(None, eval="the objective: training only")
    """Upper PPO clip epsilon; unset = the loss's preset (0.2; dapo/foldgrpo 0.28, gspo 4e-4)."""
    kl_coef: float = setting(0.0, eval="the objective: training only")
    """Coefficient of the KL penalty to the reference policy (0 = no reference pass)."""
    kl_kind: str = setting("k3", eval="the objective: training only")
    """KL estimator: k1 | k2 | k3."""
    entropy_coef: float = setting(0.0, eval="the objective: training only")
    """Entropy bonus coefficient."""
    gamma: float | None = setting(None, eval="the objective: training only")
    """Discount over turns (IGPO, GiGPO) or tokens (GAE); unset = the estimator's default (1.0; gigpo 0.95)."""
    lam: float | None = setting(None, eval="the objective: training only")
    """GAE lambda; unset = 1.0."""
    clip_bias_correction: bool = setting(False, eval="the objective: training only")
    """S-PPO clipping-bias correction (reconstruction; see agentrl.algos.losses.clip_bias_norm)."""
    clip_bias_floor: float = setting(1.0, eval="the objective: training only")
    """With clip_bias_correction: the gradient is scaled by 1 / max(floor, ||C||) (the reconstruction's floor is 1). SmolLM2-135M at lr 3e-5 measured ||C|| of 0.008-0.095 (configs/studies/stppo_vs_ppo.yaml), so at floor 1 the scale stays 1: a smaller floor makes the correction act there."""
    dynamic_sampling: bool = setting(False, eval="the objective: training only")
    """Drop groups whose rewards are all equal (DAPO)."""
    refill_rounds: int = setting(0, eval="the objective: training only")
    """With dynamic_sampling: up to this many extra sampling rounds per step, each of tasks_per_step new tasks, until the step holds tasks_per_step groups with unequal rewards (DAPO's over-sampling; extras beyond tasks_per_step are not trained on); 0 = drop only."""
    drop_void_turns: bool = setting(False, eval="the objective: training only")
    """Drop trajectories with a void turn (SimpleTIR)."""
    options: dict[str, Any] = setting(default_factory=dict, eval="the objective: training only")
    """Extra keyword options for the advantage estimator (e.g. {zeta: 0.1} for empg)."""
    loss_options: dict[str, Any] = setting(default_factory=dict, eval="the objective: training only")
    """Extra keyword options for the policy loss (e.g. {dual_clip: 3.0}, foldact weights)."""
    critic: bool = setting(False, eval="the objective: training only")
    """Add a value head on the policy backbone (needed by advantage=gae, e.g. ST-PPO)."""
    vf_coef: float = setting(0.5, eval="the objective: training only")
    """Weight of the value loss when a critic is on."""
    vf_clip: float = setting(0.5, eval="the objective: training only")
    """Value clipping range (verl's cliprange_value); 0 turns clipping off."""
    old_logprobs: str = setting("recompute", eval="the objective: training only")
    """Behaviour log-probs for the ratio: recompute (learner pass before the update) | sampler."""
    mismatch_correction: str | None = setting(None, eval="the objective: training only")
    """Correction for a sampler whose log-probs differ from the learner's (vLLM, a server, another precision): none | tis (truncated importance sampling: each token's policy-gradient term times min(learner/sampler ratio, mismatch_cap)) | token_mask (tokens whose ratio is outside [1/cap, cap] leave the loss) | seq_mask (rows whose geometric-mean ratio is outside it leave the loss); needs old_logprobs=recompute; unset = none (agentrl.algos.mismatch)."""
    mismatch_cap: float | None = setting(None, eval="the objective: training only")
    """The learner/sampler ratio bound C of mismatch_correction (and of the logged mismatch/over_cap share); unset = 2.0."""
    ig_template: str = setting(
        "Now there's enough information to answer.\n<answer>{answer}</answer>",
        eval="the objective: training only",
    )
    """IGPO: text appended after each turn's context to score the gold answer (only {answer} is averaged)."""
    full_ctx_dropout: float = setting(0.0, eval="the objective: training only")
    """FoldAct selective segment training: probability that a turn is left out of the full-context pass (and of the consistency loss); README example 0.5."""

    def validate(self, prefix: str) -> None:
        _choice(f"{prefix}.ratio", self.ratio, ("token", "turn", "sequence", None))
        _choice(
            f"{prefix}.agg", self.agg,
            ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "constant", None),
        )  # fmt: skip
        _choice(f"{prefix}.agg_unit", self.agg_unit, ("row", "rollout", None))
        _choice(f"{prefix}.kl_kind", self.kl_kind, ("k1", "k2", "k3"))
        _choice(f"{prefix}.old_logprobs", self.old_logprobs, ("recompute", "sampler"))
        _choice(
            f"{prefix}.mismatch_correction",
            self.mismatch_correction,
            ("none", "tis", "token_mask", "seq_mask", None),
        )
        if self.mismatch_cap is not None and not self.mismatch_cap > 1.0:
            raise ConfigError(f"{prefix}.mismatch_cap", f"must be > 1 (a bound on the learner/sampler ratio), got {self.mismatch_cap}",
                              "2.0 is common (Yao et al. 2025)")  # fmt: skip
        if self.vf_coef < 0 or self.vf_clip < 0:
            raise ConfigError(f"{prefix}.vf_coef", "vf_coef and vf_clip must be >= 0")
        self._check_registered(prefix)
        if self.clip_low is not None and not 0.0 <= self.clip_low < 1.0:
            raise ConfigError(f"{prefix}.clip_low", f"must be in [0, 1), got {self.clip_low}")
        if self.clip_high is not None and self.clip_high < 0:
            raise ConfigError(f"{prefix}.clip_high", f"must be >= 0, got {self.clip_high}")
        if not 0.0 <= self.full_ctx_dropout < 1.0:
            raise ConfigError(f"{prefix}.full_ctx_dropout", f"must be in [0, 1), got {self.full_ctx_dropout}")
        if self.clip_bias_floor <= 0:
            raise ConfigError(f"{prefix}.clip_bias_floor", f"must be > 0, got {self.clip_bias_floor}",
                              "1.0 is the reconstruction's floor; smaller values let the correction act on small gradients")  # fmt: skip
        if self.clip_bias_floor != 1.0 and not self.clip_bias_correction:
            raise ConfigError(f"{prefix}.clip_bias_floor", "is the clipping-bias correction's floor, which is off",
                              f"set {prefix}.clip_bias_correction=true, or leave {prefix}.clip_bias_floor at 1.0")  # fmt: skip
        if self.refill_rounds < 0:
            raise ConfigError(
                f"{prefix}.refill_rounds", f"must be >= 0, got {self.refill_rounds}", "0 turns it off"
            )
        if self.refill_rounds and not self.dynamic_sampling:
            raise ConfigError(f"{prefix}.refill_rounds", "refills the groups dynamic sampling drops, which is off",
                              f"set {prefix}.dynamic_sampling=true, or {prefix}.refill_rounds=0")  # fmt: skip

    def _check_registered(self, prefix: str) -> None:
        # names are checked against the registries so a typo fails before any model loads
        import agentrl.algos  # noqa: F401  (registers the objectives)
        from agentrl.registry import ADVANTAGES, KL_ESTIMATORS, LOSSES

        ADVANTAGES.get(self.advantage, field=f"{prefix}.advantage")
        LOSSES.get(self.loss, field=f"{prefix}.loss")
        KL_ESTIMATORS.get(self.kl_kind, field=f"{prefix}.kl_kind")


@dataclass(frozen=True)
class TrainConfig:
    steps: int = setting(20, eval="optimisation and bookkeeping: training only")
    """RL steps (each: rollouts, advantages, PPO epochs); with train.token_budget, the most steps."""
    token_budget: int | None = setting(None, eval="optimisation and bookkeeping: training only")
    """Generated tokens of the training rollouts after which RL stops: the run ends with the step whose rollouts bring the total to this many (every rank's together; tokens a tree's branches share are counted once, evals not at all), or after train.steps steps if that comes first. Compares rollout shapes at equal sampling cost, e.g. tree rollouts against chains (agentrl study's generated_tokens). Logged per step as rollout/generated_tokens_total; the steps run go to summary.json. Unset: train.steps steps."""
    lr: float = setting(1e-5, eval="optimisation and bookkeeping: training only")
    """Learning rate."""
    weight_decay: float = setting(0.0, eval="optimisation and bookkeeping: training only")
    """AdamW weight decay."""
    warmup_steps: int = setting(0, eval="optimisation and bookkeeping: training only")
    """Linear learning-rate warm-up steps."""
    ppo_epochs: int = setting(1, eval="optimisation and bookkeeping: training only")
    """Passes over each step's rollouts."""
    minibatch_size: int = setting(8, eval="optimisation and bookkeeping: training only")
    """Rows per optimizer step."""
    micro_batch_size: int = setting(4, eval="optimisation and bookkeeping: training only")
    """Rows per forward/backward (gradient accumulation up to minibatch_size)."""
    max_grad_norm: float = setting(1.0, eval="optimisation and bookkeeping: training only")
    """Gradient clipping norm."""
    skip_zero_advantage: bool = setting(False, eval="optimisation and bookkeeping: training only")
    """Do not forward rows whose advantage is 0 on every trained token (GRPO groups whose samples all scored the same, when algo.dynamic_sampling is off): their loss and gradient are exactly 0, so the update is the same in exact arithmetic (float sums differ only in order); they still count in the loss's denominators, and a minibatch left with no row still makes its optimizer step (zero gradients, so Adam's momentum moves as before). Learner metrics (loss, clipfrac, entropy) then cover the forwarded rows; loss/skipped_rows is the share skipped. Needs one process, engine=torch, a PPO-clip loss and no KL, entropy or value term (checked before the run)."""
    engine: str = setting("torch", eval="optimisation and bookkeeping: training only")
    """Learner engine: torch | deepspeed."""
    zero_stage: int = setting(2, eval="optimisation and bookkeeping: training only")
    """DeepSpeed ZeRO stage (1, 2 or 3) with engine=deepspeed."""
    offload: bool = setting(False, eval="optimisation and bookkeeping: training only")
    """DeepSpeed CPU offload of optimizer state."""
    logprob_impl: str = setting("auto", eval="optimisation and bookkeeping: training only")
    """Token log-prob/entropy implementation: auto | chunked | triton | naive."""
    bf16_autocast: bool | str = setting("auto", eval="optimisation and bookkeeping: training only")
    """Run learner forwards (SFT, scoring, PPO) under bfloat16 autocast; weights, LM head and log-probs stay float32. auto: a ~1 s probe at start times one decoder block in both and picks bf16 only where it is faster (measured: 1.75x faster on one bf16 CPU, 2x slower on an AVX512-BF16 Xeon without AMX, ~10x slower on AVX2 only); true/false force it. The decision is printed and saved in summary.json."""
    sft_warmup_steps: int = setting(0, eval="optimisation and bookkeeping: training only")
    """Supervised warm-up steps on oracle demonstrations before RL."""
    sft_lr: float = setting(1e-4, eval="optimisation and bookkeeping: training only")
    """Learning rate of the supervised warm-up."""
    sft_temperature: float | None = setting(None, eval="optimisation and bookkeeping: training only")
    """Temperature of the warm-up's NLL (logits / T). Unset: rollout.temperature (sampling at it then reproduces the fitted demonstrations; resolved value printed and saved). 1.0 fits the model's own distribution, as plain SFT does, and sampling at a lower rollout.temperature is then sharper than the demonstrations."""
    sft_demos: int = setting(64, eval="optimisation and bookkeeping: training only")
    """Training tasks the oracle demonstrates for the warm-up (successful ones are used)."""
    sft_batch_size: int = setting(8, eval="optimisation and bookkeeping: training only")
    """Demonstrations per warm-up step."""
    oracle: str = setting("", eval="optimisation and bookkeeping: training only")
    """Scripted oracle "module:Class" for the warm-up demonstrations (e.g. agentrl.envs.search.oracle:SearchOracle)."""
    sft_fold_share: float = setting(0.0, eval="optimisation and bookkeeping: training only")
    """Share of the warm-up demonstrations played with rollout.folding=branch by train.fold_oracle (an oracle that uses branch/return); the rest are played with this run's own rollout settings by train.oracle. One warm-up then shows the model both ways of working, each under its own system prompt (the folding prompt documents branch/return), so a ReAct arm and a folding arm can start from the same checkpoint. 0: none."""
    fold_oracle: str = setting("", eval="optimisation and bookkeeping: training only")
    """With sft_fold_share > 0: the folding oracle "module:Class" (e.g. agentrl.envs.search.oracle:FoldingSearchOracle)."""
    eval_temperature: float = setting(0.0, eval=True)
    """Sampling temperature of held-out evaluation (0 = greedy)."""
    eval_sampler_dtype: str = setting("model", eval=True)
    """With rollout.backend=hf: the precision held-out evals sample in: model (as the rollouts: rollout.sampler_dtype) | bfloat16 (a bfloat16 copy of the model made for each eval and freed after it, +2 bytes a parameter; its K/V take half the memory; greedy answers may differ from float32's where two tokens nearly tie, the same way before and after RL) | auto (bfloat16 where train.bf16_autocast resolved to bf16, i.e. on CPUs whose bfloat16 matmuls are faster; else model, and model with LoRA, ZeRO-3 (bfloat16 refused there) or a vLLM or remote engine; printed and saved). The evals of the quickstart are half prefill of observations, which bfloat16 runs ~1.8x faster on such CPUs."""
    num_threads: int = setting(0, eval="optimisation and bookkeeping: training only")
    """torch CPU threads (0 = torch's default); 1 is fastest when other processes share the cores."""
    kernel_cache: int = setting(0, eval="optimisation and bookkeeping: training only")
    """Entries kept by each of oneDNN's primitive cache and PyTorch's oneDNN (ideep) cache on CPU (0: the libraries' default, 1024 each). A bfloat16 matmul keeps a packed copy of its weight per input shape, so every new sequence length adds ~2 MB per linear layer until the caches are full: the quickstart's warm-up peak is 3.33 GiB with the defaults and 2.66 GiB with 64, same results; kernels that fall out of a capped cache are re-created (quiet AVX512-BF16 CPU: a decode-like step 4% slower, a learner pass not measurably; measure it: benchmarks/bench_kernel_cache.py). ONEDNN_PRIMITIVE_CACHE_CAPACITY / LRU_CACHE_CAPACITY already set in the environment win (said at start)."""
    trainable_layers: int = setting(0, eval="optimisation and bookkeeping: training only")
    """Full fine-tuning of only the top N transformer blocks and final norm (0 = every weight); cuts backward cost on CPU."""
    reuse_sampler_hidden: bool | str = setting("auto", eval="optimisation and bookkeeping: training only")
    """With train.trainable_layers: the learner starts at the lowest trained block from what that block received when the rollout's sampler computed each token (the frozen blocks below give the same output for the same tokens), instead of running the frozen blocks again: ~a third less learner compute with 10 of SmolLM2's 30 blocks trained. The hf generator keeps those states (2.3 KB a token for SmolLM2, beside its 46 KB of K/V) for the training rollouts only. auto: on where it holds (hf backend sampling the learner's own weights with its prefix cache, no LoRA, one process with engine=torch, a llama/qwen2/qwen3 decoder), else off; true: on, or an error naming what stands in the way; false: off. Resolved value printed and saved; perf/learner_from_sampler is the share of learner micro-batches that started from the sampler's states."""
    seed: int = setting(0, eval="training streams (held-out evals sample from their own seed)")
    """Seed for tasks, sampling and initialisation; each episode samples from its own stream derived from (seed, step, task, sample index)."""
    deterministic: bool = setting(False, eval="optimisation and bookkeeping: training only")
    """Strict determinism: torch.use_deterministic_algorithms(True) (raises on an op without a deterministic kernel), deterministic cuDNN/cuBLAS (slower on GPU), and lock-step decode batches that wait for a slow env call without limit. Without it CPU runs repeat too: batches are lock-step with an in-process generator, waiting at most 60 s for a slow env call (rollout/lockstep_cut counts the batches that went ahead)."""
    save_episodes: bool = setting(False, eval="optimisation and bookkeeping: training only")
    """Write each step's training episodes to out_dir/episodes/step-NNNNNN.jsonl (task-major order)."""
    eval_every: int = setting(0, eval="optimisation and bookkeeping: training only")
    """Evaluate every N steps (0 = only before and after)."""
    eval_episodes: int = setting(
        32, eval="how many tasks: checked on its own (the shared eval must cover them all)"
    )
    """Held-out episodes per evaluation."""
    eval_max_failed: float = setting(0.05, eval="as rollout.episode_timeout_s")
    """Largest share of held-out episodes that may still have failed (crashed: generator, env or sandbox error) after two replays of the failed ones; they count as unsolved. Above it the eval stops the run, naming the first error: a success figure over crashed episodes measures the crash, not the policy. Each eval's episodes are saved to out_dir/eval/step-NNNNNN.jsonl."""
    rollout_max_failed: float = setting(0.5, eval="optimisation and bookkeeping: training only")
    """Largest share of an RL step's sampled episodes (all ranks) that may have failed (crashed: generator, env or sandbox error, a tree branch whose replay diverged); they are recorded (rollout/failed) and left out of the update. Above it the run stops before that step's update, naming the first error: a run that trains on what little survives measures the crash. 1: never stop."""
    eval_before_from: str = setting("", eval="the sharing itself")
    """A finished run's out_dir whose held-out eval stands for this run's eval before RL, which then does not run: that run evaluated this run's starting model (agentrl study: the shared warm-up, whose exported model every arm starts from) on at least these eval_episodes tasks, greedy. Its per-task outcomes and eval record are taken as they are. Empty: evaluate."""
    save_every: int = setting(0, eval="optimisation and bookkeeping: training only")
    """Checkpoint every N steps (0 = only at the end)."""
    out_dir: str = setting("runs/quickstart", eval="optimisation and bookkeeping: training only")
    """Where checkpoints, episodes, metrics and plots go."""
    resume: bool = setting(True, eval="optimisation and bookkeeping: training only")
    """Resume from the latest checkpoint in out_dir if one exists."""
    wandb: bool = setting(False, eval="optimisation and bookkeeping: training only")
    """Also log to Weights & Biases (when installed)."""

    def validate(self, prefix: str, mixture: bool = False) -> None:
        _choice(f"{prefix}.engine", self.engine, ("torch", "deepspeed"))
        _choice(f"{prefix}.logprob_impl", self.logprob_impl, ("auto", "chunked", "triton", "naive"))
        if isinstance(self.bf16_autocast, str) and self.bf16_autocast != "auto":
            raise ConfigError(f"{prefix}.bf16_autocast", f"{self.bf16_autocast!r} is not allowed",
                              "use auto (measure at start), true or false")  # fmt: skip
        _choice(f"{prefix}.eval_sampler_dtype", self.eval_sampler_dtype, ("model", "bfloat16", "auto"))
        if isinstance(self.reuse_sampler_hidden, str) and self.reuse_sampler_hidden != "auto":
            raise ConfigError(f"{prefix}.reuse_sampler_hidden", f"{self.reuse_sampler_hidden!r} is not allowed",
                              "use auto, true or false")  # fmt: skip
        if self.zero_stage not in (1, 2, 3):
            raise ConfigError(f"{prefix}.zero_stage", f"must be 1, 2 or 3, got {self.zero_stage}")
        if self.minibatch_size % self.micro_batch_size:
            raise ConfigError(
                f"{prefix}.micro_batch_size",
                f"{self.micro_batch_size} does not divide minibatch_size={self.minibatch_size}",
                "pick a divisor of minibatch_size",
            )
        if self.lr <= 0:
            raise ConfigError(f"{prefix}.lr", f"must be > 0, got {self.lr}")
        if self.steps < 0:
            raise ConfigError(f"{prefix}.steps", f"must be >= 0, got {self.steps}")
        if self.token_budget is not None and self.token_budget < 1:
            raise ConfigError(f"{prefix}.token_budget", f"must be >= 1, got {self.token_budget}",
                              "give the generated tokens RL may sample, or leave it unset for train.steps steps")  # fmt: skip
        if self.sft_warmup_steps > 0 and ":" not in self.oracle and not mixture:
            raise ConfigError(
                f"{prefix}.oracle",
                "the SFT warm-up needs a scripted oracle",
                "set train.oracle=module:Class (e.g. agentrl.envs.search.oracle:SearchOracle) or sft_warmup_steps=0",
            )
        if not 0.0 <= self.sft_fold_share <= 1.0:
            raise ConfigError(f"{prefix}.sft_fold_share", f"must be in [0, 1], got {self.sft_fold_share}",
                              "use the share of warm-up demonstrations to play with branch/return folding")  # fmt: skip
        if self.sft_fold_share > 0 and ":" not in self.fold_oracle:
            raise ConfigError(f"{prefix}.fold_oracle", f"sft_fold_share={self.sft_fold_share} needs a folding oracle",
                              "set train.fold_oracle=module:Class (e.g. agentrl.envs.search.oracle:FoldingSearchOracle) "
                              "or sft_fold_share=0")  # fmt: skip
        if not 0.0 <= self.eval_max_failed <= 1.0:
            raise ConfigError(f"{prefix}.eval_max_failed", f"must be in [0, 1], got {self.eval_max_failed}",
                              "use the share of held-out episodes that may crash (0: none)")  # fmt: skip
        if not 0.0 <= self.rollout_max_failed <= 1.0:
            raise ConfigError(f"{prefix}.rollout_max_failed", f"must be in [0, 1], got {self.rollout_max_failed}",
                              "use the share of a step's episodes that may crash (1: never stop)")  # fmt: skip
        if not self.eval_temperature >= 0:
            raise ConfigError(f"{prefix}.eval_temperature", f"must be >= 0, got {self.eval_temperature}",
                              "use 0 for greedy held-out evals, or the training temperature (e.g. 0.6) to sample")  # fmt: skip
        if self.ppo_epochs < 1:
            raise ConfigError(f"{prefix}.ppo_epochs", f"must be >= 1, got {self.ppo_epochs}")
        if self.kernel_cache < 0:
            raise ConfigError(f"{prefix}.kernel_cache", f"must be >= 0, got {self.kernel_cache}",
                              "use 0 for the libraries' defaults (1024 entries each)")  # fmt: skip
        if self.sft_temperature is not None and not self.sft_temperature > 0:
            raise ConfigError(
                f"{prefix}.sft_temperature",
                f"must be > 0, got {self.sft_temperature}",
                "use 1.0 for plain SFT, or leave it unset for rollout.temperature",
            )


@dataclass(frozen=True)
class RunConfig:
    """A whole run: model, env, rollout, algorithm, training."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout generation."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Advantage estimator and loss."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimisation and bookkeeping."""

    def validate(self, prefix: str = "") -> None:
        # env last: it is the only check that imports the env registry
        for name in ("model", "rollout", "algo", "train", "env"):
            if name == "train":  # a mixture's warm-up oracles are per env (env[i].oracle)
                self.train.validate(name, mixture=bool(self.env.mixture))
            else:
                getattr(self, name).validate(name)
        if self.env.mixture:
            from agentrl.train.mixture import check_mixture_run

            check_mixture_run(self)
        from agentrl.train.plan import objective_plan

        objective_plan(self)  # every objective need has a producer under this config; options resolve
        if self.train.engine == "deepspeed" and self.train.zero_stage == 3 and self.rollout.backend == "hf":
            for field, value in (("rollout.sampler_dtype", self.rollout.sampler_dtype),
                                 ("train.eval_sampler_dtype", self.train.eval_sampler_dtype)):  # fmt: skip
                if value == "bfloat16":
                    raise ConfigError(field, "ZeRO-3 partitions the weights: the hf generator samples from the live "
                                      "model, whose forward gathers them, not from a bfloat16 copy",
                                      f"leave {field}=model (or auto) with train.zero_stage=3")  # fmt: skip
        if self.train.eval_sampler_dtype == "bfloat16" and self.rollout.backend != "hf":
            raise ConfigError("train.eval_sampler_dtype", f"bfloat16 has effect only with rollout.backend=hf, not "
                              f"{self.rollout.backend}", "remove it or use auto (a vLLM or remote engine samples in "
                              "its own dtype)")  # fmt: skip
