"""Config: YAML + dotted overrides, validation that names the field and the fix."""

from __future__ import annotations

import pytest

from agentrl.config import RunConfig, help_text, load_config, parse_overrides
from agentrl.errors import ConfigError


def test_defaults_and_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  lr: 3.0e-5\n  steps: 7\nalgo:\n  advantage: igpo\n")
    config = load_config(path, ["train.steps=9", "rollout.group_size=8", "model.lora_targets=[q_proj]"], validate=False)
    assert isinstance(config, RunConfig)
    assert (config.train.lr, config.train.steps, config.rollout.group_size) == (3e-5, 9, 8)
    assert config.algo.advantage == "igpo" and config.model.lora_targets == ("q_proj",)


def test_overrides_parse_yaml_scalars():
    assert parse_overrides(["a.b=1", "a.c=true", "d=x y", "e.f=1e-3"]) == {"a": {"b": 1, "c": True}, "d": "x y", "e": {"f": 1e-3}}


def test_a_mapping_given_to_a_field_replaces_it_a_section_mapping_merges(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("env:\n  kwargs: {hops: single, level: 1}\ntrain:\n  lr: 3.0e-5\n")
    # dotted keys change one entry; a mapping given to the field is the whole new value
    one_key = load_config(path, ["env.kwargs.hops=multi"], validate=False).env.kwargs
    assert one_key == {"hops": "multi", "level": 1}
    assert load_config(path, ["env.kwargs={}"], validate=False).env.kwargs == {}
    assert load_config(path, ["env.kwargs={level: 2}"], validate=False).env.kwargs == {"level": 2}
    # a section given as a mapping merges: the file's lr stays
    train = load_config(path, ["train={steps: 3}"], validate=False).train
    assert (train.steps, train.lr) == (3, 3e-5)


@pytest.mark.parametrize(
    "override, field, fix",
    [
        ("train.lrr=1", "train.lrr", "did you mean 'train.lr'?"),
        ("train.lr=abc", "train.lr", None),
        ("rollout.backend=foo", "rollout.backend", "use one of: hf, vllm, openai"),
        ("train.micro_batch_size=3", "train.micro_batch_size", "pick a divisor of minibatch_size"),
        ("algo.ratio=chunk", "algo.ratio", "use one of: token, turn, sequence"),
        ("rollout.backend=openai", "rollout.base_url", "set rollout.base_url=http://HOST:PORT/v1"),
        ("env.id=agentrl/Nope-v0", "env.id", None),
        ("train.sft_fold_share=1.5", "train.sft_fold_share", "must be in [0, 1]"),
        ("train.sft_fold_share=0.5", "train.fold_oracle", "FoldingSearchOracle"),
        ("rollout.prefix_cache_tokens=-1", "rollout.prefix_cache_tokens", "(0 = off)"),
        ("rollout.sampler_dtype=float16", "rollout.sampler_dtype", "bfloat16"),
        ("train.eval_temperature=-0.5", "train.eval_temperature", "use 0 for greedy held-out evals"),
    ],
)
def test_bad_values_name_the_field_and_the_fix(override, field, fix):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert info.value.field == field
    if fix:
        assert fix in str(info.value)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")


def test_every_field_has_help_text():
    rows = help_text()
    assert rows and all(text for _, _, text in rows), [name for name, _, text in rows if not text]


def test_a_prefix_cache_budget_for_a_server_backend_is_refused():
    overrides = ["rollout.backend=openai", "rollout.base_url=http://127.0.0.1:9/v1", "rollout.prefix_cache_tokens=4096"]
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert info.value.field == "rollout.prefix_cache_tokens" and "only with backend=hf" in str(info.value)
    assert load_config(None, overrides[:2]).rollout.prefix_cache_tokens is None


def test_a_sampler_dtype_for_a_server_backend_is_refused():
    overrides = ["rollout.backend=openai", "rollout.base_url=http://127.0.0.1:9/v1", "rollout.sampler_dtype=bfloat16"]
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert info.value.field == "rollout.sampler_dtype" and "only with backend=hf" in str(info.value)
    assert load_config(None, overrides[:2]).rollout.sampler_dtype == "model"


@pytest.mark.parametrize("field", ["rollout.sampler_dtype", "train.eval_sampler_dtype"])
def test_a_bfloat16_sampling_copy_under_zero3_is_refused_before_the_run(field):
    """ZeRO-3 partitions the weights; a bfloat16 copy of the partitioned model crashed every episode."""
    zero3 = ["train.engine=deepspeed", "train.zero_stage=3"]
    with pytest.raises(ConfigError) as info:
        load_config(None, [*zero3, f"{field}=bfloat16"])
    assert info.value.field == field and "ZeRO-3 partitions the weights" in str(info.value)
    assert f"leave {field}=model (or auto)" in str(info.value)
    load_config(None, [*zero3, f"{field}=auto"])  # auto resolves to the live model at the start (said there)
    load_config(None, ["train.engine=deepspeed", "train.zero_stage=2", f"{field}=bfloat16"])  # ZeRO-2: full weights


def test_an_eval_sampler_dtype_that_cannot_apply_is_refused():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["train.eval_sampler_dtype=bf16"])
    assert info.value.field == "train.eval_sampler_dtype" and "auto" in str(info.value)
    server = ["rollout.backend=openai", "rollout.base_url=http://127.0.0.1:9/v1", "train.eval_sampler_dtype=bfloat16"]
    with pytest.raises(ConfigError) as info:
        load_config(None, server)
    assert info.value.field == "train.eval_sampler_dtype" and "only with rollout.backend=hf" in str(info.value)
    assert load_config(None, [*server[:2], "train.eval_sampler_dtype=auto"]).train.eval_sampler_dtype == "auto"


def test_every_setting_is_classified_as_shaping_the_held_out_eval_or_not():
    """A new setting fails here until it is declared with ``setting(default, eval=...)``: True (arms
    that differ in it evaluate themselves), WHEN_SAMPLED, or why it does not shape the eval
    (``agentrl.setting``); a forgotten one would let a study arm take a held-out eval it would not
    have produced. EVAL_SETTINGS / NOT_EVAL_SETTINGS are read from those declarations."""
    import dataclasses

    from agentrl.config import EVAL_SETTINGS, NOT_EVAL_SETTINGS

    config = RunConfig()
    every = {f"{section}.{f.name}" for section in ("model", "env", "rollout", "algo", "train")
             for f in dataclasses.fields(getattr(config, section))}  # fmt: skip
    assert not set(EVAL_SETTINGS) & set(NOT_EVAL_SETTINGS)
    assert every - set(EVAL_SETTINGS) - set(NOT_EVAL_SETTINGS) == set()
    assert set(EVAL_SETTINGS) | set(NOT_EVAL_SETTINGS) == every  # no stale name either


def test_sampling_filters_matter_to_a_sampled_eval_only():
    from agentrl.config import eval_differences

    greedy = RunConfig()
    filtered = load_config(None, ["rollout.top_p=0.9", "rollout.top_k=20"], validate=False)
    assert eval_differences(greedy, filtered) == []  # train.eval_temperature 0: argmax, filters unused
    sampled = load_config(None, ["train.eval_temperature=0.7"], validate=False)
    sampled_filtered = load_config(None, ["train.eval_temperature=0.7", "rollout.top_p=0.9"], validate=False)
    assert eval_differences(sampled, sampled_filtered) == ["rollout.top_p: 1.0 -> 0.9"]
    served = load_config(None, ["rollout.base_url=http://a:8000/v1"], validate=False)
    assert eval_differences(greedy, served) == ["rollout.base_url: None -> 'http://a:8000/v1'"]
