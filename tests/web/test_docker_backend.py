"""The web env with ``backend="docker"``: the shop in a sandbox container on an internal network.

Real engine, real HTTP to the container's address, real kills. The Docker SDK is used here only to
check for leaks (the env itself reaches Docker through ``agentrl.sandboxes``).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time

import docker
import pytest

import agentrl
from agentrl.envs.web import manager
from agentrl.envs.web.browser import RESTART_NOTICE
from agentrl.envs.web.docker_backend import DockerShopServer
from agentrl.envs.web.oracle import WebShopOracle
from agentrl.sandboxes.service import LABEL, OWNER_LABEL, sweep_stale

pytestmark = pytest.mark.docker
N_PRODUCTS = 300


def _ours(kind: str) -> list[dict]:
    """Service containers or networks this test process owns, as the engine lists them."""
    client = docker.from_env()
    owner = f"{socket.gethostname()}:{os.getpid()}"
    listing = (
        client.api.containers(all=True, filters={"label": LABEL})
        if kind == "containers"
        else client.api.networks(filters={"label": LABEL})
    )
    return [item for item in listing if (item.get("Labels") or {}).get(OWNER_LABEL) == owner]


def _run_oracle(env, task, obs: str) -> tuple[float, dict]:
    oracle = WebShopOracle()
    oracle.reset(task)
    info: dict = {}
    for _ in range(env.unwrapped.spec_max_turns if hasattr(env.unwrapped, "spec_max_turns") else 15):
        obs, reward, terminated, truncated, info = env.step(oracle.act(obs, info))
        if terminated or truncated:
            return reward, info
    raise AssertionError("the oracle did not finish within 15 steps")


@pytest.fixture(scope="module")
def env():
    env = agentrl.make("agentrl/WebShop-v0", split="test", n_products=N_PRODUCTS, backend="docker")
    env.reset(seed=0)  # starts the container
    yield env
    env.close()


def test_oracle_buys_over_http_to_the_container(env):
    server = env.unwrapped._server
    assert isinstance(server, DockerShopServer) and server.container is not None
    assert server.url == f"http://{server.container.ip}:8000" and not server.url.startswith("http://127.")
    assert server.fingerprint == env.unwrapped.catalog.fingerprint
    tasks = env.unwrapped.tasks("test")[:4]
    for task in tasks:
        obs, _ = env.reset(options={"task": task})
        reward, info = _run_oracle(env, task, obs)
        assert reward == 1.0 and info["metrics"]["success"] == 1.0, (task.id, info["metrics"])
        assert info["metrics"]["server_restarts"] == 0.0


def test_container_is_hardened_and_reaches_only_its_internal_network(env):
    server = env.unwrapped._server
    container = server.container
    # a listener on all of the host's addresses: reachable from the host, never from the box
    listener = socket.create_server(("0.0.0.0", 0))
    port = listener.getsockname()[1]
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.connect(("10.255.255.255", 1))  # no packet sent: picks the host's outward address
    host_ip = probe.getsockname()[0]
    probe.close()
    gateway = container.ip.rsplit(".", 1)[0] + ".1"  # the host's own address on the internal network
    targets = {"public": ("1.1.1.1", 53), "host": (host_ip, port), "docker0": ("172.17.0.1", port)}
    targets["gateway"] = (gateway, port)
    script = textwrap.dedent(f"""
        import json, os, socket
        from concurrent.futures import ThreadPoolExecutor
        def reach(host, port):
            try:
                socket.create_connection((host, port), timeout=2).close()
                return "connected"
            except OSError as exc:
                return type(exc).__name__
        def resolves(name):
            try:
                socket.getaddrinfo(name, 443)
                return True
            except OSError:
                return False
        pool = ThreadPoolExecutor(8)
        dns = pool.submit(resolves, "pypi.org")
        probes = {{name: pool.submit(reach, *target) for name, target in {targets!r}.items()}}
        status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
        try:
            open("/evil", "w")
            root_writable = True
        except OSError:
            root_writable = False
        facts = {{
            "uid": os.getuid(), "cap_eff": status["CapEff"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
            "interfaces": sorted(os.listdir("/sys/class/net")), "root_writable": root_writable,
            "ipv6_off": open("/proc/sys/net/ipv6/conf/all/disable_ipv6").read().strip() == "1",
            "self": reach("127.0.0.1", 8000),
        }}
        facts.update({{name: probe.result() for name, probe in probes.items()}})
        try:
            facts["dns"] = dns.result(timeout=3)
        except TimeoutError:
            facts["dns"] = False  # a resolver that hangs resolves nothing
        print(json.dumps(facts), flush=True)
        os._exit(0)  # do not wait for a hung lookup thread
    """)
    code, output = container.exec(["python3", "-c", script], timeout=30)
    # the host itself still reaches the listener and the shop (replies to host connections pass)
    socket.create_connection((host_ip, port), timeout=2).close()
    listener.close()
    assert code == 0, output
    facts = json.loads(output.strip().splitlines()[-1])
    assert facts["uid"] == 1000 and int(facts["cap_eff"], 16) == 0 and facts["no_new_privs"] == "1"
    assert facts["interfaces"] == ["eth0", "lo"] and facts["ipv6_off"], facts
    assert not facts["root_writable"] and not facts["dns"], facts
    for name in targets:  # outside, the host's outward IP, docker0, and the bridge's own host address
        assert facts[name] != "connected", (name, facts)
    assert facts["self"] == "connected"  # the shop itself listens in the box
    assert server.network.firewalled  # the host rule that makes "host" and "gateway" unreachable
    assert env.unwrapped._client.get(f"{server.url}/api/health").status_code == 200


def test_killed_container_is_restarted_and_the_episode_told(env):
    server = env.unwrapped._server
    task = env.unwrapped.tasks("test")[5]
    obs, _ = env.reset(options={"task": task})
    obs, *_ = env.step(f"search[{task.payload['noun']}]")
    first_item = re.search(r"\[(B0[0-9A-Z]{8})\]", obs).group(1)
    old_id, old_network, generation = server.container.container_id, server.network.name, server.generation
    server.container.kill()
    assert server.container.wait_ended(10.0)
    obs, reward, terminated, truncated, _ = env.step(f"click[{first_item}]")
    assert obs.startswith(RESTART_NOTICE) and "[Search]" in obs and not (terminated or truncated)
    assert server.generation == generation + 1 and server.restarts >= 1
    assert server.container.container_id != old_id and server.container.running()
    assert [n["Name"] for n in _ours("networks")] == [server.network.name] != [old_network]  # old one removed
    reward, info = _run_oracle(env, task, obs)
    assert reward == 1.0 and info["metrics"]["server_restarts"] == 1.0


def test_close_removes_container_and_network():
    env = agentrl.make("agentrl/Web-v0", n_products=N_PRODUCTS, seed=1, backend="docker")
    env.reset(seed=0)
    server = env.unwrapped._server
    container_id, network = server.container.container_id, server.network.name
    assert container_id in {c["Id"] for c in _ours("containers")}
    assert network in {n["Name"] for n in _ours("networks")}
    env.close()
    env.close()
    assert container_id not in {c["Id"] for c in _ours("containers")}
    assert network not in {n["Name"] for n in _ours("networks")}
    assert server not in manager.running_servers() and server.rss_bytes() == 0


LEAKER = """
import sys, time
from agentrl.envs.web.docker_backend import DockerShopServer
server = DockerShopServer(seed=2, n_products=60, data_dir="builtin")
server.start()
print(server.container.container_id, server.network.name, flush=True)
time.sleep(600)
"""


def test_a_dead_owner_leaks_nothing():
    """The owner is SIGKILLed: its container goes by itself, the next sweep removes its network."""
    owner = subprocess.Popen([sys.executable, "-c", LEAKER], stdout=subprocess.PIPE, text=True)
    try:
        container_id, network = owner.stdout.readline().split()
    finally:
        owner.kill()
        owner.wait()
    client = docker.from_env()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and client.api.containers(all=True, filters={"id": container_id}):
        time.sleep(0.2)
    assert not client.api.containers(all=True, filters={"id": container_id})
    assert client.api.networks(names=[network])  # a network cannot remove itself...
    assert sweep_stale() >= 1  # ...the next owner's sweep does
    assert not [n for n in client.api.networks(names=[network]) if n["Name"] == network]
