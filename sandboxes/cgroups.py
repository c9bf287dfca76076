"""Per-box memory and pids cgroups for bubblewrap boxes (cgroup v1 or v2, when the host is root).

A cgroup's memory counter covers what bwrap's watchdog cannot see: tmpfs and ``/dev/shm`` pages,
SysV shared memory, memfds and kernel memory such as the inodes of a million empty files. Each
box gets ``agentrl/box-<pid>-<n>`` under the memory (and pids) hierarchy; its processes join it
before bwrap starts (a ``sh`` wrapper writes its own pid, then execs), and the group is removed
with the box. :func:`cgroup_support` says what this host allows and why not.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time

ROOT = "/sys/fs/cgroup"
PARENT = "agentrl"
_names = itertools.count()
_swept: set[str] = set()
_swept_lock = threading.Lock()


def cgroup_support() -> tuple[str | None, str]:
    """``("v1" | "v2", how)`` when per-box memory cgroups can be made here, else ``(None, why)``."""
    if os.geteuid() != 0:
        return None, "not root: agentrl makes per-box cgroups only as root (no delegation support)"
    controllers = os.path.join(ROOT, "cgroup.controllers")
    if os.path.exists(controllers):
        with open(controllers) as handle:
            if "memory" not in handle.read().split():
                return None, "cgroup v2 without the memory controller"
        return "v2", f"cgroup v2 at {ROOT}/{PARENT}"
    memory = os.path.join(ROOT, "memory")
    if os.path.isdir(memory) and os.access(memory, os.W_OK):
        return "v1", f"cgroup v1 at {memory}/{PARENT}"
    return None, f"no writable memory cgroup hierarchy under {ROOT}"


def _write(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(parent: str) -> list[str]:
    """Remove the empty box groups under ``parent`` left by processes that died without closing
    their boxes (killed runs), and any named after this process from before it started (a reused
    pid). Groups that still hold tasks are left alone. Returns the removed paths."""
    removed = []
    for name in os.listdir(parent):
        parts = name.split("-")
        if len(parts) != 3 or parts[0] != "box" or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        if pid != os.getpid() and _alive(pid):
            continue
        try:
            os.rmdir(os.path.join(parent, name))
        except OSError:  # tasks left in it (or already gone): not ours to kill
            continue
        removed.append(os.path.join(parent, name))
    return removed


def _parent(hierarchy: str, v2: bool) -> str:
    parent = os.path.join(hierarchy, PARENT)
    os.makedirs(parent, exist_ok=True)
    with _swept_lock:
        if parent not in _swept:  # once per process and hierarchy, before its first box
            _swept.add(parent)
            sweep_stale(parent)
    if v2:  # let the children have memory and pids controllers
        for where in (hierarchy, parent):
            _write(os.path.join(where, "cgroup.subtree_control"), "+memory +pids")
    return parent


class BoxCgroup:
    """The cgroup(s) of one box: memory limit ``memory_bytes`` (no swap), ``pids`` processes.

    No CPU controller: a per-box ``cpu`` cgroup (v1, CFS quota) made parallel box starts 2.9x
    slower here (3.9 vs 11.2 boxes/s with 8 starting at once; the kernel serializes it), and bwrap
    boxes are recycled every lease. The CPU share of a bwrap box is therefore not limited."""

    def __init__(self, version: str, memory_bytes: int, pids: int):
        self.version = version
        name = f"box-{os.getpid()}-{next(_names)}"
        self.dirs: list[str] = []
        # (host path, path in the box) of the tasks counter the agent checks at each reset
        self.pids_file: tuple[str, str] | None = None
        try:
            if version == "v2":
                path = os.path.join(_parent(ROOT, True), name)
                os.mkdir(path)
                self.dirs.append(path)
                _write(os.path.join(path, "memory.max"), str(memory_bytes))
                if os.path.exists(os.path.join(path, "memory.swap.max")):
                    _write(os.path.join(path, "memory.swap.max"), "0")
                _write(os.path.join(path, "pids.max"), str(pids))
                self.oom_file = (os.path.join(path, "memory.events"), f"{ROOT}/memory.events")
                self.pids_file = (os.path.join(path, "pids.current"), f"{ROOT}/pids.current")
            else:
                memory = os.path.join(_parent(os.path.join(ROOT, "memory"), False), name)
                os.mkdir(memory)
                self.dirs.append(memory)
                _write(os.path.join(memory, "memory.limit_in_bytes"), str(memory_bytes))
                if os.path.exists(os.path.join(memory, "memory.memsw.limit_in_bytes")):
                    _write(os.path.join(memory, "memory.memsw.limit_in_bytes"), str(memory_bytes))
                if os.path.isdir(os.path.join(ROOT, "pids")):
                    pids_dir = os.path.join(_parent(os.path.join(ROOT, "pids"), False), name)
                    os.mkdir(pids_dir)
                    self.dirs.append(pids_dir)
                    _write(os.path.join(pids_dir, "pids.max"), str(pids))
                    self.pids_file = (os.path.join(pids_dir, "pids.current"), f"{ROOT}/pids/pids.current")
                self.oom_file = (
                    os.path.join(memory, "memory.oom_control"),
                    f"{ROOT}/memory/memory.oom_control",
                )
        except OSError:
            self.remove()
            raise

    def join_command(self) -> str:
        """Shell commands that move the shell running them into the box's cgroups."""
        return " && ".join(f"echo $$ > '{d}/cgroup.procs'" for d in self.dirs)

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run by a shell that first moves itself into the box's cgroups."""
        return ["/bin/sh", "-c", f'{self.join_command()} && exec "$@"', "agentrl-cgroup", *argv]

    def memory_bytes_used(self) -> int:
        name = "memory.current" if self.version == "v2" else "memory.usage_in_bytes"
        with open(os.path.join(self.dirs[0], name)) as handle:
            return int(handle.read())

    def remove(self, wait_s: float = 5.0) -> None:
        """Kill whatever is left in the groups and remove them (their memory is uncharged)."""
        deadline = time.monotonic() + wait_s
        for path in reversed(self.dirs):
            while True:
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                try:
                    with open(os.path.join(path, "cgroup.procs")) as handle:
                        for pid in handle.read().split():
                            try:
                                os.kill(int(pid), signal.SIGKILL)
                            except ProcessLookupError:
                                pass
                except FileNotFoundError:
                    break
                time.sleep(0.01)
        self.dirs = []
