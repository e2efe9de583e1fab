#!/usr/bin/env bash
# Builds the project's images where no image registry is reachable: the local Debian base
# (deploy/container/base-image.sh), then `proxy` and `tools` from deploy/container/
# Containerfile.prebuilt with binaries built on this host. No Rust build runs inside a
# container. Prints the image names.
#
#   deploy/container/build-images.sh                    # cargo build --release, then images
#   deploy/container/build-images.sh --bin-dir DIR --tag test   # binaries already built
#
# Images: vector-tls-proxy:TAG (the proxy alone) and vector-tls-proxy-tools:TAG (loadgen,
# embedded-qdrant); TAG defaults to the workspace version.
set -euo pipefail
cd "$(dirname "$0")/../.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
tag="$version"
bin_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) bin_dir="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    *) echo "usage: $0 [--bin-dir DIR] [--tag TAG]" >&2; exit 2 ;;
  esac
done
if [ -z "$bin_dir" ]; then
  # The folder cargo builds into: CARGO_TARGET_DIR when set, else what cargo itself uses
  # (target/ in the clone, or a build.target-dir of the user's cargo configuration).
  if [ -z "${CARGO_TARGET_DIR:-}" ]; then
    CARGO_TARGET_DIR=$(cargo metadata --format-version 1 --no-deps \
      | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
  fi
  export CARGO_TARGET_DIR
  cargo build --release --locked -p proxy -p loadgen -p embedded-qdrant >&2
  bin_dir="$CARGO_TARGET_DIR/release"
fi
base=$(deploy/container/base-image.sh | tail -1)

ctx=$(mktemp -d /tmp/vtp-images.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/bin" "$ctx/config"
for b in proxy loadgen embedded-qdrant; do
  [ -x "$bin_dir/$b" ] || { echo "no $b in $bin_dir" >&2; exit 1; }
  # Debug info stays on the host (perf reads it there); the images carry the code alone.
  strip --strip-debug -o "$ctx/bin/$b" "$bin_dir/$b"
done
cp config/proxy.toml "$ctx/config/"
for target in proxy tools; do
  name=vector-tls-proxy
  [ "$target" = tools ] && name=vector-tls-proxy-tools
  docker build -q --target "$target" --build-arg BASE_IMAGE="$base" --build-arg VERSION="$version" \
    -t "$name:$tag" -f deploy/container/Containerfile.prebuilt "$ctx" >/dev/null
  echo "$name:$tag"
done
