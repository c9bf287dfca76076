"""Attacks across episodes of a pooled box: lease 1 plants, lease 2 of the same size-1 pool probes.

Every class of the security review (issue 22) on both backends: planted code that shadows the
standard library, secrets in unremovable files, SysV and POSIX IPC objects, keyrings, a work dir
made read-only, memory charged by leftover shared memory, memory that bwrap's watchdog cannot see,
and special files handed to the host's file transfer. Each next lease must look exactly like a
brand-new box (same listing, modes, IPC, keys, processes, environment).
"""

from __future__ import annotations

import functools
import json
import os
import time

import pytest
from sandbox_helpers import TEST_LIMITS, assert_usable

from agentrl.errors import SandboxError, SandboxLost
from agentrl.sandboxes import SandboxPool, make_sandbox

SECRET = "s3cret-of-episode-1"

# Lease 1: leave code and secrets behind in every way an unprivileged process can.
PLANT = rf"""
set -e
mkdir -p /work/json /work/ro/inner /work/none /tmp/keep /dev/shm/keep
printf 'import sys\nopen("/tmp/pwned", "w").write("ran")\nprint("PLANTED CODE RAN")\n' > /work/json/__init__.py
cp /work/json/__init__.py /work/solution_helper.py
echo {SECRET} > /work/ro/inner/secret; echo {SECRET} > /tmp/keep/secret; echo {SECRET} > /dev/shm/keep/secret
echo {SECRET} > /work/none/secret; mkfifo /work/fifo /tmp/fifo
chmod 555 /work/json; chmod 000 /work/ro/inner; chmod 0500 /work/ro; chmod 000 /work/none
chmod 000 /tmp/keep /dev/shm/keep
python3 -c 'import os; os.setxattr("/work", "user.secret", b"{SECRET}")'
touch -d '2001-02-03 04:05:06' /work
chmod 0500 /work
"""

IPC_PLANT = rf"""
import ctypes, ctypes.util, os, struct
libc = ctypes.CDLL(None, use_errno=True)
shm = libc.shmget(0x5EC, 1 << 20, 0o1000 | 0o600)
assert shm >= 0, os.strerror(ctypes.get_errno())
libc.shmat.restype = ctypes.c_void_p
addr = libc.shmat(shm, None, 0)
ctypes.memmove(addr, b"{SECRET}", len("{SECRET}"))
msq = libc.msgget(0x5ED, 0o1000 | 0o600)
msg = struct.pack("l", 1) + b"{SECRET}"
assert libc.msgsnd(msq, msg, len(msg) - 8, 0) == 0, os.strerror(ctypes.get_errno())
assert libc.semget(0x5EE, 3, 0o1000 | 0o600) >= 0
rt = ctypes.CDLL(ctypes.util.find_library("rt") or None, use_errno=True)
mqd = rt.mq_open(b"/leak", os.O_CREAT | os.O_RDWR, 0o600, None)
assert mqd >= 0, os.strerror(ctypes.get_errno())
assert rt.mq_send(mqd, b"{SECRET}", len("{SECRET}"), 0) == 0
print("planted")
"""

IPC_PROBE = r"""
import ctypes, ctypes.util, os
libc = ctypes.CDLL(None, use_errno=True)
rt = ctypes.CDLL(ctypes.util.find_library("rt") or None, use_errno=True)
found = {
    "shm": libc.shmget(0x5EC, 0, 0),
    "msg": libc.msgget(0x5ED, 0),
    "sem": libc.semget(0x5EE, 0, 0),
    "mqueue": rt.mq_open(b"/leak", os.O_RDONLY),
}
print(found)
"""

# Keys in the session, user and persistent keyrings (bwrap; Docker's seccomp forbids keyctl).
KEY_PLANT = rf"""
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, KEYCTL = {{"x86_64": (248, 250), "aarch64": (217, 219)}}[platform.machine()]
added = []
for ring in (-3, -4, -5):  # session, user, user-session
    added.append(libc.syscall(ADD_KEY, b"user", b"leak", b"{SECRET}", len("{SECRET}"), ring))
persistent = libc.syscall(KEYCTL, 22, -1, -4)  # KEYCTL_GET_PERSISTENT, linked into the user keyring
if persistent > 0:
    added.append(libc.syscall(ADD_KEY, b"user", b"leak", b"{SECRET}", len("{SECRET}"), persistent))
print(added)
"""

KEY_PROBE = r"""
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[platform.machine()]
found = [libc.syscall(KEYCTL, 10, ring, b"user", b"leak", 0) for ring in (-3, -4, -5)]
persistent = libc.syscall(KEYCTL, 22, -1, 0)
if persistent > 0:
    found.append(libc.syscall(KEYCTL, 10, persistent, b"user", b"leak", 0))
print(found)
print(open("/proc/keys").read().count("leak"))
"""

# What an episode sees of its box, without pids, inode numbers or times of root-owned dirs.
VIEW = r"""
import json, os, subprocess, time
def listing(root):
    out = []
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            st = os.lstat(os.path.join(top, name))
            out.append([os.path.join(top, name), oct(st.st_mode), st.st_uid, st.st_size])
    return sorted(out)
view = {}
for root in ("/work", "/tmp", "/dev/shm", "/dev/mqueue"):
    st = os.lstat(root)
    own = st.st_uid == os.getuid()
    recent = time.time() - st.st_mtime < 600  # a new box's, not one an episode set (exact: reset checks)
    view[root] = [oct(st.st_mode), st.st_uid, recent if own else None,
                  sorted(os.listxattr(root)) if own else None, listing(root)]
view["sysvipc"] = {k: open(f"/proc/sysvipc/{k}").read().splitlines()[1:] for k in ("shm", "msg", "sem")}
view["keys"] = sorted(" ".join(l.split()[7:]) for l in open("/proc/keys").read().splitlines())
view["ps"] = subprocess.run(["ps", "-e", "-o", "user=,comm="], capture_output=True, text=True).stdout.split("\n")
view["env"] = dict(os.environ)
view["cwd"] = os.getcwd()
view["id"] = [os.getuid(), os.getgid(), os.getgroups()]
print(json.dumps(view, sort_keys=True))
"""


def view(box) -> dict:
    result = box.exec(VIEW, timeout=30)
    assert result.exit_code == 0, result
    return json.loads(result.stdout)


def next_lease(pool: SandboxPool):
    """The next lease of a size-1 pool, after the background reset is done (as an idle pool is)."""
    pool.wait_ready()
    return pool.lease(timeout=60)


@pytest.fixture
def pool(backend):
    with SandboxPool(backend, size=1, **TEST_LIMITS) as pool:
        yield pool


def test_a_leased_box_looks_exactly_like_a_new_one_after_any_attack(pool, backend):
    with make_sandbox(backend, **TEST_LIMITS) as fresh:
        pristine = view(fresh)
        pristine_state = fresh.inspect()
    with pool.lease() as box:
        assert view(box) == pristine
        planted = box.exec(["sh", "-c", PLANT], timeout=30)
        assert planted.exit_code == 0, planted
        assert box.exec(IPC_PLANT, timeout=30).stdout == "planted\n"
        box.exec(KEY_PLANT, timeout=30)
        box.python_session().run("import os; os.chdir('/tmp'); os.environ['LEAK'] = '1'")
    with next_lease(pool) as box:
        seen = view(box)
        for key in pristine:
            assert seen[key] == pristine[key], key
        state = box.inspect()
        for key in ("trees", "sysv", "mqueues", "processes", "sessions"):
            assert state[key] == pristine_state[key], key
    assert pool.stats.reset_failures == 0


def test_planted_package_never_runs_in_the_next_episode(pool):
    with pool.lease() as box:
        assert box.exec(["sh", "-c", PLANT], timeout=30).exit_code == 0
        assert "PLANTED" in box.exec(["python3", "-c", "import json"], timeout=10).stdout
    with next_lease(pool) as box:
        box.put_file("solution.py", b"import json\nprint(json.dumps([1]))\n")  # /work writable again
        run = box.exec(["python3", "solution.py"], timeout=10)
        assert (run.stdout, run.exit_code) == ("[1]\n", 0)
        cell = box.python_session().run("import json, solution_helper")
        assert "PLANTED" not in cell.stdout and "ModuleNotFoundError" in cell.stderr
        assert box.exec(["cat", "/tmp/pwned"], timeout=10).exit_code != 0


def test_no_secret_survives_in_files_ipc_or_keyrings(pool, backend):
    with pool.lease() as box:
        assert box.exec(["sh", "-c", PLANT], timeout=30).exit_code == 0
        assert box.exec(IPC_PLANT, timeout=30).stdout == "planted\n"
        planted_keys = box.exec(KEY_PLANT, timeout=30)
        found = box.exec(IPC_PROBE, timeout=30).stdout
        assert "-1" not in found  # the probe finds the objects within the episode
    with next_lease(pool) as box:
        grep = box.exec(["grep", "-rs", SECRET, "/work", "/tmp", "/dev/shm"], timeout=30)
        assert grep.stdout == "" and grep.exit_code == 1
        assert box.exec(["ipcs"], timeout=10).stdout.count("0x000005e") == 0
        probe = box.exec(IPC_PROBE, timeout=30).stdout
        assert probe == "{'shm': -1, 'msg': -1, 'sem': -1, 'mqueue': -1}\n"
        keys = box.exec(KEY_PROBE, timeout=30).stdout.split("\n")
        assert all(int(found) < 0 for found in json.loads(keys[0])) and keys[1] == "0"
    if backend == "bwrap":  # keys were really planted (Docker's seccomp refuses add_key: all -1)
        assert all(int(key) > 0 for key in json.loads(planted_keys.stdout)[:3])


def test_a_read_only_work_dir_does_not_break_the_next_episode(pool):
    with pool.lease() as box:
        box.exec(["chmod", "0500", "/work"], timeout=10)
        with pytest.raises(SandboxError, match="Permission denied"):
            box.put_file("task.py", b"x")  # within the episode its own doing
    with next_lease(pool) as box:
        box.put_file("task.py", b"print('ok')")
        assert box.exec(["python3", "task.py"], timeout=10).stdout == "ok\n"


def test_leftover_shared_memory_is_uncharged_for_the_next_episode(pool):
    limit = TEST_LIMITS["memory_mb"]
    hog = f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
seg = libc.shmget(0x40C, {limit * 3 // 4} << 20, 0o1000 | 0o600)
ctypes.memset(libc.shmat(seg, None, 0), 1, {limit * 3 // 4} << 20)
print("held")
"""
    with pool.lease() as box:
        assert box.exec(hog, timeout=60).stdout == "held\n"
    for _ in range(2):
        with next_lease(pool) as box:
            run = box.exec(f"b = bytearray({limit * 2 // 3} << 20); print(len(b) >> 20)", timeout=60)
            assert not run.oom_killed and run.stdout == f"{limit * 2 // 3}\n", run


@pytest.mark.parametrize(
    "what, code",
    [
        ("memfd", "import os\nfd = os.memfd_create('x')\nwhile True: os.write(fd, b'x' * (8 << 20))"),
        (
            "SysV shm",
            "import ctypes\nlibc = ctypes.CDLL(None)\nlibc.shmat.restype = ctypes.c_void_p\n"
            "while True:\n    s = libc.shmget(0, 32 << 20, 0o1000 | 0o600)\n"
            "    ctypes.memset(libc.shmat(s, None, 0), 1, 32 << 20)",
        ),
        (
            "tmpfs",
            "import os\nwhile True: open(f'/dev/shm/{os.urandom(8).hex()}', 'wb').write(b'x' * (1 << 20))",
        ),
    ],
)
def test_memory_the_watchdog_cannot_see_is_limited(backend, what, code):
    """memfds, SysV segments and tmpfs pages count against the box's limit (a cgroup on both)."""
    from agentrl.sandboxes.cgroups import cgroup_support

    if backend == "bwrap" and cgroup_support()[0] is None:
        pytest.skip(f"no per-box memory cgroup here: {cgroup_support()[1]}")
    with make_sandbox(backend, **TEST_LIMITS) as box:
        result = box.exec(code, timeout=60)
        assert result.exit_code != 0 and not result.timed_out, result
        # Killed by the cgroup (SIGKILL, counted as OOM), or refused at a tmpfs/segment cap first.
        assert result.oom_killed or "No space left" in result.stderr or "OSError" in result.stderr, result
        box.reset()
        assert_usable(box)


def test_a_million_empty_files_are_capped(backend):
    """tmpfs inodes: Docker caps them (nr_inodes); bwrap cannot, so its memory cgroup must."""
    from agentrl.sandboxes.cgroups import BoxCgroup, cgroup_support

    if backend == "bwrap" and cgroup_support()[0] is None:
        pytest.skip(f"no per-box memory cgroup here: {cgroup_support()[1]}")
    code = "import os\nn = 0\ntry:\n    while True:\n        os.mknod(f'/work/{n}'); n += 1\nfinally:\n    print(n, flush=True)"
    with make_sandbox(backend, memory_mb=64, work_tmpfs_mb=32) as box:
        if backend == "docker":
            result = box.exec(code, timeout=120)
            assert "No space left" in result.stderr and int(result.stdout) <= 32 * 256, result
            box.reset()
        else:
            assert isinstance(box.cgroup, BoxCgroup)
            try:  # the inodes cannot be reclaimed: the cgroup OOM-kills the creator, maybe the agent
                result = box.exec(code, timeout=120)
                assert result.oom_killed, result
                assert box.cgroup.memory_bytes_used() <= 64 << 20
                box.reset()
            except SandboxLost as exc:
                assert "code 137" in str(exc)  # killed with its cgroup's memory full
        assert box.exec(["ls", "/work"], timeout=30).stdout == ""
        assert_usable(box)


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_file_transfer_refuses_special_files_at_once(backend, kind):
    make = {
        "fifo": ["mkfifo", "/work/special", "/tmp/special"],
        "socket": [
            "python3",
            "-c",
            "import socket\nfor p in ('/work/special', '/tmp/special'):\n"
            "    socket.socket(socket.AF_UNIX).bind(p)",
        ],
    }[kind]
    with make_sandbox(backend, **TEST_LIMITS) as box:
        assert box.exec(make, timeout=10).exit_code == 0
        for path in ("special", "/tmp/special"):
            for call in (functools.partial(box.get_file, path), functools.partial(box.put_file, path, b"x")):
                started = time.monotonic()
                with pytest.raises(SandboxError, match=f"is a {'FIFO' if kind == 'fifo' else 'socket'}"):
                    call()
                assert time.monotonic() - started < 1.0
        assert_usable(box)


@pytest.mark.docker
def test_a_reset_that_cannot_verify_replaces_the_box_loudly(caplog):
    """A tree deeper than the scrub can walk: the reset fails, says why, and the box is replaced."""
    with SandboxPool("docker", size=1, **TEST_LIMITS) as pool:
        with pool.lease() as first:
            deep = "/".join(["d"] * 1100)
            assert box_ok(
                first.exec(["sh", "-c", f"mkdir -p {deep} && echo {SECRET} > {deep}/x"], timeout=60)
            )
        with next_lease(pool) as box:
            assert box is not first
            assert box.exec(["ls", "-A", "/work"], timeout=10).stdout == ""
        assert pool.stats.reset_failures == 1 and "too deep" in pool.stats.last_reset_error
        assert "sandbox reset failed" in caplog.text


def box_ok(result) -> bool:
    assert result.exit_code == 0, result
    return True


@pytest.mark.bwrap
def test_bwrap_pool_recycles_and_leaves_no_cgroup_behind():
    import glob

    from agentrl.sandboxes.cgroups import cgroup_support

    with pytest.raises(SandboxError, match="pool reset must be one of"):
        SandboxPool("bwrap", size=1, reset="wipe")
    mine = f"/sys/fs/cgroup/*/agentrl/box-{os.getpid()}-*"
    others = set(glob.glob(mine))  # boxes of this process's other pools (a shared code-env pool)
    with SandboxPool("bwrap", size=1, reset="recycle", **TEST_LIMITS) as pool:
        with pool.lease() as first:
            pass
        with next_lease(pool) as second:
            assert second is not first and not first.alive  # a new box; the old one is gone
            if cgroup_support()[0] is not None:
                assert second.cgroup is not None and set(second.cgroup.dirs) <= set(glob.glob(mine)) - others
        pool.wait_ready()
        assert pool.stats.recycled == 2 and pool.stats.reset_failures == 0
    assert set(glob.glob(mine)) == others  # every box's cgroup went with it


@pytest.mark.bwrap
def test_groups_left_by_a_killed_process_are_swept_before_the_first_box():
    """A run killed with its boxes leaves empty ``box-<pid>-<n>`` groups; the next process removes
    those of dead pids (and of its own pid, from before it started), never a live process's."""
    import subprocess
    import sys

    from agentrl.sandboxes import cgroups

    version, why = cgroups.cgroup_support()
    if version is None:
        pytest.skip(why)
    hierarchy = cgroups.ROOT if version == "v2" else os.path.join(cgroups.ROOT, "memory")
    parent = os.path.join(hierarchy, cgroups.PARENT)
    os.makedirs(parent, exist_ok=True)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    live = subprocess.Popen(["sleep", "60"])
    made = {who: os.path.join(parent, f"box-{pid}-7") for who, pid in
            (("dead", int(dead.stdout)), ("live", live.pid))}  # fmt: skip
    try:
        for path in made.values():
            os.mkdir(path)
        removed = cgroups.sweep_stale(parent)
        assert made["dead"] in removed and not os.path.exists(made["dead"])
        assert made["live"] not in removed and os.path.isdir(made["live"])
    finally:
        live.kill()
        live.wait()
        for path in made.values():
            if os.path.isdir(path):
                os.rmdir(path)
