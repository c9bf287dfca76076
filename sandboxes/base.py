"""The sandbox contract and the host side of the in-sandbox agent that both backends share.

A backend only knows how to launch the agent (``agent.py``) in an isolated box and hand back a
:class:`Transport` (a byte stream to its stdin/stdout). Everything else - execs, files, interpreter
sessions, loss detection and self-healing - lives here once.
"""

from __future__ import annotations

import base64
import itertools
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agentrl.errors import SandboxError, SandboxLost

# One program for the box: the reset helpers first, then the agent (which imports them by name only
# when it runs on a host).
AGENT_SOURCE = "\n".join(
    (Path(__file__).resolve().parent / name).read_text() for name in ("agent_clean.py", "agent.py")
)
SESSION_SOURCE = (Path(__file__).resolve().parent / "session_server.py").read_text()
# Host-side slack on top of an exec's own timeout before the agent counts as hung.
AGENT_GRACE_S = 10.0


@dataclass(frozen=True)
class Limits:
    """Resource limits and isolation settings of one sandbox (the same for every backend)."""

    memory_mb: int = 512
    pids: int = 64
    cpus: float = 1.0
    work_tmpfs_mb: int = 64
    output_limit: int = 65536
    network: str | None = None  # None: no network at all; else an internal network the env owns
    ro_mounts: dict[str, str] = field(default_factory=dict)  # host path -> sandbox path, read-only
    # Seconds a reset between leases may take (killing, deleting, verifying); past it the reset
    # fails and the pool replaces the box. Bounds what an episode's leftovers cost the pool.
    reset_budget_s: float = 2.0

    def __post_init__(self) -> None:
        for name in ("memory_mb", "pids", "work_tmpfs_mb", "output_limit"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"sandbox limit {name} must be positive, got {getattr(self, name)!r}")
        for name in ("cpus", "reset_budget_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"sandbox limit {name} must be positive, got {getattr(self, name)!r}")


@dataclass
class Usage:
    """Resources one exec used: wall time, CPU time (user+system) and peak resident memory."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    peak_mem_bytes: int = 0


@dataclass
class ExecResult:
    """The outcome of one exec or interpreter cell.

    ``stdout``/``stderr`` are decoded text, each capped at the sandbox's output limit with a
    ``[output truncated ...]`` note appended when cut. ``exit_code`` follows the shell (128+N when
    killed by signal N). ``restarted`` is True when an interpreter session was lost and replaced.
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    oom_killed: bool = False
    truncated: bool = False
    usage: Usage = field(default_factory=Usage)
    restarted: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.oom_killed

    def observation(self) -> str:
        """A compact text for a model: output, then what went wrong (timeout, OOM, exit code)."""
        parts = [self.stdout.rstrip("\n")] if self.stdout.strip() else []
        if self.stderr.strip():
            parts.append(self.stderr.rstrip("\n"))
        if self.timed_out:
            parts.append("[timed out: the command was killed]")
        elif self.oom_killed:
            parts.append("[out of memory: the command was killed]")
        elif self.exit_code != 0:
            parts.append(f"[exit code {self.exit_code}]")
        return "\n".join(parts) if parts else "[no output]"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Sandbox(Protocol):
    """What every backend offers. Use as a context manager: ``with make_sandbox() as sb: ...``."""

    def start(self) -> None: ...
    def exec(
        self, command: list[str] | str, timeout: float = 10.0, stdin: bytes | None = None
    ) -> ExecResult: ...
    def put_file(self, path: str, data: bytes) -> None: ...
    def get_file(self, path: str) -> bytes: ...
    def reset(self) -> None: ...
    def close(self) -> None: ...
    def python_session(self, name: str = "default") -> PythonSession: ...


class TransportClosed(Exception):
    """The agent's stream ended (the sandbox died or was removed)."""


class Transport(Protocol):
    def send(self, data: bytes) -> None: ...
    def recv_line(self, deadline: float) -> bytes: ...
    def close(self) -> None: ...


class AgentSandbox:
    """Host side of a sandbox run by ``agent.py``; backends implement ``_launch`` and ``_destroy``.

    Thread-safe: requests are serialized. After :class:`SandboxLost` the object heals itself: the
    next call starts a fresh sandbox (its state is gone, which the error message says).
    """

    backend = "agent"

    def __init__(self, limits: Limits | None = None, **limit_kwargs: Any):
        self.limits = limits or Limits(**limit_kwargs)
        self._lock = threading.RLock()
        self._transport: Transport | None = None
        self._ids = itertools.count(1)
        self.started_at = 0.0
        self.generation = 0  # bumps each time a fresh box replaces a lost one
        self.lost_count = 0
        self._closed = False

    # ------------------------------------------------------------------ backend hooks
    def _launch(self) -> Transport:
        """Start the box with the agent as PID 1; every backend implements it."""
        raise NotImplementedError(f"{type(self).__name__} must implement _launch() -> Transport")

    def _destroy(self) -> None:
        """Remove the box; every backend implements it."""
        raise NotImplementedError(f"{type(self).__name__} must implement _destroy()")

    def _loss_reason(self) -> str:
        return "the sandbox process ended"

    def _agent_config(self) -> dict[str, Any]:
        """What the agent is told at start (backends add their own keys)."""
        from agentrl.sandboxes.image import IMAGE_ENV, SANDBOX_UID, WORK_DIR

        return {
            "sandbox_uid": SANDBOX_UID,
            "reset_budget_s": self.limits.reset_budget_s,
            "work": WORK_DIR,
            "writable": [WORK_DIR, "/tmp"],
            "clean": [WORK_DIR, "/tmp", "/dev/shm"],
            "output_limit": self.limits.output_limit,
            "env": dict(IMAGE_ENV),
            "session_source": SESSION_SOURCE,
        }

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Launch the box and wait for its agent (idempotent)."""
        with self._lock:
            if self._transport is not None:
                return
            self._closed = False
            transport = self._launch()
            try:
                hello = json.loads(transport.recv_line(time.monotonic() + 60.0))
            except (TransportClosed, TimeoutError, ValueError) as exc:
                reason = self._loss_reason()
                self._destroy()
                raise SandboxError(f"{self.backend} sandbox did not start: {reason} ({exc})") from exc
            if not hello.get("ready"):
                self._destroy()
                raise SandboxError(f"{self.backend} sandbox agent sent an unexpected greeting: {hello}")
            self._transport = transport
            self.started_at = time.monotonic()

    def close(self) -> None:
        """Stop and remove the box. Safe to call twice; ``start()`` brings up a fresh one."""
        with self._lock:
            self._closed = True
            if self._transport is not None:
                self._transport.close()
                self._transport = None
            self._destroy()

    def __enter__(self) -> AgentSandbox:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return self._transport is not None

    @property
    def age_s(self) -> float:
        return time.monotonic() - self.started_at if self.started_at else 0.0

    # ------------------------------------------------------------------ requests
    def _request(self, op: str, wait_s: float, **payload: Any) -> dict[str, Any]:
        """Send one request; ``wait_s`` is how long the host waits before calling the agent hung."""
        with self._lock:
            if self._closed:
                raise SandboxError(f"the {self.backend} sandbox is closed; call start() to get a fresh one")
            if self._transport is None:  # never started, or lost: (re)start transparently
                self.start()
            request_id = next(self._ids)
            line = json.dumps({"id": request_id, "op": op, **payload}).encode() + b"\n"
            deadline = time.monotonic() + wait_s
            try:
                self._transport.send(line)
                while True:
                    reply = json.loads(self._transport.recv_line(deadline))
                    if reply.get("id") == request_id:
                        break
            except (TransportClosed, TimeoutError, OSError, ValueError) as exc:
                hung = isinstance(exc, TimeoutError)
                reason = "its agent stopped answering" if hung else self._loss_reason()
                self._lost()
                raise SandboxLost(
                    f"sandbox lost ({reason}); its state (files, processes, interpreter variables) is "
                    "gone and a fresh sandbox replaces it on the next call"
                ) from exc
            if not reply.get("ok"):
                raise SandboxError(f"sandbox refused {op}: {reply.get('error')}")
            return reply

    def _lost(self) -> None:
        self.lost_count += 1
        self.generation += 1
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        self._destroy()

    def exec(
        self,
        command: list[str] | str,
        timeout: float = 10.0,
        stdin: bytes | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run ``command`` (an argv list, or a string of Python code) to completion or its timeout.

        Every process the command started is killed when it ends or times out.

        Raises:
            SandboxLost: the sandbox died; the next call runs in a fresh one.
        """
        argv = ["python3", "-c", command] if isinstance(command, str) else [str(arg) for arg in command]
        if not argv:
            raise SandboxError("exec needs a non-empty argv")
        payload: dict[str, Any] = {"argv": argv, "timeout": float(timeout), "env": env or {}}
        if stdin is not None:
            payload["stdin"] = base64.b64encode(stdin).decode()
        return _result(self._request("exec", timeout + AGENT_GRACE_S, **payload))

    def run_python(self, code: str, timeout: float = 10.0, session: str = "default") -> ExecResult:
        """Run a cell in the named stateful interpreter (see :class:`PythonSession`)."""
        return _result(
            self._request("py", timeout + AGENT_GRACE_S, sid=session, code=code, timeout=float(timeout))
        )

    def python_session(self, name: str = "default") -> PythonSession:
        return PythonSession(self, name)

    def put_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` (relative to the work dir, or under /tmp); no symlinks followed."""
        self._request("put", 30.0, path=path, data=base64.b64encode(bytes(data)).decode())

    def get_file(self, path: str) -> bytes:
        """Read a file from the work dir (or /tmp); symlinks and paths outside are refused."""
        return base64.b64decode(self._request("get", 30.0, path=path)["data"])

    def reset(self) -> None:
        """Scrub the box for the next episode and verify it (see ``agent.py``: ``op_reset``).

        Kills every process and interpreter, deletes everything in ``/work``, ``/tmp`` and
        ``/dev/shm`` whatever its modes, removes SysV and POSIX IPC objects, restores those dirs'
        mode, mtime and xattrs, then checks all of it.

        Raises:
            SandboxError: the box could not be made clean (the message lists what was left); it
                must not serve another episode (the pool replaces it).
        """
        self._request("reset", 30.0)

    def inspect(self) -> dict[str, Any]:
        """What an episode could observe of earlier ones: the writable dirs' trees and own state,
        SysV and POSIX IPC objects, processes and interpreter sessions."""
        return self._request("inspect", 30.0)["state"]

    def ping(self, timeout: float = 5.0) -> bool:
        """Health check: True when the agent answers; a dead box is marked lost (and replaced later)."""
        try:
            self._request("ping", timeout)
        except SandboxLost:
            return False
        return True


class PythonSession:
    """A stateful interpreter inside a sandbox: variables persist across :meth:`run` calls.

    A cell that crashes the interpreter or overruns its timeout gets a result saying so
    (``restarted=True``, a note in stderr); the next cell runs in a fresh interpreter. A timeout is
    first answered with KeyboardInterrupt, which keeps the variables when the cell lets it.
    """

    def __init__(self, sandbox: AgentSandbox, name: str = "default"):
        self.sandbox = sandbox
        self.name = name
        self.restarts = 0

    def run(self, code: str, timeout: float = 10.0) -> ExecResult:
        result = self.sandbox.run_python(code, timeout=timeout, session=self.name)
        self.restarts += int(result.restarted)
        return result

    @property
    def restarted(self) -> bool:
        return self.restarts > 0


def _result(reply: dict[str, Any]) -> ExecResult:
    return ExecResult(
        stdout=reply["stdout"],
        stderr=reply["stderr"],
        exit_code=int(reply["exit_code"]),
        timed_out=bool(reply["timed_out"]),
        oom_killed=bool(reply["oom_killed"]),
        truncated=bool(reply["truncated"]),
        usage=Usage(
            wall_s=reply["wall_s"], cpu_s=reply["cpu_s"], peak_mem_bytes=int(reply["peak_mem_bytes"])
        ),
        restarted=bool(reply.get("restarted", False)),
    )
