"""Same seed, same run: `agentrl train` in separate processes gives bit-identical weights, metrics and
episodes (``train.deterministic=true``), and a run killed with SIGKILL after a checkpoint and resumed
ends where an uninterrupted run ends. The runs use a tiny random model, a critic and GAE, so every
step makes a real update (non-zero advantages and gradients) although the tiny model never solves a
task."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from agentrl.rollout.generators.base import derive_seed

STEPS = 3
CONFIG = {
    "env": {"id": "agentrl/Search-v0", "max_turns": 2, "max_obs_chars": 300, "kwargs": {"hops": "single"}},
    "rollout": {"group_size": 2, "tasks_per_step": 2, "max_new_tokens": 8, "concurrency": 4,
                "max_context_tokens": 1024, "temperature": 1.0},
    "algo": {"advantage": "gae", "critic": True, "entropy_coef": 0.01},
    "train": {"lr": 1e-3, "minibatch_size": 2, "micro_batch_size": 1, "eval_episodes": 1, "num_threads": 1,
              "seed": 3, "steps": STEPS, "save_every": 1, "save_episodes": True, "deterministic": True},
}  # fmt: skip
# wall-clock measurements: the only metrics allowed to differ between two runs of one config
TIMINGS = ("perf/", "rollout/episodes_per_s", "rollout/turns_per_s", "rollout/tokens_per_s",
           "rollout/generator_idle_share")  # fmt: skip


@pytest.fixture(scope="module")
def run_config(tmp_path_factory) -> Path:
    from agentrl.rollout.model import load_tokenizer, tiny_model

    root = tmp_path_factory.mktemp("repro")
    tokenizer = load_tokenizer("smollm2-135m")
    tiny_model(tokenizer, layers=1, hidden=32, seed=0).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump({"model": {"name": str(root / "model")}, **CONFIG}))
    return path


def _command(config: Path, out_dir: Path, *overrides: str) -> list[str]:
    script = Path(sys.executable).with_name("agentrl")
    head = [str(script)] if script.exists() else [sys.executable, "-m", "agentrl.cli"]
    return [*head, "train", str(config), f"train.out_dir={out_dir}", *overrides]


def _env(hash_seed: int) -> dict[str, str]:
    # a different string-hash seed per process: no result may depend on set/dict order of strings
    return {**os.environ, "PYTHONHASHSEED": str(hash_seed), "HF_HUB_OFFLINE": "1", "COLUMNS": "1000"}


def _train(config: Path, out_dir: Path, hash_seed: int, *overrides: str) -> str:
    done = subprocess.run(_command(config, out_dir, *overrides), env=_env(hash_seed), capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def _weights(out_dir: Path) -> dict[str, torch.Tensor]:
    path = out_dir / "checkpoints" / f"step-{STEPS:06d}" / "engine.pt"
    return torch.load(path, weights_only=False)["policy"]


def _metrics(out_dir: Path) -> list[dict[str, float]]:
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(TIMINGS)} for r in records]


def _episodes(out_dir: Path) -> list[dict]:
    """Every saved training episode, wall-clock timings removed."""
    out = []
    for path in sorted((out_dir / "episodes").glob("step-*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            record.pop("timings")
            for segment in record["segments"]:
                for turn in segment["turns"]:
                    turn.pop("timings")
            out.append(record)
    return out


def _assert_same_run(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key
    assert _metrics(a) == _metrics(b)
    assert _episodes(a) == _episodes(b)


def _assert_real_updates(out_dir: Path, steps: range) -> None:
    """Every compared step trained on episodes with non-zero advantages and moved the weights."""
    by_step = {r["step"]: r for r in _metrics(out_dir) if "loss/grad_norm" in r}
    for step in steps:
        record = by_step[step]
        assert record["rollout/failed"] == 0, record
        assert record["rollout/advantage_abs"] > 0 and record["loss/grad_norm"] > 0, record
    assert len(_episodes(out_dir)) == STEPS * 4


@pytest.mark.slow
def test_same_config_twice_gives_identical_weights_metrics_and_episodes(run_config, tmp_path):
    _train(run_config, tmp_path / "a", hash_seed=1)
    _train(run_config, tmp_path / "b", hash_seed=2)
    _assert_real_updates(tmp_path / "a", range(1, STEPS + 1))
    _assert_same_run(tmp_path / "a", tmp_path / "b")
    # the episodes do not depend on how many run at once (one stream per episode, not per batch),
    # nor on lockstep batching: the same tokens, observations and rewards; the sampler's log-probs
    # and entropies come from batches of other shapes, so they match to float rounding (the learner
    # recomputes its own, so the weights stay bit-identical)
    _train(run_config, tmp_path / "c", 3, "rollout.concurrency=1", "train.deterministic=false")
    sampler_floats = ("output_logprobs", "output_entropy")
    exact, alone = _episodes(tmp_path / "a"), _episodes(tmp_path / "c")
    for ep_a, ep_c in zip(exact, alone, strict=True):
        for seg_a, seg_c in zip(ep_a["segments"], ep_c["segments"], strict=True):
            for turn_a, turn_c in zip(seg_a["turns"], seg_c["turns"], strict=True):
                for key in sampler_floats:
                    assert turn_c.pop(key) == pytest.approx(turn_a.pop(key), abs=1e-4)
    assert exact == alone
    wa, wc = _weights(tmp_path / "a"), _weights(tmp_path / "c")
    assert all(torch.equal(wa[k], wc[k]) for k in wa)


@pytest.mark.slow
def test_the_same_seed_gives_the_same_run_without_train_deterministic(run_config, tmp_path):
    """The default: no strict torch algorithms, but lock-step decode batches (the in-process
    generator's batches do not depend on timing), so two runs of one config still match bit for bit."""
    _train(run_config, tmp_path / "a", 1, "train.deterministic=false")
    _train(run_config, tmp_path / "b", 2, "train.deterministic=false")
    _assert_real_updates(tmp_path / "a", range(1, STEPS + 1))
    _assert_same_run(tmp_path / "a", tmp_path / "b")
    assert all(r.get("rollout/lockstep_cut", 0) == 0 for r in _metrics(tmp_path / "a"))


@pytest.mark.slow
def test_sigkill_after_a_checkpoint_then_resume_equals_uninterrupted(run_config, tmp_path):
    _train(run_config, tmp_path / "straight", hash_seed=1)
    out = tmp_path / "killed"
    latest = out / "checkpoints" / "latest"
    proc = subprocess.Popen(_command(run_config, out), env=_env(2), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not (latest.exists() and latest.read_text() == "step-000001"):
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 10 minutes"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)  # mid step 2: no clean shutdown, no final save
    finally:
        proc.kill()
        proc.wait()
    resumed_from = (out / "checkpoints" / "latest").read_text()
    assert resumed_from in ("step-000001", "step-000002"), "the kill came too late to test a resume"
    log = _train(run_config, out, hash_seed=3)
    assert f"(step {int(resumed_from[-6:])})" in log  # it resumed rather than starting over
    _assert_real_updates(out, range(int(resumed_from[-6:]) + 1, STEPS + 1))
    _assert_same_run(tmp_path / "straight", out)


def test_episode_seeds_do_not_depend_on_the_process():
    """``derive_seed`` hashes its parts itself: the same in processes with different hash seeds."""
    code = "from agentrl.rollout.generators.base import derive_seed; print(derive_seed(3, 'rollout', 7, 'task-1'))"
    seeds = {
        subprocess.run([sys.executable, "-c", code], env=_env(h), capture_output=True, text=True,
                       check=True).stdout.strip()
        for h in (1, 2)
    }  # fmt: skip
    assert seeds == {str(derive_seed(3, "rollout", 7, "task-1"))}
    assert derive_seed(3, "rollout", 1) != derive_seed(3, "rollout", 2)
    # no aliasing of (step 1, sample 0) with (step 0, sample 1), as seed + step + index had
    assert derive_seed(3, "rollout", 1, 0) != derive_seed(3, "rollout", 0, 1)


# --------------------------------------------------------------------------- in process, fast
@pytest.fixture(scope="module")
def tiny_generator():
    from agentrl.rollout.generators.hf import HFGenerator
    from agentrl.rollout.model import load_tokenizer, tiny_model

    tokenizer = load_tokenizer("smollm2-135m")
    return HFGenerator(tiny_model(tokenizer, layers=1, hidden=32, seed=0), tokenizer, max_batch_size=2)


def test_a_seeded_row_samples_the_same_in_any_batch(tiny_generator):
    from agentrl.rollout.generators.base import SamplingParams

    tok = tiny_generator.tokenizer
    prompts = [tok.encode(t, add_special_tokens=False) for t in ("alpha beta", "a longer prompt here", "x")]
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0)
    together = tiny_generator.generate(prompts, sampling, seeds=[11, 12, 13])  # batches of 2: split
    alone = [
        tiny_generator.generate([p], sampling, seeds=[s])[0]
        for p, s in zip(prompts, (11, 12, 13), strict=True)
    ]
    reordered = tiny_generator.generate(prompts[::-1], sampling, seeds=[13, 12, 11])[::-1]
    for a, b, c in zip(together, alone, reordered, strict=True):
        assert a.ids == b.ids == c.ids and len(a.ids) > 0
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert len({tuple(o.ids) for o in together}) == 3
    other = tiny_generator.generate(prompts[:1], sampling, seeds=[99])[0]
    assert other.ids != together[0].ids  # another seed, another sample


def test_runner_episodes_do_not_depend_on_concurrency(tiny_generator):
    """8 episodes (4 tasks x 2 samples) at concurrency 1 and 8: the same tokens and observations."""
    from agentrl.rollout.runner import run_episodes
    from agentrl.rollout.settings import RolloutConfig

    def run(concurrency: int) -> list:
        config = RolloutConfig(
            max_new_tokens=8, max_turns=2, temperature=1.0, max_context_tokens=1024, concurrency=concurrency,
            group_size=2,
        )  # fmt: skip
        return run_episodes(
            "agentrl/Search-v0", [None] * 4, tiny_generator, tiny_generator.tokenizer, config, seed=5,
            env_kwargs={"max_turns": 2, "hops": "single"},
        )  # fmt: skip

    one, eight = run(1), run(8)
    assert all(not ep.failed for ep in one + eight)
    for a, b in zip(one, eight, strict=True):
        assert (a.episode_id, a.task_id, a.outcome) == (b.episode_id, b.task_id, b.outcome)
        assert [seg.token_ids() for seg in a.segments] == [seg.token_ids() for seg in b.segments]
        for ta, tb in zip(a.turns, b.turns, strict=True):
            assert ta.output_logprobs == pytest.approx(tb.output_logprobs, abs=1e-4)
    samples = [tuple(ep.turns[0].output_ids) for ep in one]
    assert len(set(samples)) == len(samples)  # group members are distinct samples, not copies


def test_latest_checkpoint_survives_a_kill_between_rename_and_marker(tmp_path):
    from train_helpers import tiny_lm

    from agentrl.train.checkpoint import latest_checkpoint, save_checkpoint
    from agentrl.train.engines import TorchEngine
    from agentrl.train.learner import Policy

    engine = TorchEngine(Policy(tiny_lm()), lr=1e-3)
    save_checkpoint(tmp_path, 1, engine, {})
    save_checkpoint(tmp_path, 2, engine, {})
    root = tmp_path / "checkpoints"
    (root / "latest").write_text("step-000003")  # marker written, folder not (or removed) yet
    assert latest_checkpoint(tmp_path) == root / "step-000002"
    (root / "latest").unlink()
    assert latest_checkpoint(tmp_path) == root / "step-000002"
    assert latest_checkpoint(tmp_path / "nothing") is None


def test_a_metrics_line_torn_by_a_kill_is_dropped_on_resume(tmp_path):
    from agentrl.train.metrics import MetricsLogger

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "env/reward": 0.5}\n{"step": 2, "env/rew')
    logger = MetricsLogger(tmp_path, resume=True, tensorboard=False)
    assert logger.history == [{"step": 1, "env/reward": 0.5}]
    logger.truncate(1)
    logger.log(2, {"env/reward": 0.25})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
