#!/usr/bin/env bash
# Builds what an operator installs, with one command:
#   - vector-tls-proxy_VERSION-REVISION_amd64.deb (cargo-deb: the proxy, its systemd unit, a
#     sysusers.d entry, config/proxy.toml as a conffile, Qdrant's unit as an example);
#   - the images vector-tls-proxy:VERSION (the proxy alone) and vector-tls-proxy-tools:VERSION
#     (loadgen, embedded-qdrant), saved as .tar.gz for `docker load` (with --images);
#   - a CycloneDX SBOM (JSON) of what each artifact links (cargo-cyclonedx, from Cargo.lock);
#   - SHA256SUMS over all of them (`sha256sum -c SHA256SUMS` checks a download).
#
#   deploy/package/build.sh [--out DIR] [--images] [--profile release|dev] [--no-build] [--revision N]
#
# DIR defaults to dist/ under cargo's target folder ($CARGO_TARGET_DIR, else target/). cargo-deb and cargo-cyclonedx are built from
# crates.io into ~/.cache/vector-tls-proxy/tools on first use. --profile dev (with
# --no-build) packages a test build's binary, as the tests do; releases use the default.
set -euo pipefail
cd "$(dirname "$0")/../.."
# The folder cargo builds into: CARGO_TARGET_DIR when set, else what cargo itself uses
# (target/ in the clone, or a build.target-dir of the user's cargo configuration).
if [ -z "${CARGO_TARGET_DIR:-}" ]; then
  CARGO_TARGET_DIR=$(cargo metadata --format-version 1 --no-deps \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
fi
export CARGO_TARGET_DIR
# One package build at a time per target folder: cargo-deb stages the stripped binary under
# it and cargo-cyclonedx writes its SBOMs into the source tree, so two builds at once (the
# container tests run two) could package each other's half-written files. The second waits.
mkdir -p "$CARGO_TARGET_DIR"
exec 9>"$CARGO_TARGET_DIR/.package-build.lock"
flock 9
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
out="$CARGO_TARGET_DIR/dist"
profile=release
images=0
build=1
revision=1
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --images) images=1; shift ;;
    --profile) profile="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    # The Debian revision (VERSION-N): a rebuild of the same version that upgrades the last.
    --revision) revision="$2"; shift 2 ;;
    *) echo "usage: $0 [--out DIR] [--images] [--profile release|dev] [--no-build] [--revision N]" >&2; exit 2 ;;
  esac
done
bin_dir="$CARGO_TARGET_DIR/release"
[ "$profile" = dev ] && bin_dir="$CARGO_TARGET_DIR/debug"

tools="${XDG_CACHE_HOME:-$HOME/.cache}/vector-tls-proxy/tools"
tool() { # tool CRATE VERSION: the crate's binary, built once into $tools
  local crate="$1" version="$2"
  if [ ! -x "$tools/bin/$crate" ] || ! cargo install --list --root "$tools" | grep -qx "$crate v$version:"; then
    echo "building $crate $version into $tools" >&2
    CARGO_TARGET_DIR="$tools/build" cargo install "$crate" --version "$version" --locked \
      --root "$tools" --quiet >&2
    rm -rf "$tools/build"
  fi
  echo "$tools/bin/$crate"
}
cargo_deb=$(tool cargo-deb 3.8.0)
cargo_cyclonedx=$(tool cargo-cyclonedx 0.5.9)

mkdir -p "$out"
rm -f "$out"/*.deb "$out"/*.cdx.json "$out"/*.tar.gz "$out"/SHA256SUMS
if [ "$build" = 1 ]; then
  cargo build --locked --profile "$profile" -p proxy >&2
fi
# cargo-deb warns that a dev profile is for tests only, which is what it is used for here.
"$cargo_deb" --no-build --profile "$profile" --deb-revision "$revision" -p proxy -o "$out/" 2> >(grep -v 'dev profile\|debug symbols set\|^ *To enable' >&2) >/dev/null

# SBOMs: the proxy's (the .deb and the proxy image link exactly the proxy crate's graph),
# and the tools' (loadgen and embedded-qdrant).
sbom_dir=$(mktemp -d /tmp/vtp-sbom.XXXXXX)
trap 'rm -rf "$sbom_dir"' EXIT
# cargo-cyclonedx writes MEMBER/MEMBER.cdx.json for every workspace member: each is moved
# out of the source tree at once.
"$cargo_cyclonedx" cyclonedx --format json --spec-version 1.5 --quiet >&2
for member in */*.cdx.json; do
  mv "$member" "$sbom_dir/"
done
cp "$sbom_dir/proxy.cdx.json" "$out/vector-tls-proxy_${version}-${revision}_amd64.deb.cdx.json"
cp "$sbom_dir/proxy.cdx.json" "$out/vector-tls-proxy_${version}.image.cdx.json"
python3 - "$sbom_dir/loadgen.cdx.json" "$sbom_dir/embedded-qdrant.cdx.json" \
  "$out/vector-tls-proxy-tools_${version}.image.cdx.json" <<'PY'
# The tools image holds two programs: one SBOM with both graphs' components, once each.
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
seen = {c.get("bom-ref") for c in a.get("components", [])}
a["components"] = a.get("components", []) + [c for c in b.get("components", []) if c.get("bom-ref") not in seen]
a.setdefault("metadata", {})["component"] = {"type": "container", "name": "vector-tls-proxy-tools", "bom-ref": "vector-tls-proxy-tools"}
a["dependencies"] = a.get("dependencies", []) + b.get("dependencies", [])
json.dump(a, open(sys.argv[3], "w"), indent=1)
PY

if [ "$images" = 1 ]; then
  for image in $(deploy/container/build-images.sh --bin-dir "$bin_dir" --tag "$version"); do
    name=${image%%:*}
    docker save "$image" | gzip -1 >"$out/${name}_${version}.image.tar.gz"
  done
fi
# The list is written outside $out first: a temporary file inside it could be created by the
# redirection before the glob is expanded (the two sides of the pipe start together), and
# then be listed with a checksum of its own.
sums="$(mktemp)"
(cd "$out" && sha256sum -- *) | grep -v ' SHA256SUMS$' >"$sums"
chmod 644 "$sums"
mv "$sums" "$out/SHA256SUMS"
ls -l "$out" | tail -n +2 | awk '{ print $5, $9 }'
