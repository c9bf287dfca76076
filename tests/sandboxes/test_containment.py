"""Attacks a model's code could make, against every backend: each ends with a clean result, a
usable sandbox afterwards, and the host untouched."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import threading
import uuid

import pytest
from sandbox_helpers import TEST_LIMITS, assert_usable

from agentrl.errors import SandboxError
from agentrl.sandboxes import make_sandbox

FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""

MEMORY_BOMB = """
chunks = []
while True:
    chunks.append(bytearray(8 << 20))
"""


def host_processes_with(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


def test_exec_basics_and_usage(sandbox):
    result = sandbox.exec(["sh", "-c", "cat; echo err >&2; exit 3"], timeout=10, stdin=b"in\n")
    assert (result.stdout, result.stderr, result.exit_code) == ("in\n", "err\n", 3)
    assert not (result.timed_out or result.oom_killed or result.truncated)
    busy = sandbox.exec("sum(i * i for i in range(3_000_000))", timeout=20)
    assert busy.exit_code == 0
    assert busy.usage.cpu_s > 0.05 and busy.usage.wall_s >= busy.usage.cpu_s * 0.5
    assert busy.usage.peak_mem_bytes > 1 << 20
    missing = sandbox.exec(["no-such-binary"], timeout=5)
    assert missing.exit_code == 127 and "no-such-binary" in missing.stderr


def test_runs_unprivileged_without_capabilities(sandbox):
    status = sandbox.exec(
        ["sh", "-c", "id -u; grep -E '^(CapEff|CapPrm|NoNewPrivs)' /proc/self/status"], timeout=5
    )
    lines = status.stdout.split()
    assert lines[0] == "1000"
    assert "0000000000000000" in status.stdout and status.stdout.count("0000000000000000") == 2
    assert "NoNewPrivs:\t1" in status.stdout or lines[-1] == "1"


def test_fork_bomb(sandbox):
    result = sandbox.exec(FORK_BOMB, timeout=3)
    assert result.timed_out and result.exit_code == 137
    assert result.usage.wall_s < 15
    assert_usable(sandbox)


def test_memory_bomb_is_reported_as_oom(sandbox):
    result = sandbox.exec(MEMORY_BOMB, timeout=20)
    assert result.oom_killed, result
    assert not result.timed_out and result.exit_code != 0
    assert_usable(sandbox)


def test_cpu_spin_past_timeout(sandbox):
    result = sandbox.exec("while True: pass", timeout=1.0)
    assert result.timed_out and result.exit_code == 137
    assert 0.9 < result.usage.wall_s < 5
    assert_usable(sandbox)


def test_daemonized_child_is_gone(sandbox):
    marker = str(300 + uuid.uuid4().int % 600)  # a sleep no other process on the host runs
    daemon = f'setsid sh -c "sleep {marker}" </dev/null >/dev/null 2>&1 & echo started'
    quick = sandbox.exec(["sh", "-c", daemon], timeout=5)
    assert quick.stdout == "started\n" and not quick.timed_out
    slow = sandbox.exec(["sh", "-c", daemon + f"; exec sleep {marker}"], timeout=1)
    assert slow.timed_out
    double_fork = f"import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execvp('sleep', ['sleep', '{marker}'])\n"
    assert sandbox.exec(double_fork, timeout=5).exit_code == 0
    assert_usable(sandbox)
    assert host_processes_with(f"sleep {marker}") == []


def test_writes_outside_work_dir_fail_and_host_is_untouched(sandbox):
    name = f"agentrl-escape-{uuid.uuid4().hex[:8]}"
    for target in (f"/{name}", f"/usr/{name}", f"/etc/{name}", f"/usr/bin/{name}"):
        result = sandbox.exec(["sh", "-c", f"echo x > {target}"], timeout=5)
        assert result.exit_code != 0, target
        assert "Read-only file system" in result.stderr or "Permission denied" in result.stderr, result.stderr
        assert not os.path.exists(target)
    assert sandbox.exec(["sh", "-c", "echo ok > /work/fine && cat /work/fine"], timeout=5).stdout == "ok\n"
    assert sandbox.exec(["sh", "-c", "echo ok > /tmp/fine && cat /tmp/fine"], timeout=5).stdout == "ok\n"


def test_filling_the_tmpfs_stops_at_its_cap(sandbox):
    result = sandbox.exec(
        ["sh", "-c", "head -c 200000000 /dev/zero > /work/big; echo rc=$?; wc -c < /work/big"], timeout=20
    )
    assert "No space left on device" in result.stderr
    size = int(result.stdout.split()[-1])
    assert 0 < size <= TEST_LIMITS["work_tmpfs_mb"] << 20
    sandbox.exec(["rm", "-f", "/work/big"], timeout=5)
    assert_usable(sandbox)


def test_printing_a_gigabyte_is_cut(sandbox):
    result = sandbox.exec(
        ["sh", "-c", "head -c 1000000000 /dev/zero | tr '\\0' x; echo done >&2"], timeout=60
    )
    assert result.truncated and not result.timed_out, result.usage
    limit = TEST_LIMITS["output_limit"]
    assert result.stdout.startswith("x" * limit)
    assert len(result.stdout) < limit + 200
    assert "[output truncated:" in result.stdout and str(1_000_000_000 - limit) in result.stdout
    assert result.stderr == "done\n"
    assert_usable(sandbox)


def test_no_network(sandbox):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("0.0.0.0", 0))  # all host addresses, the bridge's included
    listener.listen(8)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted = []

    def accept():
        try:
            accepted.append(listener.accept())
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    try:
        interfaces = sandbox.exec(
            ["sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1; echo ---; tail -n +2 /proc/net/route"],
            timeout=5,
        )
        names, routes = interfaces.stdout.split("---")
        assert [n.strip() for n in names.split()] == ["lo"]  # no interface that leads anywhere
        assert routes.strip() == ""  # and no route
        probe = f"""
import socket
for host in ("127.0.0.1", "172.17.0.1", "example.com"):
    try:
        socket.create_connection((host, {port}), timeout=2).close()
        print(host, "CONNECTED")
    except OSError as exc:
        print(host, "refused", type(exc).__name__)
"""
        result = sandbox.exec(probe, timeout=20)
        assert "CONNECTED" not in result.stdout and result.stdout.count("refused") == 3, result
    finally:
        thread.join()
        listener.close()
    assert accepted == []


def test_host_environment_is_not_visible(backend):
    secret = f"s3cret-{uuid.uuid4().hex}"
    os.environ["AGENTRL_TEST_SECRET"] = secret
    try:
        with make_sandbox(backend, **TEST_LIMITS) as box:
            result = box.exec(["sh", "-c", "env; cat /proc/*/environ 2>/dev/null; echo"], timeout=5)
    finally:
        del os.environ["AGENTRL_TEST_SECRET"]
    assert result.exit_code == 0 and "PATH=" in result.stdout
    assert secret not in result.stdout and "AGENTRL_TEST_SECRET" not in result.stdout


def test_put_get_refuse_traversal_and_symlinks(sandbox):
    with open("/etc/passwd", "rb") as handle:
        host_passwd = hashlib.sha256(handle.read()).hexdigest()
    sandbox.put_file("sub/dir/file.txt", b"payload")
    assert sandbox.get_file("sub/dir/file.txt") == b"payload"
    assert sandbox.get_file("/work/sub/dir/file.txt") == b"payload"
    sandbox.put_file("sub/../normal.txt", b"ok")  # stays inside: allowed
    assert sandbox.get_file("normal.txt") == b"ok"
    assert (
        sandbox.exec(
            ["sh", "-c", "ln -s /etc/passwd link; ln -s / rootlink; ln -s /etc etcdir"], timeout=5
        ).exit_code
        == 0
    )
    for bad in (
        "../../etc/passwd",
        "/etc/passwd",
        "link",
        "rootlink/etc/passwd",
        "etcdir/passwd",
        "..",
        "/work",
    ):
        with pytest.raises(SandboxError):
            sandbox.get_file(bad)
    for bad in ("../../etc/evil", "/etc/evil", "/usr/evil", "link", "etcdir/evil", "rootlink/tmp/x"):
        with pytest.raises(SandboxError):
            sandbox.put_file(bad, b"evil")
    inside = sandbox.exec(
        ["sh", "-c", "grep -c evil /etc/passwd; ls /etc/evil 2>&1; ls /tmp/x 2>&1"], timeout=5
    )
    assert inside.stdout.startswith("0\n") and "No such file" in inside.stdout
    with open("/etc/passwd", "rb") as handle:
        assert hashlib.sha256(handle.read()).hexdigest() == host_passwd
    assert not os.path.exists("/etc/evil")
    sandbox.reset()
    assert sandbox.exec(["ls", "-A", "/work"], timeout=5).stdout == ""


def test_killing_pid1_does_nothing(sandbox):
    generation = sandbox.generation
    result = sandbox.exec(
        ["sh", "-c", "kill -KILL 1; kill -TERM 1; kill -INT 1; kill -HUP 1; kill -STOP 1; echo survived"],
        timeout=5,
    )
    assert "survived" in result.stdout
    ptrace_view = sandbox.exec(["cat", "/proc/1/maps"], timeout=5)  # the agent is not dumpable
    assert ptrace_view.exit_code != 0 and "Permission denied" in ptrace_view.stderr
    # kill(-1): every process the user may signal (all but PID 1 and the caller itself).
    everything = sandbox.exec(
        ["sh", "-c", "sleep 50 & sleep 50 & kill -KILL -1; wait; echo after"], timeout=5
    )
    assert everything.stdout == "after\n" and not everything.timed_out
    assert_usable(sandbox)
    assert sandbox.generation == generation  # the same box, not a replacement
