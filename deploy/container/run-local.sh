#!/usr/bin/env bash
# Builds the image's runtime stage where no container registry is reachable, starts
# embedded-qdrant and the proxy as containers, and runs loadgen against them.
#
# deploy/container/Containerfile's build stage needs a Rust image from a registry; here the
# binaries are built on the host instead (same workspace, same release profile), and the
# runtime stage, taken verbatim from the Containerfile, is built on a Debian bookworm base
# made with debootstrap from Debian's packages and imported with `podman import`.
#
# Needs root (debootstrap, podman). Installs podman, runc and debootstrap with apt-get when
# missing. About 5 minutes warm; the base root file system is cached in ~/.cache.
#
#   deploy/container/run-local.sh [--requests N] [--keep]
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

requests=200
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --requests) requests="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [--requests N] [--keep]" >&2; exit 2 ;;
  esac
done

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
image="localhost/vector-tls-proxy:${version}"
base="localhost/debian-bookworm-minbase:local"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/vector-tls-proxy"
work=$(mktemp -d /tmp/vtp-container.XXXXXX)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
# This cgroup layout needs runc (crun fails), and podman's default ulimits are refused.
run_flags=(--runtime runc --network host --ulimit nofile=1024:1024 --ulimit nproc=1024:1024)

need=()
for pkg in podman runc debootstrap; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
  echo "== installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >"$work/apt.log" 2>&1 \
    || { tail -20 "$work/apt.log"; exit 1; }
fi

# podman starts health-check timers through systemd, which these machines lack: it logs an
# error per container and runs without them. That line is dropped; anything else shows.
pod() {
  podman "$@" 2> >(grep -v 'systemd connection' >&2)
}

cleanup() {
  if [ "$keep" = 0 ]; then
    podman --runtime runc rm -f vtp-proxy vtp-qdrant >/dev/null 2>&1 || true
    rm -rf "$work"
  fi
}
trap cleanup EXIT

echo "== base image: Debian bookworm (minbase) from Debian's packages"
if ! podman image exists "$base"; then
  mkdir -p "$cache"
  if [ ! -f "$cache/bookworm-minbase.tar" ]; then
    rootfs="$work/rootfs"
    debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
      || { tail -20 "$work/debootstrap.log"; exit 1; }
    tar -C "$rootfs" -cf "$cache/bookworm-minbase.tar" .
    rm -rf "$rootfs"
  fi
  podman import "$cache/bookworm-minbase.tar" "$base" >/dev/null
fi

echo "== binaries (cargo build --release, on the host)"
cargo build --release --locked -p proxy -p loadgen -p embedded-qdrant 2>&1 | tail -1
ctx="$work/context"
mkdir -p "$ctx/out" "$ctx/config"
cp "$CARGO_TARGET_DIR"/release/{proxy,loadgen,embedded-qdrant} "$ctx/out/"
# As the Containerfile's build stage does: the release profile keeps debug info for perf.
strip --strip-debug "$ctx/out/"*
cp config/proxy.toml "$ctx/config/"

echo "== runtime stage of deploy/container/Containerfile on that base"
{
  echo "ARG RUNTIME_IMAGE=$base"
  # The runtime stage, verbatim, but for where the binaries come from.
  sed -n '/^FROM \${RUNTIME_IMAGE} AS runtime/,$p' deploy/container/Containerfile \
    | sed 's|^COPY --from=build /out/proxy /out/loadgen /out/embedded-qdrant |COPY out/proxy out/loadgen out/embedded-qdrant |'
} >"$ctx/Containerfile"
grep -q '^COPY out/proxy' "$ctx/Containerfile" \
  || { echo "the runtime stage's COPY line changed; update this script" >&2; exit 1; }
podman build --runtime runc --network host --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
  --format docker --build-arg VERSION="$version" -t "$image" -f "$ctx/Containerfile" "$ctx" >"$work/build.log" 2>&1 \
  || { tail -30 "$work/build.log"; exit 1; }
echo "image: $image ($(podman image inspect "$image" --format '{{.Size}}') bytes)"
echo "label: org.opencontainers.image.version=$(podman image inspect "$image" --format '{{index .Labels "org.opencontainers.image.version"}}')"
echo "user: $(podman image inspect "$image" --format '{{.Config.User}}')"

echo "== certificates (proxy gen-certs, in the image)"
certs="$work/certs"
mkdir -p "$certs"
chmod 0777 "$certs"
pod run --rm "${run_flags[@]}" -v "$certs:/certs:Z" --entrypoint /usr/local/bin/proxy "$image" \
  gen-certs --out /certs --algorithms ecdsa-p256 >/dev/null
chmod -R a+r "$certs"

ports=$(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(5)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
)
read -r q_rest q_grpc p_rest p_grpc _ <<<"$ports"
# The image's HEALTHCHECK asks the admin port's default address.
p_admin=9900
if curl -s "http://127.0.0.1:$p_admin/" >/dev/null 2>&1; then
  echo "port $p_admin is taken on this host; the image's health check needs it" >&2
  exit 1
fi
cat >"$work/proxy.toml" <<EOF
provider = "aws-lc-rs"
[admin]
listen = "127.0.0.1:$p_admin"
[[listener]]
name = "rest"
listen = "127.0.0.1:$p_rest"
cert = "/etc/vector-tls-proxy/certs/ecdsa-p256.crt"
key = "/etc/vector-tls-proxy/certs/ecdsa-p256.key"
upstream = "http://127.0.0.1:$q_rest"
[[listener]]
name = "grpc"
listen = "127.0.0.1:$p_grpc"
cert = "/etc/vector-tls-proxy/certs/ecdsa-p256.crt"
key = "/etc/vector-tls-proxy/certs/ecdsa-p256.key"
upstream = "http://127.0.0.1:$q_grpc"
upstream_protocol = "h2c"
EOF
chmod a+r "$work/proxy.toml"

echo "== containers: embedded-qdrant and the proxy (host network, loopback ports)"
podman rm -f vtp-proxy vtp-qdrant >/dev/null 2>&1 || true
pod run -d --name vtp-qdrant "${run_flags[@]}" --entrypoint /usr/local/bin/embedded-qdrant "$image" \
  --rest "127.0.0.1:$q_rest" --grpc "127.0.0.1:$q_grpc" --data /var/lib/embedded-qdrant >/dev/null
pod run -d --name vtp-proxy "${run_flags[@]}" \
  -v "$certs:/etc/vector-tls-proxy/certs:ro,Z" -v "$work/proxy.toml:/etc/vector-tls-proxy/proxy.toml:ro,Z" \
  "$image" >/dev/null
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$p_admin/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
echo "readyz: $(curl -sS "http://127.0.0.1:$p_admin/readyz")"
# podman runs health checks from systemd timers; without systemd it says so on stderr
# (filtered here) and `healthcheck run` still runs the image's HEALTHCHECK once.
pod healthcheck run vtp-proxy
echo "HEALTHCHECK: $(podman inspect vtp-proxy --format '{{.State.Health.Status}}' 2>/dev/null)"
echo "processes: $(podman top vtp-proxy user args | tail -n +2 | tr -s ' ')"

echo "== loadgen (from the image) against the proxy container, REST and gRPC"
for protocol in rest grpc; do
  port=$p_rest
  [ "$protocol" = grpc ] && port=$p_grpc
  pod run --rm "${run_flags[@]}" -v "$certs:/certs:ro,Z" --entrypoint /usr/local/bin/loadgen "$image" \
    run --target "localhost:$port" --protocol "$protocol" --ca /certs/ca.crt --collection "container-$protocol" \
    --recreate --requests "$requests" --concurrency 4 --warmup 0s --power none --quiet \
    --proxy-metrics "http://127.0.0.1:$p_admin/metrics"
done

echo "== proxy metrics"
curl -sS "http://127.0.0.1:$p_admin/metrics" | grep -E '^proxy_(http_requests_total|tls_handshakes_total)' | head -8
