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
    from agentrl.cluster.remote_env import RaySettings

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


def _nodes(*cpus: float, **resources: float) -> list[dict]:
    return [{"Alive": True, "Resources": {"CPU": c, **(resources if i == len(cpus) - 1 else {})}}
            for i, c in enumerate(cpus)]  # fmt: skip


def test_placement_fits_the_cluster_before_any_actor_is_created():
    """`--ray local` on 2 cores with 4 episodes at once: 1 CPU per env cannot place them all, so the
    default is lowered to what fits; a value the user set is refused at once, naming what fits."""
    from agentrl.errors import ConfigError
    from agentrl.cluster.remote_env import RaySettings, fit_placement

    kept, line = fit_placement(_nodes(2), RaySettings(), concurrency=2)
    assert kept.num_cpus_per_env == 1.0 and "they fit" in line
    fitted, line = fit_placement(_nodes(2), RaySettings(), concurrency=4)
    assert fitted.num_cpus_per_env == 0.5 and "lowered to 0.5" in line
    fitted, _ = fit_placement(_nodes(1, 1), RaySettings(envs_per_actor=2), concurrency=6)
    assert fitted.num_cpus_per_env == 0.25  # 3 actors of 2 envs on two 1-CPU nodes: half a CPU an actor
    with pytest.raises(ConfigError, match=r"room for 2 episode\(s\).*at most 2 at once.*num_cpus_per_env=0.5"):
        fit_placement(_nodes(2), RaySettings(fit=False), concurrency=4)
    with pytest.raises(ConfigError, match="no node of the Ray cluster has 1 'gpu_box'.*envnode"):
        fit_placement(_nodes(1, 1, envnode=1), RaySettings(resources={"gpu_box": 1}), concurrency=1)
    # pinned to the one node with the resource: only its CPU counts
    fitted, _ = fit_placement(_nodes(4, 1, envnode=1), RaySettings(resources={"envnode": 1}), concurrency=4)
    assert fitted.num_cpus_per_env == 0.25
