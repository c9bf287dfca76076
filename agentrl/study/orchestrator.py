"""``agentrl study CONFIG``: objectives side by side, from one warm-up, on equal terms.

A study YAML names a base run config, the methods (each a set of dotted overrides; the first, or the
one named by ``baseline:``, is the arm every other is tested against), seeds, a sample budget and a
held-out size::

    base: configs/quickstart.yaml        # a path (relative to this file or the cwd) or an inline mapping
    overrides: [env.id=agentrl/SearchMultiHop-v0]   # applied to every run, the warm-up included
    methods:
      grpo: {}                            # the baseline arm
      igpo: {algo.advantage: igpo}
    seeds: [0, 1, 2]
    episodes: 192                         # sampled training episodes per arm (steps x tasks x group)
                                          # (or generated_tokens: N, below)
    eval_tasks: 128                       # held-out tasks, the same for every arm (greedy unless
                                          # overrides set train.eval_temperature)
    out_dir: runs/studies/igpo_vs_grpo

Per seed the supervised warm-up runs once (``seed-S/warmup``: the base config with ``train.steps=0``)
and evaluates the first ``eval_tasks`` held-out tasks (greedy, or sampled at ``train.eval_temperature``
from streams keyed by the task, so every arm's eval draws the same random numbers). Every method starts from its exported
model (``model.adapter=seed-S/warmup/model``, ``train.sft_warmup_steps=0``), takes that eval as its
eval before RL (``train.eval_before_from=seed-S/warmup``: one eval per seed, not one per arm; an arm
whose overrides change how the held-out eval runs, e.g. ``rollout.folding``, evaluates itself), and
runs with the same ``train.seed`` (so the same training tasks in the same order and the same
sampling streams), as many RL steps as make ``episodes`` sampled episodes, and evaluates after RL on
the same first ``eval_tasks`` held-out tasks. In place of ``episodes``, ``generated_tokens: N`` gives
every arm the same sampling cost instead (arms whose rollouts differ in shape, e.g. tree rollouts
against chains): each arm runs until its training rollouts have generated N tokens
(``train.token_budget``: it stops with the step that reaches N), at most ``max_steps`` steps
(default 64); the report gives each run's steps, episodes and tokens. Runs go one at a time in ``agentrl train``
subprocesses (the trainer picks the GPU when there is one). A run is finished when its
``summary.json`` exists; a re-run skips finished runs, and an unfinished one resumes from its last
checkpoint (``train.save_every``) or starts over. ``results.json``, ``report.md`` and the plots
(:mod:`agentrl.study.report`) are rewritten after every run, marked incomplete until all are. They
cover the study's ``seeds`` only: a sitting with ``seeds=[1,2]`` in a folder where seed 0 finished
says so at its end and gives the ``seeds=[0,1,2] --max-runs 0`` command that reports all three.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agentrl.config import RunConfig, eval_differences, load_config, parse_overrides, to_dict
from agentrl.errors import AgentRLError, ConfigError

# run fields the study itself sets; a method or common override may not touch them
STUDY_SET = {
    "train.seed": "set the study's seeds",
    "train.out_dir": "set the study's out_dir",
    "train.steps": "set the study's episodes (steps = episodes / (tasks_per_step x group_size x (1 + branches))) or max_steps",
    "train.token_budget": "set the study's generated_tokens",
    "train.eval_episodes": "set the study's eval_tasks",
    "train.eval_before_from": "every arm takes the warm-up's held-out eval as its eval before RL",
    "train.resume": "the study always resumes",
    "model.adapter": "every arm starts from the warm-up's model; set model.* in the study's overrides",
}
# a method may not change the warm-up: every arm starts from the one checkpoint
ARM_ONLY_SET = {f"train.{k}": "the warm-up is shared: set it in the study's overrides"
                for k in ("sft_warmup_steps", "sft_lr", "sft_temperature", "sft_demos", "sft_batch_size", "oracle",
                          "sft_fold_share", "fold_oracle")}  # fmt: skip
KEYS = ("name", "base", "overrides", "methods", "baseline", "seeds", "episodes", "generated_tokens", "max_steps",
        "eval_tasks", "out_dir")


@dataclass(frozen=True)
class Method:
    name: str
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class Run:
    """One ``agentrl train`` of the study: the warm-up (``method`` None) or an arm."""

    seed: int
    method: str | None
    out_dir: Path
    overrides: tuple[str, ...]
    steps: int = 0
    own_eval: tuple[str, ...] = ()  # an arm that evaluates like the warm-up does not: why it evaluates itself
    token_budget: int | None = None  # generated tokens after which the arm stops (steps is then the most)

    @property
    def label(self) -> str:
        return f"seed {self.seed} {self.method or 'warm-up'}"

    @property
    def finished(self) -> bool:
        return (self.out_dir / "summary.json").exists()


@dataclass(frozen=True)
class StudyConfig:
    name: str
    base: Path  # the base run config (an inline one is written to out_dir/base.yaml)
    overrides: tuple[str, ...]
    methods: tuple[Method, ...]
    baseline: str
    seeds: tuple[int, ...]
    episodes: int | None  # sampled episodes per arm, or
    eval_tasks: int
    out_dir: Path
    generated_tokens: int | None = None  # generated tokens per arm (train.token_budget) ...
    max_steps: int = 64  # ... in at most this many steps

    @property
    def budget(self) -> str:
        """The arms' equal share, in words."""
        if self.generated_tokens is not None:
            return f"{self.generated_tokens:,} generated tokens per arm (at most {self.max_steps} steps)"
        return f"{self.episodes} sampled episodes per arm"

    def run_dir(self, seed: int, name: str) -> Path:
        """Where a seed's run lives: ``out_dir/seed-S/<warmup | method name>``."""
        return self.out_dir / f"seed-{seed}" / name

    def warmup(self, seed: int) -> Run:
        out = self.run_dir(seed, "warmup")
        forced = (f"train.seed={seed}", f"train.out_dir={out}", "train.steps=0",
                  f"train.eval_episodes={self.eval_tasks}", "train.resume=true")  # fmt: skip
        return Run(seed, None, out, (*self.overrides, *forced))

    def arm(self, seed: int, method: Method, steps: int) -> Run:
        out = self.run_dir(seed, method.name)
        warm = self.warmup(seed).out_dir
        # the warm-up's held-out eval is every arm's eval before RL (one eval per seed, not one per
        # arm), unless the arm evaluates otherwise (its own prompt, context or folding mode: it then
        # evaluates itself), or a warm-up finished by an older study evaluated fewer tasks
        own = self.eval_differences(method)
        shared = () if own or _evaluated(warm) < self.eval_tasks else (f"train.eval_before_from={warm}",)
        forced = (
            f"train.seed={seed}", f"train.out_dir={out}", f"train.steps={steps}",
            f"train.eval_episodes={self.eval_tasks}", "train.resume=true", "train.sft_warmup_steps=0",
            f"model.adapter={warm / 'model'}", *shared,
            *((f"train.token_budget={self.generated_tokens}",) if self.generated_tokens is not None else ()),
        )  # fmt: skip
        return Run(seed, method.name, out, (*self.overrides, *method.overrides, *forced), steps, tuple(own),
                   self.generated_tokens)  # fmt: skip

    def eval_differences(self, method: Method) -> list[str]:
        """The held-out eval settings (``agentrl.config.EVAL_SETTINGS``) the method changes from the
        warm-up's, as ``key: warm-up -> arm``; empty when its eval before RL is the warm-up's."""
        configs = []
        for field, overrides in (("study.base/overrides", self.overrides),
                                 (f"study.methods.{method.name}", (*self.overrides, *method.overrides))):  # fmt: skip
            try:
                configs.append(load_config(self.base, list(overrides), validate=False))
            except ConfigError as exc:
                raise ConfigError(f"{field}: {exc.field}", exc.problem, exc.fix) from exc
        return eval_differences(*configs)


def _evaluated(warmup_dir: Path) -> float:
    """Held-out tasks a warm-up evaluated (infinite while it has not run: it will evaluate them all)."""
    summary = warmup_dir / "summary.json"
    if not summary.exists():
        return float("inf")
    return len(json.loads(summary.read_text())["eval_tasks"]["before"])


def _as_overrides(value: Any, field: str, *, method: bool) -> tuple[str, ...]:
    """A list of ``a.b=c`` strings or a mapping ``{a.b: c}`` -> override strings (checked)."""
    if value is None:
        return ()
    if isinstance(value, dict):
        items = [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in value.items()]
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        items = list(value)
    else:
        raise ConfigError(field, f"expected a mapping of dotted fields or a list of 'a.b=c', got {value!r}",
                          "e.g. {algo.advantage: igpo} or [algo.advantage=igpo]")  # fmt: skip
    for item in items:
        key = item.partition("=")[0].strip()
        if "=" not in item:
            raise ConfigError(field, f"override {item!r} has no '='", "write section.field=value")
        owner = STUDY_SET.get(key) or (ARM_ONLY_SET.get(key) if method else None)
        if owner is not None:
            raise ConfigError(f"{field}: {key}", "is set by the study for every run", f"remove it; {owner}")
    parse_overrides(items)  # shape errors (no section) now
    return tuple(items)


def load_study(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> StudyConfig:
    """Read and validate a study YAML (``overrides``: top-level ``key=value``, e.g. ``seeds=[0]``),
    building every run's config so a bad override fails before anything runs."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(
            "study", f"file {str(path)!r} does not exist", "pass e.g. configs/studies/igpo_vs_grpo.yaml"
        )
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ConfigError("study", f"{path} must hold a mapping")
    for item in overrides:
        key, eq, value = item.partition("=")
        if not eq or "." in key:
            raise ConfigError(
                item, "a study override is a top-level key=value", "e.g. seeds=[0] or eval_tasks=64"
            )
        raw[key.strip()] = yaml.safe_load(value)
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise ConfigError(f"study.{unknown[0]}", "unknown key", f"known keys: {', '.join(KEYS)}")
    for key in ("base", "methods", "seeds", "eval_tasks"):
        if key not in raw:
            raise ConfigError(f"study.{key}", "is required", "see agentrl/study/orchestrator.py for an example")
    if ("episodes" in raw) == ("generated_tokens" in raw):
        raise ConfigError("study.episodes", "give the arms' budget as one of episodes or generated_tokens"
                          + (", not both" if "episodes" in raw else ""),
                          "episodes: N (sampled episodes per arm) or generated_tokens: N (generated tokens per arm)")  # fmt: skip
    if "max_steps" in raw and "generated_tokens" not in raw:
        raise ConfigError("study.max_steps", "only bounds a generated_tokens budget",
                          "remove it: with episodes, steps = episodes / episodes per step")  # fmt: skip
    name = str(raw.get("name") or path.stem)
    out_dir = Path(raw.get("out_dir") or f"runs/studies/{name}")
    base = raw["base"]
    if isinstance(base, dict):
        out_dir.mkdir(parents=True, exist_ok=True)
        base_path = out_dir / "base.yaml"
        base_path.write_text(yaml.safe_dump(base, sort_keys=False))
    elif isinstance(base, str):
        base_path = Path(base) if Path(base).exists() else path.parent / base
        if not base_path.exists():
            raise ConfigError("study.base", f"no file {base!r} (tried the cwd and {path.parent})",
                              "give a path to a run config or an inline mapping")  # fmt: skip
    else:
        raise ConfigError("study.base", f"expected a path or a mapping, got {base!r}")
    methods_raw = raw["methods"]
    if not isinstance(methods_raw, dict) or len(methods_raw) < 2:
        raise ConfigError("study.methods", "needs at least two methods (a mapping name -> overrides)",
                          "e.g. {grpo: {}, igpo: {algo.advantage: igpo}}")  # fmt: skip
    methods = tuple(
        Method(str(n), _as_overrides(v, f"study.methods.{n}", method=True)) for n, v in methods_raw.items()
    )
    baseline = str(raw.get("baseline") or methods[0].name)
    if baseline not in {m.name for m in methods}:
        raise ConfigError(
            "study.baseline",
            f"{baseline!r} is not a method",
            f"use one of: {', '.join(m.name for m in methods)}",
        )
    seeds = raw["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise ConfigError(
            "study.seeds", f"expected a non-empty list of integers, got {seeds!r}", "e.g. [0, 1, 2]"
        )
    if len(set(seeds)) != len(seeds):
        raise ConfigError("study.seeds", f"repeats a seed: {seeds}")
    for key in ("episodes", "generated_tokens", "max_steps", "eval_tasks"):
        if key in raw and (not isinstance(raw[key], int) or isinstance(raw[key], bool) or raw[key] < 1):
            raise ConfigError(f"study.{key}", f"expected a positive integer, got {raw[key]!r}")
    study = StudyConfig(
        name=name, base=base_path, overrides=_as_overrides(raw.get("overrides"), "study.overrides", method=False),
        methods=methods, baseline=baseline, seeds=tuple(seeds), episodes=raw.get("episodes"),
        eval_tasks=raw["eval_tasks"], out_dir=out_dir, generated_tokens=raw.get("generated_tokens"),
        max_steps=raw.get("max_steps", StudyConfig.max_steps),
    )  # fmt: skip
    plan(study)  # every run's config builds and validates
    return study


def _run_config(study: StudyConfig, run: Run, field: str) -> RunConfig:
    try:
        return load_config(study.base, list(run.overrides))
    except ConfigError as exc:
        raise ConfigError(f"{field}: {exc.field}", exc.problem, exc.fix) from exc


def plan(study: StudyConfig) -> list[Run]:
    """Every run in order (per seed: the warm-up, then the methods), each config validated."""
    runs: list[Run] = []
    for seed in study.seeds:
        warm = study.warmup(seed)
        config = _run_config(study, warm, "study.base/overrides")
        if config.model.lora_rank > 0:
            raise ConfigError("study.base: model.lora_rank", "a study hands the warm-up on as a full model",
                              "use model.lora_rank=0 in the base config")  # fmt: skip
        runs.append(warm)
        for method in study.methods:
            probe = _run_config(study, study.arm(seed, method, 1), f"study.methods.{method.name}")
            if study.episodes is None:  # a generated-token budget: the run stops when it is spent
                runs.append(study.arm(seed, method, study.max_steps))
                continue
            per_task = probe.rollout.episodes_per_task
            per_step = probe.rollout.tasks_per_step * per_task
            if study.episodes % per_step:
                raise ConfigError(
                    "study.episodes",
                    f"{study.episodes} is not a whole number of steps of method {method.name!r} "
                    f"({probe.rollout.tasks_per_step} tasks x {per_task} episodes = {per_step} per step)",
                    f"use a multiple of {per_step}",
                )
            runs.append(study.arm(seed, method, study.episodes // per_step))
    return runs


_MISSING = object()


def _leaf(tree: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _MISSING
        tree = tree[part]
    return tree


def changed_settings(study: StudyConfig, run: Run) -> list[str]:
    """What a finished run ran with that the study's plan now sets otherwise (its explicit overrides,
    compared with the run's ``resolved_config.yaml``): a study YAML edited after a run finished.
    Left out: ``train.out_dir``, ``train.eval_before_from`` and an arm's ``model.adapter`` (where the
    run, the eval before RL and the warm-up's model live, not what they were: a study folder copied
    or moved elsewhere resumes there) and a
    warm-up's ``train.eval_episodes`` (a warm-up that evaluated fewer tasks leaves its arms to evaluate
    themselves, :meth:`StudyConfig.arm`). A field the run's code did not have yet counts as its default."""
    resolved_path = run.out_dir / "resolved_config.yaml"
    if not resolved_path.exists():
        return []
    resolved = yaml.safe_load(resolved_path.read_text()) or {}
    planned, defaults = to_dict(_run_config(study, run, "study")), to_dict(RunConfig())
    changes = []
    for item in run.overrides:
        key = item.partition("=")[0].strip()
        if key in ("train.out_dir", "train.eval_before_from") or (key == "train.eval_episodes" and run.method is None):
            continue
        if key == "model.adapter" and run.method is not None:  # the study's own warm-up, wherever the folder is
            continue
        want, have = _leaf(planned, key), _leaf(resolved, key)
        if have is _MISSING:
            have = _leaf(defaults, key)
        if want is not _MISSING and want != have:
            changes.append(f"{key}: ran with {have!r}, the study now sets {want!r}")
    return changes


def check_finished(study: StudyConfig, runs: list[Run]) -> None:
    """Fail before anything runs if a finished run (kept by a re-run) no longer matches the study."""
    stale = {run: changed_settings(study, run) for run in runs if run.finished}
    stale = {run: changes for run, changes in stale.items() if changes}
    if stale:
        lines = "; ".join(f"{run.label} ({run.out_dir}): {', '.join(c)}" for run, c in stale.items())
        raise ConfigError(
            "study", f"finished runs were made with other settings than the study now gives them: {lines}",
            "delete those run folders to re-run them with the new settings, or set a new out_dir",
        )  # fmt: skip


#: settings whose ``auto`` a run resolves when it starts (from the bf16 measurement), which every arm
#: of a seed takes from its warm-up
RESOLVED_AT_START = ("train.bf16_autocast", "rollout.sampler_dtype", "train.eval_sampler_dtype")


def inherited_precision(study: StudyConfig, run: Run) -> tuple[str, ...]:
    """``train.bf16_autocast`` (and ``rollout.sampler_dtype`` / ``train.eval_sampler_dtype``, which
    follow it) for an arm whose setting is ``auto``: the value its warm-up resolved.

    ``auto`` times bf16 against float32 when a run starts; near the threshold that probe goes either
    way (an H200 shared by six runs measured 1.06x to 1.27x), so arms of one seed could train in
    different precisions. Resolved once per seed, by the warm-up, every arm of the seed trains in the
    one precision (each seed still measures its own), and evaluates as the warm-up did (its eval
    before RL is the warm-up's)."""
    if run.method is None:
        return ()
    config = _run_config(study, run, "study")
    auto = [key for key in RESOLVED_AT_START if getattr(getattr(config, key.split(".")[0]), key.split(".")[1]) == "auto"]
    return resolved_precision(study.warmup(run.seed).out_dir, auto)


def resolved_precision(run_dir: Path, keys: Any = RESOLVED_AT_START) -> tuple[str, ...]:
    """``keys`` (of :data:`RESOLVED_AT_START`) as the run in ``run_dir`` resolved them at its start
    (its ``resolved_config.yaml``), as ``key=value`` overrides; none where it has not run or left them ``auto``."""
    resolved_path = run_dir / "resolved_config.yaml"
    resolved = (yaml.safe_load(resolved_path.read_text()) if resolved_path.exists() else None) or {}
    given = []
    for key in keys:
        value = _leaf(resolved, key)
        if isinstance(value, bool):
            given.append(f"{key}={str(value).lower()}")
        elif isinstance(value, str) and value != "auto":
            given.append(f"{key}={value}")
    return tuple(given)


def _command(study: StudyConfig, run: Run, progress: Any = None) -> list[str]:
    precision = inherited_precision(study, run)
    if precision and progress is not None:
        progress.line(f"study: {run.label}: {' '.join(precision)}, as its warm-up resolved auto "
                      "(one precision for every arm of a seed)")  # fmt: skip
    cmd = [sys.executable, "-m", "agentrl.cli", "train", str(study.base), *run.overrides, *precision]
    run.out_dir.mkdir(parents=True, exist_ok=True)
    (run.out_dir / "command.txt").write_text(" ".join(cmd[2:]) + "\n")
    return cmd


def _failure(run: Run, rc: int) -> str:
    return f"study run '{run.label}' failed (exit {rc}); see {run.out_dir / 'train.log'}"


def dies_with_parent(command: list[str]) -> list[str]:
    """``command`` run under util-linux ``setpriv --pdeathsig TERM``: the kernel sends it SIGTERM when
    the process that started it dies, however it dies (SIGKILL, the OOM killer, a job scheduler's
    timeout), so a killed study leaves no run training unwatched. Unchanged where ``setpriv`` is
    missing (not Linux): there a study stopped by SIGTERM or Ctrl-C still stops its runs."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--", *command] if setpriv else list(command)


def run_one(study: StudyConfig, run: Run, progress: Any = None) -> None:
    """``agentrl train BASE OVERRIDES`` in a subprocess (its progress lines pass through)."""
    rc = subprocess.run(dies_with_parent(_command(study, run, progress)), env=os.environ.copy()).returncode
    if rc != 0 or not run.finished:
        raise AgentRLError(f"{_failure(run, rc)}. Fix the cause and re-run the study: finished runs are kept")


def child_env(parallel: int) -> dict[str, str]:
    """The runs' environment: with several runs sharing a GPU, PyTorch's allocator grows its segments
    instead of caching fixed blocks, which keeps each run's reserved memory near what it uses,
    unless ``PYTORCH_CUDA_ALLOC_CONF`` is set already. (The 105 GiB one process once held on an H200
    was JAX's preallocation in a shop server, started by bm25s: ``agentrl.tools.search.import_bm25s``.)"""
    env = os.environ.copy()
    if parallel > 1:
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    return env


def this_sitting(todo: list[Run], max_runs: int | None) -> tuple[list[Run], bool]:
    """The unfinished runs in plan order up to the first arm past ``max_runs``; and whether that cut any."""
    chosen: list[Run] = []
    arms = 0
    for run in todo:
        if run.method is not None:
            if max_runs is not None and arms >= max_runs:
                return chosen, True
            arms += 1
        chosen.append(run)
    return chosen, False


def _starting(progress: Any, run: Run) -> None:
    budget = run.token_budget
    steps = f"until {budget:,} generated tokens, at most {run.steps} RL steps" if budget else f"{run.steps} RL steps"
    progress.line(f"study: {run.label}: starting ({steps}) -> {run.out_dir}")
    if run.own_eval:
        progress.line(f"study: {run.label}: evaluates itself before RL, since it evaluates otherwise "
                      f"than the warm-up ({'; '.join(run.own_eval)})")  # fmt: skip


def run_parallel(study: StudyConfig, chosen: list[Run], parallel: int, progress: Any, finished: Any,
                 *, poll_s: float = 2.0) -> None:  # fmt: skip
    """Up to ``parallel`` runs at once, each arm once its seed's warm-up is done (warm-ups first, in
    plan order); each run's terminal output goes to its ``out_dir/study_output.log``. A failed run
    fails the arms that need it; the others go on, and the study raises at the end naming them all."""
    env = child_env(parallel)
    pending, running, failed = list(chosen), {}, []  # running: Run -> (process, its log file)

    def stop(signum: int, frame: Any) -> None:  # SIGTERM (kill, a job scheduler) ends the study like Ctrl-C
        raise SystemExit(128 + signum)

    before = signal.signal(signal.SIGTERM, stop)
    try:
        while pending or running:
            for run in list(pending):
                if len(running) >= parallel:
                    break
                warm = None if run.method is None else study.warmup(run.seed)
                if warm is not None and any(f.out_dir == warm.out_dir for f in failed):
                    pending.remove(run)
                    failed.append(run)
                    progress.line(f"study: {run.label}: not started: its warm-up failed")
                    continue
                if warm is not None and not warm.finished:
                    continue  # waits for its warm-up
                pending.remove(run)
                _starting(progress, run)
                cmd = _command(study, run, progress)  # makes out_dir
                log = open(run.out_dir / "study_output.log", "a")  # noqa: SIM115 - closed when the run ends
                process = subprocess.Popen(dies_with_parent(cmd), env=env, stdout=log, stderr=subprocess.STDOUT)
                running[run] = (process, log)
            time.sleep(poll_s)
            for run, (process, log) in list(running.items()):
                rc = process.poll()
                if rc is None:
                    continue
                log.close()
                del running[run]
                if rc != 0 or not run.finished:
                    failed.append(run)
                    progress.line(f"{_failure(run, rc)}; its terminal output: {run.out_dir / 'study_output.log'}")
                else:
                    finished(run)
    finally:  # stopped (Ctrl-C, SIGTERM, an error here): no run goes on unwatched
        signal.signal(signal.SIGTERM, before)
        for process, log in running.values():
            process.terminate()
            process.wait()
            log.close()
    if failed:
        raise AgentRLError("; ".join(f"'{r.label}'" for r in failed) + " failed (see the lines above). "
                           "Fix the cause and re-run the study: finished runs are kept")  # fmt: skip


def run_study(study: StudyConfig, *, max_runs: int | None = None, parallel: int = 1) -> dict[str, Any]:
    """Run what is not finished (at most ``max_runs`` arms this sitting, ``parallel`` runs at once), then
    write the results; finished runs whose settings the study now changes fail it first
    (:func:`check_finished`)."""
    from agentrl.study.report import write_results
    from agentrl.train.progress import RunProgress

    if parallel < 1:
        raise ConfigError("--parallel", f"must be >= 1, got {parallel}", "use 1 to run one run at a time")
    runs = plan(study)
    check_finished(study, runs)
    study.out_dir.mkdir(parents=True, exist_ok=True)
    (study.out_dir / "study.yaml").write_text(yaml.safe_dump(_describe(study, runs), sort_keys=False))
    progress = RunProgress(study.out_dir, append=True)  # study.out_dir/train.log: the study's own lines
    todo = [r for r in runs if not r.finished]
    chosen, cut = this_sitting(todo, max_runs)
    progress.print(f"study {study.name}: {len(runs)} runs ({len(runs) - len(todo)} finished, {len(todo)} to run), "
                   f"{study.budget} -> {study.out_dir}")  # fmt: skip
    if parallel > 1:
        progress.line(f"study: up to {parallel} runs at once (--parallel); PYTORCH_CUDA_ALLOC_CONF="
                      f"{child_env(parallel)['PYTORCH_CUDA_ALLOC_CONF']}")  # fmt: skip
    for run in runs:
        if run.finished:
            progress.line(f"study: {run.label}: finished, skipped ({run.out_dir / 'summary.json'})")
    with progress.phase(f"study {study.name}", sum(r.method is not None for r in chosen), unit="run") as phase:

        def finished(run: Run) -> None:
            if run.method is None:
                progress.line(f"study: {run.label}: finished")
                return
            summary = json.loads((run.out_dir / "summary.json").read_text())
            phase.advance(run=f"seed{run.seed}/{run.method}", after=float(summary["success_after"]))
            write_results(study, runs)

        if parallel == 1:
            for run in chosen:
                _starting(progress, run)
                run_one(study, run, progress)
                finished(run)
        else:
            run_parallel(study, chosen, parallel, progress, finished)
    if cut:
        progress.line(f"study: stopped after {sum(r.method is not None for r in chosen)} run(s) (--max-runs); "
                      "re-run to continue")  # fmt: skip
    results = write_results(study, runs)
    progress.line(f"study: results {'complete' if results['complete'] else 'partial'}: "
                  f"{study.out_dir / 'results.json'}, {study.out_dir / 'report.md'}")  # fmt: skip
    hint = pooling_hint(study)
    if hint:
        progress.line(hint)
    progress.close()
    return results


def other_finished_seeds(study: StudyConfig) -> list[int]:
    """Seeds outside ``study.seeds`` whose warm-up and every arm finished in ``study.out_dir`` (an
    earlier sitting with other seeds): the report of this sitting leaves them out."""
    names = ["warmup", *(m.name for m in study.methods)]
    found = []
    for folder in study.out_dir.glob("seed-*"):
        seed = folder.name.removeprefix("seed-")
        if not seed.lstrip("-").isdigit() or int(seed) in study.seeds:
            continue
        if all((study.run_dir(int(seed), name) / "summary.json").exists() for name in names):
            found.append(int(seed))
    return sorted(found)


def pooling_hint(study: StudyConfig) -> str | None:
    """The line that says how to report this sitting's seeds together with :func:`other_finished_seeds`."""
    others = other_finished_seeds(study)
    if not others:
        return None
    every = sorted({*study.seeds, *others})
    return (f"study: seed(s) {', '.join(map(str, others))} also finished in {study.out_dir}, left out of this report "
            f"(seeds {', '.join(map(str, study.seeds))}); to report all together, without running anything: "
            f"agentrl study CONFIG seeds=[{','.join(map(str, every))}] --max-runs 0")  # fmt: skip


def _describe(study: StudyConfig, runs: list[Run]) -> dict[str, Any]:
    """The resolved study (saved as study.yaml): what each run is given."""
    return {
        "name": study.name, "base": str(study.base), "baseline": study.baseline, "seeds": list(study.seeds),
        "episodes": study.episodes, "generated_tokens": study.generated_tokens,
        **({"max_steps": study.max_steps} if study.generated_tokens is not None else {}), "eval_tasks": study.eval_tasks,
        "runs": [{"seed": r.seed, "method": r.method or "warmup", "steps": r.steps, "out_dir": str(r.out_dir),
                  "overrides": list(r.overrides), **({"own_eval_before": list(r.own_eval)} if r.own_eval else {})}
                 for r in runs],
    }  # fmt: skip


__all__ = ["Method", "Run", "StudyConfig", "changed_settings", "check_finished", "child_env", "load_study",
           "other_finished_seeds", "plan", "pooling_hint", "resolved_precision", "run_parallel", "run_study",
           "this_sitting"]
