"""A pool of warm sandboxes leased one per episode; every lease gets a box as clean as a new one.

``with pool.lease() as sandbox:`` hands out a started, health-checked sandbox. When the block ends
the box goes to a background worker that makes it clean for the next lease, off every episode's
critical path, in one of two ways (``reset=``):

* ``"recycle"``: the box is destroyed and a brand-new one is started in its place (new
  namespaces, tmpfs, IPC objects, keyrings, counters);
* ``"scrub"`` (the default on both backends): the in-box agent kills every process, deletes
  everything in the writable dirs whatever its modes, removes SysV and POSIX IPC objects, empties
  the keyrings, puts its own limits and scheduling back, forgets every exit status, and then
  *verifies* the box matches its state at start (processes counted by the box's ``pids`` cgroup,
  no socket left, ...: ``agent_clean.py``), all within ``reset_budget_s``; a box that fails the
  check, runs past the budget or dies is replaced by a new one. A failed reset is never silent: it
  is logged, counted in :class:`PoolStats` and the box never serves another lease.

``"auto"`` picks by backend (:data:`DEFAULT_RESET`, chosen by ``benchmarks/bench_sandbox.py``). A
box older than ``max_lifetime_s`` or used for ``max_uses`` leases is replaced. A sandbox that dies
under an episode raises :class:`~agentrl.errors.SandboxLost` in that episode only; the same handle
starts a fresh box on its next call, so the episode (and the run) goes on.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agentrl.errors import SandboxError
from agentrl.sandboxes.backends import make_sandbox, resolve_backend
from agentrl.sandboxes.base import AgentSandbox

log = logging.getLogger("agentrl.sandboxes")

RESET_MODES = ("auto", "scrub", "recycle")
# Measured (docs/sandboxes.md, benchmarks/results/sandbox/): recycling queues leases on box
# starts (the engine's ~0.5 s per container; ~11 new bwrap boxes/s on 2 cores) while a verified
# scrub takes milliseconds, so both backends scrub by default (issue 42).
DEFAULT_RESET = {"docker": "scrub", "bwrap": "scrub"}


@dataclass
class PoolStats:
    """Counters of a pool's life (for logs and the run's metrics)."""

    created: int = 0
    leases: int = 0
    resets: int = 0  # verified scrubs
    recycled: int = 0  # boxes replaced after a lease by design (reset="recycle")
    reset_failures: int = 0  # scrubs that failed or did not verify: the box was replaced
    replaced_expired: int = 0
    replaced_unhealthy: int = 0
    start_failures: int = 0  # replacements that could not start (the pool shrinks until one does)
    lost: int = 0  # boxes that died under an episode (killed, removed, daemon hiccup)
    last_reset_error: str = ""


class SandboxPool:
    """Thread-safe pool of sandboxes of one backend: ``size`` leased at most, plus ``spares``.

    Args:
        backend: ``"auto"``, ``"docker"`` or ``"bwrap"`` (see :func:`make_sandbox`).
        size: most sandboxes leased at once; ``lease`` waits when all are leased.
        spares: boxes kept started beyond ``size`` (being prepared counts), so a lease finds one
            ready while the box it replaces is still being recycled; default ``size`` with
            ``reset="recycle"`` (a whole wave of episodes can end at once: 1 per 8 left p99 lease
            waits of 2 s at 32 concurrent 5 s episodes here), 0 with ``"scrub"`` (milliseconds).
        max_uses: leases before a sandbox is replaced by a fresh one.
        max_lifetime_s: age after which a sandbox is replaced.
        prewarm: start all ``size + spares`` sandboxes now, in parallel (else on first demand).
        reset: ``"auto"`` (scrub), ``"scrub"`` or ``"recycle"``; see the module docstring.
        **limits: :class:`~agentrl.sandboxes.base.Limits` fields (``memory_mb``, ``pids``, ...).
    """

    def __init__(
        self,
        backend: str = "auto",
        size: int = 4,
        *,
        max_uses: int = 200,
        max_lifetime_s: float = 3600.0,
        prewarm: bool = True,
        image: str | None = None,
        reset: str = "auto",
        spares: int | None = None,
        **limits: Any,
    ):
        if size < 1:
            raise SandboxError(f"pool size must be at least 1, got {size}")
        if reset not in RESET_MODES:
            raise SandboxError(f"pool reset must be one of {', '.join(RESET_MODES)}, got {reset!r}")
        self.backend = resolve_backend(backend)
        self.reset = DEFAULT_RESET[self.backend] if reset == "auto" else reset
        self.size = size
        if spares is None:
            spares = size if self.reset == "recycle" else 0
        if spares < 0:
            raise SandboxError(f"pool spares must be 0 or more, got {spares}")
        self.spares = spares
        self.max_uses = max_uses
        self.max_lifetime_s = max_lifetime_s
        self._make = lambda: make_sandbox(self.backend, image=image, **limits)
        self._idle: collections.deque[AgentSandbox] = collections.deque()
        self._uses: dict[AgentSandbox, int] = {}
        self._count = 0  # boxes alive or being prepared, at most size + spares
        self._leased = 0
        self._renewing = 0  # boxes being made clean (or replaced) in the background
        self._closed = False
        self._cond = threading.Condition()
        workers = min(size + spares, 64)  # mostly waiting on the boxes, not computing
        self._workers = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox-pool")
        self.stats = PoolStats()
        log.info(
            "sandbox pool: backend=%s size=%d spares=%d reset=%s max_uses=%d max_lifetime_s=%g",
            self.backend, size, spares, self.reset, max_uses, max_lifetime_s,
        )  # fmt: skip
        if prewarm:
            futures = [self._workers.submit(self._new) for _ in range(size + spares)]
            warm, errors = [], []
            for future in futures:
                try:
                    warm.append(future.result())
                except SandboxError as exc:
                    errors.append(exc)
            if errors:
                for sandbox in warm:
                    sandbox.close()
                self._workers.shutdown()
                raise errors[0]
            with self._cond:
                self._idle.extend(warm)
                self._count = len(warm)

    def _new(self) -> AgentSandbox:
        sandbox = self._make()
        sandbox.start()
        with self._cond:
            self._uses[sandbox] = 0
            self.stats.created += 1
        return sandbox

    @contextlib.contextmanager
    def lease(self, timeout: float | None = None) -> Iterator[AgentSandbox]:
        """Lease a sandbox for one episode; it is made clean in the background afterwards.

        Raises:
            SandboxError: no sandbox became free within ``timeout`` seconds, or the pool is closed.
        """
        sandbox = self._acquire(timeout)
        lost_before = sandbox.lost_count
        try:
            yield sandbox
        finally:
            self._release(sandbox, sandbox.lost_count - lost_before)

    def _acquire(self, timeout: float | None) -> AgentSandbox:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    raise SandboxError("the sandbox pool is closed")
                if self._leased < self.size and self._idle:
                    sandbox: AgentSandbox | None = self._idle.popleft()
                    self._leased += 1
                    break
                if self._leased < self.size and self._count < self.size + self.spares:
                    self._count += 1
                    self._leased += 1
                    sandbox = None
                    break
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise SandboxError(f"no sandbox became free within {timeout} s (pool size {self.size})")
                self._cond.wait(remaining)
            self.stats.leases += 1
        try:
            if sandbox is None:
                return self._new()
            return self._checked(sandbox)
        except BaseException:
            with self._cond:
                self._count -= 1
                self._leased -= 1
                self._cond.notify_all()
            raise

    def _checked(self, sandbox: AgentSandbox) -> AgentSandbox:
        """Replace a sandbox that grew too old while idle or fails its health check (killed)."""
        expired = sandbox.age_s > self.max_lifetime_s
        try:
            healthy = not expired and sandbox.alive and sandbox.ping()
        except SandboxError:
            healthy = False
        if healthy:
            return sandbox
        with self._cond:
            if expired:
                self.stats.replaced_expired += 1
            else:
                self.stats.replaced_unhealthy += 1
        self._discard(sandbox)
        return self._new()

    def _release(self, sandbox: AgentSandbox, lost: int) -> None:
        with self._cond:
            self.stats.lost += lost
            self._uses[sandbox] = self._uses.get(sandbox, 0) + 1
            self._leased -= 1
            closed = self._closed
            self._cond.notify_all()
        if not closed:
            with self._cond:
                self._renewing += 1
            try:
                self._workers.submit(self._renew, sandbox)
                return
            except RuntimeError:  # the pool closed meanwhile
                with self._cond:
                    self._renewing -= 1
        self._discard(sandbox)
        with self._cond:
            self._count -= 1
            self._cond.notify_all()

    def _renew(self, sandbox: AgentSandbox) -> None:
        """Background: make ``sandbox`` clean for the next lease, or put a new box in its place."""
        try:
            self._renew_one(sandbox)
        finally:
            with self._cond:
                self._renewing -= 1
                self._cond.notify_all()

    def _renew_one(self, sandbox: AgentSandbox) -> None:
        expired = self._uses.get(sandbox, 0) >= self.max_uses or sandbox.age_s > self.max_lifetime_s
        if expired:
            with self._cond:
                self.stats.replaced_expired += 1
        elif self.reset == "scrub" and sandbox.alive:
            try:
                sandbox.reset()
            except SandboxError as exc:  # includes SandboxLost
                with self._cond:
                    self.stats.reset_failures += 1
                    self.stats.last_reset_error = str(exc)
                log.warning("sandbox reset failed, replacing the box: %s", exc)
            else:
                with self._cond:
                    self.stats.resets += 1
                self._put_back(sandbox)
                return
        elif self.reset == "recycle":
            with self._cond:
                self.stats.recycled += 1
        if not sandbox.alive or self.reset == "scrub":  # a broken box: free its memory first
            self._discard(sandbox)
        try:
            fresh = self._new()
        except Exception as exc:  # any failure: the slot must be given back, and said so
            self._discard(sandbox)
            with self._cond:
                self.stats.start_failures += 1
                self._count -= 1
                self._cond.notify_all()
            log.error("could not start a replacement sandbox (the pool is one short): %s", exc)
            return
        self._put_back(fresh)  # ready for the next lease before the old box is even removed
        self._discard(sandbox)

    def _put_back(self, sandbox: AgentSandbox) -> None:
        with self._cond:
            closed = self._closed
            if closed:
                self._count -= 1
            else:
                self._idle.append(sandbox)
            self._cond.notify_all()
        if closed:
            self._discard(sandbox)

    def _discard(self, sandbox: AgentSandbox) -> None:
        with self._cond:
            self._uses.pop(sandbox, None)
        try:
            sandbox.close()
        except SandboxError as exc:
            log.warning("could not remove a sandbox: %s", exc)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until no box is being made clean in the background (tests, benchmarks, shutdown)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._renewing:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SandboxError(f"{self._renewing} sandbox(es) still being renewed after {timeout} s")
                self._cond.wait(remaining)

    def idle_sandboxes(self) -> list[AgentSandbox]:
        """The boxes waiting for a lease now (clean and started)."""
        with self._cond:
            return list(self._idle)

    def close(self) -> None:
        """Close idle sandboxes now, wait for boxes being prepared, and close leased ones when
        their lease ends. Safe to call twice."""
        with self._cond:
            self._closed = True
            idle, self._idle = list(self._idle), collections.deque()
            self._count -= len(idle)
            self._cond.notify_all()
        for sandbox in idle:
            self._discard(sandbox)
        self._workers.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
