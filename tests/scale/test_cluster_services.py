"""The shared services a Ray env actor gets come from what its env declares (``TextEnv.shared_services``),
not from its constructor's parameters. No Ray needed: this is the driver's reading of the declarations."""

from __future__ import annotations

import pytest

from agentrl.cluster.services import SERVICES, env_needs
from agentrl.env import TextEnv, register
from agentrl.errors import EnvError


def test_every_registered_env_declares_known_services_and_gets_them():
    import gymnasium as gym

    import agentrl
    from agentrl.registry import load_entry_point

    for env_id in agentrl.registered_ids():
        declared = load_entry_point(gym.spec(env_id).kwargs["entry_point"]).shared_services
        assert set(declared) <= set(SERVICES), (env_id, declared)
        needs = env_needs(env_id, {})
        assert needs["sandbox_pool"] == ("sandbox_pool" in declared), env_id
        assert (needs["shop"] is not None) == ("shop" in declared), env_id


def test_the_envs_that_share_services():
    for env_id in ("agentrl/Code-v0", "agentrl/SQL-v0", "agentrl/GAIA-v0"):
        assert env_needs(env_id, {}) == {"sandbox_pool": True, "shop": None}
    assert env_needs("agentrl/Search-v0", {}) == {"sandbox_pool": False, "shop": None}
    shop = env_needs("agentrl/WebShop-v0", {"seed": 3, "backend": "docker", "max_turns": 4})["shop"]
    assert shop == {"seed": 3, "n_products": 1500, "backend": "docker"}  # the shop's settings only
    # a shop given by URL is used as it is: no shared server
    assert env_needs("agentrl/WebShop-v0", {"server_url": "http://127.0.0.1:1"})["shop"] is None
    assert env_needs(lambda: None, {}) == {"sandbox_pool": False, "shop": None}  # a factory: none


class _Misdeclared(TextEnv):
    shared_services = ("sandbox",)


def test_an_unknown_declared_service_is_refused_by_name():
    import gymnasium as gym

    from agentrl.env import ENV_DESCRIPTIONS

    register("test/Misdeclared-v0", f"{__name__}:_Misdeclared", description="a typo", max_turns=2)
    try:
        with pytest.raises(
            EnvError, match=r"_Misdeclared.shared_services names \['sandbox'\].*sandbox_pool, shop"
        ):
            env_needs("test/Misdeclared-v0", {})
    finally:  # other tests list the registered ids
        gym.registry.pop("test/Misdeclared-v0")
        ENV_DESCRIPTIONS.pop("test/Misdeclared-v0")
