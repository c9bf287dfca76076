#!/usr/bin/env bash
# Prepare a fresh Debian machine for the sandbox tests (run as root, before pytest):
#   1. install docker.io, debootstrap and bubblewrap (skipped when already there),
#   2. start dockerd in the background unless an engine already answers, and wait for it,
#   3. build the sandbox image offline (debootstrap -> docker import), cached by recipe hash.
# Usage: .ci/setup-sandbox.sh [VENV_DIR_OR_PYTHON]   (default: .venv of the repo)
# Idempotent: a second run installs nothing, starts nothing and reuses the image (a few seconds).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${1:-$REPO/.venv}
if [ -x "$TARGET/bin/python" ]; then PYTHON=$TARGET/bin/python; else PYTHON=$TARGET; fi
[ -x "$PYTHON" ] || { echo "setup-sandbox: no python at $TARGET (pass the venv dir or its python)" >&2; exit 2; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
log() { echo "setup-sandbox: $*"; }
started=$(date +%s)

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v setpriv >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]}"
    $SUDO apt-get update -q
    # With recommends (cgroupfs-mount, iptables, ...): the set this script was tested with.
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need[@]}"
fi

if docker info >/dev/null 2>&1; then
    log "a Docker engine already answers"
else
    if ! mountpoint -q /sys/fs/cgroup && command -v cgroupfs-mount >/dev/null; then
        $SUDO cgroupfs-mount || true  # dockerd needs cgroups; some minimal images do not mount them
    fi
    for pidfile in /var/run/docker.pid /var/run/docker/containerd/containerd.pid; do
        # a dockerd that died leaves its pid file, and a new one refuses to start over it
        if [ -f "$pidfile" ] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then $SUDO rm -f "$pidfile"; fi
    done
    log "starting dockerd (log: /var/log/agentrl-dockerd.log)"
    $SUDO sh -c 'nohup dockerd >/var/log/agentrl-dockerd.log 2>&1 &'
    for _ in $(seq 1 60); do
        docker info >/dev/null 2>&1 && break
        sleep 1
    done
    if ! docker info >/dev/null 2>&1; then
        echo "setup-sandbox: dockerd did not answer within 60 s; last lines of its log:" >&2
        tail -n 30 /var/log/agentrl-dockerd.log >&2 || true
        echo "setup-sandbox: Docker tests would fail; fix dockerd (cgroups, iptables, storage driver) or run without AGENTRL_REQUIRE_DOCKER" >&2
        exit 1
    fi
    log "dockerd is up"
fi

# bwrap boxes get a private overlay of /usr (issue 42); without the module they fall back to a
# shared bind, which `agentrl sandbox doctor` reports as "private /usr view per box  NO".
grep -qw overlay /proc/filesystems || $SUDO modprobe overlay 2>/dev/null || log "no overlayfs here: bwrap boxes share the host's /usr view"

log "building the sandbox image (cached by recipe hash)"
$SUDO "$PYTHON" -m agentrl.sandboxes build
log "done in $(( $(date +%s) - started )) s"
