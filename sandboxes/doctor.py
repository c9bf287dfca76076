"""``agentrl sandbox doctor``: which limits each backend enforces on *this* host, measured.

Every row is a small bounded attack run in a real box with small limits (128 MiB memory, a 32 MiB
work tmpfs): memory the watchdog cannot see (a memfd, SysV shared memory), a flood of empty files
(tmpfs inodes), two spinning processes (the CPU share), a SysV segment (is the IPC namespace
private?) and keyrings (does a key survive into the next box?). Each probe stops itself at twice
the limit, so a limit that does not hold is reported, never suffered.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass

from agentrl.errors import SandboxError, SandboxLost

LIMITS = {"memory_mb": 128, "work_tmpfs_mb": 32, "pids": 64, "cpus": 1.0}
MEMFD = """
import os
fd = os.memfd_create("probe")
for _ in range(32):
    os.write(fd, b"x" * (8 << 20))
print("held", os.fstat(fd).st_size >> 20)
"""
SHM = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
for i in range(8):
    seg = libc.shmget(0, 32 << 20, 0o1000 | 0o600)
    if seg < 0:
        raise SystemExit("shmget refused: " + str(ctypes.get_errno()))
    ctypes.memset(libc.shmat(seg, None, 0), 1, 32 << 20)
print("held", 8 * 32)
"""
INODES = """
import os, time
n, end = 0, time.monotonic() + 20
try:
    while n < 300_000 and time.monotonic() < end:
        os.mknod(f"/work/{n}"); n += 1
    print("created", n)
except OSError as exc:
    print("stopped", n, exc.strerror)
"""
SPIN = """
import os, time
pids = []
for _ in range(2):  # processes, not threads: the GIL would cap threads at one CPU
    pid = os.fork()
    if pid == 0:
        end = time.monotonic() + 2
        while time.monotonic() < end:
            pass
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
print(round(sum(os.times()[2:4]), 2))
"""
ADD_KEY, KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}.get(platform.machine(), (0, 0))
KEY_ADD = (
    "import ctypes; libc = ctypes.CDLL(None, use_errno=True)\n"
    f"r = libc.syscall({ADD_KEY}, b'user', b'agentrl-doctor', b'x', 1, -4)\n"
    "print(r if r > 0 else -ctypes.get_errno())"
)
KEY_FIND = (
    "import ctypes; libc = ctypes.CDLL(None, use_errno=True)\n"
    f"print(libc.syscall({KEYCTL}, 10, -4, b'user', b'agentrl-doctor', 0))"
)


@dataclass
class Check:
    backend: str
    limit: str
    holds: bool | None  # None: could not be measured here
    measured: str


def _memory(backend: str, name: str, code: str) -> Check:
    from agentrl.sandboxes import make_sandbox

    limit = f"memory limit covers {name}"
    try:
        with make_sandbox(backend, **LIMITS) as box:
            result = box.exec(code, timeout=60)
    except SandboxLost as exc:
        return Check(
            backend, limit, True, f"the box was killed at its {LIMITS['memory_mb']} MiB limit ({exc})"
        )
    if "held" in result.stdout:
        return Check(
            backend,
            limit,
            False,
            f"{result.stdout.split()[-1]} MiB held with a {LIMITS['memory_mb']} MiB limit",
        )
    how = "OOM-killed" if result.oom_killed else f"exit {result.exit_code}: {result.stderr.strip()[-80:]}"
    return Check(backend, limit, True, f"{how} before {2 * LIMITS['memory_mb']} MiB")


def _inodes(backend: str) -> Check:
    from agentrl.sandboxes import make_sandbox

    limit = "tmpfs inodes bounded"
    started = time.monotonic()
    try:
        with make_sandbox(backend, **LIMITS) as box:
            result = box.exec(INODES, timeout=60)
    except SandboxLost:
        return Check(backend, limit, True, "no inode cap, but the memory cgroup killed the box (SandboxLost)")
    words = result.stdout.split()
    took = time.monotonic() - started
    if words[:1] == ["stopped"]:
        return Check(
            backend, limit, True, f"{words[1]} empty files, then {' '.join(words[2:])} ({took:.1f} s)"
        )
    if result.oom_killed:
        return Check(
            backend, limit, True, f"no inode cap; the memory cgroup OOM-killed the writer ({took:.1f} s)"
        )
    return Check(
        backend, limit, False, f"{' '.join(words[1:]) or '?'} empty files and still going ({took:.1f} s)"
    )


def _cpu(backend: str) -> Check:
    from agentrl.sandboxes import make_sandbox

    with make_sandbox(backend, **LIMITS) as box:
        result = box.exec(SPIN, timeout=30)
        host = subprocess.run([sys.executable, "-c", SPIN], capture_output=True, text=True)
    used, free = float(result.stdout.strip() or "nan"), float(host.stdout.strip() or "nan")
    cap = 2 * LIMITS["cpus"] * 1.15  # 2 s at the quota, 15% slack
    measured = f"2 processes spinning 2 s used {used} CPU-s in the box, {free} CPU-s on the host"
    holds = used <= cap if free > cap else None  # a host too busy to exceed the cap proves nothing
    if backend == "bwrap":  # known: no CPU controller is applied (cgroups.py says why)
        holds, measured = False, f"no CPU limit is applied to bwrap boxes; {measured}"
    return Check(backend, f"CPU share <= {LIMITS['cpus']} CPU", holds, measured)


def _ipc(backend: str) -> Check:
    from agentrl.sandboxes import make_sandbox

    key = 0x4147_0000 + os.getpid() % 0xFFFF
    code = f"import ctypes; print(ctypes.CDLL(None).shmget({key}, 4096, 0o1000 | 0o600))"
    with make_sandbox(backend, **LIMITS) as box:
        made = box.exec(code, timeout=30).stdout.strip()
        with open("/proc/sysvipc/shm") as handle:
            seen = any(line.split()[0] == str(key) for line in handle.read().splitlines()[1:])
    return Check(backend, "private IPC namespace", not seen and made != "-1",
                 f"box made segment id {made}; host {'sees' if seen else 'does not see'} its key")  # fmt: skip


def _keyrings(backend: str) -> Check:
    from agentrl.sandboxes import make_sandbox

    if not ADD_KEY:
        return Check(backend, "keyrings not shared between boxes", None, f"no probe for {platform.machine()}")
    with make_sandbox(backend, **LIMITS) as box:
        added = int(box.exec(KEY_ADD, timeout=30).stdout.strip())
    with make_sandbox(backend, **LIMITS) as box:
        found = int(box.exec(KEY_FIND, timeout=30).stdout.strip())
    if added < 0:
        return Check(backend, "keyrings not shared between boxes", True, f"add_key refused (errno {-added})")
    return Check(backend, "keyrings not shared between boxes", found < 0,
                 f"key {added} added in one box; the next box {'finds' if found > 0 else 'does not find'} it")  # fmt: skip


AGENT_PROBE = """
import resource
try:
    resource.prlimit(1, resource.RLIMIT_NOFILE, (16, resource.prlimit(1, resource.RLIMIT_NOFILE)[1]))
    print("changed")
except PermissionError:
    print("refused")
"""


def _agent(backend: str) -> Check:
    """Can code change the agent's limits (which every later exec inherits)? Refused, or put back."""
    from agentrl.sandboxes import make_sandbox

    limit = "agent out of the code's reach"
    with make_sandbox(backend, **LIMITS) as box:
        outcome = box.exec(AGENT_PROBE, timeout=30).stdout.strip()
        box.reset()  # must put the soft limit back (or fail: then the pool replaces the box)
        after = box.exec("import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])").stdout
    if outcome == "refused":
        return Check(backend, limit, True, "prlimit on PID 1 refused (another uid)")
    return Check(backend, limit, None,
                 f"same uid: prlimit on PID 1 {outcome}; the reset put it back (next exec's soft NOFILE: {after.strip()})")  # fmt: skip


def diagnose(backend: str) -> list[Check]:
    """All checks for one backend (each starts its own small boxes)."""
    checks = [_memory(backend, "memfd", MEMFD), _memory(backend, "SysV shm", SHM), _inodes(backend)]
    checks += [_cpu(backend), _ipc(backend), _keyrings(backend), _agent(backend)]
    if backend == "bwrap":
        from agentrl.sandboxes.bwrap_backend import private_usr_supported
        from agentrl.sandboxes.cgroups import cgroup_support

        version, how = cgroup_support()
        checks.insert(0, Check(backend, "per-box memory+pids cgroup", version is not None, how))
        private = private_usr_supported()
        checks.insert(1, Check(backend, "private /usr view per box", private,
                               "a read-only overlay of the host's /usr per box" if private else
                               "host /usr bound: needs root, unshare and overlayfs; inotify sees other boxes' opens"))  # fmt: skip
    return checks


def main(backends: list[str], as_json: bool = False) -> int:
    """Print the table (or JSON); exit code 1 when any limit does not hold."""
    from agentrl.sandboxes import resolve_backend

    rows: list[Check] = []
    for name in backends:
        try:
            rows += diagnose(resolve_backend(name))
        except SandboxError as exc:
            rows.append(Check(name, "backend usable", False, str(exc)))
    if as_json:
        print(json.dumps([row.__dict__ for row in rows], indent=2))
    else:
        print(f"{'backend':<8} {'limit':<36} {'holds':<6} measured")
        for row in rows:
            holds = {True: "yes", False: "NO", None: "?"}[row.holds]
            print(f"{row.backend:<8} {row.limit:<36} {holds:<6} {row.measured}")
    return 0 if all(row.holds is not False for row in rows) else 1
