"""The sandbox image: built offline from a debootstrap of minimal Debian, cached by recipe hash.

No registry is reachable where agentrl trains, so the base image is made from the recipe in
``sandboxes/images/`` (``build-rootfs.sh`` + ``packages.txt``): debootstrap into a folder, tar it,
``docker import`` it with the user, work dir and environment baked in. The tag carries a hash of the
recipe, so a changed recipe builds a new image and an unchanged one is never rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrl.errors import SandboxError

IMAGES_DIR = Path(__file__).resolve().parent / "images"
RECIPE_FILES = ("build-rootfs.sh", "packages.txt")
IMAGE_REPO = "agentrl-sandbox"
SANDBOX_UID = 1000
WORK_DIR = "/work"
# Baked into the image by `docker import --change`; the sandbox sees nothing of the host's env.
IMAGE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORK_DIR,
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def recipe_hash() -> str:
    """Hash of the recipe files (12 hex digits); it names the image tag."""
    digest = hashlib.sha256()
    for name in RECIPE_FILES:
        digest.update(name.encode() + b"\0" + (IMAGES_DIR / name).read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def default_image() -> str:
    """The image sandboxes use: ``$AGENTRL_SANDBOX_IMAGE`` or ``agentrl-sandbox:<recipe hash>``."""
    return os.environ.get("AGENTRL_SANDBOX_IMAGE") or f"{IMAGE_REPO}:{recipe_hash()}"


def apt_mirror() -> str:
    """The Debian mirror apt already uses on this machine (so builds work where only it is reachable)."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        # deb822 ("URIs: http://.../debian") and one-line ("deb http://.../debian bookworm main").
        for match in re.finditer(r"(?:URIs:\s*|^deb\s+(?:\[[^]]*\]\s+)?)(\S+/debian)/?\s", text, re.M):
            return match.group(1)
    return "http://deb.debian.org/debian"


def build_image(client: Any, force: bool = False, *, log: Any = print) -> str:
    """Build the sandbox image unless an image with the recipe's tag exists; return the tag.

    Needs root, ``debootstrap`` and a Docker engine (``DOCKER_HOST`` is honoured). Takes a few
    minutes the first time (the debootstrap), well under a second when the image is cached.

    Args:
        client: a ``docker.DockerClient`` (``agentrl.sandboxes.docker_backend.docker_client()``).
        force: rebuild even if the tagged image exists.
        log: where progress lines go.

    Raises:
        SandboxError: no engine, not root, debootstrap missing or failing.
    """
    tag = f"{IMAGE_REPO}:{recipe_hash()}"
    if not force and _image_exists(client, tag):
        log(f"image {tag} is up to date (recipe hash unchanged)")
        return tag
    if os.geteuid() != 0:
        raise SandboxError("building the sandbox image needs root (debootstrap); run it with sudo")
    if shutil.which("debootstrap") is None:
        raise SandboxError("debootstrap is not installed; run `apt-get install -y debootstrap`")

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="agentrl-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        mirror = apt_mirror()
        log(f"debootstrap bookworm from {mirror} into {rootfs} (a few minutes) ...")
        proc = subprocess.run(
            ["sh", str(IMAGES_DIR / "build-rootfs.sh"), str(rootfs), mirror],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise SandboxError(f"build-rootfs.sh failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        log(f"rootfs ready after {time.monotonic() - started:.0f} s; importing as {tag} ...")
        tarball = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tarball), "."], check=True)
        changes = [f"USER {SANDBOX_UID}:{SANDBOX_UID}", f"WORKDIR {WORK_DIR}", 'CMD ["/bin/sh"]']
        changes += [f"ENV {key}={value}" for key, value in IMAGE_ENV.items()]
        client.api.import_image_from_file(
            str(tarball), repository=IMAGE_REPO, tag=recipe_hash(), changes=changes
        )
    if not _image_exists(client, tag):
        raise SandboxError(f"docker import reported no error but image {tag} is missing")
    log(f"built {tag} in {time.monotonic() - started:.0f} s")
    return tag


def _image_exists(client, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True
