"""``backend: docker``: the shop server in a hardened sandbox container on its own internal network.

The sandbox image has only Debian's ``python3`` (3.11, standard library). The shop needs starlette,
uvicorn, bm25s, rapidfuzz and agentrl itself, so the host's own site-packages and agentrl's source
folders are mounted **read-only at the same paths** inside the container (an editable install's
path finder then works unchanged) and the image's ``python3`` runs the server with those
site-packages added. That needs the same ``major.minor`` Python on both sides (compiled wheels are
built for one ABI): checked at start, with a clear error. The WebShop data folder goes in read-only
too. Nothing is writable but a size-capped ``/tmp``.

Network: the container's only interface is on an internal bridge network created for it (no route
outside, no DNS); the host reaches it at the container's address there. The env lifecycle is the
local backend's (:class:`~agentrl.envs.web.manager.ShopServer`): shared by refcount, restarted when
dead (the episode is told), stopped at release / exit. The Docker calls live in
``agentrl.sandboxes.service``.

Limits: the engine must be local (the host reaches container addresses and mounts its own paths);
the host's address on the internal network (its gateway) is reachable from the container, so host
services listening on 0.0.0.0 can be reached from it - the shop is our code, not the model's.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path
from typing import Any

from agentrl.envs.web import manager
from agentrl.errors import EnvError, SandboxError
from agentrl.paths import benchmark_dir
from agentrl.sandboxes.service import ServiceContainer, ServiceNetwork

SHOP_PORT = 8000
DATA_MOUNT = "/opt/agentrl-data"
# The in-container entry: check the Python ABI, add the host's site dirs, run the server module.
BOOTSTRAP = """\
import json, runpy, site, sys
want = tuple(json.loads(sys.argv[1]))
if sys.version_info[:2] != want:
    sys.exit("the image's python3 is %d.%d but the host's packages are for %d.%d: use an image with "
             "Python %d.%d (AGENTRL_SANDBOX_IMAGE) or backend: local" % (sys.version_info[:2] + want + want))
for folder in json.loads(sys.argv[2]):
    site.addsitedir(folder)
sys.argv = ["agentrl.envs.web.server", *sys.argv[3:]]
runpy.run_module("agentrl.envs.web.server", run_name="__main__", alter_sys=True)
"""


def host_code_mounts() -> tuple[list[str], dict[str, str]]:
    """The host's site-packages folders and agentrl's source folders, mounted at their own paths.

    Returns:
        ``(site dirs to add inside, {host path: container path})``.
    """
    import agentrl
    import agentrl.envs
    import agentrl.sandboxes
    import agentrl.tools

    site_dirs = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    folders = {str(Path(p).resolve()) for p in site_dirs if Path(p).is_dir()}
    for module in (agentrl, agentrl.envs, agentrl.tools, agentrl.sandboxes):
        folder = Path(module.__file__).resolve().parent
        if not any(folder.is_relative_to(site) for site in folders):
            folders.add(str(folder))
    # a folder inside another mounted folder needs no mount of its own
    top = [f for f in sorted(folders) if not any(f != o and Path(f).is_relative_to(o) for o in folders)]
    return [str(Path(p).resolve()) for p in site_dirs if Path(p).is_dir()], {f: f for f in top}


class DockerShopServer(manager.ShopServer):
    """A :class:`~agentrl.envs.web.manager.ShopServer` whose process is a sandbox container.

    Args:
        seed, n_products, data_dir: the catalogue (as for the local server).
        memory_mb, pids, cpus: the container's limits.
        image: image tag (default: the sandbox image).
    """

    backend = "docker"

    def __init__(
        self,
        *,
        seed: int = 0,
        n_products: int = 1500,
        data_dir: str | None = "auto",
        memory_mb: int = 1024,
        pids: int = 256,
        cpus: float = 1.0,
        image: str | None = None,
    ):
        super().__init__(seed=seed, n_products=n_products, data_dir=data_dir)
        self.memory_mb, self.pids, self.cpus, self.image = memory_mb, pids, cpus, image
        self.network: ServiceNetwork | None = None
        self.container: ServiceContainer | None = None

    @property
    def pid(self) -> int | None:
        return None  # the process lives in the container's pid namespace

    def _command(self) -> tuple[list[str], dict[str, str]]:
        site_dirs, mounts = host_code_mounts()
        data_arg = "builtin"
        if self.data_dir not in (None, "builtin"):
            folder = benchmark_dir("webshop") if self.data_dir == "auto" else Path(self.data_dir) / "webshop"
            if not folder.is_dir():
                raise EnvError(f"no WebShop data folder at {folder}; use data_dir='auto' or 'builtin'")
            mounts[str(folder.resolve())] = f"{DATA_MOUNT}/webshop"  # with its SHA256SUMS: checked inside
            data_arg = DATA_MOUNT
        argv = [
            "python3", "-c", BOOTSTRAP, json.dumps(sys.version_info[:2]), json.dumps(site_dirs),
            "--host", "0.0.0.0", "--port", str(SHOP_PORT), "--seed", str(self.seed),
            "--n-products", str(self.n_products), "--data-dir", data_arg,
        ]  # fmt: skip
        return argv, mounts

    def start(self) -> None:
        with self._lock:
            if self.container is not None and self.container.running():
                return
            argv, mounts = self._command()
            network = ServiceNetwork(prefix="agentrl-shop")
            try:
                network.create()
                container = ServiceContainer(
                    argv,
                    network=network.name,
                    image=self.image,
                    memory_mb=self.memory_mb,
                    pids=self.pids,
                    cpus=self.cpus,
                    ro_mounts=mounts,
                )
                ready: dict[str, Any] = json.loads(container.start(timeout=manager.STARTUP_TIMEOUT_S))
            except SandboxError as exc:
                network.remove()
                raise EnvError(f"the shop server container did not start: {exc}") from exc
            self.network, self.container = network, container
            self.url = f"http://{container.ip}:{ready['port']}"
            self.fingerprint = ready["fingerprint"]
            self.generation += 1

    def _running(self) -> bool:
        return self.container is not None and self.container.running()

    def stop(self) -> None:
        with self._lock:
            container, self.container = self.container, None
            network, self.network = self.network, None
        if container is not None:
            container.stop()
        if network is not None:
            network.remove()

    def rss_bytes(self) -> int:
        """Memory the container's cgroup uses (0 if it is not running)."""
        container = self.container
        return container.memory_bytes() if container is not None else 0
