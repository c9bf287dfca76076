"""Docker-specific checks (the container's hardening as the engine reports it, the image cache, no
leaked containers) and the ``python -m agentrl.sandboxes`` commands on both backends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from sandbox_helpers import TEST_LIMITS

from agentrl.sandboxes import make_sandbox, resolve_backend
from agentrl.sandboxes.image import apt_mirror, default_image, recipe_hash

BACKENDS = [pytest.param("docker", marks=pytest.mark.docker), pytest.param("bwrap", marks=pytest.mark.bwrap)]


def owned_containers(pid: int) -> list[dict]:
    from agentrl.sandboxes.docker_backend import LABEL, docker_client

    return [
        c
        for c in docker_client().api.containers(all=True, filters={"label": LABEL})
        if c["Labels"].get(f"{LABEL}.owner", "").endswith(f":{pid}")
    ]


@pytest.mark.docker
def test_container_is_hardened_as_the_engine_reports():
    from agentrl.sandboxes.docker_backend import docker_client

    with make_sandbox("docker", **TEST_LIMITS) as box:
        container_id = box.container_id
        info = docker_client().api.inspect_container(container_id)
    host = info["HostConfig"]
    assert host["ReadonlyRootfs"] is True
    # the agent (root in the box) keeps only what it needs to run code as uid 1000 and kill it
    assert host["CapDrop"] == ["ALL"] and sorted(host["CapAdd"]) == ["CAP_KILL", "CAP_SETGID", "CAP_SETUID"]
    assert host["LogConfig"]["Type"] == "none" and info["LogPath"] == ""  # nothing on the host's disk
    assert host["Sysctls"] == {"net.ipv4.tcp_max_tw_buckets": "0"}
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["NetworkMode"] == "none" and info["Config"]["NetworkDisabled"] is True
    assert host["Memory"] == TEST_LIMITS["memory_mb"] << 20 and host["MemorySwap"] == host["Memory"]
    assert host["PidsLimit"] == TEST_LIMITS["pids"] and host["NanoCpus"] == 10**9
    assert host["Privileged"] is False and not host.get("Binds")
    assert set(host["Tmpfs"]) == {"/work", "/tmp", "/dev/shm"} and "size=32m" in host["Tmpfs"]["/work"]
    assert "nr_inodes=4096" in host["Tmpfs"]["/dev/shm"]
    assert info["Config"]["User"] == "0:0"  # the agent; every exec runs as 1000 (test_containment)
    # closed means removed (other tests' pooled boxes of this process may still be alive)
    assert container_id not in [c["Id"] for c in owned_containers(os.getpid())]


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_only_mount_named_by_the_env(backend):
    with tempfile.TemporaryDirectory() as shared:
        shared_dir = Path(shared)
        (shared_dir / "data.txt").write_text("shared data\n")
        shared_dir.chmod(0o755)  # the sandbox's user must be able to read what the env shares
        with make_sandbox(backend, ro_mounts={shared: "/data"}, **TEST_LIMITS) as box:
            result = box.exec(["sh", "-c", "cat /data/data.txt; echo x > /data/new"], timeout=5)
        assert result.stdout == "shared data\n" and "Read-only file system" in result.stderr
        assert sorted(p.name for p in shared_dir.iterdir()) == ["data.txt"]


@pytest.mark.docker
def test_containers_of_a_killed_process_go_away():
    script = "from agentrl.sandboxes import make_sandbox\nb = make_sandbox('docker'); b.start(); print('up', flush=True)\nimport time; time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "up\n"
        assert len(owned_containers(child.pid)) == 1
        child.send_signal(signal.SIGKILL)
        child.wait()
        deadline = time.monotonic() + 20
        while owned_containers(child.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert owned_containers(child.pid) == []  # attach EOF -> agent exits -> auto-remove
    finally:
        child.kill()
        child.wait()


@pytest.mark.docker
def test_image_is_cached_by_recipe_hash():
    from agentrl.sandboxes import build_image

    started = time.monotonic()
    assert build_image() == default_image() == f"agentrl-sandbox:{recipe_hash()}"
    assert time.monotonic() - started < 5  # cached: no debootstrap
    assert len(recipe_hash()) == 12 and recipe_hash() == recipe_hash()
    assert apt_mirror().startswith("http")


@pytest.mark.docker
def test_auto_prefers_docker_when_an_engine_answers():
    assert resolve_backend("auto") == "docker"


@pytest.mark.parametrize("backend", BACKENDS)
def test_cli_runs_python_shell_and_sql_files(backend, tmp_path):
    (tmp_path / "hello.py").write_text("import sys\nprint('hello', sum(range(10)))\nsys.exit(4)\n")
    (tmp_path / "query.sql").write_text(
        "create table t(x); insert into t values (1),(2),(3);\nselect sum(x) from t;\n"
    )
    (tmp_path / "spin.sh").write_text("while :; do :; done\n")
    # the user's command (`agentrl sandbox run`, which runs `python -m agentrl.sandboxes run`)
    command = [str(Path(sys.executable).parent / "agentrl"), "sandbox", "run", "--backend", backend]
    hello = subprocess.run([*command, str(tmp_path / "hello.py")], capture_output=True, text=True)
    assert (hello.returncode, hello.stdout) == (4, "hello 45\n"), hello.stderr
    query = subprocess.run([*command, "--json", str(tmp_path / "query.sql")], capture_output=True, text=True)
    result = json.loads(query.stdout)
    assert result["stdout"] == "6\n" and result["exit_code"] == 0 and result["usage"]["wall_s"] > 0
    spin = subprocess.run(
        [*command, "--timeout", "1", str(tmp_path / "spin.sh")], capture_output=True, text=True
    )
    assert spin.returncode == 137 and "timed out" in spin.stderr
    missing = subprocess.run([*command, str(tmp_path / "missing.py")], capture_output=True, text=True)
    assert missing.returncode == 2 and "missing.py" in missing.stderr and "does not exist" in missing.stderr, missing.stderr
    for bad, said in ((["--timeout", "0"], "--timeout"), (["--backend", "vm"], "unknown sandbox backend 'vm'")):
        refused = subprocess.run([*command, *bad, str(tmp_path / "hello.py")], capture_output=True, text=True)
        assert refused.returncode == 2 and said in refused.stderr and "hello" not in refused.stdout


def test_cli_help_lists_the_commands():
    out = subprocess.run(
        [sys.executable, "-m", "agentrl.sandboxes", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0 and all(word in out.stdout for word in ("build", "run", "clean"))
    assert textwrap.dedent(out.stdout)


class UnixToTcpProxy:
    """A TCP listener on 127.0.0.1 that forwards to the local engine's unix socket: a stand-in for a
    remote engine reached through ``DOCKER_HOST=tcp://...`` (the SDK's TCP code path)."""

    def __init__(self, unix_path: str = "/var/run/docker.sock"):
        import socket
        import threading

        self.unix_path = unix_path
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(self.unix_path)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src, dst) -> None:
        import socket

        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


@pytest.mark.docker
def test_engine_reached_through_docker_host_tcp(monkeypatch):
    import agentrl.sandboxes.docker_backend as docker_backend

    if not os.path.exists("/var/run/docker.sock"):
        pytest.skip("the engine here is not on the default unix socket")
    proxy = UnixToTcpProxy()
    try:
        monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{proxy.port}")
        monkeypatch.setattr(docker_backend, "_client", None)  # a client for the new DOCKER_HOST
        assert docker_backend.docker_client().api.base_url == f"http://127.0.0.1:{proxy.port}"
        with make_sandbox("docker", **TEST_LIMITS) as box:
            assert box.exec("print(7 * 6)", timeout=10).stdout == "42\n"
            assert box.python_session().run("'remote'").stdout == "'remote'\n"
    finally:
        proxy.close()
        monkeypatch.setattr(docker_backend, "_client", None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_doctor_measures_every_limit_through_the_cli(backend):
    """`agentrl sandbox doctor` runs the bounded attacks and says, per limit, whether it held."""
    from agentrl.sandboxes.cgroups import cgroup_support

    agentrl = Path(sys.executable).with_name("agentrl")
    done = subprocess.run(
        [str(agentrl), "sandbox", "doctor", "--backends", backend, "--json"], capture_output=True, text=True
    )
    rows = {row["limit"]: row for row in json.loads(done.stdout)}
    expected = {
        "memory limit covers memfd",
        "memory limit covers SysV shm",
        "tmpfs inodes bounded",
        "CPU share <= 1.0 CPU",
        "private IPC namespace",
        "keyrings not shared between boxes",
        "agent out of the code's reach",
    }
    assert expected <= set(rows), rows
    if backend == "docker":  # another uid: refused outright (bwrap: put back at reset, holds None)
        assert rows["agent out of the code's reach"]["holds"] is True
    elif os.geteuid() == 0:
        assert rows["private /usr view per box"]["holds"] is True
    assert all(rows[name]["backend"] == backend and rows[name]["measured"] for name in expected)
    assert rows["private IPC namespace"]["holds"] and rows["keyrings not shared between boxes"]["holds"]
    if backend == "docker" or cgroup_support()[0] is not None:
        assert rows["memory limit covers memfd"]["holds"] and rows["memory limit covers SysV shm"]["holds"]
        assert rows["tmpfs inodes bounded"]["holds"]
    else:  # the watchdog cannot see a memfd: the doctor must say so, and fail
        assert rows["memory limit covers memfd"]["holds"] is False
    failing = [row for row in rows.values() if row["holds"] is False]
    assert done.returncode == (1 if failing else 0), done.stderr
