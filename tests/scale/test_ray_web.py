"""WebShop under ``env.placement: ray``: env actors browse a shared shop server over real HTTP.

``env.ray_services=node`` runs one shop server per node (a ShopHost actor, 127.0.0.1),
``cluster`` one for the whole cluster on its node's address; either way the episodes are the ones
local placement gives.
"""

from __future__ import annotations

import pytest

from agentrl.envs.web.oracle import WebShopOracle
from tests.scale.test_ray_envs import _canonical, _config

pytestmark = pytest.mark.slow  # a cluster plus a shop server per node on the shared 2-core machine

ENV_ID = "agentrl/WebShop-v0"
ENV_KWARGS = {"split": "test", "n_products": 300, "seed": 4}


def _tasks(n: int) -> list:
    import agentrl

    env = agentrl.make(ENV_ID, **ENV_KWARGS)
    tasks = list(env.unwrapped.load_tasks("test"))[:n]
    env.close()
    return tasks


@pytest.mark.parametrize("services", ["node", "cluster"])
def test_webshop_envs_in_ray_actors_share_the_shop_and_equal_local(ray_cluster, tokenizer, services):
    import agentrl
    from agentrl.cluster.remote_env import RayEnvs, RaySettings
    from agentrl.rollout.runner import RunStats, run_oracle_episodes

    tasks = _tasks(4)
    local = run_oracle_episodes(
        lambda: agentrl.make(ENV_ID, **ENV_KWARGS), tasks, WebShopOracle, tokenizer, _config(), seed=2
    )
    settings = RaySettings(num_cpus_per_env=0.25, envs_per_actor=1, call_timeout_s=60, services=services)
    envs = RayEnvs(ENV_ID, ENV_KWARGS, settings)
    try:
        stats = RunStats()
        remote = run_oracle_episodes(envs, tasks, WebShopOracle, tokenizer, _config(), seed=2, stats=stats)
        urls = {url for a in envs.actors for url in envs.ray.get(a.shop_urls.remote())}
        placed = {envs.ray.get(a.where.remote())["node_id"] for a in envs.actors}
        shops = [envs.ray.get(s.where.remote()) for s in envs.services.shops.values()]
    finally:
        envs.shutdown()
    assert stats.failed == 0 and [e.outcome for e in local] == [e.outcome for e in remote]
    assert sum(e.outcome for e in local) >= 3  # the oracle buys the right product
    assert [_canonical(e) for e in remote] == [_canonical(e) for e in local]
    assert len(placed) == 2
    # the shop runs in its own actor's process, never in an env actor, and the envs browse its URL
    assert len(shops) == (2 if services == "node" else 1), shops
    assert urls == {s["url"] for s in shops}, (urls, shops)
    hosts = {s["url"].split("//")[1].split(":")[0] for s in shops}
    assert hosts == {"127.0.0.1"} if services == "node" else "127.0.0.1" not in hosts, hosts
