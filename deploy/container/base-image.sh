#!/usr/bin/env bash
# Makes the local Debian bookworm base images the project's images build on, where no
# image registry is reachable: debootstrap from Debian's package mirror (the one apt uses
# here, read from its deb822 sources), then `docker import`. The root file systems are
# cached as tarballs under ~/.cache, so this is quick after the first time.
#
#   deploy/container/base-image.sh            # vector-tls-proxy-base:bookworm
#   deploy/container/base-image.sh systemd    # vector-tls-proxy-base:bookworm-systemd too
#   deploy/container/base-image.sh python     # vector-tls-proxy-base:bookworm-python too
#
# The runtime base holds what the runtime stage of deploy/container/Containerfile installs
# (libssl3, ca-certificates, curl for the health check) and the proxy's user, so images
# build on it with COPY alone, no package manager run inside a build. The systemd base
# adds systemd as PID 1, for booting the project's units in a container (run it with
# --stop-signal SIGRTMIN+3, which `docker import` cannot set). The python base adds
# Debian's Python 3 with venv, for the tests' stand-in of OpenVINO Model Server's image.
# Needs root (debootstrap, chroot) and a Docker Engine.
set -euo pipefail
cache="${XDG_CACHE_HOME:-$HOME/.cache}/vector-tls-proxy/base"
mkdir -p "$cache"

mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)\/\?$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
mirror="${DEBIAN_MIRROR:-${mirror:-http://deb.debian.org/debian}}"
command -v debootstrap >/dev/null || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
}

# rootfs NAME PACKAGES: a cached tarball of bookworm minbase with PACKAGES (named by their
# list, so a changed list makes a new one).
rootfs() {
  local name="$1-$(printf '%s' "$2" | sha256sum | cut -c1-8)" packages="$2"
  local tarball="$cache/$name.tar"
  if [ -f "$tarball" ]; then
    echo "$tarball"
    return
  fi
  local dir
  dir=$(mktemp -d /tmp/vtp-rootfs.XXXXXX)
  debootstrap --variant=minbase --include="$packages" bookworm "$dir" "$mirror" >"$cache/$name.log" 2>&1 \
    || { tail -20 "$cache/$name.log" >&2; rm -rf "$dir"; exit 1; }
  # The proxy's user (uid 10001, as in the Containerfile) and the folders it writes.
  chroot "$dir" groupadd --system --gid 10001 vtp 2>/dev/null
  chroot "$dir" useradd --system --uid 10001 --gid vtp --no-create-home --home-dir /nonexistent vtp 2>/dev/null
  mkdir -p "$dir/etc/vector-tls-proxy/certs" "$dir/var/lib/embedded-qdrant"
  chroot "$dir" chown vtp:vtp /etc/vector-tls-proxy/certs /var/lib/embedded-qdrant
  # Smaller images: no package lists, docs or caches.
  rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin "$dir"/usr/share/doc/* \
    "$dir"/usr/share/man/* "$dir"/usr/share/locale/*
  tar -C "$dir" --numeric-owner -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
  rm -rf "$dir"
  echo "$tarball"
}

# import TARBALL TAG [CHANGE...]: the image, imported again when its tarball changed.
import() {
  local tarball="$1" tag="$2"
  shift 2
  local made_from
  made_from=$(docker image inspect -f '{{index .Config.Labels "vector-tls-proxy.rootfs"}}' "$tag" 2>/dev/null || true)
  if [ "$made_from" != "$(basename "$tarball")" ]; then
    local changes=(--change "LABEL vector-tls-proxy.rootfs=$(basename "$tarball")")
    for c in "$@"; do changes+=(--change "$c"); done
    docker import "${changes[@]}" "$tarball" "$tag" >/dev/null
  fi
  echo "$tag"
}

runtime_packages="ca-certificates,curl,libssl3"
import "$(rootfs bookworm-runtime "$runtime_packages")" vector-tls-proxy-base:bookworm \
  'CMD ["/bin/bash"]'
if [ "${1:-}" = python ]; then
  import "$(rootfs bookworm-python "$runtime_packages,python3,python3-venv")" \
    vector-tls-proxy-base:bookworm-python 'CMD ["/bin/bash"]'
fi
if [ "${1:-}" = systemd ]; then
  # openssl: the quick start makes the API key with it.
  import "$(rootfs bookworm-systemd "$runtime_packages,systemd,systemd-sysv,dbus,procps,openssl")" \
    vector-tls-proxy-base:bookworm-systemd 'CMD ["/sbin/init"]'
fi
