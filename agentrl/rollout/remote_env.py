"""Moved to :mod:`agentrl.cluster.remote_env` (issue #45: cluster placement has its own package).

Kept only for ``benchmarks/bench_ray.py``, which imports these two names from here; delete this
module once it imports them from ``agentrl.cluster.remote_env``."""

from agentrl.cluster.remote_env import RayEnvs as RayEnvs
from agentrl.cluster.remote_env import RaySettings as RaySettings
