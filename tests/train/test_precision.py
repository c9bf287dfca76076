"""train.bf16_autocast: auto -> a measured decision (agentrl.train.precision)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.train.precision import MIN_GAIN, SLOW_RATIO, Timing, cpu_name, decide, probe_bf16, resolve_bf16

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"


def test_no_fast_bf16_kernels_is_decided_on_the_tiny_pass_alone():
    bf16, reason = decide([Timing(1, 32, fp32_s=0.020, bf16_s=0.190)])  # an AVX2-only CPU
    assert bf16 is False and "9.5x slower" in reason and "no fast bf16 kernels on this CPU" in reason
    assert "on this GPU" in decide([Timing(1, 32, fp32_s=0.020, bf16_s=0.190)], on_gpu=True)[1]


def test_bf16_that_raises_means_float32():
    bf16, reason = decide([Timing(1, 32, fp32_s=0.020, bf16_s=None)])
    assert bf16 is False and "not supported" in reason


def test_bf16_is_chosen_only_when_clearly_faster_at_the_learner_shape():
    tiny = Timing(1, 32, fp32_s=0.010, bf16_s=0.012)  # overheads: a tiny pass cannot decide
    assert decide([tiny, Timing(4, 128, fp32_s=0.100, bf16_s=0.057)]) == (
        True,
        "bf16 1.75x faster than float32",
    )
    bf16, reason = decide([tiny, Timing(4, 128, fp32_s=0.100, bf16_s=0.100 / MIN_GAIN * 1.01)])
    assert bf16 is False and f"needs {MIN_GAIN:.2f}x" in reason
    with pytest.raises(ValueError, match="stage-2"):
        decide([tiny])  # stage 1 passed: the rule needs the learner-shape timing
    assert decide([Timing(1, 32, 0.010, 0.010 * SLOW_RATIO * 1.01)])[0] is False


def test_true_and_false_force_without_probing():
    for setting in (True, False):
        decision = resolve_bf16(setting, model=None)  # type: ignore[arg-type]  (never touched)
        assert decision.bf16 is setting and decision.source == "config" and decision.timings == ()
    with pytest.raises(ValueError, match="true, false or auto"):
        resolve_bf16("sometimes", model=None)  # type: ignore[arg-type]


def test_the_probe_times_a_real_block_and_leaves_the_model_as_it_was():
    from agentrl.rollout.model import load_tokenizer, tiny_model

    model = tiny_model(load_tokenizer("smollm2-135m"), layers=1, hidden=32, seed=0)
    model.model.layers[0].mlp.requires_grad_(False)
    flags = [p.requires_grad for p in model.parameters()]
    before = [p.detach().clone() for p in model.parameters()]
    rng = torch.get_rng_state()
    threads = torch.get_num_threads()
    decision = probe_bf16(model, rows=2)
    assert decision.source == "probe" and decision.timings and decision.timings[0].fp32_s > 0
    assert decision.bf16 == decide(list(decision.timings))[0]
    assert "fp32" in decision.line() and decision.line().startswith("precision: train.bf16_autocast=")
    assert decision.as_dict()["timings"][0]["tokens"] == 32
    assert decision.device == "" and f"(probe on {cpu_name()}:" in decision.line()  # timed on the CPU
    assert [p.requires_grad for p in model.parameters()] == flags
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b.detach()) for a, b in zip(before, model.parameters(), strict=True))
    assert torch.equal(torch.get_rng_state(), rng) and torch.get_num_threads() == threads


def test_config_default_is_auto_and_bad_values_name_the_field():
    assert load_config(None).train.bf16_autocast == "auto"
    assert load_config(QUICKSTART).train.bf16_autocast == "auto"
    assert load_config(None, ["train.bf16_autocast=true"]).train.bf16_autocast is True
    with pytest.raises(ConfigError, match="train.bf16_autocast") as err:
        load_config(None, ["train.bf16_autocast=fast"])
    assert "auto" in str(err.value) and "true" in str(err.value)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_probe_times_the_gpu_and_says_so():
    """An H200 run printed 'probe on Intel(R) Xeon(R) Processor' for timings taken on the GPU."""
    from agentrl.rollout.model import load_tokenizer, tiny_model

    model = tiny_model(load_tokenizer("smollm2-135m"), layers=1, hidden=32, seed=0).cuda()
    decision = probe_bf16(model, rows=2)
    name = torch.cuda.get_device_name()
    assert decision.device == name and f"(probe on {name}:" in decision.line()
    assert decision.as_dict()["device"] == name and decision.as_dict()["cpu"] == cpu_name()


@pytest.mark.parametrize("saved", [True, False])
def test_a_resumed_auto_run_keeps_the_decision_saved_at_its_start_without_probing(tmp_path, saved):
    (tmp_path / "resolved_config.yaml").write_text(f"train:\n  bf16_autocast: {str(saved).lower()}\n")
    # model=None: a probe would have to touch it, so reaching the model would raise
    decision = resolve_bf16("auto", model=None, resumed_from=tmp_path)  # type: ignore[arg-type]
    assert (decision.bf16, decision.source, decision.timings) == (saved, "resumed", ())
    assert f"read from {tmp_path / 'resolved_config.yaml'}" in decision.line()
    assert decision.line().startswith(f"precision: train.bf16_autocast={str(saved).lower()} (resumed")
    # a forced setting is still the config's, resumed or not
    assert resolve_bf16(not saved, model=None, resumed_from=tmp_path).bf16 is (not saved)  # type: ignore[arg-type]


def test_a_resumed_run_without_a_saved_decision_probes(tmp_path):
    from agentrl.rollout.model import load_tokenizer, tiny_model
    from agentrl.train.precision import resumed_bf16

    assert resumed_bf16("auto", tmp_path, model=None) is None  # type: ignore[arg-type]  (no file)
    (tmp_path / "resolved_config.yaml").write_text("train:\n  bf16_autocast: auto\n")  # never resolved
    assert resumed_bf16("auto", tmp_path, model=None) is None  # type: ignore[arg-type]
    model = tiny_model(load_tokenizer("smollm2-135m"), layers=1, hidden=32, seed=0)
    assert resolve_bf16("auto", model, resumed_from=tmp_path).source == "probe"
