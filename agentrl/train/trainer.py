"""The RL training run, as a :class:`Trainer` a reader can walk:

    setup()      resolve the config once (auto settings measured, printed, saved), load the model,
                 build policy / generator / envs / logger, supervised warm-up, the learner engine,
                 resume from a checkpoint, held-out eval before RL
    step(i)      one RL step (agentrl.train.step.rl_step: rollouts -> filters -> advantages -> PPO
                 -> weights to the generator), an eval every train.eval_every steps, the metrics
                 logged, a checkpoint every train.save_every steps
    evaluate(i)  the held-out eval (agentrl.train.heldout)
    finish()     held-out eval after RL, the paired comparison, the exported model, summary.json

``agentrl train CONFIG [section.field=value ...]`` calls :func:`agentrl.cli.train_main`, which calls :func:`train`.
What a step reads is :class:`agentrl.train.step.Run` (built once); what carries between steps is
:class:`agentrl.train.step.StepState`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from agentrl.config import RunConfig, resolve_env_budgets, to_dict
from agentrl.errors import ConfigError
from agentrl.train import frozen
from agentrl.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, seed_everything
from agentrl.train.engines import make_engine, world
from agentrl.train.heldout import check_shared_eval, compare_evals, held_out_means, make_evaluator
from agentrl.train.igscore import GoldAnswerScorer, learner_continuation_scorer
from agentrl.train.learner import build_policy, is_peft
from agentrl.train.memory import PhasePeaks, cap_kernel_caches
from agentrl.train.metrics import MetricsLogger
from agentrl.train.plan import objective_plan
from agentrl.train.precision import Decision, resolve_bf16
from agentrl.train.progress import RunProgress
from agentrl.train.rollouts import batching_line, make_rollouts, mixture_lines
from agentrl.train.step import Run, Sampling, StepState, TaskSampler, filter_episodes, make_sampler, rl_step
from agentrl.train.weights import export_model, generating, restore_generator_rng, sync_generator


# --------------------------------------------------------------------------- the config, resolved once
def declared_config(config: RunConfig) -> RunConfig:
    """What the config leaves unset and the config alone decides: the env's turn budget and
    observation cap (its registration's), a mixture's entry names and eval sizes,
    ``train.sft_temperature`` (the sampler's ``rollout.temperature``)."""
    config = resolve_env_budgets(config)
    if config.env.mixture:
        from agentrl.train.mixture import resolve

        config = resolve(config)
    sft_temperature = (
        config.train.sft_temperature or config.rollout.temperature
    )  # the policy divides logits by it
    return dataclasses.replace(
        config, train=dataclasses.replace(config.train, sft_temperature=sft_temperature)
    )


def measured_config(config: RunConfig, model: Any, progress: RunProgress,
                    resumed_from: Path | None) -> tuple[RunConfig, Decision]:  # fmt: skip
    """What this machine and model decide, printed: ``train.bf16_autocast: auto`` measured
    (:mod:`agentrl.train.precision`; a resumed run keeps the decision it made at its start) and
    ``rollout.prefix_cache_tokens`` unset (every episode in flight, within a quarter of the
    machine's memory). Returns the config the run uses and saves, and the precision decision."""
    from agentrl.rollout.generators.kv_cache import kv_bytes_per_token, prefix_cache_budget

    train = config.train
    precision = resolve_bf16(
        train.bf16_autocast, model, rows=train.micro_batch_size, resumed_from=resumed_from
    )
    progress.print(precision.line())
    rollout = config.rollout
    if rollout.backend == "hf":
        sampler, said = rollout.sampler_dtype, "as set"
        lora = config.model.lora_rank > 0 or is_peft(model)
        live = live_weights_only(config, lora)
        if sampler == "auto":
            sampler = "bfloat16" if precision.bf16 and config.model.dtype != "bfloat16" and not live else "model"
            said = f"auto: train.bf16_autocast resolved to {str(precision.bf16).lower()}" + (f", {live}" if live else "")
        elif sampler == "bfloat16" and config.model.dtype == "bfloat16":
            sampler, said = "model", "model.dtype is bfloat16 already: the live weights"
        elif sampler == "bfloat16" and lora:
            raise ConfigError("rollout.sampler_dtype", "a LoRA model samples from its live weights",
                              "leave rollout.sampler_dtype=model (or auto) with LoRA")  # fmt: skip
        progress.print(f"generator: hf samples in {config.model.dtype if sampler == 'model' else sampler} "
                       f"(rollout.sampler_dtype={sampler}, {said})")  # fmt: skip
        kv_dtype = torch.bfloat16 if sampler == "bfloat16" else None
        tokens = rollout.prefix_cache_tokens
        if tokens is None:
            tokens, why = prefix_cache_budget(model, rollout.concurrency * rollout.max_context_tokens, dtype=kv_dtype)
        else:
            why = f"{tokens} tokens ({tokens * kv_bytes_per_token(model, kv_dtype) / 2**30:.1f} GiB), as set"
        progress.print(f"generator: hf, rollout.prefix_cache_tokens={tokens}: {why}")
        rollout = dataclasses.replace(rollout, prefix_cache_tokens=tokens, sampler_dtype=sampler)
        train = dataclasses.replace(train, eval_sampler_dtype=eval_sampler(config, precision, lora, sampler, progress))
    elif train.eval_sampler_dtype == "auto":
        progress.print(f"evals: the {rollout.backend} engine samples in its own dtype (train.eval_sampler_dtype=model, auto)")
        train = dataclasses.replace(train, eval_sampler_dtype="model")
    reuse, line = frozen.resolve(dataclasses.replace(config, rollout=rollout), model,
                                 lora=config.model.lora_rank > 0 or is_peft(model), sampler_dtype=rollout.sampler_dtype)  # fmt: skip
    progress.print(line)
    train = dataclasses.replace(train, reuse_sampler_hidden=reuse)
    train = dataclasses.replace(train, bf16_autocast=precision.bf16)
    return dataclasses.replace(config, train=train, rollout=rollout), precision


def live_weights_only(config: RunConfig, lora: bool) -> str:
    """Why the hf generator must sample from the live model rather than a bfloat16 copy ("" where it
    may): LoRA (the adapters live in the model) or ZeRO-3 (the weights are partitioned; the model's
    forward gathers them)."""
    if lora:
        return "LoRA"
    return "ZeRO-3" if config.train.engine == "deepspeed" and config.train.zero_stage == 3 else ""


def eval_sampler(config: RunConfig, precision: Decision, lora: bool, rollouts: str, progress: RunProgress) -> str:
    """``train.eval_sampler_dtype`` resolved and printed (``auto``: bfloat16 where the learner's bf16
    autocast was measured faster, as ``rollout.sampler_dtype``); ``model`` where the rollouts
    (``rollouts``: the resolved ``rollout.sampler_dtype``) sample in bfloat16 already."""
    asked, said = config.train.eval_sampler_dtype, "as set"
    live = live_weights_only(config, lora)
    if asked == "auto":
        asked = "bfloat16" if precision.bf16 and not live else "model"
        said = f"auto: train.bf16_autocast resolved to {str(precision.bf16).lower()}" + (f", {live}" if live else "")
    if asked == "bfloat16" and lora:
        raise ConfigError("train.eval_sampler_dtype", "a LoRA model samples from its live weights",
                          "leave train.eval_sampler_dtype=model (or auto) with LoRA")  # fmt: skip
    if asked == "bfloat16" and "bfloat16" in (config.model.dtype, rollouts):
        asked, said = "model", "the rollouts sample in bfloat16 already"
    if config.train.eval_episodes > 0:
        dtype = config.model.dtype if rollouts == "model" else rollouts
        progress.print(f"evals: hf samples in {dtype if asked == 'model' else asked} "
                       f"(train.eval_sampler_dtype={asked}, {said})")  # fmt: skip
    return asked


def make_generator_for(config: RunConfig, policy: Any, tokenizer: Any) -> Any:
    """The rollout generator: hf samples from the live policy model (one decode batch can hold every
    episode in flight); vllm and openai run their own engine or server (vllm gets the learner's
    weights each step: :func:`agentrl.train.weights.sync_generator`)."""
    from agentrl.rollout.generators.base import make_generator

    rollout, seed = config.rollout, config.train.seed
    if rollout.backend == "hf":
        return make_generator("hf", model=policy.model, tokenizer=tokenizer, seed=seed,
                              max_batch_size=max(32, rollout.concurrency, rollout.branch_concurrency or 0),
                              prefix_cache_tokens=rollout.prefix_cache_tokens,
                              sample_dtype=torch.bfloat16 if rollout.sampler_dtype == "bfloat16" else None,
                              hidden_layer=policy.start_layer)  # fmt: skip
    if rollout.backend == "vllm":
        return make_generator("vllm", model_name=config.model.name, dtype=config.model.dtype, seed=seed,
                              max_model_len=rollout.max_context_tokens + rollout.max_new_tokens)  # fmt: skip
    return make_generator(rollout.backend, model_name=config.model.name, dtype=config.model.dtype,
                          base_url=rollout.base_url)  # fmt: skip


# --------------------------------------------------------------------------- the trainer
class Trainer:
    """One training run: :meth:`setup`, :meth:`step` for each RL step, :meth:`finish`; :meth:`fit`
    does all three. ``config`` is the run config as given; :attr:`config` after :meth:`setup` is the
    one the run uses (every auto setting resolved), assigned once."""

    def __init__(self, given: RunConfig):
        self.declared = declared_config(given)  # resolved without the model: fails here, before it loads
        train = self.declared.train
        self.out_dir = Path(train.out_dir)
        self.rank0 = world()[0] == 0
        self.resume_from = latest_checkpoint(self.out_dir) if train.resume else None
        if train.eval_before_from:  # fail before the model loads
            check_shared_eval(train.eval_before_from, self.declared)
        self.config: RunConfig | None = None
        self.run: Run | None = None
        self.state = StepState()

    def setup(self) -> None:
        """Everything before the first RL step; see the module docstring."""
        from agentrl.rollout.model import load_model

        declared, out_dir, rank0 = self.declared, self.out_dir, self.rank0
        if declared.train.num_threads > 0:
            torch.set_num_threads(declared.train.num_threads)
        seed_everything(declared.train.seed, strict=declared.train.deterministic)
        progress = RunProgress(out_dir, enabled=rank0, append=self.resume_from is not None)
        progress.print(cap_kernel_caches(declared.train.kernel_cache))  # before the first matmul
        if not declared.env.mixture:  # a mixture's per-env budgets are in its lines below
            progress.print(f"env: {declared.env.id} max_turns={declared.env.max_turns} max_obs_chars="
                           f"{declared.env.max_obs_chars} (unset in the config: the env's registration)")  # fmt: skip
        # model, policy (LoRA, critic), generator over the live model, env tasks
        device = "cuda" if torch.cuda.is_available() else "cpu"
        with progress.phase("model load", per_step=False):
            model, tokenizer = load_model(declared.model.name, dtype=declared.model.dtype,
                                          adapter=declared.model.adapter, device=device)  # fmt: skip
        for fixed in getattr(tokenizer, "agentrl_fixed", None) or ():  # a converter's special tokens, set right
            progress.print(f"tokenizer: {fixed}, as the model's config states")
        resumed = out_dir if self.resume_from is not None else None
        self.config, self.precision = measured_config(declared, model, progress, resumed)
        config = self.config
        policy = build_policy(model, config)
        policy.start_layer = frozen.start_layer(config, model)  # train.reuse_sampler_hidden
        if config.algo.kl_coef > 0:
            policy.prepare_reference()
        generator = make_generator_for(config, policy, tokenizer)
        rollouts = make_rollouts(config, generator, tokenizer)
        progress.print(batching_line(generator, rollouts.run_options["lockstep"]))
        tree = 1 + config.rollout.branches
        if config.rollout.branches and tree > config.train.micro_batch_size:  # update.row_chunks keeps a tree whole
            progress.print(f"learner: RL micro-batches are whole trees of {tree} episodes (their shared prefix runs "
                           f"once), above train.micro_batch_size={config.train.micro_batch_size}, which applies to "
                           "the warm-up and to scoring")  # fmt: skip
        for line in mixture_lines(config, rollouts) if config.env.mixture else ():
            progress.print(line)
        logger = MetricsLogger(out_dir, enabled=rank0, wandb=config.train.wandb, run_config=to_dict(config),
                               resume=self.resume_from is not None, console=progress.console)  # fmt: skip
        if rank0:  # auto settings resolved
            (out_dir / "resolved_config.yaml").write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
        if config.rollout.folding == "branch":
            from agentrl.rollout.process_rewards import describe

            logger.console.print(describe(config.rollout))
        peaks = PhasePeaks()  # perf/rss_peak_<phase>_gib per step / eval; the run's maxima in summary.json
        self.evaluator = make_evaluator(
            config, rollouts, policy, logger, progress, out_dir if rank0 else None, peaks
        )
        plan = objective_plan(config)  # built once: what validation checked is what every step runs
        logger.console.print(
            f"objective: {json.dumps(plan.summary())}"
        )  # resolved options; saved in summary.json
        if config.train.token_budget is not None:
            progress.print(f"RL: until the training rollouts have generated {config.train.token_budget:,} tokens "
                           f"(train.token_budget), at most {config.train.steps} steps (train.steps)")  # fmt: skip
        pad_id = int(tokenizer.pad_token_id)
        if self.resume_from is None and config.train.sft_warmup_steps > 0:  # a checkpoint already has it
            self._warm_up(config, rollouts, policy, logger, progress, peaks, pad_id)
        engine = make_engine(policy, config)
        if config.train.skip_zero_advantage and engine.world_size > 1:
            raise ConfigError("train.skip_zero_advantage", f"needs one process (this run has {engine.world_size}): "
                              "every rank must run the same backward passes", "set train.skip_zero_advantage=false")  # fmt: skip
        ig_scorer = GoldAnswerScorer(
            None, tokenizer, config.algo.ig_template, continuation=learner_continuation_scorer(engine)
        )  # runs only if the advantage estimator reads gt_logprob
        sampler = make_sampler(config, rollouts)
        if self.resume_from is not None:
            self.state = StepState.from_checkpoint(*load_checkpoint(self.resume_from, engine))
            sampler = make_sampler(config, rollouts, self.state.saved["sampler"])
            restore_generator_rng(generator, self.state.saved.get("generator_rng"))
            logger.truncate(self.state.step)
            logger.console.print(f"resumed from {self.resume_from} (step {self.state.step})")
        self.run = Run(config=config, tokenizer=tokenizer, policy=policy, engine=engine, generator=generator,
                       rollouts=rollouts, sampling=Sampling(config, rollouts, sampler, engine, progress), plan=plan,
                       ig_scorer=ig_scorer, logger=logger, progress=progress, peaks=peaks, out_dir=out_dir,
                       rank0=rank0, pad_id=pad_id)  # fmt: skip
        sync_generator(engine, generator)  # a separate generator (vLLM) gets the warmed-up or resumed weights
        if self.state.eval_before is None:
            self.state.eval_before, self.state.eval_before_details = self.evaluate(0)

    def _warm_up(self, config: RunConfig, rollouts: Any, policy: Any, logger: MetricsLogger, progress: RunProgress,
                 peaks: PhasePeaks, pad_id: int) -> None:  # fmt: skip
        """Supervised warm-up on the oracle's demonstrations, logged at steps -sft_warmup_steps .. 0."""
        from agentrl.env import solved
        from agentrl.train.sft import sft_warmup, warn_long_turns

        train = config.train
        t0 = time.perf_counter()
        peaks.start()
        wanted = rollouts.demo_count(train.sft_demos)
        with progress.phase("warm-up demonstrations", wanted, unit="episode", per_step=False) as phase:
            success = lambda ep: solved(ep.metrics, ep.outcome, rollouts.success_metric(ep))  # noqa: E731
            demos, n_fold = rollouts.demonstrations(
                train.sft_demos, train.seed, on_episode=phase.on_episode("success", success)
            )
        usable = [not d.failed and d.outcome > 0 for d in demos]
        folded = f" ({sum(usable[:n_fold])} of them folded, train.sft_fold_share)" if n_fold else ""
        logger.console.print(f"warm-up: {sum(usable)} demonstrations{folded}, "
                             f"NLL at temperature {train.sft_temperature:g} (train.sft_temperature)")  # fmt: skip
        warn_long_turns(
            [d for d, ok in zip(demos, usable, strict=True) if ok], config.rollout.max_new_tokens, logger
        )
        sft_steps = train.sft_warmup_steps
        with progress.phase("warm-up", sft_steps) as phase:
            # warm-up steps are logged at steps -sft_steps .. -1 (RL starts at 1), so curve.png shows them
            def sft_log(i: int, values: dict[str, float]) -> None:
                logger.log(i - sft_steps, values)
                phase.advance(loss=values["sft/loss"])

            losses = sft_warmup(policy, demos, steps=sft_steps, lr=train.sft_lr, log=sft_log,
                                batch_size=train.sft_batch_size, micro_batch_size=train.micro_batch_size,
                                seed=train.seed, pad_id=pad_id, max_grad_norm=train.max_grad_norm,
                                temperature=train.sft_temperature)  # fmt: skip
        logger.log(0, {"sft/loss_first": losses[0], "sft/loss_last": losses[-1], "perf/sft_s": time.perf_counter() - t0,
                       **peaks.end("sft")}, echo=("sft/loss_first", "sft/loss_last"))  # fmt: skip

    def evaluate(self, step: int) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """The held-out eval at ``step`` (0: before RL), logged; per-task outcomes and details."""
        with generating(self.run.engine, self.run.generator):  # ZeRO-3: the weights gathered once
            return self.evaluator(step)

    def step(self, i: int) -> dict[str, float]:
        """RL step ``i`` (0-based): the step, an eval when ``train.eval_every`` says, the metrics
        logged at ``i + 1``, a checkpoint when ``train.save_every`` says (and after the last)."""
        run, train = self.run, self.config.train
        metrics = rl_step(run, i)
        self.state.generated_tokens += metrics.get("rollout/sampled_tokens", 0.0)
        metrics["rollout/generated_tokens_total"] = self.state.generated_tokens
        self.state.step = i + 1
        last = self.done()
        if train.eval_every and (i + 1) % train.eval_every == 0 and not last:
            self.evaluate(i + 1)  # logged; the summary compares the evals before and after RL
        run.logger.log(
            i + 1, metrics, echo=("env/reward", "loss/loss", "loss/entropy", "perf/step_s", "eval/success")
        )
        if (train.save_every and (i + 1) % train.save_every == 0) or last:
            save_checkpoint(self.out_dir, i + 1, run.engine, self.state.checkpoint(run))
        return metrics

    def done(self) -> bool:
        """RL is over: train.steps steps ran, or the rollouts generated train.token_budget tokens."""
        train, state = self.config.train, self.state
        spent = train.token_budget is not None and state.generated_tokens >= train.token_budget
        return state.step >= train.steps or spent

    def finish(self) -> dict[str, Any]:
        """Held-out eval after RL (none when no RL step ran: a study's warm-up run, whose weights are
        the ones just evaluated), the paired comparison, tables and plots, the exported model,
        ``summary.json``; returns the summary."""
        run, state = self.run, self.state
        before, before_details = state.eval_before, state.eval_before_details or {}  # older checkpoints: none
        after, after_details = self.evaluate(state.step) if state.step > 0 else (before, before_details)
        common = dict.fromkeys(before.keys() & after.keys())  # the tasks compare_evals pairs
        summary = {**compare_evals(before, after), "steps": state.step, "out_dir": str(self.out_dir),
                   "generated_tokens": state.generated_tokens,  # by the training rollouts (train.token_budget)
                   "objective": run.plan.summary(),
                   "eval_tasks": {"before": before, "after": after},  # per task: paired tests
                   "eval_details": {"before": before_details, "after": after_details},
                   "held_out_means": {"before": held_out_means(before_details, common),
                                      "after": held_out_means(after_details, common)}}  # fmt: skip
        self._report(summary, before, after)
        summary["precision"] = self.precision.as_dict()
        summary["peak_rss_gib"] = dict(run.peaks.peaks)  # this process, per phase (agentrl.train.memory)
        summary["model_dir"] = str(
            export_model(run.engine, run.tokenizer, self.out_dir / "model", write=self.rank0)
        )
        if self.rank0:
            (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def _report(self, summary: dict[str, Any], before: dict[str, float], after: dict[str, float]) -> None:
        """The held-out table (per env for a mixture, with its own sign test), curve.png, peak RSS."""
        logger, rollouts = self.run.logger, self.run.rollouts
        row = lambda s: (f"{s['success_before']:.3f}", f"{s['success_after']:.3f}", str(s["eval_episodes"]),  # noqa: E731
                         str(s["gained"]), str(s["lost"]), f"{s['p_value']:.3g}")  # fmt: skip
        if self.config.env.mixture:  # one row per env (its own sign test), then all tasks together
            names = rollouts.names
            summary["per_env"] = {name: compare_evals(*({t: v for t, v in table.items() if t.startswith(f"{name}/")}
                                                        for table in (before, after)))
                                  for name in names}  # fmt: skip
            logger.table("held-out success per env (same tasks before and after RL)",
                         [(name, *row(s)) for name, s in summary["per_env"].items()] + [("all", *row(summary))],
                         ("env", "before RL", "after RL", "tasks", "gained", "lost", "sign-test p"))  # fmt: skip
            logger.plot(("sft/loss", tuple(f"env/{n}/reward" for n in names), tuple(f"eval/{n}/success" for n in names),
                         tuple(f"mix/{n}/max_turns" for n in names), tuple(f"mix/{n}/filtered" for n in names),
                         "loss/loss"))  # fmt: skip
        else:
            logger.table("held-out success (same tasks before and after RL)", [row(summary)],
                         ("before RL", "after RL", "tasks", "gained", "lost", "sign-test p"))  # fmt: skip
            logger.plot(("sft/loss", "env/reward", "eval/success", "loss/loss", "loss/entropy"))
        if line := self.run.peaks.line():
            logger.console.print(line)
        logger.close()
        self.run.progress.close()

    def fit(self) -> dict[str, Any]:
        """The whole run: :meth:`setup`, every RL step not yet done, :meth:`finish`."""
        self.setup()
        while not self.done():
            self.step(self.state.step)
        return self.finish()


def train(config: RunConfig) -> dict[str, Any]:
    """Run a whole training job; returns a summary (success before/after, steps, out_dir)."""
    return Trainer(config).fit()


__all__ = ["TaskSampler", "Trainer", "compare_evals", "filter_episodes", "train"]
