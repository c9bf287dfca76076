"""Envs in Ray actors (``env.placement: ray``), driven by the same runner as local envs.

Each episode's env -- with its sandbox pool, web-shop session or retriever client -- is built and
stepped inside a Ray actor on whichever node has room. The runner gets a :class:`RemoteEnv`
adapter with the env interface (``reset``/``step``/``unwrapped.final_info``/``close``) whose
methods await actor calls, so the agent, the token bookkeeping and the episode schema are the
ones of a local env. Ray does the scheduling; this module only keeps a pool of actor slots.

    envs = RayEnvs("agentrl/Search-v0", {"split": "train"}, RaySettings(address="auto"))  # or a factory
    episodes = run_episodes(envs, tasks, generator, tokenizer, config)

Every remote call has a timeout (``env.ray_call_timeout_s``). An actor that dies mid-episode
fails only the episodes it hosted (recorded with the cause, or rerun on a new actor
``env.ray_lost_retries`` times); the pool drops it and later episodes get a new actor. The
runner's watchdog (``rollout.watchdog_s``) covers remote calls too: a step stuck on a slow node
is cancelled at the watchdog, and an actor hosting only that episode is killed to free its CPUs.
Starting the env (:meth:`RemoteEnv.start`: an actor slot, the actor process, the env built on it)
is the episode's ``starting`` phase, which the watchdog does not count: it has its own limit,
``env.ray_start_timeout_s``.
``ray`` is imported only here and in ``services.py``, and only when Ray placement is used.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.errors import ConfigError, EnvError

log = logging.getLogger("agentrl.rollout")

PLACEMENTS = ("local", "ray")
RAY_FIELDS = (
    "ray_address",
    "num_cpus_per_env",
    "envs_per_actor",
    "ray_resources",
    "ray_call_timeout_s",
    "ray_start_timeout_s",
    "ray_lost_retries",
    "ray_services",
)


class EnvActorLost(EnvError):
    """The actor hosting an episode's env died; the runner reruns the episode ``env.ray_lost_retries`` times."""

    env_lost = True


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            "env.placement", "ray placement needs Ray, which is not installed", "pip install 'agentrl[ray]'"
        ) from exc
    return ray


def validate_placement(env: Any, prefix: str) -> None:
    """Checks the ``env`` section's placement fields (called by ``EnvConfig.validate``)."""
    if env.placement not in PLACEMENTS:
        raise ConfigError(f"{prefix}.placement", f"unknown placement {env.placement!r}", "use local or ray")
    if env.placement == "local":
        for f in dataclasses.fields(env):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            if f.name in RAY_FIELDS and getattr(env, f.name) != default:
                raise ConfigError(
                    f"{prefix}.{f.name}",
                    "only applies to placement ray",
                    f"set {prefix}.placement=ray or drop it",
                )
        return
    _import_ray()
    if env.num_cpus_per_env < 0:
        raise ConfigError(f"{prefix}.num_cpus_per_env", f"must be >= 0, got {env.num_cpus_per_env}")
    if env.envs_per_actor < 1:
        raise ConfigError(f"{prefix}.envs_per_actor", f"must be >= 1, got {env.envs_per_actor}")
    if env.ray_lost_retries < 0:
        raise ConfigError(f"{prefix}.ray_lost_retries", f"must be >= 0, got {env.ray_lost_retries}")
    for name in ("ray_call_timeout_s", "ray_start_timeout_s"):
        if getattr(env, name) <= 0:
            raise ConfigError(f"{prefix}.{name}", f"must be > 0, got {getattr(env, name)}")
    from agentrl.cluster.services import SCOPES

    if env.ray_services not in SCOPES:
        raise ConfigError(
            f"{prefix}.ray_services",
            f"unknown scope {env.ray_services!r}",
            f"use one of: {', '.join(SCOPES)}",
        )
    for label, amount in env.ray_resources.items():
        if not isinstance(amount, int | float) or isinstance(amount, bool) or amount <= 0:
            raise ConfigError(
                f"{prefix}.ray_resources.{label}",
                f"must be a positive number, got {amount!r}",
                "e.g. {envnode: 1}",
            )


@dataclass(frozen=True)
class RaySettings:
    """How env actors are placed (from the ``env`` section: ``RaySettings.from_env(config.env)``).
    The one home of the placement defaults: the ``env.ray_*`` settings (:class:`agentrl.config.EnvConfig`,
    where their help text is) refer to these."""

    address: str | None = None
    num_cpus_per_env: float = 1.0
    envs_per_actor: int = 1
    resources: dict[str, float] = field(default_factory=dict)
    call_timeout_s: float = 120.0
    #: a new env: an actor on a node with room (process start, imports, env data), the env built on it
    start_timeout_s: float = 300.0
    lost_retries: int = 0
    services: str = "node"  # shared tool services: node | cluster | actor (see services.py)
    #: when the episodes run at once do not fit the cluster at ``num_cpus_per_env``: lower it so they
    #: do (True) or refuse at once (False); never wait for actors that cannot be placed
    fit: bool = True

    @classmethod
    def from_env(cls, env: Any) -> RaySettings:
        return cls(
            # the default 1 CPU per env is fitted to the cluster; a value set in the config is kept
            fit=env.num_cpus_per_env == cls.num_cpus_per_env,
            address=env.ray_address,
            num_cpus_per_env=env.num_cpus_per_env,
            envs_per_actor=env.envs_per_actor,
            resources=dict(env.ray_resources),
            call_timeout_s=env.ray_call_timeout_s,
            start_timeout_s=env.ray_start_timeout_s,
            lost_retries=env.ray_lost_retries,
            services=env.ray_services,
        )


def init_ray(address: str | None) -> Any:
    """Connects to (or, with ``address=None``, starts) Ray once per process; returns the module."""
    ray = _import_ray()
    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        except ConnectionError as exc:
            raise ConfigError(
                "env.ray_address",
                f"no Ray cluster answers at {address!r} ({exc})",
                "start one (ray start --head) and pass its HOST:PORT, or null for a Ray on this machine",
            ) from exc
    return ray


def episode_envs(env_cfg: Any, env_kwargs: dict[str, Any], local: Any, concurrency: int | None = None) -> Any:
    """The runner's env source for ``env.placement``: ``local`` (a factory) or a :class:`RayEnvs`
    pool sized for ``concurrency`` episodes at once (see :func:`fit_placement`)."""
    if env_cfg.placement != "ray":
        return local
    return RayEnvs(env_cfg.id, env_kwargs, RaySettings.from_env(env_cfg), concurrency=concurrency)


def fit_placement(nodes: list[dict[str, Any]], settings: RaySettings, concurrency: int) -> tuple[RaySettings, str]:
    """Size env actors to the cluster before any is created: ``concurrency`` episodes need
    ``ceil(concurrency / envs_per_actor)`` actors of ``num_cpus_per_env * envs_per_actor`` CPUs (plus
    ``resources``), each on one node. When they fit, ``settings`` as given; when they do not and
    ``settings.fit``, the largest CPUs per env that lets them fit (Ray takes fractions); else a
    :class:`ConfigError` naming what is asked, what the cluster has and what to change. ``nodes``:
    ``ray.nodes()``. Returns ``(settings, one line saying what was decided)``."""
    import math

    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive")]
    s = settings
    for label, amount in s.resources.items():
        if not any(r.get(label, 0) >= amount for r in alive):
            have = sorted({k for r in alive for k in r if k not in ("CPU", "memory", "object_store_memory")})
            raise ConfigError(
                "env.ray_resources",
                f"no node of the Ray cluster has {amount:g} {label!r} (its resources: {', '.join(have) or 'none'})",
                "start a node with it (ray start --resources) or drop it from env.ray_resources",
            )
    hosts = [r for r in alive if all(r.get(k, 0) >= v for k, v in s.resources.items())]
    cpus = [float(r.get("CPU", 0)) for r in hosts]
    actors = math.ceil(concurrency / s.envs_per_actor)

    def room(per_actor: float) -> int:  # actors the nodes can hold at once
        return sum(int(c / per_actor + 1e-9) for c in cpus) if per_actor > 0 else actors

    per_actor = s.num_cpus_per_env * s.envs_per_actor
    asked = (
        f"{concurrency} episode(s) at once = {actors} env actor(s) of {per_actor:g} CPU "
        f"(env.num_cpus_per_env {s.num_cpus_per_env:g} x env.envs_per_actor {s.envs_per_actor})"
    )
    cluster = f"{sum(cpus):g} CPU on {len(cpus)} node(s)"
    if room(per_actor) >= actors:
        return s, f"{asked}; the cluster has {cluster}: they fit"
    # the largest CPUs per actor that fits: some node's CPUs split evenly
    candidates = [c / k for c in cpus for k in range(1, actors + 1) if c > 0]
    fitting = [c for c in candidates if c < per_actor and room(c) >= actors]
    fitted = math.floor(max(fitting) / s.envs_per_actor * 1000) / 1000 if fitting else 0.0
    if not s.fit or fitted <= 0:
        room_now = room(per_actor) * s.envs_per_actor
        raise ConfigError(
            "env.num_cpus_per_env",
            f"{asked} cannot all be placed: the cluster has {cluster}, room for {room_now} episode(s)",
            f"run at most {room_now} at once (--concurrency / rollout.concurrency)"
            + (f", or set env.num_cpus_per_env={fitted:g}" if fitted > 0 else "")
            + ", or add nodes",
        )
    line = (
        f"{asked} do not fit the cluster's {cluster}: env.num_cpus_per_env lowered to {fitted:g} so that "
        "all are placed at once (set env.num_cpus_per_env, or lower the concurrency, to choose otherwise)"
    )
    return dataclasses.replace(s, num_cpus_per_env=fitted), line


class EnvHost:
    """The actor body: hosts up to ``envs_per_actor`` envs, each keyed by its episode's handle."""

    def __init__(self, env: str | Callable[[], Any], env_kwargs: dict[str, Any]):
        self.env = env  # a registered id, or a zero-argument factory (shipped to the actor by Ray)
        self.env_kwargs = env_kwargs
        self.envs: dict[str, Any] = {}
        self.services: dict[str, Any] = {}
        self.shop_urls_used: set[str] = set()

    def where(self) -> dict[str, Any]:
        import ray

        context = ray.get_runtime_context()
        return {"pid": os.getpid(), "node_id": context.get_node_id(), "actor_id": context.get_actor_id()}

    def attach(self, services: dict[str, Any]) -> None:
        """Use the node's (or cluster's) shared services (``services.ClusterServices.for_node``)."""
        from agentrl.cluster.services import attach

        attach(services)
        self.services = services

    def sandbox_pools(self) -> list[dict[str, Any]]:
        """The sandbox pools this actor's envs lease from: backend, size, counters and hosting process."""
        if "sandbox_pool" in self.services:
            import ray

            return ray.get(self.services["sandbox_pool"].stats.remote())
        from agentrl.tools.python import pool_stats

        return [{**pool, "host": self.where()} for pool in pool_stats()]

    def _make(self) -> Any:
        from agentrl.env import make

        if not isinstance(self.env, str):
            return self.env()
        kwargs = dict(self.env_kwargs)
        if "shop" in self.services:  # the node's (or cluster's) shop server, over HTTP
            import ray

            kwargs["server_url"] = ray.get(self.services["shop"].url.remote())
            self.shop_urls_used.add(kwargs["server_url"])
        return make(self.env, **kwargs)

    def shop_urls(self) -> list[str]:
        """The shared shop URLs this actor's envs were given (``env.ray_services``)."""
        return sorted(self.shop_urls_used)

    def open(self, key: str) -> None:
        """Build the env of episode ``key`` (its constructor: data, tool clients, sandbox pool)."""
        if key not in self.envs:
            self.envs[key] = self._make()

    def reset(self, key: str, seed: int | None, options: dict[str, Any] | None) -> tuple[Any, ...]:
        from agentrl.rollout.agent import _sandbox_id

        self.open(key)
        env = self.envs[key]
        obs, info = env.reset(seed=seed, options=options)
        inner = env.unwrapped
        meta = {
            "task": inner.task,
            "tools": list(inner.tools),
            "system_prompt": inner.system_prompt,
            "sandbox_id": _sandbox_id(env),
        }
        return obs, info, meta

    def step(self, key: str, action: str) -> tuple[Any, ...]:
        return self._env(key).step(action)

    def final_info(self, key: str, *args: Any, **kwargs: Any) -> Any:
        return self._env(key).unwrapped.final_info(*args, **kwargs)

    def close(self, key: str) -> None:
        env = self.envs.pop(key, None)
        if env is not None:
            env.close()

    def _env(self, key: str) -> Any:
        if key not in self.envs:
            raise EnvError(f"env {key} is not open on this actor (call reset first)")
        return self.envs[key]


class _Actor:
    """One env actor and how many of its slots are taken."""

    def __init__(self, handle: Any, index: int):
        self.handle = handle
        self.index = index
        self.used = 0
        self.dead = False
        self.started = False
        self.info: dict[str, Any] = {}  # pid, node_id, actor_id once it runs
        self.ready = handle.where.remote()  # resolves once the actor process runs


class RayEnvs:
    """Env factory for the runner: each call returns a :class:`RemoteEnv` hosted by a pooled actor.

    Actors are created on demand (``envs_per_actor`` episodes each, ``num_cpus_per_env`` CPUs per
    slot, plus ``resources``), reused across episodes and runs, and dropped when they die.
    """

    def __init__(
        self,
        env: str | Callable[[], Any],
        env_kwargs: dict[str, Any] | None = None,
        settings: RaySettings | None = None,
        *,
        concurrency: int | None = None,
    ):
        """``concurrency``: episodes that will run at once; given, the actors are sized to the
        cluster first (:func:`fit_placement`: fitted or refused, never left waiting)."""
        self.env = env
        self.env_id = (
            env if isinstance(env, str) else getattr(env, "env_id", getattr(env, "__name__", "custom"))
        )
        self.env_kwargs = dict(env_kwargs or {})
        if self.env_kwargs and not isinstance(env, str):
            raise ConfigError("env.kwargs", "kwargs go with a registered env id", "bind them in the factory")
        self.settings = settings or RaySettings()
        self.lost_retries = self.settings.lost_retries  # read by the runner
        self.ray = init_ray(self.settings.address)
        if concurrency is not None:
            self.settings, line = fit_placement(self.ray.nodes(), self.settings, concurrency)
            print(f"[ray] {line}", file=sys.stderr, flush=True)
        from agentrl.cluster.services import ClusterServices, env_needs

        self.services = ClusterServices(self.ray, self.settings.services, env_needs(env, self.env_kwargs))
        self._actors: list[_Actor] = []
        self._counter = itertools.count()
        self._lock = threading.Lock()
        s = self.settings
        self._actor_cls = self.ray.remote(EnvHost).options(
            num_cpus=s.num_cpus_per_env * s.envs_per_actor,
            resources=dict(s.resources) or None,
            max_concurrency=s.envs_per_actor + 1,  # blocking env calls of its episodes run side by side
            scheduling_strategy="SPREAD",
        )
        self.open_envs: dict[str, RemoteEnv] = {}  # live handles, for inspection (tests, benchmarks)
        nodes = [n for n in self.ray.nodes() if n.get("Alive")]
        log.info(
            "env placement ray: %s on %d node(s) (%s CPU), %s env(s)/actor, %.2f CPU/env, resources %s, "
            "call timeout %.0fs, %d rerun(s) of lost episodes, %s",
            self.env_id, len(nodes), self.ray.cluster_resources().get("CPU", 0), s.envs_per_actor,
            s.num_cpus_per_env, dict(s.resources), s.call_timeout_s, s.lost_retries, self.services.describe(),
        )  # fmt: skip

    def __call__(self) -> RemoteEnv:
        return RemoteEnv(self)

    # -- slots (thread-safe: close() runs in the runner's executor)
    def acquire(self) -> _Actor:
        with self._lock:
            for actor in self._actors:
                if not actor.dead and actor.used < self.settings.envs_per_actor:
                    actor.used += 1
                    return actor
            actor = _Actor(self._actor_cls.remote(self.env, self.env_kwargs), next(self._counter))
            actor.used = 1
            self._actors.append(actor)
            return actor

    def release(self, actor: _Actor) -> None:
        with self._lock:
            actor.used -= 1

    def mark_dead(self, actor: _Actor) -> None:
        with self._lock:
            already, actor.dead = actor.dead, True
            if actor in self._actors:
                self._actors.remove(actor)
        if not already:  # the boxes it leased from its node's pool go back
            self.services.owner_lost(actor.info.get("node_id"), actor.info.get("actor_id"))

    @property
    def actors(self) -> list[Any]:
        with self._lock:
            return [a.handle for a in self._actors]

    def shutdown(self) -> None:
        """Kills this pool's actors (the Ray connection stays up)."""
        with self._lock:
            actors, self._actors = self._actors, []
        for actor in actors:
            self.ray.kill(actor.handle)
        self.services.shutdown()


class RemoteEnv:
    """The env interface over a pooled Ray actor; its ``reset``/``step``/``final_info`` are async."""

    def __init__(self, pool: RayEnvs):
        self.pool = pool
        self.key = uuid.uuid4().hex[:12]
        self.actor: _Actor | None = None
        self.task: Any = None
        self.tools: list[dict[str, Any]] = []
        self.system_prompt = ""
        self.sandbox_id: str | None = None
        self.closed = False

    @property
    def unwrapped(self) -> RemoteEnv:
        return self

    @property
    def max_turns(self) -> int | None:
        """The hosted env's turn budget (read by the episode loop; None for a custom factory)."""
        from agentrl.env import registered_turn_budget

        env = self.pool.env
        return registered_turn_budget(env, self.pool.env_kwargs) if isinstance(env, str) else None

    @property
    def handle(self) -> Any:
        """The Ray actor handle hosting this env (``None`` before ``reset``)."""
        return self.actor.handle if self.actor is not None else None

    async def start(self) -> None:
        """Start this episode's env: an actor slot, the actor running (a new one needs a node with
        room), the env built on it. The episode loop awaits this as its ``starting`` phase, which the
        rollout watchdog does not count; ``env.ray_start_timeout_s`` bounds it instead."""
        if self.actor is None:
            self.actor = self.pool.acquire()
            self.pool.open_envs[self.key] = self
        await self._started()
        limit = self.pool.settings.start_timeout_s
        open_ref = self.actor.handle.open.remote(self.key)
        await self._await(
            open_ref, limit, "start", kill=self.actor.used == 1, setting="env.ray_start_timeout_s"
        )

    async def _started(self) -> None:
        """Waits (up to ``env.ray_start_timeout_s``) until the actor runs: a new one needs a node with room."""
        assert self.actor is not None
        if self.actor.started:
            return
        s = self.pool.settings
        need = f"{s.num_cpus_per_env * s.envs_per_actor} CPU and resources {dict(s.resources)}"
        try:
            info = await self._await(self.actor.ready, s.start_timeout_s, "start", kill=True)
        except EnvError:
            raise EnvError(
                f"env actor {self.actor.index} did not start within {s.start_timeout_s:.0f}s "
                f"(env.ray_start_timeout_s): does a node have {need} free? (env.num_cpus_per_env, "
                "env.envs_per_actor, env.ray_resources)"
            ) from None
        self.actor.info = info
        services = self.pool.services.for_node(info["node_id"])
        if services:  # before its first env is made: the node's sandbox pool and shop
            await self._await(
                self.actor.handle.attach.remote(services), s.start_timeout_s, "attach", kill=True,
                setting="env.ray_start_timeout_s",
            )  # fmt: skip
        self.actor.started = True

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        assert self.actor is not None
        await self._started()
        ref = getattr(self.actor.handle, method).remote(self.key, *args, **kwargs)
        # a hung env alone on its actor: kill it to free its CPUs for a new one
        return await self._await(ref, self.pool.settings.call_timeout_s, method, kill=self.actor.used == 1)

    async def _await(
        self, ref: Any, timeout: float, method: str, *, kill: bool, setting: str = "env.ray_call_timeout_s"
    ) -> Any:
        assert self.actor is not None
        ray = self.pool.ray
        try:
            return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout=timeout)
        except TimeoutError:
            ray.cancel(ref)
            if kill:
                self.pool.mark_dead(self.actor)
                ray.kill(self.actor.handle)
            raise EnvError(
                f"remote env {method} took over {timeout:.0f}s on actor {self.actor.index} ({setting})"
            ) from None
        except asyncio.CancelledError:  # the runner's watchdog (or the whole run) gave up on the episode
            if ref is not self.actor.ready:  # the actor's start is awaited by its other episodes too
                ray.cancel(ref)
            if self.actor.used == 1 and not self.actor.dead:  # its only episode: free its CPUs, now
                self.pool.mark_dead(self.actor)
                ray.kill(self.actor.handle)
            raise
        except ray.exceptions.RayActorError as exc:
            self.pool.mark_dead(self.actor)
            cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise EnvActorLost(f"env actor {self.actor.index} died during {method}: {cause}") from None
        except ray.exceptions.RayTaskError as exc:
            raise exc.as_instanceof_cause() from None

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict]:
        if self.actor is None:  # not started by the loop (a direct caller): start it now
            await self.start()
        obs, info, meta = await self._call("reset", seed, options)
        self.task, self.tools = meta["task"], meta["tools"]
        self.system_prompt, self.sandbox_id = meta["system_prompt"], meta["sandbox_id"]
        return obs, info

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        return await self._call("step", action)

    async def final_info(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("final_info", *args, **kwargs)

    close_never_blocks = True  # the runner closes it inline, so its slot is free for the next episode

    def close(self) -> None:
        """Frees the slot; the actor closes the env in the background (nothing to wait for)."""
        if self.closed or self.actor is None:
            self.closed = True
            return
        self.closed = True
        self.pool.open_envs.pop(self.key, None)
        if not self.actor.dead:
            self.actor.handle.close.remote(self.key)
        self.pool.release(self.actor)
