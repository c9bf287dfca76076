"""A pool of warm sandboxes leased one per episode, reset between episodes, replaced when worn out.

``with pool.lease() as sandbox:`` hands out a started, health-checked sandbox; when the block ends
the sandbox is reset (processes killed, work dir emptied) and goes back to the pool. A sandbox
older than ``max_lifetime_s`` or used for ``max_uses`` leases is replaced. A sandbox that dies under
an episode raises :class:`~agentrl.errors.SandboxLost` in that episode only; the same handle starts a
fresh box on its next call, so the episode (and the run) goes on.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from agentrl.errors import SandboxError
from agentrl.sandboxes.base import AgentSandbox


@dataclass
class PoolStats:
    """Counters of a pool's life (for logs and the run's metrics)."""

    created: int = 0
    leases: int = 0
    resets: int = 0
    replaced_expired: int = 0
    replaced_unhealthy: int = 0
    lost: int = 0  # boxes that died under an episode (killed, removed, daemon hiccup)


class SandboxPool:
    """Thread-safe pool of at most ``size`` sandboxes of one backend.

    Args:
        backend: ``"auto"``, ``"docker"`` or ``"bwrap"`` (see :func:`make_sandbox`).
        size: most sandboxes alive at once; ``lease`` waits when all are leased.
        max_uses: leases before a sandbox is replaced by a fresh one.
        max_lifetime_s: age after which a sandbox is replaced at its next lease.
        prewarm: start all ``size`` sandboxes now (else on first demand).
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
        **limits: Any,
    ):
        from agentrl.sandboxes import make_sandbox

        if size < 1:
            raise SandboxError(f"pool size must be at least 1, got {size}")
        self.size = size
        self.max_uses = max_uses
        self.max_lifetime_s = max_lifetime_s
        self._make = lambda: make_sandbox(backend, image=image, **limits)
        self._idle: collections.deque[AgentSandbox] = collections.deque()
        self._uses: dict[int, int] = {}
        self._count = 0
        self._closed = False
        self._cond = threading.Condition()
        self.stats = PoolStats()
        if prewarm:
            warm = [self._new() for _ in range(size)]
            with self._cond:
                self._idle.extend(warm)
                self._count = len(warm)

    def _new(self) -> AgentSandbox:
        sandbox = self._make()
        sandbox.start()
        self._uses[id(sandbox)] = 0
        with self._cond:
            self.stats.created += 1
        return sandbox

    @contextlib.contextmanager
    def lease(self, timeout: float | None = None) -> Iterator[AgentSandbox]:
        """Lease a sandbox for one episode; it is reset and returned to the pool afterwards.

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
                if self._idle:
                    sandbox: AgentSandbox | None = self._idle.popleft()
                    break
                if self._count < self.size:
                    self._count += 1
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
                self._cond.notify()
            raise

    def _checked(self, sandbox: AgentSandbox) -> AgentSandbox:
        """Replace a sandbox that is worn out or fails its health check."""
        expired = self._uses.get(id(sandbox), 0) >= self.max_uses or sandbox.age_s > self.max_lifetime_s
        try:
            healthy = not expired and sandbox.ping()
        except SandboxError:  # a lost box that could not be restarted
            healthy = False
        if not healthy:
            with self._cond:
                if expired:
                    self.stats.replaced_expired += 1
                else:
                    self.stats.replaced_unhealthy += 1
            self._uses.pop(id(sandbox), None)
            sandbox.close()
            return self._new()
        return sandbox

    def _release(self, sandbox: AgentSandbox, lost: int) -> None:
        with self._cond:
            self.stats.lost += lost
        self._uses[id(sandbox)] = self._uses.get(id(sandbox), 0) + 1
        if sandbox.alive:
            try:
                sandbox.reset()
                with self._cond:
                    self.stats.resets += 1
            except SandboxError:
                pass  # lost during reset: it heals (restarts) at its next lease's health check
        with self._cond:
            if self._closed:
                self._count -= 1
                sandbox.close()
            else:
                self._idle.append(sandbox)
            self._cond.notify()

    def close(self) -> None:
        """Close idle sandboxes now and leased ones when their lease ends. Safe to call twice."""
        with self._cond:
            self._closed = True
            idle, self._idle = list(self._idle), collections.deque()
            self._count -= len(idle)
            self._cond.notify_all()
        for sandbox in idle:
            sandbox.close()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
