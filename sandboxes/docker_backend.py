"""Docker backend: one hardened container per sandbox, its PID 1 the agent, spoken to over attach.

All Docker Engine API calls of agentrl live in this package. The engine is found the usual way
(``docker.from_env()``: ``DOCKER_HOST``, ``DOCKER_TLS_VERIFY``, ``DOCKER_CERT_PATH``), so a remote
engine works as well as the local socket.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import threading
import time
from typing import Any

from agentrl.errors import SandboxError
from agentrl.sandboxes.base import AGENT_SOURCE, AgentSandbox, Limits, TransportClosed
from agentrl.sandboxes.image import SANDBOX_UID, WORK_DIR, default_image

LABEL = "agentrl.sandbox"
_client_lock = threading.Lock()
_client = None
# docker-py keeps one connection pool per URL (so per container) and closes the least recently used
# beyond 25 (its num_pools argument is ignored for local sockets), even while another thread is
# using it: 32 parallel launches crashed in urllib3. A launch touches 3 URLs, so at most 6 launches
# or removals run at once (the pool prepares boxes in parallel; the engine is the bottleneck anyway).
_engine_slots = threading.BoundedSemaphore(6)


def docker_client():
    """A process-wide ``docker.DockerClient`` from the environment; SandboxError when unreachable."""
    global _client
    import docker
    import docker.errors

    with _client_lock:
        if _client is None:
            try:
                _client = docker.from_env(timeout=60)
            except docker.errors.DockerException as exc:
                raise SandboxError(
                    f"no Docker engine answers ({exc}); start dockerd, set DOCKER_HOST, or use backend='bwrap'"
                ) from exc
        return _client


def engine_available(timeout: float = 3.0) -> bool:
    """True when a Docker engine answers a ping within ``timeout`` seconds."""
    import docker
    import docker.errors
    import requests.exceptions

    try:
        return bool(docker.from_env(timeout=timeout).ping())
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError):
        return False


class DockerTransport:
    """The agent's stdin/stdout through the container's attach socket (multiplexed frames)."""

    def __init__(self, attached: Any):
        self.sock: socket.socket = getattr(attached, "_sock", attached)
        self.frames = b""  # undecoded bytes from the engine
        self.stdout = b""  # the agent's stdout, decoded from frames
        self.stderr_tail = b""  # the agent's own stderr, for diagnostics

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise TransportClosed(str(exc)) from exc

    def recv_line(self, deadline: float) -> bytes:
        while b"\n" not in self.stdout:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no answer from the sandbox agent")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError as exc:
                raise TimeoutError("no answer from the sandbox agent") from exc
            except OSError as exc:
                raise TransportClosed(str(exc)) from exc
            if not chunk:
                raise TransportClosed("the container's attach stream ended")
            self.frames += chunk
            self._demux()
        line, _, self.stdout = self.stdout.partition(b"\n")
        return line

    def _demux(self) -> None:
        # Engine frame: [stream(1) 0 0 0 size(4, big-endian)] payload; stream 1 = stdout, 2 = stderr.
        while len(self.frames) >= 8:
            stream = self.frames[0]
            (size,) = struct.unpack(">I", self.frames[4:8])
            if len(self.frames) < 8 + size:
                return
            payload, self.frames = self.frames[8 : 8 + size], self.frames[8 + size :]
            if stream == 1:
                self.stdout += payload
            else:
                self.stderr_tail = (self.stderr_tail + payload)[-4096:]

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


AGENT_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL")
SHM_MB, SHM_INODES = 16, 4096
NET_SYSCTLS = {"net.ipv4.tcp_max_tw_buckets": "0"}


def tmpfs_inodes(limits: Limits) -> int:
    """Inode cap of each tmpfs: one per 4 KiB of its size (a million empty files cost kernel memory)."""
    return max(1024, limits.work_tmpfs_mb * 256)


class DockerSandbox(AgentSandbox):
    """A sandbox in a Docker container: no network, read-only root, tmpfs work dir (size and inode
    caps), non-root user, no capabilities, no-new-privileges, memory/pids/CPU limits, a private IPC
    namespace, only read-only host mounts.

    Args:
        image: image tag; defaults to the recipe-built ``agentrl-sandbox:<hash>``.
        limits: a :class:`Limits`; or pass its fields as keyword arguments.
    """

    backend = "docker"

    def __init__(self, limits: Limits | None = None, *, image: str | None = None, **limit_kwargs: Any):
        super().__init__(limits, **limit_kwargs)
        self.image = image or default_image()
        self.container_id: str | None = None

    def _launch(self) -> DockerTransport:
        with _engine_slots:
            return self._launch_container()

    def _launch_container(self) -> DockerTransport:
        import docker.errors
        from docker.types import Ulimit

        client = docker_client()
        limits = self.limits
        tmpfs_opts = f"size={limits.work_tmpfs_mb}m,nr_inodes={tmpfs_inodes(limits)},exec"
        host_config = client.api.create_host_config(
            network_mode=limits.network or "none",
            read_only=True,
            tmpfs={
                WORK_DIR: f"{tmpfs_opts},mode=0700,uid={SANDBOX_UID},gid={SANDBOX_UID}",
                "/tmp": f"{tmpfs_opts},mode=1777",
                # the engine's own /dev/shm has no inode cap: millions of empty files, slow to scrub
                "/dev/shm": f"size={SHM_MB}m,nr_inodes={SHM_INODES},mode=1777,nosuid,nodev,noexec",
            },
            # The agent is root with these three only (it runs every exec as SANDBOX_UID, which has
            # none): sandboxed code cannot signal, limit, re-nice or re-pin a process of another uid.
            cap_drop=["ALL"],
            cap_add=list(AGENT_CAPS),
            security_opt=["no-new-privileges"],
            mem_limit=f"{limits.memory_mb}m",
            memswap_limit=f"{limits.memory_mb}m",  # no swap: the memory limit is the limit
            pids_limit=limits.pids,
            nano_cpus=int(limits.cpus * 1e9),
            ulimits=[Ulimit(name="nofile", soft=1024, hard=1024), Ulimit(name="core", soft=0, hard=0)],
            binds={host: {"bind": inside, "mode": "ro"} for host, inside in limits.ro_mounts.items()},
            ipc_mode="private",
            auto_remove=True,  # if this process dies, the agent sees EOF, exits, and the box goes
            # Nothing of the box's output reaches the host's disk: the engine's default json-file
            # driver wrote every exec output and get_file payload (the attach stream) uncapped.
            log_config={"Type": "none", "Config": {}},
            # no TCP TIME_WAIT state kept between leases (a covert channel); namespaced per box
            sysctls=dict(NET_SYSCTLS) if limits.network is None else None,
        )
        try:
            config = client.api.create_container_config(
                self.image,
                command=["python3", "-c", AGENT_SOURCE, json.dumps(self._agent_config())],
                user="0:0",  # the agent; it runs every exec as SANDBOX_UID (see AGENT_CAPS)
                working_dir="/",
                stdin_open=True,
                tty=False,
                network_disabled=limits.network is None,
                labels={LABEL: "1", f"{LABEL}.owner": f"{socket.gethostname()}:{os.getpid()}"},
                host_config=host_config,
            )
            # StdinOnce: when our attach stream closes (this process died) the agent sees EOF.
            config["StdinOnce"] = True
            created = client.api.create_container_from_config(config)
        except docker.errors.ImageNotFound as exc:
            raise SandboxError(
                f"sandbox image {self.image} is missing; build it with `agentrl sandbox build` "
                "(or `python -m agentrl.sandboxes build`)"
            ) from exc
        except docker.errors.APIError as exc:
            raise SandboxError(
                f"docker refused to create the sandbox container: {exc.explanation or exc}"
            ) from exc
        self.container_id = created["Id"]
        try:
            attached = client.api.attach_socket(
                self.container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            client.api.start(self.container_id)
        except docker.errors.APIError as exc:
            self._destroy(engine_slot_held=True)
            raise SandboxError(
                f"docker could not start the sandbox container: {exc.explanation or exc}"
            ) from exc
        return DockerTransport(attached)

    def _loss_reason(self) -> str:
        import docker.errors
        import requests.exceptions

        if self.container_id is None:
            return "the container was never created"
        try:
            state = docker_client().api.inspect_container(self.container_id)["State"]
        except docker.errors.NotFound:
            return "the container was removed from outside"
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            # APIError, or the daemon itself is down (connection refused): the box is lost either way
            return f"the Docker engine did not answer ({exc})"
        if state.get("Running"):
            return "the container's agent stream broke while the container still runs"
        oom = ", OOM-killed" if state.get("OOMKilled") else ""
        return f"the container exited (code {state.get('ExitCode')}{oom})"

    def _destroy(self, engine_slot_held: bool = False) -> None:
        import docker.errors
        import requests.exceptions

        if self.container_id is None:
            return
        container_id, self.container_id = self.container_id, None
        try:
            with contextlib.nullcontext() if engine_slot_held else _engine_slots:
                docker_client().api.remove_container(container_id, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: auto-remove is already removing it
                raise SandboxError(f"could not remove sandbox container {container_id[:12]}: {exc}") from exc
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise SandboxError(
                f"the Docker engine did not answer while removing {container_id[:12]}: {exc}"
            ) from exc


def one_shot_container(argv: list[str], image: str | None = None, memory_mb: int = 512) -> bytes:
    """Run ``argv`` in a brand-new hardened container and remove it (the cold path benchmarks compare)."""
    client = docker_client()
    return client.containers.run(
        image or default_image(),
        argv,
        remove=True,
        network_disabled=True,
        network_mode="none",
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        user=f"{SANDBOX_UID}:{SANDBOX_UID}",
        mem_limit=f"{memory_mb}m",
        pids_limit=64,
        nano_cpus=10**9,
        labels={LABEL: "1"},
    )


def engine_exec(sandbox: DockerSandbox, argv: list[str]) -> bytes:
    """Run ``argv`` through the engine's own exec API in ``sandbox``'s container (no agent), for comparison."""
    return docker_client().containers.get(sandbox.container_id).exec_run(argv).output


def remove_all_sandboxes() -> int:
    """Force-remove every agentrl sandbox container on the engine (cleanup after crashes)."""
    import docker.errors

    client = docker_client()
    count = 0
    for summary in client.api.containers(all=True, filters={"label": LABEL}):
        try:
            client.api.remove_container(summary["Id"], force=True)
            count += 1
        except docker.errors.NotFound:
            pass
    return count
