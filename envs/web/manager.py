"""Start, share, watch and stop shop servers.

Envs with the same catalogue settings share one server (one session per episode): :func:`acquire`
returns it and counts references, :func:`release` stops it when the last env lets go. A server that
died is restarted by :meth:`ShopServer.ensure_running`; its ``generation`` counts restarts so an env
can tell that its session is gone. Servers are also stopped at interpreter exit, and a local server
exits by itself when the process that started it dies (``--watch-parent``).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx

from agentrl.errors import EnvError
from agentrl.registry import load_entry_point

STARTUP_TIMEOUT_S = 90.0
DOCKER_SERVER = "agentrl.envs.web.docker_backend:DockerShopServer"  # backend="docker"
_LOCK = threading.Lock()
_SERVERS: dict[tuple[Any, ...], list[Any]] = {}  # key -> [server, refcount]


class ShopServer:
    """One shop server process (``backend="local"``) listening on 127.0.0.1.

    ``backend="docker"`` is :class:`agentrl.envs.web.docker_backend.DockerShopServer`, a subclass that
    overrides ``start``, ``_running``, ``stop`` and ``rss_bytes``; restarts and sharing stay here.
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        n_products: int = 1500,
        data_dir: str | None = "auto",
        external_url: str | None = None,
        host: str = "127.0.0.1",
    ):
        """``external_url``: a shop someone else runs; it is used as is, never started or restarted.
        ``host``: the address a local server listens on (a Ray cluster-wide shop uses its node's)."""
        self.host = host
        self.external = external_url is not None
        self.seed = seed
        self.n_products = n_products
        self.data_dir = data_dir
        self.url = external_url.rstrip("/") if external_url else ""
        self.fingerprint = ""
        self.generation = 1 if external_url else 0
        self.restarts = 0
        self._process: subprocess.Popen[str] | None = None
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ lifecycle
    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        with self._lock:
            if self._process is not None and self._process.poll() is None:
                return
            argv = [
                sys.executable, "-m", "agentrl.envs.web.server", "--host", self.host, "--port", "0",
                "--seed", str(self.seed), "--n-products", str(self.n_products),
                "--data-dir", "builtin" if self.data_dir is None else str(self.data_dir), "--watch-parent",
            ]  # fmt: skip
            process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
            )
            ready = self._wait_ready(process)
            self._process = process
            self.url = f"http://{self.host}:{ready['port']}"
            self.fingerprint = ready["fingerprint"]
            self.generation += 1

    def _wait_ready(self, process: subprocess.Popen[str]) -> dict[str, Any]:
        lines: list[str] = []

        def read() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                lines.append(line)
                if line.startswith("READY "):
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(STARTUP_TIMEOUT_S)
        ready = next((line for line in lines if line.startswith("READY ")), None)
        if ready is None:
            process.kill()
            _, err = process.communicate(timeout=10)
            raise EnvError(
                f"the shop server did not start within {STARTUP_TIMEOUT_S:.0f}s "
                f"(exit code {process.returncode}); its stderr ends with:\n{(err or '')[-2000:]}"
            )
        # nobody reads the pipes after this: send stdout/stderr nowhere so the server never blocks
        threading.Thread(target=process.communicate, daemon=True).start()
        return json.loads(ready[len("READY ") :])

    def _running(self) -> bool:
        """Whether our server process still runs (the docker backend checks its container)."""
        return self._process is not None and self._process.poll() is None

    def alive(self) -> bool:
        """True if the process runs and answers ``/api/health``."""
        with self._lock:
            if not self.external and not self._running():
                return False
            url = self.url
        try:
            return httpx.get(f"{url}/api/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def ensure_running(self, seen_generation: int) -> int:
        """Restart the server if it is dead and nobody restarted it since ``seen_generation``.

        Returns:
            The current generation; greater than ``seen_generation`` means sessions were lost.
        """
        with self._lock:
            if self.generation != seen_generation:
                return self.generation
            if not self.alive():
                if self.external:
                    raise EnvError(f"the shop at {self.url} does not answer (it is not ours to restart)")
                self.stop()
                self.start()
                self.restarts += 1
            return self.generation

    def stop(self) -> None:
        with self._lock:
            process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)

    def rss_bytes(self) -> int:
        """Resident memory of the server process (0 if it is not running)."""
        pid = self.pid
        status = Path(f"/proc/{pid}/status")
        if pid is None or not status.exists():
            return 0
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0


def acquire(
    *, seed: int = 0, n_products: int = 1500, data_dir: str | None = "auto", backend: str = "local"
) -> ShopServer:
    """A running shared server for these settings (started on first use)."""
    if backend not in ("local", "docker"):
        raise EnvError(f"unknown shop backend {backend!r}; choose 'local' or 'docker'")
    key = (backend, seed, n_products, data_dir)
    with _LOCK:
        entry = _SERVERS.get(key)
        if entry is None:
            # loaded by name: only docker users load the sandboxes package (and the subclass imports us)
            server_cls = ShopServer if backend == "local" else load_entry_point(DOCKER_SERVER)
            server: ShopServer = server_cls(seed=seed, n_products=n_products, data_dir=data_dir)
            server.start()
            entry = _SERVERS[key] = [server, 0]
        entry[1] += 1
        return entry[0]


def release(server: ShopServer) -> None:
    """Drop one reference; the last one stops the server."""
    with _LOCK:
        for key, entry in list(_SERVERS.items()):
            if entry[0] is server:
                entry[1] -= 1
                if entry[1] <= 0:
                    del _SERVERS[key]
                    server.stop()
                return


def running_servers() -> list[ShopServer]:
    with _LOCK:
        return [entry[0] for entry in _SERVERS.values()]


@atexit.register
def stop_all() -> None:
    """Stop every server this process started (also runs at interpreter exit)."""
    with _LOCK:
        servers = [entry[0] for entry in _SERVERS.values()]
        _SERVERS.clear()
    for server in servers:
        server.stop()
