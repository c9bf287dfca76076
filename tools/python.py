"""The ``python`` tool: a stateful interpreter inside a sandbox, plus the per-episode sandbox slot.

``SandboxSlot`` leases one sandbox from a process-wide pool on first use and gives it back at the end
of the episode, so many envs share a few warm sandboxes; the pool makes the box clean for the next
episode in the background (nothing of this episode - files, IPC objects, processes, memory - can be
seen by the next; see ``agentrl.sandboxes.pool``). The python tool runs each
call as a cell of :class:`agentrl.sandboxes.PythonSession`: variables persist across calls; stdout,
stderr and tracebacks come back cut to ``max_output_chars`` with a note; a timeout, an out-of-memory
kill or a crash becomes an ``Error: ...`` observation that says whether earlier variables survived.

Threat model: the model's code runs only inside the sandbox (no network, read-only root, limits on
memory, processes and CPU, see ``agentrl.sandboxes``); nothing here evaluates model text on the host.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from agentrl.errors import SandboxError, ToolError
from agentrl.tools.base import Tool, ToolResult, tool

DEFAULT_POOL_SIZE = 4
_POOLS: dict[tuple[Any, ...], Any] = {}
_POOL_FAILURES: dict[tuple[Any, ...], tuple[float, str]] = {}
_POOLS_LOCK = threading.Lock()
_LIVE_SLOTS: weakref.WeakSet[SandboxSlot] = weakref.WeakSet()  # slots holding a lease (released at exit)
FAILURE_RETRY_S = 30.0  # a backend that failed to start is not retried on every call
_POOL_PROVIDER: Callable[[str, int, dict[str, Any]], Any] | None = None


def use_pool_provider(provider: Callable[[str, int, dict[str, Any]], Any] | None) -> None:
    """Make :func:`shared_pool` return ``provider(backend, size, limits)`` in this process: an object
    with ``lease(timeout)`` and ``close()`` (a Ray env actor leases from its node's pool this way)."""
    global _POOL_PROVIDER
    with _POOLS_LOCK:
        _POOL_PROVIDER = provider


def shared_pool(backend: str = "auto", size: int = DEFAULT_POOL_SIZE, **limits: Any) -> Any:
    """The process-wide :class:`agentrl.sandboxes.SandboxPool` for ``backend`` and ``limits``.

    Raises:
        SandboxError: no sandbox backend can start here (the message says why and how to fix it).
    """
    key = (backend, size, tuple(sorted((k, repr(v)) for k, v in limits.items())))
    with _POOLS_LOCK:
        if key in _POOLS:
            return _POOLS[key]
        failed = _POOL_FAILURES.get(key)
        if failed and time.monotonic() - failed[0] < FAILURE_RETRY_S:
            raise SandboxError(failed[1])
        if _POOL_PROVIDER is not None:
            _POOLS[key] = _POOL_PROVIDER(backend, size, dict(limits))
            return _POOLS[key]
        try:
            from agentrl.sandboxes import SandboxPool, resolve_backend

            resolved = resolve_backend(backend)  # fails fast (and is remembered) without any backend
            pool = SandboxPool(backend=resolved, size=size, prewarm=False, **limits)
        except (SandboxError, ImportError, ValueError) as exc:
            message = (
                f"no sandbox is available (backend {backend!r}: {exc}). Install Docker or bubblewrap "
                "(apt-get install bubblewrap) so code can run"
            )
            _POOL_FAILURES[key] = (time.monotonic(), message)
            raise SandboxError(message) from exc
        _POOLS[key] = pool
        return pool


def pool_stats() -> list[dict[str, Any]]:
    """Backend, size and :class:`~agentrl.sandboxes.PoolStats` counters of this process's shared pools."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
    return [
        {"backend": p.backend, "size": p.size, **dataclasses.asdict(p.stats)}
        for p in pools
        if hasattr(p, "stats")
    ]


@atexit.register
def close_shared_pools() -> None:
    """Release live leases, then close every shared pool (their sandboxes too). Safe to call twice."""
    for slot in list(_LIVE_SLOTS):
        try:
            slot.release()
        except (SandboxError, OSError) as exc:  # a dead engine at exit must not stop the other cleanups
            print(f"agentrl: could not return a sandbox at exit: {exc}")
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        try:
            pool.close()
        except (SandboxError, OSError) as exc:
            print(f"agentrl: could not close a sandbox pool at exit: {exc}")


class SandboxSlot:
    """One episode's sandbox: leased from the shared pool on first use, returned by :meth:`release`.

    Args:
        backend: ``"auto"``, ``"docker"`` or ``"bwrap"``.
        pool_size: size of the shared pool this slot leases from.
        lease_timeout_s: how long to wait for a free sandbox before the call fails.
        **limits: sandbox limits (``memory_mb``, ``pids``, ``cpus`` ...).
    """

    def __init__(
        self,
        backend: str = "auto",
        pool_size: int = DEFAULT_POOL_SIZE,
        lease_timeout_s: float = 120.0,
        **limits: Any,
    ):
        self.backend = backend
        self.pool_size = pool_size
        self.lease_timeout_s = lease_timeout_s
        self.limits = limits
        self._stack: contextlib.ExitStack | None = None
        self._sandbox: Any = None
        self.sandbox_seconds = 0.0  # wall time spent in sandbox calls (cells, queries, put_file)
        self.lease_seconds = 0.0  # time spent leasing a sandbox (waiting, starting, health check)
        self.release_seconds = 0.0  # time spent giving it back (the clean-up itself runs in the background)

    def get(self) -> Any:
        """The leased sandbox (leasing one now if needed).

        Raises:
            SandboxError: no backend, or no sandbox free within ``lease_timeout_s``.
        """
        if self._sandbox is None:
            start = time.perf_counter()
            pool = shared_pool(self.backend, self.pool_size, **self.limits)
            stack = contextlib.ExitStack()
            self._sandbox = stack.enter_context(pool.lease(timeout=self.lease_timeout_s))
            self._stack = stack
            _LIVE_SLOTS.add(self)
            self.lease_seconds += time.perf_counter() - start
        return self._sandbox

    @property
    def leased(self) -> bool:
        return self._sandbox is not None

    def sibling(self) -> SandboxSlot:
        """A slot on the same pool with the same limits, holding no lease (a fork's own)."""
        return SandboxSlot(self.backend, self.pool_size, self.lease_timeout_s, **self.limits)

    def reset_timings(self) -> None:
        """A new episode starts: its sandbox, lease and release seconds count from zero."""
        self.sandbox_seconds = self.lease_seconds = self.release_seconds = 0.0

    def release(self) -> None:
        """Give the sandbox back (the pool cleans or replaces it in the background). Safe to call twice."""
        stack, self._stack, self._sandbox = self._stack, None, None
        _LIVE_SLOTS.discard(self)
        if stack is not None:
            start = time.perf_counter()
            stack.close()
            self.release_seconds += time.perf_counter() - start


def cut_middle(text: str, max_chars: int) -> str:
    """Keep the head and tail of ``text`` within ``max_chars`` and say how much was cut."""
    if len(text) <= max_chars:
        return text
    head = max_chars * 2 // 3
    tail = max_chars - head
    return f"{text[:head]}\n[... {len(text) - max_chars} characters cut ...]\n{text[-tail:]}"


def format_cell(result: Any, *, timeout_s: float, memory_mb: int | None, max_output_chars: int) -> str:
    """Observation text of one interpreter cell; raises ToolError for timeouts, OOM and crashes."""
    parts = []
    if result.stdout.strip():
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr.strip():
        parts.append(result.stderr.rstrip("\n"))
    output = cut_middle("\n".join(parts), max_output_chars)
    lost = (
        " The interpreter was restarted: variables from earlier calls are gone."
        if result.restarted
        else " Variables from earlier calls are kept."
    )
    partial = f"\nOutput before it stopped:\n{output}" if output else ""
    if result.timed_out:
        raise ToolError(f"the code ran longer than the {timeout_s:g} s limit and was stopped.{lost}{partial}")
    if result.oom_killed:
        limit = f" ({memory_mb} MB)" if memory_mb else ""
        raise ToolError(f"the code ran out of memory{limit} and was stopped.{lost}{partial}")
    if result.restarted:
        raise ToolError(f"the interpreter crashed (exit code {result.exit_code}).{lost}{partial}")
    return output if output else "[no output: print() the values you want to see]"


def make_python_tool(
    slot: SandboxSlot,
    *,
    timeout_s: float = 10.0,
    max_output_chars: int = 4000,
    session_name: str = "agent",
) -> Tool:
    """Build the ``python`` tool bound to one episode's sandbox slot."""

    def python(code: str) -> ToolResult:
        """Run Python code in a persistent interpreter (variables, imports and functions stay defined
        between calls). Use print() to see values; the value of a final bare expression is shown too.
        Only the standard library is available (math, fractions, itertools, datetime, statistics ...).

        Args:
            code: Python source to run.
        """
        if not code.strip():
            raise ToolError("the code is empty; pass Python source in the 'code' argument")
        session = slot.get().python_session(session_name)
        start = time.perf_counter()
        try:
            result = session.run(code, timeout=timeout_s)
        finally:
            slot.sandbox_seconds += time.perf_counter() - start
        text = format_cell(
            result,
            timeout_s=timeout_s,
            memory_mb=slot.limits.get("memory_mb"),
            max_output_chars=max_output_chars,
        )
        usage = result.usage
        return ToolResult(
            text,
            usage={
                "wall_s": usage.wall_s,
                "cpu_s": usage.cpu_s,
                "peak_mem_bytes": float(usage.peak_mem_bytes),
            },
        )

    return tool(python)
