"""Validation of the env section's placement fields (no cluster needed)."""

from __future__ import annotations

import pytest

from agentrl.config import load_config
from agentrl.errors import ConfigError


@pytest.mark.parametrize(
    ("overrides", "field", "fix"),
    [
        (["env.placement=cloud"], "env.placement", "use local or ray"),
        (["env.ray_address=auto"], "env.ray_address", "set env.placement=ray"),
        (["env.envs_per_actor=4"], "env.envs_per_actor", "set env.placement=ray"),
        (["env.ray_services=cluster"], "env.ray_services", "set env.placement=ray"),
    ],
)
def test_bad_placement_settings_name_the_field_and_the_fix(overrides, field, fix):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert err.value.field == field and fix in str(err.value)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("env.envs_per_actor=0", "env.envs_per_actor"),
        ("env.num_cpus_per_env=-1", "env.num_cpus_per_env"),
        ("env.ray_call_timeout_s=0", "env.ray_call_timeout_s"),
        ("env.ray_start_timeout_s=0", "env.ray_start_timeout_s"),
        ("env.ray_lost_retries=-1", "env.ray_lost_retries"),
        ("env.ray_resources={envnode: 0}", "env.ray_resources.envnode"),
        ("env.ray_services=rack", "env.ray_services"),
    ],
)
def test_bad_ray_values_are_refused(override, field):
    pytest.importorskip("ray", reason="ray is not installed: pip install 'agentrl[ray]' (CI installs it)")
    with pytest.raises(ConfigError) as err:
        load_config(None, ["env.placement=ray", override])
    assert err.value.field == field


def test_ray_settings_are_kept_as_given():
    pytest.importorskip("ray", reason="ray is not installed: pip install 'agentrl[ray]' (CI installs it)")
    from agentrl.rollout.remote_env import RaySettings

    config = load_config(
        None,
        [
            "env.placement=ray",
            "env.ray_address=auto",
            "env.envs_per_actor=3",
            "env.ray_resources={envnode: 1}",
            "env.ray_services=cluster",
            "env.ray_start_timeout_s=45",
        ],
    )
    assert RaySettings.from_env(config.env) == RaySettings(
        address="auto", envs_per_actor=3, resources={"envnode": 1.0}, services="cluster", start_timeout_s=45.0
    )
