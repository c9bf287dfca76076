"""bubblewrap backend: the same agent in user/pid/net/ipc/uts namespaces, for hosts without Docker.

The host's ``/usr`` is the box's read-only ``/usr`` (so the sandbox runs the host's ``python3``;
as root through a private overlay per box, so inotify in one box sees nothing others open), the work dir
and ``/tmp`` are size-capped tmpfs, there is no network (a fresh, empty net namespace), a private
IPC namespace with its own ``/dev/mqueue``, no host env vars and no other host path. As root, each
box gets its own memory+pids cgroup (``cgroups.py``: v1 or v2), whose memory counter also charges
tmpfs, SysV shm, memfds and kernel memory; without one, memory is an RSS watchdog plus
``RLIMIT_AS`` (blind to shm and tmpfs). Processes are also ``RLIMIT_NPROC`` on a dedicated uid.
The CPU share is not limited (only each exec's timeout is; ``cgroups.py`` says why). bwrap
cannot set tmpfs options besides ``--size``, so the number of inodes is bounded only by the memory
cgroup. ``agentrl sandbox doctor`` measures it all.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Any

from agentrl.errors import SandboxError
from agentrl.sandboxes.base import AGENT_SOURCE, AgentSandbox, Limits, TransportClosed
from agentrl.sandboxes.cgroups import BoxCgroup, cgroup_support
from agentrl.sandboxes.image import IMAGE_ENV, SANDBOX_UID, WORK_DIR

# When the host process is root, each bwrap sandbox runs as its own unprivileged host uid, so that
# RLIMIT_NPROC (counted per host uid) is a per-sandbox process limit.
HOST_UID_BASE = 61000
_uid_slots = itertools.count()
_uid_lock = threading.Lock()


def bwrap_available() -> bool:
    """True when ``bwrap`` is installed and can create its namespaces here."""
    path = shutil.which("bwrap")
    if path is None:
        return False
    probe = subprocess.run(
        [path, "--unshare-all", "--ro-bind", "/usr", "/usr", *_usr_merge_links(), "--", "/usr/bin/true"],
        capture_output=True,
    )
    return probe.returncode == 0


# As root, each box's /usr is a read-only overlay of the host's mounted here in the box's own mount
# namespace (the directories are shared and empty on the host).
PRIVATE_USR = "/run/agentrl-bwrap/usr"
EMPTY_LAYER = "/run/agentrl-bwrap/empty"


def private_usr_supported() -> bool:
    """True when boxes get a private overlay of /usr (root, with ``unshare`` and overlayfs)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    with open("/proc/filesystems") as handle:
        if "overlay" not in handle.read():
            return False
    for path in (PRIVATE_USR, EMPTY_LAYER):
        os.makedirs(path, mode=0o755, exist_ok=True)
    return True


def _usr_merge_links() -> list[str]:
    links = []
    for name in ("bin", "sbin", "lib", "lib64", "lib32"):
        target = os.path.join("/", name)
        if os.path.islink(target):
            links += ["--symlink", os.readlink(target), target]
        elif os.path.isdir(target):
            links += ["--ro-bind", target, target]
    return links


_etc_lock = threading.Lock()
_etc_path: str | None = None
ETC_FILES = {
    "passwd": "root:x:0:0:root:/:/usr/sbin/nologin\nsandbox:x:1000:1000::/work:/bin/sh\n",
    "group": "root:x:0:\nsandbox:x:1000:\n",
    "hostname": "sandbox\n",
    "hosts": "127.0.0.1 localhost sandbox\n",
}


def _etc_dir() -> str:
    """A tiny /etc for the sandbox (its user and hostname); the host's /etc is never bound."""
    global _etc_path
    with _etc_lock:
        if _etc_path is None:
            path = tempfile.mkdtemp(prefix="agentrl-bwrap-etc-")
            for name, text in ETC_FILES.items():
                with open(os.path.join(path, name), "w") as handle:
                    handle.write(text)
                os.chmod(os.path.join(path, name), 0o644)
            os.chmod(path, 0o755)  # readable by the unprivileged uid bwrap runs as
            atexit.register(shutil.rmtree, path, True)
            _etc_path = path
        return _etc_path


class PipeTransport:
    """The agent's stdin/stdout as the pipes of the local bwrap process."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.buffer = b""

    def send(self, data: bytes) -> None:
        try:
            self.process.stdin.write(data)
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise TransportClosed(str(exc)) from exc

    def recv_line(self, deadline: float) -> bytes:
        fd = self.process.stdout.fileno()
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no answer from the sandbox agent")
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise TransportClosed("the bwrap process closed its output")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def close(self) -> None:
        for handle in (self.process.stdin, self.process.stdout):
            try:
                handle.close()
            except (OSError, ValueError):
                pass


class BwrapSandbox(AgentSandbox):
    """A sandbox in bubblewrap namespaces (same protocol and limits as :class:`DockerSandbox`)."""

    backend = "bwrap"

    def __init__(self, limits: Limits | None = None, **limit_kwargs: Any):
        super().__init__(limits, **limit_kwargs)
        if self.limits.network is not None:
            raise SandboxError("the bwrap backend has no networks; use network=None or the docker backend")
        self.process: subprocess.Popen | None = None
        self._stderr = None
        self.cgroup: BoxCgroup | None = None
        self.cgroup_version, self.cgroup_note = cgroup_support()
        self._usr_choice: bool | None = None
        with _uid_lock:
            self.host_uid = HOST_UID_BASE + (os.getpid() * 131 + next(_uid_slots)) % 4000

    def _agent_config(self) -> dict[str, Any]:
        memory = self.limits.memory_mb << 20
        rlimits = {"RLIMIT_CORE": 0, "RLIMIT_NOFILE": 1024, "RLIMIT_AS": 2 * memory + (256 << 20)}
        rlimits["RLIMIT_NPROC"] = self._nproc_limit()
        # Without a cgroup the RSS watchdog is the memory limit (it cannot see shm, memfd or tmpfs).
        watchdog = self.cgroup_version is None
        config = {**super()._agent_config(), "memory_bytes": memory, "watchdog": watchdog, "rlimits": rlimits}
        config["outside_tasks"] = 1  # bwrap's monitor process shares the box's pids cgroup
        return config

    def _private_usr(self) -> bool:
        if self._usr_choice is None:
            self._usr_choice = private_usr_supported()
        return self._usr_choice

    def _nproc_limit(self) -> int:
        if os.geteuid() == 0:
            return self.limits.pids  # the sandbox's own host uid: the count is the sandbox's alone
        # Unprivileged: the count covers all of this user's processes, so allow for the ones running.
        mine = 0
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    mine += os.stat(f"/proc/{name}").st_uid == os.geteuid()
                except OSError:
                    pass
        return mine + self.limits.pids

    def _command(self) -> list[str]:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxError(
                "bubblewrap is not installed; run `apt-get install -y bubblewrap` or use Docker"
            )
        size = str(self.limits.work_tmpfs_mb << 20)
        argv = []
        if os.geteuid() == 0:
            uid = str(self.host_uid)
            argv += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--"]
        argv += [
            bwrap,
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--as-pid-1",
        ]
        argv += [
            "--cap-drop",
            "ALL",
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_UID),
            "--hostname",
            "sandbox",
        ]
        usr = PRIVATE_USR if self._private_usr() else "/usr"
        argv += ["--ro-bind", usr, "/usr", *_usr_merge_links()]
        argv += ["--ro-bind", _etc_dir(), "/etc", "--proc", "/proc", "--dev", "/dev"]
        argv += ["--size", size, "--tmpfs", WORK_DIR, "--size", size, "--tmpfs", "/tmp"]
        argv += ["--size", str(16 << 20), "--tmpfs", "/dev/shm", "--mqueue", "/dev/mqueue"]
        if self.cgroup is not None:  # the agent reads its OOM-kill and task counters, as under Docker
            argv += ["--ro-bind", *self.cgroup.oom_file]
            if self.cgroup.pids_file is not None:
                argv += ["--ro-bind", *self.cgroup.pids_file]
        for host, inside in self.limits.ro_mounts.items():
            argv += ["--ro-bind", host, inside]
        argv += ["--remount-ro", "/"]  # bwrap's root is a tmpfs: make it read-only like Docker's
        argv += ["--chdir", WORK_DIR, "--clearenv"]
        for key, value in IMAGE_ENV.items():
            argv += ["--setenv", key, value]
        argv += ["--", "/usr/bin/python3", "-c", AGENT_SOURCE, json.dumps(self._agent_config())]
        return argv

    def _launch(self) -> PipeTransport:
        self._stderr = tempfile.TemporaryFile()
        if self.cgroup_version is not None:
            try:
                self.cgroup = BoxCgroup(self.cgroup_version, self.limits.memory_mb << 20, self.limits.pids)
            except OSError as exc:
                raise SandboxError(
                    f"could not make the bwrap box's cgroup ({self.cgroup_note}): {exc}"
                ) from exc
        argv = self._command()
        steps = [self.cgroup.join_command()] if self.cgroup is not None else []
        if self._private_usr():
            # A private mount namespace (gone with the box) where /usr is an overlay of the host's:
            # its inodes are the box's own, so inotify in one box sees nothing another box or the
            # host opens there (a bind of /usr shares every inode, and every open, between boxes).
            steps.append(f"mount -t overlay agentrl-usr -o ro,lowerdir=/usr:{EMPTY_LAYER} {PRIVATE_USR}")
            argv = ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
                    " && ".join(steps) + ' && exec "$@"', "agentrl-box", *argv]  # fmt: skip
        elif steps:
            argv = ["/bin/sh", "-c", steps[0] + ' && exec "$@"', "agentrl-box", *argv]
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env={}
        )
        return PipeTransport(self.process)

    def _loss_reason(self) -> str:
        if self.process is None:
            return "bwrap never started"
        try:
            code = self.process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            code = None
        tail = b""
        if self._stderr is not None:
            self._stderr.seek(0)
            tail = self._stderr.read()[-600:]
        detail = f": {tail.decode(errors='replace').strip()}" if tail.strip() else ""
        return f"bwrap exited (code {code}){detail}" if code is not None else "the agent's pipe broke"

    def _destroy(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()  # --die-with-parent takes the whole pid namespace with it
            process.wait()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        cgroup, self.cgroup = self.cgroup, None
        if cgroup is not None:
            try:
                cgroup.remove()
            except OSError as exc:
                raise SandboxError(f"could not remove the bwrap box's cgroup {cgroup.dirs}: {exc}") from exc
