"""A real two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``), one per test module.

The head has 1 CPU; the second node has 1 CPU and the custom resource ``envnode`` so tests can
pin env actors to it. Only the processes this fixture started are stopped (never ``ray stop``).
"""

from __future__ import annotations

import contextlib
import os

import pytest


@contextlib.contextmanager
def two_node_cluster(head: dict[str, float], node: dict[str, float]):
    """A 1-CPU head with custom resources ``head`` and a 1-CPU node with ``node``, this process
    connected; on exit only what it started is stopped."""
    ray = pytest.importorskip(
        "ray", reason="ray is not installed: pip install 'agentrl[ray]' (CI installs it)"
    )
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, "resources": head}
    )
    cluster.add_node(num_cpus=1, resources=node)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="session")
def cluster_of_two():
    """:func:`two_node_cluster` for a test module's own labels (a fixture: conftest is not imported)."""
    return two_node_cluster


@pytest.fixture(scope="module")
def ray_cluster():
    with two_node_cluster({}, {"envnode": 1}) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def tokenizer():
    from agentrl.rollout.model import load_tokenizer

    return load_tokenizer("smollm2-135m")
