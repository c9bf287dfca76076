"""What the in-box agent does between leases: remove every trace an episode can leave, put the
agent's own state back, and check that the box is as it was when it started.

Standard library only, like ``agent.py``: ``base.py`` sends this source ahead of the agent's as one
``python3 -c`` program, so both share one namespace inside the box. What is checked at each reset
(``agent.py``: ``op_reset``), each against the value recorded when the box started:

* files: ``/work``, ``/tmp``, ``/dev/shm`` empty; those dirs' own mode, mtime, xattrs;
* IPC: no SysV object, no POSIX message queue; keyrings: the same keys as at start (bwrap; Docker's
  seccomp profile forbids ``keyctl``);
* processes: none but the agent, counted by the box's ``pids`` cgroup (threads and zombies
  included: a thread group whose leader exited shows as a zombie and still counts);
* the agent itself: every rlimit, nice value, CPU affinity, scheduling policy and I/O priority
  (sandboxed code of the agent's uid can change them; a soft value is put back, a lowered hard
  limit cannot be and fails the reset, so the box is replaced);
* the network namespace: no socket in use, no TCP TIME_WAIT left.

The whole reset has a time budget; past it the reset fails and the pool replaces the box.
"""

import os
import resource
import stat
import time

MQUEUE_DIR = "/dev/mqueue"
IPC_KINDS = ("shm", "msg", "sem")  # the files of /proc/sysvipc
IPC_RMID = 0
# x86_64 / aarch64 syscall numbers the os module has no wrapper for
SYSCALLS = {
    "x86_64": {"keyctl": 250, "ioprio_set": 251, "ioprio_get": 252},
    "aarch64": {"keyctl": 219, "ioprio_set": 30, "ioprio_get": 31},
}
KEYCTL_CLEAR, KEYCTL_GET_PERSISTENT = 7, 22
KEYRINGS = (-3, -4, -5)  # session, user, user-session
PIDS_FILES = ("/sys/fs/cgroup/pids/pids.current", "/sys/fs/cgroup/pids.current")
_libc = []


def libc():
    if not _libc:
        import ctypes

        _libc.append(ctypes.CDLL(None, use_errno=True))
    return _libc[0]


def syscall(name, *args):
    """Raw syscall by name (-1 where this architecture's number is unknown)."""
    import platform

    number = SYSCALLS.get(platform.machine(), {}).get(name)
    return -1 if number is None else libc().syscall(number, *args)


class OverBudget(Exception):
    """The reset ran past its time budget."""


# ---------------------------------------------------------------- the agent's own state
def agent_state():
    """Everything sandboxed code of the agent's uid can change about the agent from outside it."""
    limits = {}
    for name in sorted(n for n in dir(resource) if n.startswith("RLIMIT_") and n != "RLIMIT_OFILE"):
        limits[name] = list(resource.getrlimit(getattr(resource, name)))
    return {
        "rlimits": limits,
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "affinity": sorted(os.sched_getaffinity(0)),
        "sched": [os.sched_getscheduler(0), os.sched_getparam(0).sched_priority],
        "ioprio": syscall("ioprio_get", 1, 0),  # IOPRIO_WHO_PROCESS, self
    }


def restore_agent_state(original):
    """Put back what an episode changed (soft limits, nice, affinity, policy, I/O priority); return
    what cannot be put back, e.g. a lowered hard limit (only a new box has it again)."""
    now = agent_state()
    problems = []
    for name, (soft, hard) in original["rlimits"].items():
        cur_soft, cur_hard = now["rlimits"][name]
        if cur_hard != hard:
            problems.append(f"the agent's {name} hard limit was changed from {hard} to {cur_hard}")
        elif cur_soft != soft:
            attempt(problems, f"restore {name}", resource.setrlimit, getattr(resource, name), (soft, hard))
    if now["nice"] != original["nice"]:
        attempt(problems, "restore nice", os.setpriority, os.PRIO_PROCESS, 0, original["nice"])
    if now["affinity"] != original["affinity"]:
        attempt(problems, "restore CPU affinity", os.sched_setaffinity, 0, original["affinity"])
    if now["sched"] != original["sched"]:
        policy, priority = original["sched"]
        attempt(problems, "restore scheduling", os.sched_setscheduler, 0, policy, os.sched_param(priority))
    if now["ioprio"] != original["ioprio"] and syscall("ioprio_set", 1, 0, original["ioprio"]) != 0:
        problems.append("restore I/O priority: " + os.strerror(libc_errno()))
    after = agent_state()
    for key in ("nice", "affinity", "sched", "ioprio"):
        if after[key] != original[key]:
            problems.append(f"the agent's {key} is {after[key]}, was {original[key]}")
    problems += [
        f"the agent's {name} is {after['rlimits'][name]}, was {value}"
        for name, value in original["rlimits"].items()
        if after["rlimits"][name] != value and not any(name in p for p in problems)
    ]
    return problems


def attempt(problems, what, call, *args):
    try:
        call(*args)
    except OSError as exc:
        problems.append(f"{what}: {exc.strerror}")


def libc_errno():
    import ctypes

    return ctypes.get_errno()


# ---------------------------------------------------------------- processes and network
def task_count():
    """Tasks (threads, zombies included) in the box: its ``pids`` cgroup's count, else /proc's."""
    for path in PIDS_FILES:
        try:
            with open(path) as handle:
                return int(handle.read()), "cgroup"
        except (OSError, ValueError):
            continue
    total = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                total += len(os.listdir(f"/proc/{name}/task"))
            except OSError:
                pass
    return total, "proc"


def own_threads():
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 1


def net_state():
    """Sockets in use and TCP TIME_WAIT entries of the box's network namespace (both families)."""
    counts = {}
    for path in ("/proc/net/sockstat", "/proc/net/sockstat6"):
        try:
            with open(path) as handle:
                lines = handle.read().splitlines()
        except OSError:
            continue
        for line in lines:
            proto, _, rest = line.partition(":")
            fields = rest.split()
            for key, value in zip(fields[::2], fields[1::2], strict=False):
                if key in ("inuse", "tw"):
                    counts[f"{proto}.{key}"] = counts.get(f"{proto}.{key}", 0) + int(value)
    return {key: value for key, value in counts.items() if value}


# ---------------------------------------------------------------- keyrings
def clear_keyrings():
    """Empty the session, user, user-session and persistent keyrings (where keyctl is allowed)."""
    problems = []
    persistent = syscall("keyctl", KEYCTL_GET_PERSISTENT, -1, -3)  # linked: possessed
    if persistent < 0 and libc_errno() in (1, 38):  # EPERM (Docker's seccomp), ENOSYS: no keyrings
        return problems
    for ring in ((persistent,) if persistent > 0 else ()) + KEYRINGS:
        if syscall("keyctl", KEYCTL_CLEAR, ring) != 0 and libc_errno() not in (2, 126):  # ENOENT, ENOKEY
            problems.append(f"clear keyring {ring}: {os.strerror(libc_errno())}")
    return problems


def key_list():
    """Type and description of every key this uid can see (without serials, counts or times)."""
    try:
        with open("/proc/keys") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    return sorted(" ".join(line.split()[7:]) for line in lines)


# ---------------------------------------------------------------- files
def scrub(root, original, owner, deadline):
    """Delete everything under ``root`` whatever its modes, restore ``root``'s own mode, times and
    (no) xattrs as recorded at start; return what could not be done (never raises)."""
    problems = []
    try:
        info = os.lstat(root)
    except OSError as exc:
        return [f"{root}: {exc.strerror}"]
    if info.st_uid == owner:
        try:  # the episode may have taken its own permissions away
            os.chmod(root, 0o700)
        except OSError as exc:
            problems.append(f"chmod {root}: {exc.strerror}")
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        return problems + [f"open {root}: {exc.strerror}"]
    try:
        empty_dir(fd, root, problems, deadline)
    except RecursionError:
        problems.append(f"{root}: directory tree too deep to remove")
    finally:
        os.close(fd)
    if original is not None and info.st_uid == owner:
        try:
            for name in os.listxattr(root, follow_symlinks=False):
                os.removexattr(root, name, follow_symlinks=False)
        except OSError as exc:
            problems.append(f"xattrs of {root}: {exc.strerror}")
        try:
            os.chmod(root, original["mode"])
            os.utime(root, ns=(original["mtime_ns"], original["mtime_ns"]), follow_symlinks=False)
        except OSError as exc:
            problems.append(f"restore {root}: {exc.strerror}")
    return problems


def empty_dir(dir_fd, where, problems, deadline):
    """Remove every entry of the open directory ``dir_fd`` (depth first), never following a symlink.

    Raises:
        OverBudget: past ``deadline`` (the caller fails the reset; the box is replaced).
    """
    for name in os.listdir(dir_fd):
        if time.monotonic() > deadline:
            raise OverBudget(where)
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                if info.st_mode & 0o700 != 0o700:
                    os.chmod(name, 0o700, dir_fd=dir_fd)  # a directory: chmod follows nothing here
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
                try:
                    empty_dir(sub, f"{where}/{name}", problems, deadline)
                finally:
                    os.close(sub)
                os.rmdir(name, dir_fd=dir_fd)
            else:
                os.unlink(name, dir_fd=dir_fd)
        except OSError as exc:
            problems.append(f"remove {where}/{name}: {exc.strerror}")


def tree(root):
    """Sorted (path, mode, uid, size) of everything under ``root``, without following symlinks
    (iterative: an episode may leave a tree deeper than Python's recursion limit)."""
    entries, stack = [], [root]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as listing:
                for entry in listing:
                    info = entry.stat(follow_symlinks=False)
                    entries.append([entry.path, info.st_mode, info.st_uid, info.st_size])
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError as exc:
            entries.append([top, "unreadable", exc.strerror, 0])
    return sorted(entries, key=str)


def root_state(root, owner):
    """A writable dir's own mode, owner, xattrs and (when it is the sandbox uid's) mtime."""
    try:
        info = os.lstat(root)
    except OSError as exc:
        return {"error": exc.strerror}
    state = {"mode": info.st_mode, "uid": info.st_uid, "gid": info.st_gid}
    if info.st_uid == owner:  # root-owned /tmp (Docker): the episode cannot change these
        # atime is restored too, but not compared: listing a directory may move it (relatime)
        try:
            state["xattrs"] = sorted(os.listxattr(root, follow_symlinks=False))
        except OSError as exc:
            state["xattrs"] = [f"? {exc.strerror}"]
        state["mtime_ns"] = info.st_mtime_ns
    return state


# ---------------------------------------------------------------- IPC
def sysv_ids(kind):
    """Ids of the SysV IPC objects of ``kind`` (shm, msg, sem) in this IPC namespace."""
    try:
        with open(f"/proc/sysvipc/{kind}") as handle:
            lines = handle.read().splitlines()[1:]
    except OSError:
        return []
    return [int(line.split()[1]) for line in lines if line.strip()]


def remove_ipc(deadline):
    """Remove every SysV shm segment, message queue and semaphore set and every POSIX mqueue."""
    import ctypes

    lib = libc()
    calls = {"shm": lib.shmctl, "msg": lib.msgctl, "sem": lambda i, cmd, _: lib.semctl(i, 0, cmd)}
    problems = []
    for kind, call in calls.items():
        for ipc_id in sysv_ids(kind):
            if time.monotonic() > deadline:
                raise OverBudget(f"SysV {kind}")
            if call(ipc_id, IPC_RMID, None) != 0:
                problems.append(f"remove SysV {kind} {ipc_id}: {os.strerror(ctypes.get_errno())}")
    if os.path.isdir(MQUEUE_DIR):
        for name in os.listdir(MQUEUE_DIR):
            try:
                os.unlink(os.path.join(MQUEUE_DIR, name))
            except OSError as exc:
                problems.append(f"remove mqueue {name}: {exc.strerror}")
    return problems
