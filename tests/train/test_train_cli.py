"""`agentrl train` as a user runs it: output to a pipe, the quickstart config in both precisions."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs" / "quickstart.yaml"
# the quickstart made CI-sized: 1 warm-up step on 2 demos, 1 RL step of one tree of 2 episodes (a root
# and one branch forked before its last turn, as the quickstart's trees of 16), 1 eval task, the top 2
# blocks trained
SHORT = [
    "train.steps=1", "train.sft_warmup_steps=1", "train.sft_demos=2", "train.sft_batch_size=1",
    "train.micro_batch_size=1", "train.minibatch_size=2", "train.eval_episodes=1", "train.resume=false",
    "train.trainable_layers=2", "rollout.tasks_per_step=1", "rollout.group_size=1", "rollout.branches=1",
    "rollout.concurrency=2",
    "rollout.max_new_tokens=16", "algo.dynamic_sampling=false",
]  # fmt: skip


def agentrl_train(*args: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    """``agentrl train ...`` in a subprocess, stdout and stderr to pipes (not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )  # fmt: skip


@pytest.mark.slow
def test_train_through_a_pipe_prints_every_phase_and_records_the_auto_precision(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    # rollout.prefix_cache_tokens=null: the quickstart sets 24576; unset, the default budget is resolved and said
    proc = agentrl_train(str(QUICKSTART), f"model.name={tiny_model_dir}", *SHORT, "train.sft_warmup_steps=3",
                         "train.steps=2", "train.num_threads=1", "rollout.prefix_cache_tokens=null",
                         f"train.out_dir={out}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # transformers 5.x's renamed arguments (kv_cache.cache_arg): no deprecation noise in the user's terminal
    for old in ("`past_key_values` is deprecated", "`gradient_checkpointing_enable` is deprecated"):
        assert old not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()

    def having(pattern: str) -> list[str]:
        return [x for x in lines if re.match(pattern, x)]

    decision = having(
        r"precision: train\.bf16_autocast=(true|false) \(probe on .*fp32 [\d.]+ ms, bf16 [\d.]+ ms"
    )
    assert len(decision) == 1, proc.stdout
    assert having(r"model load:  done in ")
    assert having(r"kernel caches: 64 entries each in oneDNN's and PyTorch's \(train\.kernel_cache\)$")  # the quickstart's
    # a tree (root + 1 branch) is one RL micro-batch whatever train.micro_batch_size=1 says: said, not silent
    assert having(r"learner: RL micro-batches are whole trees of 2 episodes .* above train\.micro_batch_size=1,")
    assert having(r"warm-up demonstrations:  episode 2/2  success=1  done in ")
    # one line per warm-up step: step, loss, elapsed, ETA
    steps = having(r"warm-up:  step \d/3  loss=[\d.]+  elapsed [\d.]+s  eta [\d.]+s$")
    assert [x.split()[2] for x in steps] == ["1/3", "2/3", "3/3"], proc.stdout
    assert having(r"eval before RL:  episode 1/1  success=[\d.]+  done in ")
    for step in (1, 2):
        assert having(rf"step {step}/2 rollout:  episode 2/2  reward=[\d.]+  done in ")
        assert having(rf"step {step}/2 learner:  loss=\S+  done in ")
        assert having(rf"step {step}  reward=")
    assert having(r"eval after step 2:  episode 1/1  success=")
    assert "\x1b[" not in proc.stdout  # plain text in a pipe
    # the log file has the same lines; the decision is saved resolved
    log = (out / "train.log").read_text()
    assert all(x in log for x in (decision[0], *steps))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["precision"]["source"] == "probe" and summary["precision"]["timings"]
    resolved = yaml.safe_load((out / "resolved_config.yaml").read_text())
    assert resolved["train"]["bf16_autocast"] is summary["precision"]["bf16_autocast"]
    # the prefix cache: at least the default 65,536 tokens (above 2 episodes x 1,536 in flight)
    cache = having(r"generator: hf, rollout\.prefix_cache_tokens=65536: 65536 tokens \(.*: the default, above the 3072 of every episode in flight$")
    assert len(cache) == 1 and cache[0] in log, proc.stdout
    # decode batches: lock-step by default with the in-process generator, said once
    batching = having(r"rollout batching: lock-step \(.*the same seed gives the same run\), waiting at most 60s ")
    assert len(batching) == 1 and batching[0] in log, proc.stdout
    assert resolved["rollout"]["prefix_cache_tokens"] == 65536
    assert decision[0].startswith(
        f"precision: train.bf16_autocast={str(resolved['train']['bf16_autocast']).lower()}"
    )
    # metrics.jsonl has the warm-up steps (before RL's step 1), so curve.png shows them
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "sft/loss" in r] == [-3, -2, -1]
    assert [r["rollout/lockstep_cut"] for r in records if "rollout/lockstep_cut" in r] == [0.0, 0.0]
    # each eval line shows the success that is logged, not the mean outcome (a partial score)
    logged = {r["step"]: r["eval/success"] for r in records if "eval/success" in r}
    for step, pattern in ((0, r"eval before RL:  episode 1/1  success="), (2, r"eval after step 2:  episode 1/1  success=")):
        printed = float(having(pattern)[0].split("success=")[1].split()[0])
        assert printed == pytest.approx(logged[step], abs=5e-4), (step, printed, logged)
    # beside success, the held-out means of each task's reward and metrics, logged and summarised alike
    means = {r["step"]: r["eval/outcome"] for r in records if "eval/outcome" in r}
    assert summary["held_out_means"]["before"]["outcome"] == pytest.approx(means[0])
    assert summary["held_out_means"]["after"]["outcome"] == pytest.approx(means[2])
    assert set(summary["eval_details"]["after"]) == set(summary["eval_tasks"]["after"])
    assert (out / "curve.png").stat().st_size > 0
    # peak RSS per phase: logged per step / eval, the run's maxima in the summary and a closing line
    phases = {"sft", "eval", "rollout", "scoring", "learner"}
    assert set(summary["peak_rss_gib"]) == phases
    model_gib = 0.05  # a one-block model: every phase holds at least torch, the tokenizer and the env
    assert all(model_gib < v < 64 for v in summary["peak_rss_gib"].values()), summary["peak_rss_gib"]
    for step in (1, 2):
        record = next(r for r in records if r["step"] == step and "perf/step_s" in r)
        assert {"perf/rss_peak_rollout_gib", "perf/rss_peak_scoring_gib", "perf/rss_peak_learner_gib"} <= set(record)
    logged = max(r["perf/rss_peak_learner_gib"] for r in records if "perf/rss_peak_learner_gib" in r)
    assert summary["peak_rss_gib"]["learner"] == logged
    assert having(r"peak memory \(this process's RSS, GiB\): sft [\d.]+, eval [\d.]+, rollout [\d.]+, scoring [\d.]+, learner [\d.]+$")


def _bf16_kernels() -> str | None:
    """None where this CPU has fast bf16 kernels, else the probe's reason."""
    from agentrl.rollout.model import load_model
    from agentrl.train.precision import probe_bf16

    model, _ = load_model("smollm2-135m", dtype="float32")
    decision = probe_bf16(model)
    return None if decision.bf16_kernels else f"{decision.reason} ({decision.cpu})"


@pytest.mark.slow
@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
def test_the_quickstart_config_runs_end_to_end(bf16, tmp_path):
    """configs/quickstart.yaml itself (SmolLM2-135M, search env, warm-up + RL + eval), CI-sized.

    Forced bf16 runs only where the CPU has fast bf16 kernels: without them one bf16 warm-up step
    of the 30-block model takes minutes (the CPU this was written on measures bf16 ~10x slower).
    The bf16 code path itself is covered on every CPU by the tiny-model tests in test_learner.py
    and test_trainer.py."""
    if bf16 and (reason := _bf16_kernels()) is not None:
        pytest.skip(f"no bf16 on this CPU: {reason}")
    out = tmp_path / "run"
    proc = agentrl_train(
        str(QUICKSTART), *SHORT, f"train.bf16_autocast={str(bf16).lower()}", f"train.out_dir={out}"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["precision"] == {**summary["precision"], "bf16_autocast": bf16, "source": "config"}
    assert summary["eval_episodes"] == 1 and summary["steps"] == 1
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "sft/loss" in r] == [-1]
    assert any("perf/step_s" in r and r["step"] == 1 for r in records)
    assert "held-out success before RL:" in proc.stdout


def _float32_learner_run(tiny_model_dir, tmp_path, setting: str) -> tuple[subprocess.CompletedProcess[str], dict, list[dict]]:
    """The CI-sized quickstart on the tiny model, the learner in float32, with ``setting``: the
    process, the resolved config and the metrics records."""
    out = tmp_path / "run"
    proc = agentrl_train(str(QUICKSTART), f"model.name={tiny_model_dir}", *SHORT, "train.bf16_autocast=false",
                         setting, f"train.out_dir={out}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    resolved = yaml.safe_load((out / "resolved_config.yaml").read_text())
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return proc, resolved, records


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["bfloat16", "auto"])
def test_a_bfloat16_sampler_trains_and_the_learner_measures_its_mismatch(setting, tiny_model_dir, tmp_path):
    """rollout.sampler_dtype: bfloat16 samples from a bfloat16 copy (given the learner's weights after
    the warm-up and each update), so the learner measures the sampler's log-probs (mismatch/*);
    auto where the learner runs float32 samples from the live weights, said and saved."""
    proc, resolved, records = _float32_learner_run(tiny_model_dir, tmp_path, f"rollout.sampler_dtype={setting}")
    step = next(r for r in records if r["step"] == 1 and "perf/step_s" in r)
    if setting == "bfloat16":
        assert "generator: hf samples in bfloat16 (rollout.sampler_dtype=bfloat16, as set)" in proc.stdout
        assert resolved["rollout"]["sampler_dtype"] == "bfloat16"
        assert step["mismatch/abs_mean"] > 0  # bfloat16 samples, float32 learner: their log-probs differ
    else:
        line = "generator: hf samples in float32 (rollout.sampler_dtype=model, auto: train.bf16_autocast resolved to false)"
        assert line in proc.stdout and resolved["rollout"]["sampler_dtype"] == "model"
        assert "mismatch/abs_mean" not in step  # the live weights: nothing to measure


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["bfloat16", "auto"])
def test_evals_in_bfloat16_are_said_saved_and_leave_the_rollouts_in_float32(setting, tiny_model_dir, tmp_path):
    """train.eval_sampler_dtype: bfloat16 evaluates from a bfloat16 copy while the rollouts sample the
    live float32 weights (no mismatch to measure); auto where the learner runs float32 keeps float32."""
    proc, resolved, records = _float32_learner_run(tiny_model_dir, tmp_path, f"train.eval_sampler_dtype={setting}")
    step = next(r for r in records if r["step"] == 1 and "perf/step_s" in r)
    assert "mismatch/abs_mean" not in step and resolved["rollout"]["sampler_dtype"] == "model"
    assert [r["step"] for r in records if "eval/success" in r] == [0, 1]
    if setting == "bfloat16":
        assert "evals: hf samples in bfloat16 (train.eval_sampler_dtype=bfloat16, as set)" in proc.stdout
        assert resolved["train"]["eval_sampler_dtype"] == "bfloat16"
    else:
        line = "evals: hf samples in float32 (train.eval_sampler_dtype=model, auto: train.bf16_autocast resolved to false)"
        assert line in proc.stdout and resolved["train"]["eval_sampler_dtype"] == "model"


@pytest.mark.slow
def test_a_warm_up_can_demonstrate_folding_beside_react(tiny_model_dir, tmp_path):
    """`train.sft_fold_share`: half the demonstrations are played with branch/return by the folding
    oracle (under the folding system prompt), half as ReAct; the warm-up trains on both."""
    out = tmp_path / "run"
    proc = agentrl_train(str(QUICKSTART), f"model.name={tiny_model_dir}", *SHORT, "train.steps=0",
                         "train.num_threads=1", "env.id=agentrl/SearchMultiHop-v0", "env.kwargs.hops=multi",
                         "env.max_turns=10", "train.sft_demos=4", "train.sft_batch_size=4", "train.sft_warmup_steps=2",
                         "train.sft_fold_share=0.5", "train.fold_oracle=agentrl.envs.search.oracle:FoldingSearchOracle",
                         f"train.out_dir={out}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warm-up demonstrations:  episode 4/4  success=" in proc.stdout
    found = re.search(r"warm-up: (\d) demonstrations \((\d) of them folded, train\.sft_fold_share\)", proc.stdout)
    assert found and int(found.group(2)) == 2 and int(found.group(1)) >= 2, proc.stdout  # 3-hop ReAct may not fit
    assert re.search(r"warm-up:  step 2/2  loss=[\d.]+  done in", proc.stdout)
    # SHORT's 16-token turns are shorter than any tool call: every demonstration is over the budget
    assert re.search(r"warm-up: (\d) of \1 demonstrations have a turn longer than rollout\.max_new_tokens=16 "
                     r"\(longest \d+ tokens\)", proc.stdout), proc.stdout  # fmt: skip
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["sft/demos_over_budget"] for r in records if "sft/demos_over_budget" in r] == [float(found.group(1))]
    resolved = yaml.safe_load((out / "resolved_config.yaml").read_text())["train"]
    assert (resolved["sft_fold_share"], resolved["fold_oracle"]) == (0.5, "agentrl.envs.search.oracle:FoldingSearchOracle")


@pytest.mark.slow
def test_a_resumed_run_keeps_the_precision_it_chose_at_its_start(tiny_model_dir, tmp_path):
    """`auto` is a timing probe: on a busy machine a second probe may decide otherwise, and a run
    that changed precision halfway would not be the run it would have been unstopped. The saved
    decision is flipped here (as a different first probe would have made it): the resumed run
    follows the saved one, says so, and saves it again."""
    out = tmp_path / "run"
    common = [str(QUICKSTART), f"model.name={tiny_model_dir}", *SHORT, "train.sft_warmup_steps=0",
              "train.num_threads=1", "train.save_every=1", f"train.out_dir={out}"]  # fmt: skip
    first = agentrl_train(*common)
    assert first.returncode == 0, first.stderr[-3000:]
    resolved = yaml.safe_load((out / "resolved_config.yaml").read_text())
    flipped = not resolved["train"]["bf16_autocast"]
    resolved["train"]["bf16_autocast"] = flipped
    (out / "resolved_config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    second = agentrl_train(*common, "train.steps=2", "train.resume=true")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout
    line = f"precision: train.bf16_autocast={str(flipped).lower()} (resumed"
    assert [x for x in second.stdout.splitlines() if x.startswith("precision:")][0].startswith(line), second.stdout
    assert yaml.safe_load((out / "resolved_config.yaml").read_text())["train"]["bf16_autocast"] is flipped
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["precision"]["bf16_autocast"], summary["precision"]["source"]) == (flipped, "resumed")
    assert summary["steps"] == 2


@pytest.mark.slow
def test_a_token_budget_ends_rl_with_the_step_that_spends_it(tiny_model_dir, tmp_path):
    """train.token_budget: RL stops after the step whose rollouts bring the generated tokens to the
    budget (train.steps is then the most steps). The same seed samples the same first step, so a
    budget of one token stops after step 1, and that step's tokens plus one after step 2."""

    def run(name: str, budget: int) -> tuple[subprocess.CompletedProcess[str], dict, list[dict]]:
        out = tmp_path / name
        proc = agentrl_train(str(QUICKSTART), f"model.name={tiny_model_dir}", *SHORT, "train.steps=5",
                             "train.sft_warmup_steps=0", "train.num_threads=1", f"train.token_budget={budget}",
                             f"train.out_dir={out}")  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return proc, json.loads((out / "summary.json").read_text()), [r for r in steps if "perf/step_s" in r]

    proc, summary, steps = run("one", 1)
    assert "RL: until the training rollouts have generated 1 tokens (train.token_budget), at most 5 steps" in proc.stdout
    assert summary["steps"] == 1 and [r["step"] for r in steps] == [1]
    first = steps[0]["rollout/sampled_tokens"]
    assert first >= 1 and summary["generated_tokens"] == first == steps[0]["rollout/generated_tokens_total"]
    _, summary2, steps2 = run("two", int(first) + 1)
    assert summary2["steps"] == 2 and [r["step"] for r in steps2] == [1, 2]
    assert steps2[0]["rollout/sampled_tokens"] == first  # the same first step
    assert summary2["generated_tokens"] == first + steps2[1]["rollout/sampled_tokens"] >= first + 1


@pytest.mark.slow
def test_zero3_through_torchrun_samples_from_the_partitioned_model(tiny_model_dir, tmp_path):
    """`train.engine=deepspeed train.zero_stage=3` as the GPU recipes run it, one process through torchrun:
    the hf generator samples from the live model, whose forward gathers the partitioned weights. With
    bf16 on, `auto` would make a bfloat16 eval copy of a partitioned model (every episode crashed); it
    resolves to the live model and says why. The CPU's packed LM head is never used on partitioned weights
    (it crashed every episode too)."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "-m", "agentrl.cli", "train",
         str(QUICKSTART), f"model.name={tiny_model_dir}", *SHORT, "train.bf16_autocast=true", "train.engine=deepspeed",
         "train.zero_stage=3", "train.eval_max_failed=0", f"train.out_dir={out}"],
        capture_output=True, text=True, timeout=900, cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "episode failed" not in proc.stdout + proc.stderr
    assert "evals: hf samples in float32 (train.eval_sampler_dtype=model, auto: train.bf16_autocast resolved to true, ZeRO-3)" in proc.stdout
    resolved = yaml.safe_load((out / "resolved_config.yaml").read_text())
    assert resolved["train"]["eval_sampler_dtype"] == "model" and resolved["rollout"]["sampler_dtype"] == "model"
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "eval/success" in r] == [0, 1]
    step = next(r for r in records if r["step"] == 1 and "perf/step_s" in r)
    assert step["rollout/failed"] == 0 and step["loss/grad_norm"] >= 0  # the learner ran through DeepSpeed's step
    assert summary["steps"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("limit", [None, "1"])
def test_a_step_whose_episodes_mostly_crashed_stops_the_run_before_its_update(limit, tiny_model_dir, tmp_path):
    """Every training episode times out (rollout.episode_timeout_s far below one turn): by default the
    run stops at step 1 naming the first error, before an update on nothing; train.rollout_max_failed=1
    lets it go on (an H200 quickstart trained 4 steps on the 16 roots of 256 episodes, every branch crashed)."""
    out = tmp_path / "run"
    extra = [] if limit is None else [f"train.rollout_max_failed={limit}"]
    proc = agentrl_train(str(QUICKSTART), f"model.name={tiny_model_dir}", *SHORT, "train.sft_warmup_steps=0",
                         "train.eval_episodes=0", "rollout.episode_timeout_s=0.001", *extra,
                         f"train.out_dir={out}")  # fmt: skip
    log = (out / "train.log").read_text()
    if limit is None:
        assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
        said = re.search(r"training failed: step 1/1: (\d+) of (\d+) sampled episodes failed \(first: ", log)
        assert said and said.group(1) == said.group(2), log[-2000:]
        assert "allow more with train.rollout_max_failed (now 0.5)" in " ".join(log.split())
        assert not (out / "checkpoints" / "latest").exists()
    else:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        step = next(json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"perf/step_s"' in x)
        assert step["rollout/failed"] == step["rollout/episodes"] > 0 and "loss/loss" not in step


@pytest.mark.slow
def test_a_builtin_tokenizer_with_the_wrong_eos_is_set_to_the_models_and_said(tmp_path):
    """A converted copy whose tokenizer names <|im_start|> the EOS (what transformers 5.17's GGUF converter
    wrote): agentrl train uses the model's EOS (<|im_end|>, id 2), says so in the terminal and train.log,
    and writes the copy's tokenizer files right (the other files are links to the real cache: untouched)."""
    from agentrl.rollout.model import builtin_cache_path

    source = builtin_cache_path("smollm2-135m")
    copy = tmp_path / "cache" / "models" / "smollm2-135m"
    copy.mkdir(parents=True)
    for item in source.iterdir():
        (copy / item.name).symlink_to(item)
    config = json.loads((source / "tokenizer_config.json").read_text())
    (copy / "tokenizer_config.json").unlink()
    (copy / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|im_start|>"}))
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", str(QUICKSTART), "train.steps=0", "train.sft_warmup_steps=0",
         "train.eval_episodes=0", "train.bf16_autocast=false", f"train.out_dir={out}"],
        capture_output=True, text=True, timeout=900, cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "AGENTRL_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    line = "tokenizer: eos_token '<|im_start|>' -> '<|im_end|>' (id 2), as the model's config states"
    assert line in proc.stdout and line in (out / "train.log").read_text()
    assert "the tokenizer's special tokens differ from the model's" in proc.stderr  # the loader's own warning
    saved = json.loads((copy / "tokenizer_config.json").read_text())  # fixed on disk, where vLLM would read it
    assert saved["eos_token"] == "<|im_end|>" and (source / "tokenizer_config.json").is_file()
    assert json.loads((source / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"


@pytest.mark.slow
@pytest.mark.parametrize("engine", [["train.engine=torch"], ["train.engine=deepspeed", "train.zero_stage=3"]],
                         ids=["ddp", "zero3"])  # fmt: skip
def test_two_processes_through_torchrun_write_one_log_and_one_record_per_step(engine, tiny_model_dir, tmp_path):
    """`torchrun --nproc_per_node 2 -m agentrl.cli train ...`: rank 0 alone prints, writes train.log and
    metrics.jsonl (every rank did: each line twice, two records per step, two writers on one file)."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "agentrl.cli", "train",
         str(QUICKSTART), f"model.name={tiny_model_dir}", *SHORT, "rollout.tasks_per_step=2", "train.eval_episodes=2",
         "train.bf16_autocast=false", *engine, f"train.out_dir={out}"],
        capture_output=True, text=True, timeout=900, cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "eval/success" in r] == [0, 1]
    assert [r["step"] for r in records if "perf/step_s" in r] == [1]
    assert proc.stdout.count("held-out success before RL:") == 1
    log = (out / "train.log").read_text()
    assert log.count("eval before RL:  episode 2/2") == 1 and log.count("step 1/1 learner:") == 1


def test_a_bad_config_through_torchrun_is_said_once_not_by_every_rank(tmp_path):
    """Every rank reads the same config: `torchrun --nproc_per_node 2` with a bad field prints its
    config error once (rank 0), and every rank exits 2 before anything runs."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "agentrl.cli", "train",
         str(QUICKSTART), "train.rollout_max_failed=2", f"train.out_dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert out.count("config error:") == 1, out[-3000:]
    assert "train.rollout_max_failed" in out
    assert "exitcode  : 2" in out  # torchrun's summary of the failed ranks
    assert not (tmp_path / "run").exists()
