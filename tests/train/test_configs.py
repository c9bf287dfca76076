"""Every file in configs/ parses and validates; bad values fail naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2] / "configs"
STUDIES = sorted((ROOT / "studies").glob("*.yaml"))  # study files (agentrl study), not run configs
CONFIGS = sorted(p for p in ROOT.rglob("*.yaml") if p not in STUDIES)


def test_there_are_configs():
    names = {p.name for p in CONFIGS}
    assert "quickstart.yaml" in names
    assert len(CONFIGS) >= 6


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_parses_and_validates(path):
    config = load_config(path)
    assert config.train.steps > 0
    assert config.train.minibatch_size % config.train.micro_batch_size == 0
    from agentrl.registry import ADVANTAGES, LOSSES

    assert config.algo.advantage in ADVANTAGES and config.algo.loss in LOSSES


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.name)
def test_study_config_builds_every_run(path, tmp_path):
    from agentrl.study.orchestrator import load_study, plan

    study = load_study(path, [f"out_dir={tmp_path}"])
    runs = plan(study)
    # one warm-up per seed plus one run per method and seed, each a validated RunConfig
    assert len(runs) == len(study.seeds) * (1 + len(study.methods))


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("algo.advantage=igpoo", "algo.advantage"),
        ("algo.loss=nope", "algo.loss"),
        ("train.micro_batch_size=3", "train.micro_batch_size"),
        ("algo.old_logprobs=cached", "algo.old_logprobs"),
        ("train.oracle=", "train.oracle"),
        ("train.zero_stage=4", "train.zero_stage"),
    ],
)
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError) as info:
        load_config(CONFIGS[[p.name for p in CONFIGS].index("quickstart.yaml")], [override])
    assert field in str(info.value)


def test_gpu_recipes_use_deepspeed_zero3_and_vllm():
    recipes = [p for p in CONFIGS if p.parent.name == "recipes"]
    assert len(recipes) == 5
    for path in recipes:
        config = load_config(path)
        assert config.train.engine == "deepspeed" and config.train.zero_stage == 3, path.name
        assert config.rollout.backend == "vllm", path.name
        assert config.model.name.startswith("Qwen/Qwen2.5-"), path.name
