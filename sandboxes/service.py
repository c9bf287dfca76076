"""Long-running service containers on an internal network the caller owns (e.g. an env's shop server).

A sandbox (``docker_backend.py``) runs short execs and kills every process at each exec's end, so
it cannot host a server. A :class:`ServiceContainer` runs one command for as long as it is wanted,
with the same hardening as a sandbox (read-only root, non-root uid, ``cap_drop=ALL``,
``no-new-privileges``, memory/pids/CPU limits, only read-only host mounts, a size-capped ``/tmp``,
IPv6 off) and one network: an internal bridge network (:class:`ServiceNetwork`) with no route
outside, which the host reaches at the container's address on it.

Docker's ``internal=True`` only stops *forwarding*: the container still gets a default route to
the host's address on the bridge, and every host service listening on 0.0.0.0 (an inference
server, the engine's other bridges' addresses, the host's own IP) answers it. So a
:class:`ServiceNetwork` also adds a host firewall rule on its bridge that drops new connections
from the network to the host (replies to connections the host opens still pass); it needs
``iptables`` and root on the engine's host, and fails with a clear error otherwise
(``block_host=False`` opts out knowingly).

If the process that started a service dies, the container goes too: PID 1 is a small launcher that
exits (killing the service) when its stdin - our attach stream - reaches EOF, and the container is
auto-removed. Networks cannot remove themselves; :func:`sweep_stale` removes the labelled networks
and containers of dead owners on this host, and :class:`ServiceNetwork` calls it on creation.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from typing import Any

from agentrl.errors import SandboxError
from agentrl.sandboxes.base import TransportClosed
from agentrl.sandboxes.docker_backend import DockerTransport, docker_client
from agentrl.sandboxes.image import SANDBOX_UID, default_image

LABEL = "agentrl.service"
OWNER_LABEL = f"{LABEL}.owner"
# PID 1 of a service container: runs the command and dies with our attach stream (stdin EOF).
LAUNCHER_SOURCE = """\
import os, subprocess, sys, threading
child = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL)
def watch_stdin():
    while os.read(0, 65536):
        pass
    child.kill()
    os._exit(0)
threading.Thread(target=watch_stdin, daemon=True).start()
sys.exit(child.wait())
"""
_names = itertools.count(1)
FIREWALL_TAG = "agentrl-service"


def _firewall_rule(bridge: str) -> list[str]:
    """The INPUT rule (without -A/-I/-D) that keeps a service network from opening host connections."""
    return [
        "INPUT", "-i", bridge, "-m", "conntrack", "--ctstate", "NEW,INVALID",
        "-m", "comment", "--comment", f"{FIREWALL_TAG} {_owner()}", "-j", "DROP",
    ]  # fmt: skip


def _iptables(binary: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    path = shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/sbin")
    if path is None:
        raise SandboxError(
            f"{binary} is missing: a service network cannot be closed to the host "
            "(apt-get install -y iptables, or pass block_host=False to accept the risk)"
        )
    return subprocess.run([path, "-w", "5", *args], capture_output=True, text=True, timeout=30)


def _sweep_firewall() -> int:
    """Delete our INPUT rules whose bridge no longer exists (their owner died before removing them)."""
    removed = 0
    for binary in ("iptables", "ip6tables"):
        if shutil.which(binary, path="/usr/sbin:/sbin:" + os.environ.get("PATH", "")) is None:
            continue
        listing = _iptables(binary, ["-S", "INPUT"])
        for line in listing.stdout.splitlines():
            parts = line.split()
            if FIREWALL_TAG not in line or "-i" not in parts:
                continue
            bridge = parts[parts.index("-i") + 1]
            if not os.path.exists(f"/sys/class/net/{bridge}"):
                # -S prints the comment quoted; rebuild the rule from its parts for -D
                spec = _firewall_rule(bridge)
                spec[spec.index("--comment") + 1] = line.split('--comment "', 1)[1].split('"', 1)[0]
                if _iptables(binary, ["-D", *spec]).returncode == 0:
                    removed += 1
    return removed


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _owner_dead(owner: str) -> bool:
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another machine's (or unlabelled): not ours to judge
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def sweep_stale() -> int:
    """Remove service containers and networks whose owner process on this host is dead.

    Returns:
        How many containers and networks were removed.
    """
    import docker.errors

    client = docker_client()
    removed = 0
    for summary in client.api.containers(all=True, filters={"label": LABEL}):
        if _owner_dead(summary.get("Labels", {}).get(OWNER_LABEL, "")):
            try:
                client.api.remove_container(summary["Id"], force=True)
                removed += 1
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: already being removed
                    raise
    for network in client.api.networks(filters={"label": LABEL}):
        if _owner_dead(network.get("Labels", {}).get(OWNER_LABEL, "")):
            try:
                client.api.remove_network(network["Id"])
                removed += 1
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if exc.status_code != 403:  # 403: still has endpoints; a later sweep gets it
                    raise
    if os.geteuid() == 0:  # after the networks: a rule goes once its bridge is gone
        removed += _sweep_firewall()
    return removed


class ServiceNetwork:
    """An internal bridge network owned by this process: no route outside, the host reaches its members.

    Args:
        prefix: start of the network's name (a unique suffix is added).
        block_host: add the host firewall rule that drops connections the network opens to the host
            (see the module docstring); False leaves host services on 0.0.0.0 reachable from it.
    """

    def __init__(self, prefix: str = "agentrl-svc", *, block_host: bool = True):
        suffix = uuid.uuid4().hex[:6]
        self.name = f"{prefix}-{os.getpid()}-{next(_names)}-{suffix}"
        self.bridge = f"agr{os.getpid() % 100000}{suffix}"[:15]  # Linux interface names: <= 15 chars
        self.block_host = block_host
        self.firewalled: list[str] = []  # the iptables binaries holding our rule
        self.id: str | None = None

    def create(self) -> str:
        """Create the network (sweeping dead owners' leftovers first); returns its name."""
        import docker.errors

        if self.id is not None:
            return self.name
        sweep_stale()
        try:
            created = docker_client().api.create_network(
                self.name,
                driver="bridge",
                internal=True,
                labels={LABEL: "1", OWNER_LABEL: _owner()},
                options={
                    "com.docker.network.bridge.enable_icc": "true",
                    "com.docker.network.bridge.name": self.bridge,
                },
            )
        except docker.errors.APIError as exc:
            raise SandboxError(
                f"docker could not create network {self.name}: {exc.explanation or exc}"
            ) from exc
        self.id = created["Id"]
        if self.block_host:
            try:
                self._close_to_host()
            except SandboxError:
                self.remove()
                raise
        return self.name

    def _close_to_host(self) -> None:
        if os.geteuid() != 0:
            raise SandboxError(
                "closing a service network to the host needs root (a host firewall rule on its "
                "bridge); run as root, or pass block_host=False to accept that the service can reach "
                "host ports listening on 0.0.0.0"
            )
        for binary in ("iptables", "ip6tables"):
            done = _iptables(binary, ["-I", *_firewall_rule(self.bridge)])
            if done.returncode != 0:
                if binary == "ip6tables":  # no IPv6 here; containers have IPv6 disabled anyway
                    continue
                raise SandboxError(f"iptables refused the service network's rule: {done.stderr.strip()}")
            self.firewalled.append(binary)

    def remove(self) -> None:
        """Remove the network (its containers must be gone); idempotent."""
        import docker.errors

        network_id, self.id = self.id, None
        for binary in self.firewalled:
            _iptables(binary, ["-D", *_firewall_rule(self.bridge)])
        self.firewalled = []
        if network_id is None:
            return
        try:
            docker_client().api.remove_network(network_id)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            raise SandboxError(f"could not remove network {self.name}: {exc.explanation or exc}") from exc

    def exists(self) -> bool:
        import docker.errors

        try:
            docker_client().api.inspect_network(self.name)
        except docker.errors.NotFound:
            return False
        return True


class ServiceContainer:
    """One hardened, detached, long-running command on a :class:`ServiceNetwork`.

    Args:
        command: argv to run (the image's ``python3`` is there; host code comes in by ``ro_mounts``).
        network: the network's name (from :meth:`ServiceNetwork.create`).
        image: image tag (default: the sandbox image).
        memory_mb, pids, cpus: cgroup limits (no swap).
        tmp_mb: size of the writable ``/tmp`` (the only writable place).
        ro_mounts: ``{host path: container path}``, mounted read-only.
        env: extra environment variables (nothing of the host's is passed).
    """

    def __init__(
        self,
        command: list[str],
        *,
        network: str,
        image: str | None = None,
        memory_mb: int = 1024,
        pids: int = 256,
        cpus: float = 1.0,
        tmp_mb: int = 64,
        ro_mounts: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
    ):
        if memory_mb <= 0 or pids <= 0 or cpus <= 0 or tmp_mb <= 0:
            raise SandboxError("service limits memory_mb, pids, cpus and tmp_mb must be positive")
        self.command = list(command)
        self.network = network
        self.image = image or default_image()
        self.memory_mb, self.pids, self.cpus, self.tmp_mb = memory_mb, pids, cpus, tmp_mb
        self.ro_mounts = dict(ro_mounts or {})
        self.env = dict(env or {})
        self.container_id: str | None = None
        self.ip: str | None = None
        self._transport: DockerTransport | None = None
        self._ended = threading.Event()  # set when the attach stream ends (the container stopped)
        self._output_tail = b""

    # ------------------------------------------------------------------ lifecycle
    def start(self, ready_prefix: str = "READY ", timeout: float = 90.0) -> str:
        """Start the container and wait for a stdout line starting with ``ready_prefix``.

        Returns:
            The rest of that line.

        Raises:
            SandboxError: docker refused, or the command exited or stayed silent past ``timeout``
                (the message carries the end of its output).
        """
        import docker.errors
        from docker.types import Ulimit

        if self.container_id is not None:
            raise SandboxError("this service container is already started; stop() it first")
        client = docker_client()
        host_config = client.api.create_host_config(
            network_mode=self.network,
            read_only=True,
            tmpfs={"/tmp": f"size={self.tmp_mb}m,mode=1777"},
            shm_size=16 << 20,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            mem_limit=f"{self.memory_mb}m",
            memswap_limit=f"{self.memory_mb}m",
            pids_limit=self.pids,
            nano_cpus=int(self.cpus * 1e9),
            ulimits=[Ulimit(name="nofile", soft=4096, hard=4096), Ulimit(name="core", soft=0, hard=0)],
            binds={host: {"bind": inside, "mode": "ro"} for host, inside in self.ro_mounts.items()},
            ipc_mode="private",
            sysctls={"net.ipv6.conf.all.disable_ipv6": "1"},  # no link-local path to the host
            auto_remove=True,
            log_config={"Type": "none", "Config": {}},  # its output (attach) never lands on the host's disk
        )
        try:
            config = client.api.create_container_config(
                self.image,
                command=["python3", "-c", LAUNCHER_SOURCE, *self.command],
                user=f"{SANDBOX_UID}:{SANDBOX_UID}",
                working_dir="/tmp",
                environment=self.env,
                stdin_open=True,
                tty=False,
                labels={LABEL: "1", OWNER_LABEL: _owner()},
                host_config=host_config,
            )
            config["StdinOnce"] = True  # our attach stream closing (we died) closes its stdin
            created = client.api.create_container_from_config(config)
        except docker.errors.ImageNotFound as exc:
            raise SandboxError(
                f"image {self.image} is missing; build it with `agentrl sandbox build`"
            ) from exc
        except docker.errors.APIError as exc:
            raise SandboxError(
                f"docker refused to create the service container: {exc.explanation or exc}"
            ) from exc
        self.container_id = created["Id"]
        self._ended.clear()
        self._output_tail = b""
        try:
            attached = client.api.attach_socket(
                self.container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            self._transport = DockerTransport(attached)
            client.api.start(self.container_id)
            inspected = client.api.inspect_container(self.container_id)
            self.ip = inspected["NetworkSettings"]["Networks"][self.network]["IPAddress"]
        except (docker.errors.APIError, KeyError) as exc:
            self.stop()
            raise SandboxError(f"docker could not start the service container: {exc}") from exc
        return self._wait_ready(ready_prefix, timeout)

    def _wait_ready(self, ready_prefix: str, timeout: float) -> str:
        assert self._transport is not None
        deadline = time.monotonic() + timeout
        seen: list[bytes] = []
        try:
            while True:
                line = self._transport.recv_line(deadline)
                if line.decode(errors="replace").startswith(ready_prefix):
                    break
                seen.append(line)
        except (TimeoutError, TransportClosed) as exc:
            tail = (b"\n".join(seen) + b"\n" + self._transport.stderr_tail).decode(errors="replace")[-2000:]
            self.stop()
            raise SandboxError(
                f"the service did not get ready within {timeout:.0f}s ({exc}); its output ends with:\n{tail}"
            ) from exc
        threading.Thread(target=self._drain, daemon=True, name="service-drain").start()
        return line.decode(errors="replace")[len(ready_prefix) :]

    def _drain(self) -> None:
        """Read (and keep the tail of) the output so the service never blocks on a full pipe; note EOF."""
        transport = self._transport
        try:
            while transport is not None:
                transport.sock.settimeout(None)
                chunk = transport.sock.recv(1 << 16)
                if not chunk:
                    break
                self._output_tail = (self._output_tail + chunk)[-8192:]
        except OSError:
            pass
        self._ended.set()

    def running(self) -> bool:
        """False once the container stopped (its attach stream ended) or was never started."""
        return self.container_id is not None and not self._ended.is_set()

    def wait_ended(self, timeout: float) -> bool:
        """Block until the container stopped (True) or ``timeout`` passed (False)."""
        return self._ended.wait(timeout)

    def output_tail(self) -> str:
        """The last output bytes after the ready line (raw engine frames, for diagnostics)."""
        return self._output_tail.decode(errors="replace")

    def kill(self) -> None:
        """SIGKILL the container as a crash would (it is then auto-removed); for tests and drills."""
        import docker.errors

        if self.container_id is None:
            return
        try:
            docker_client().api.kill(self.container_id)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: not running any more
                raise SandboxError(f"could not kill service container: {exc}") from exc

    def stop(self) -> None:
        """Remove the container (force); idempotent."""
        import docker.errors

        container_id, self.container_id = self.container_id, None
        transport, self._transport = self._transport, None
        self.ip = None
        if transport is not None:
            transport.close()
        if container_id is None:
            return
        try:
            docker_client().api.remove_container(container_id, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: auto-remove is already removing it
                raise SandboxError(f"could not remove service container {container_id[:12]}: {exc}") from exc
        # auto_remove runs asynchronously: wait (briefly) until the engine forgot it, so the network
        # can be removed right after
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            try:
                docker_client().api.inspect_container(container_id)
            except docker.errors.NotFound:
                return
            time.sleep(0.05)

    # ------------------------------------------------------------------ inspection
    def exec(self, argv: list[str], timeout: float = 30.0) -> tuple[int, str]:
        """Run ``argv`` inside the running container through the engine (diagnostics and tests).

        Runs as the same non-root uid, without capabilities. Returns ``(exit code, output)``.
        """
        if self.container_id is None:
            raise SandboxError("the service container is not running")
        client = docker_client()
        exec_id = client.api.exec_create(
            self.container_id, ["timeout", str(int(timeout)), *argv], user=f"{SANDBOX_UID}:{SANDBOX_UID}"
        )["Id"]
        output = client.api.exec_start(exec_id)
        code = client.api.exec_inspect(exec_id)["ExitCode"]
        return int(code if code is not None else -1), output.decode(errors="replace")

    def memory_bytes(self) -> int:
        """Current memory use of the container's cgroup (0 when not running)."""
        import docker.errors

        if self.container_id is None:
            return 0
        try:
            stats: dict[str, Any] = docker_client().api.stats(self.container_id, stream=False)
        except docker.errors.NotFound:
            return 0
        memory = stats.get("memory_stats") or {}
        cache = (memory.get("stats") or {}).get("cache", 0)
        return max(0, int(memory.get("usage", 0)) - int(cache))

    def info(self) -> dict[str, Any]:
        """Name, address and limits, for logs and reports."""
        return {
            "container": (self.container_id or "")[:12],
            "network": self.network,
            "ip": self.ip,
            "memory_mb": self.memory_mb,
            "pids": self.pids,
            "cpus": self.cpus,
        }
