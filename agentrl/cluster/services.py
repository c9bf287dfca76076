"""Shared tool services for Ray env actors: one sandbox pool per node, shop servers per node or cluster.

With ``env.placement: ray`` the env actors of one node would each start their own sandbox pool and
their own web-shop server. ``env.ray_services`` shares them instead:

* ``node`` (default): one :class:`SandboxPoolHost` actor per node holds that node's sandbox pools
  (with the env's pool size and limits: ``pool_size`` is per node) and one :class:`ShopHost` actor
  per node runs the shop server on 127.0.0.1; the node's env actors lease boxes from the pool host
  and browse the shop over HTTP.
* ``cluster``: as ``node``, except that one shop server serves the whole cluster, listening on its
  node's address (sandbox pools stay per node: a box lives on the machine whose engine runs it).
* ``actor``: every env actor keeps its own pool and server (the layout before services existed).

Which services an env needs, it declares (:attr:`agentrl.env.TextEnv.shared_services`, one of
:data:`SERVICES` each): ``sandbox_pool`` (code, SQL, GAIA: its tools lease boxes through
``tools.python.shared_pool``) or ``shop`` (the web shop: it takes ``server_url``, and its ``seed``,
``n_products``, ``data_dir`` and ``backend`` kwargs configure the shared server; a ``server_url``
given keeps the env on that shop). Nothing here reads an env's constructor.

Service actors take no CPU, are pinned to their node, are owned by the driver's
:class:`~agentrl.cluster.remote_env.RayEnvs` pool (they end with it) and start when the first env
actor of their node does. A box leased by an actor that dies goes back to its node's pool (scrubbed
like any other).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from agentrl.errors import ConfigError, EnvError, SandboxError, SandboxLost

log = logging.getLogger("agentrl.rollout")

SCOPES = ("node", "cluster", "actor")
SERVICES = ("sandbox_pool", "shop")  # what an env may declare in TextEnv.shared_services
SHOP_SETTINGS = ("seed", "n_products", "data_dir", "backend")  # a shop env's kwargs the shared server takes
SANDBOX_METHODS = ("exec", "run_python", "put_file", "get_file", "inspect", "ping")
SERVICE_CONCURRENCY = 256  # blocking sandbox calls of every env on the node run side by side


def env_needs(env: str | Callable[[], Any], env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The shared services an env id needs: ``{"sandbox_pool": bool, "shop": settings or None}``, from
    what its class declares (:attr:`agentrl.env.TextEnv.shared_services`).

    A factory (not a registered id) gets none: its envs keep their own pools and servers.
    """
    if not isinstance(env, str):
        return {"sandbox_pool": False, "shop": None}
    import gymnasium as gym

    import agentrl.envs  # noqa: F401  (registers the ids)
    from agentrl.registry import load_entry_point

    spec = gym.spec(env)
    defaults = {**spec.kwargs, **env_kwargs}
    cls = load_entry_point(spec.kwargs["entry_point"])
    declared = tuple(getattr(cls, "shared_services", ()))
    unknown = [name for name in declared if name not in SERVICES]
    if unknown:
        raise EnvError(f"{cls.__name__}.shared_services names {unknown}, not a shared service "
                       f"(one of {', '.join(SERVICES)})")  # fmt: skip
    shop = None
    if "shop" in declared and not defaults.get("server_url"):
        shop = {k: defaults[k] for k in SHOP_SETTINGS if k in defaults}
    return {"sandbox_pool": "sandbox_pool" in declared, "shop": shop}


# ---------------------------------------------------------------------------------- actor bodies
def _where() -> dict[str, Any]:
    import ray

    context = ray.get_runtime_context()
    return {"pid": os.getpid(), "node_id": context.get_node_id()}


class SandboxPoolHost:
    """Actor body: the sandbox pools of one node (``tools.python.shared_pool``) and their leases."""

    def __init__(self) -> None:
        self.leases: dict[int, tuple[contextlib.ExitStack, Any, str]] = {}
        self.ids = itertools.count(1)
        self.lock = threading.Lock()

    def where(self) -> dict[str, Any]:
        return _where()

    def lease(
        self, backend: str, size: int, limits: dict[str, Any], timeout: float | None, owner: str
    ) -> tuple[str, Any]:
        from agentrl.tools.python import shared_pool

        try:
            pool = shared_pool(backend, size, **limits)
            stack = contextlib.ExitStack()
            sandbox = stack.enter_context(pool.lease(timeout=timeout))
        except SandboxError as exc:
            return "error", (type(exc).__name__, str(exc))
        with self.lock:
            lease_id = next(self.ids)
            self.leases[lease_id] = (stack, sandbox, owner)
        return "ok", (lease_id, sandbox.generation)

    def call(self, lease_id: int, method: str, args: tuple, kwargs: dict[str, Any]) -> tuple[str, Any, int]:
        if method not in SANDBOX_METHODS:
            raise SandboxError(f"sandbox method {method!r} is not served (one of {SANDBOX_METHODS})")
        with self.lock:
            entry = self.leases.get(lease_id)
        if entry is None:
            return "error", ("SandboxError", f"sandbox lease {lease_id} is not held"), 0
        sandbox = entry[1]
        try:
            value = getattr(sandbox, method)(*args, **kwargs)
        except SandboxError as exc:
            return "error", (type(exc).__name__, str(exc)), sandbox.generation
        return "ok", value, sandbox.generation

    def release(self, lease_id: int) -> None:
        with self.lock:
            entry = self.leases.pop(lease_id, None)
        if entry is not None:
            entry[0].close()  # back to the pool, which scrubs or replaces it in the background

    def release_owner(self, owner: str) -> int:
        """Give back every box an env actor that died still held; returns how many."""
        with self.lock:
            ids = [k for k, (_, _, who) in self.leases.items() if who == owner]
        for lease_id in ids:
            self.release(lease_id)
        if ids:
            log.warning(
                "sandbox pool host: %d box(es) of dead env actor %s returned to the pool", len(ids), owner
            )
        return len(ids)

    def stats(self) -> list[dict[str, Any]]:
        from agentrl.tools.python import pool_stats

        where = _where()
        with self.lock:
            held = len(self.leases)
        return [{**pool, "host": where, "held": held} for pool in pool_stats()]


class ShopHost:
    """Actor body: one web-shop server process for a node (on 127.0.0.1) or the cluster (node address)."""

    def __init__(self, settings: dict[str, Any], public: bool):
        import ray

        from agentrl.envs.web import manager

        backend = settings.get("backend", "local")
        kwargs = {k: v for k, v in settings.items() if k != "backend"}
        if backend == "docker":
            from agentrl.envs.web.docker_backend import DockerShopServer

            self.server: Any = DockerShopServer(**kwargs)
        else:
            host = ray.util.get_node_ip_address() if public else "127.0.0.1"
            self.server = manager.ShopServer(host=host, **kwargs)
        self.server.start()  # its process exits by itself if this actor dies (--watch-parent)

    def where(self) -> dict[str, Any]:
        return {**_where(), "url": self.server.url, "server_pid": self.server.pid}

    def url(self) -> str:
        """The shop's URL, restarting the server first if it died."""
        self.server.ensure_running(self.server.generation)
        return self.server.url


# ------------------------------------------------------------------------- env actor side
class NodeSandbox:
    """A box leased from the node's :class:`SandboxPoolHost`: the sandbox methods the tools use."""

    backend = "node-pool"

    def __init__(self, host: Any, lease_id: int, generation: int):
        self.host = host
        self.lease_id = lease_id
        self.generation = generation  # bumps when a fresh box replaced a lost one (SQL copies redo)
        self.lost_count = 0

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        import ray

        status, value, self.generation = ray.get(self.host.call.remote(self.lease_id, method, args, kwargs))
        if status == "error":
            name, message = value
            if name == "SandboxLost":
                self.lost_count += 1
                raise SandboxLost(message)
            raise SandboxError(message)
        return value

    def exec(self, command: list[str] | str, timeout: float = 10.0, **kwargs: Any) -> Any:
        return self._call("exec", command, timeout, **kwargs)

    def run_python(self, code: str, timeout: float = 10.0, session: str = "default") -> Any:
        return self._call("run_python", code, timeout, session)

    def python_session(self, name: str = "default") -> Any:
        from agentrl.sandboxes.base import PythonSession

        return PythonSession(self, name)  # type: ignore[arg-type]  (it only calls run_python)

    def put_file(self, path: str, data: bytes) -> None:
        self._call("put_file", path, data)

    def get_file(self, path: str) -> bytes:
        return self._call("get_file", path)

    def inspect(self) -> dict[str, Any]:
        return self._call("inspect")

    def ping(self, timeout: float = 5.0) -> bool:
        return self._call("ping", timeout)


class NodeSandboxPool:
    """What ``tools.python.shared_pool`` returns in an env actor with node services: leases go to the host."""

    def __init__(self, host: Any, backend: str, size: int, limits: dict[str, Any]):
        self.host = host
        self.backend, self.size, self.limits = backend, size, limits

    @contextlib.contextmanager
    def lease(self, timeout: float | None = None) -> Iterator[NodeSandbox]:
        import ray

        owner = ray.get_runtime_context().get_actor_id() or f"pid-{os.getpid()}"
        status, value = ray.get(self.host.lease.remote(self.backend, self.size, self.limits, timeout, owner))
        if status == "error":
            raise SandboxError(value[1])
        lease_id, generation = value
        try:
            yield NodeSandbox(self.host, lease_id, generation)
        finally:  # waited for: the pool's counters are current when the episode's last call returns
            ray.get(self.host.release.remote(lease_id))

    def close(self) -> None:
        """Nothing to close here: the node's pool outlives this actor."""


def attach(services: dict[str, Any]) -> None:
    """In an env actor: route its envs' sandbox pools to the node's pool host (``services``)."""
    host = services.get("sandbox_pool")
    if host is not None:
        from agentrl.tools.python import use_pool_provider

        use_pool_provider(lambda backend, size, limits: NodeSandboxPool(host, backend, size, limits))


# ------------------------------------------------------------------------------ driver side
class ClusterServices:
    """The driver's service actors: per node (sandbox pools, shops) or per cluster (shop)."""

    def __init__(self, ray: Any, scope: str, needs: dict[str, Any]):
        if scope not in SCOPES:
            raise ConfigError(
                "env.ray_services", f"unknown scope {scope!r}", f"use one of: {', '.join(SCOPES)}"
            )
        shop = needs.get("shop")
        if scope == "cluster" and shop and shop.get("backend", "local") == "docker":
            raise ConfigError(
                "env.ray_services",
                "a docker shop server is reachable only from its own machine",
                "use env.ray_services=node, or the local shop backend (env.kwargs.backend=local)",
            )
        self.ray, self.scope, self.needs = ray, scope, needs
        self.lock = threading.Lock()
        self.pool_hosts: dict[str, Any] = {}  # node id -> SandboxPoolHost handle
        self.shops: dict[str, Any] = {}  # node id (or "cluster") -> ShopHost handle

    def describe(self) -> str:
        wanted = [
            name
            for name, on in (("sandbox pool", self.needs["sandbox_pool"]), ("shop", self.needs["shop"]))
            if on
        ]
        if self.scope == "actor" or not wanted:
            return f"services {self.scope} (each actor its own{': ' + ', '.join(wanted) if wanted else ''})"
        shop = " (shop per cluster)" if self.scope == "cluster" and self.needs["shop"] else ""
        return f"services {self.scope}: {', '.join(wanted)} per node{shop}"

    def _pinned(self, body: type, node_id: str) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return self.ray.remote(body).options(
            num_cpus=0,
            max_concurrency=SERVICE_CONCURRENCY,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        )

    def for_node(self, node_id: str) -> dict[str, Any]:
        """Handles (and the shop URL ref) for the env actors of ``node_id``, starting them on first use."""
        if self.scope == "actor":
            return {}
        out: dict[str, Any] = {}
        with self.lock:
            if self.needs["sandbox_pool"]:
                if node_id not in self.pool_hosts:
                    self.pool_hosts[node_id] = self._pinned(SandboxPoolHost, node_id).remote()
                out["sandbox_pool"] = self.pool_hosts[node_id]
            if self.needs["shop"]:
                key = "cluster" if self.scope == "cluster" else node_id
                if key not in self.shops:
                    body = self._pinned(ShopHost, node_id)
                    self.shops[key] = body.remote(self.needs["shop"], public=self.scope == "cluster")
                out["shop"] = self.shops[key]
        return out

    def owner_lost(self, node_id: str | None, actor_id: str | None) -> None:
        """An env actor died: its leased boxes go back to its node's pool."""
        host = self.pool_hosts.get(node_id or "")
        if host is not None and actor_id:
            host.release_owner.remote(actor_id)

    def handles(self) -> list[Any]:
        with self.lock:
            return [*self.pool_hosts.values(), *self.shops.values()]

    def shutdown(self) -> None:
        with self.lock:
            actors = [*self.pool_hosts.values(), *self.shops.values()]
            self.pool_hosts, self.shops = {}, {}
        for actor in actors:
            self.ray.kill(actor)
