#!/bin/sh
# Build the agentrl sandbox root filesystem offline-friendly: debootstrap a minimal Debian into DEST.
# Usage: build-rootfs.sh DEST [MIRROR]   (needs root and debootstrap; MIRROR defaults to deb.debian.org)
# The result is piped into `docker import` by `python -m agentrl.sandboxes build`. Every change to
# this file (or to packages.txt) changes the recipe hash and therefore the image tag.
set -eu
DEST=${1:?usage: build-rootfs.sh DEST [MIRROR]}
MIRROR=${2:-http://deb.debian.org/debian}
SUITE=bookworm
HERE=$(cd "$(dirname "$0")" && pwd)
# Comments and blank lines in packages.txt are ignored.
PKGS=$(grep -v '^[[:space:]]*#' "$HERE/packages.txt" | tr -s ' \n' ',' | sed 's/^,//; s/,$//')

debootstrap --variant=minbase --include="$PKGS" "$SUITE" "$DEST" "$MIRROR"

# The unprivileged user every sandboxed process runs as (uid/gid 1000, home = the work dir).
chroot "$DEST" groupadd --gid 1000 sandbox
chroot "$DEST" useradd --uid 1000 --gid 1000 --home-dir /work --no-create-home --shell /bin/sh sandbox
mkdir -p "$DEST/work"
chown 1000:1000 "$DEST/work"

# Nothing a model needs, and less to scan: package caches, docs, man pages, most locales.
rm -rf "$DEST"/var/cache/apt/archives/*.deb "$DEST"/var/lib/apt/lists/* \
       "$DEST"/usr/share/doc/* "$DEST"/usr/share/man/* "$DEST"/usr/share/info/* \
       "$DEST"/var/log/* "$DEST"/tmp/* "$DEST"/var/tmp/*
find "$DEST/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'C.UTF-8' -exec rm -rf {} + 2>/dev/null || true
# Byte-compile the standard library once, so a read-only root does not slow every interpreter start.
chroot "$DEST" python3 -m compileall -q -j 0 /usr/lib/python3 >/dev/null 2>&1 || true
