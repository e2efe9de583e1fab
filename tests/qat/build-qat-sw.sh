#!/usr/bin/env bash
# Builds Intel's QAT_Engine as an OpenSSL 3 provider in software mode (qat_sw) with the two
# libraries it needs, from their public sources, into a cache folder that later runs reuse.
# It is the fixture for the proxy's openssl-qat path on machines without QAT hardware: the
# real provider, its real configuration reading and its real asynchronous multi-buffer
# signing, not a stand-in of ours.
#
#   tests/qat/build-qat-sw.sh            # build (or reuse) and print the prefix
#   QAT_SW_PREFIX=/opt/qat-sw tests/qat/build-qat-sw.sh
#
# Versions are the ones QAT_Engine v1.8.1 pins (v1.9.0 pins a cryptography-primitives commit
# that is not published). Sources come from GitHub, or from local clones or mirrors named by
# QAT_ENGINE_GIT, IPSEC_MB_GIT and CRYPTO_PRIMITIVES_GIT (any `git clone` source).
#
# Three provider builds share the libraries: $PREFIX/lib/ossl-modules (release),
# $PREFIX/debug/lib/ossl-modules (--enable-qat_debug: the provider logs the configuration
# it read and every request it offloads; slow, for the configuration tests only) and, on a
# non-Intel CPU, $PREFIX/stock/lib/ossl-modules (the released code unpatched: qat_sw
# switched off for the CPU while its algorithms stay registered, the "loaded but not
# offloading" case the proxy's start-up proof must catch).
#
# Needs: git, a C toolchain, nasm, cmake, autoconf, automake, libtool, pkg-config and the
# OpenSSL 3 development files (Debian: apt-get install nasm cmake autoconf automake libtool
# pkg-config libssl-dev). Takes about 12 minutes on two cores the first time.
set -euo pipefail

QAT_ENGINE_VERSION=v1.8.1
IPSEC_MB_VERSION=v2.0
CRYPTO_PRIMITIVES_VERSION=v1.0.0

PREFIX=${QAT_SW_PREFIX:-$HOME/.cache/qat-sw/$QAT_ENGINE_VERSION}
QAT_ENGINE_GIT=${QAT_ENGINE_GIT:-https://github.com/intel/QAT_Engine.git}
IPSEC_MB_GIT=${IPSEC_MB_GIT:-https://github.com/intel/intel-ipsec-mb.git}
CRYPTO_PRIMITIVES_GIT=${CRYPTO_PRIMITIVES_GIT:-https://github.com/intel/cryptography-primitives.git}
JOBS=${JOBS:-$(nproc)}

# The stamp names everything that changes the result, so a changed recipe rebuilds.
STAMP_TEXT="qat_engine=$QAT_ENGINE_VERSION ipsec_mb=$IPSEC_MB_VERSION crypto_mb=$CRYPTO_PRIMITIVES_VERSION recipe=3"
if [[ -f $PREFIX/.built && "$(cat "$PREFIX/.built")" == "$STAMP_TEXT" ]]; then
    echo "$PREFIX"
    exit 0
fi

for tool in git nasm cmake autoreconf libtoolize pkg-config make cc; do
    command -v "$tool" >/dev/null || {
        echo "build-qat-sw: '$tool' is missing (apt-get install nasm cmake autoconf automake libtool pkg-config libssl-dev)" >&2
        exit 2
    }
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/qat-sw-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
log() { echo "build-qat-sw: $*" >&2; }

fetch() { # url version dir
    log "fetching $1 at $2"
    git clone -q "$1" "$WORK/$3"
    git -C "$WORK/$3" -c advice.detachedHead=false checkout -q "$2"
}
fetch "$IPSEC_MB_GIT" "$IPSEC_MB_VERSION" ipsec-mb
fetch "$CRYPTO_PRIMITIVES_GIT" "$CRYPTO_PRIMITIVES_VERSION" crypto-primitives
fetch "$QAT_ENGINE_GIT" "$QAT_ENGINE_VERSION" qat-engine

rm -rf "$PREFIX"
mkdir -p "$PREFIX"

log "building intel-ipsec-mb $IPSEC_MB_VERSION"
make -s -C "$WORK/ipsec-mb/lib" -j"$JOBS" SAFE_DATA=y >"$WORK/ipsec-mb.log" 2>&1 \
    || { tail -40 "$WORK/ipsec-mb.log" >&2; exit 1; }
make -s -C "$WORK/ipsec-mb/lib" install PREFIX="$PREFIX" NOLDCONFIG=y >>"$WORK/ipsec-mb.log" 2>&1 \
    || { tail -40 "$WORK/ipsec-mb.log" >&2; exit 1; }

log "building crypto_mb from cryptography-primitives $CRYPTO_PRIMITIVES_VERSION"
(
    cd "$WORK/crypto-primitives/sources/ippcp/crypto_mb"
    cmake . -B"$WORK/crypto_mb-build" -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_BUILD_TYPE=Release
    make -C "$WORK/crypto_mb-build" -j"$JOBS" crypto_mb
    make -C "$WORK/crypto_mb-build" install
) >"$WORK/crypto_mb.log" 2>&1 || { tail -40 "$WORK/crypto_mb.log" >&2; exit 1; }

build_provider() { # libdir extra-configure-flags...
    local libdir=$1
    shift
    (
        cd "$WORK/qat-engine"
        git clean -qfdx
        ./autogen.sh
        ./configure --enable-qat_provider --disable-qat_hw --enable-qat_sw \
            --with-qat_sw_crypto_mb_install_dir="$PREFIX" \
            --with-qat_sw_ipsec_mb_install_dir="$PREFIX" "$@"
        make -j"$JOBS"
        mkdir -p "$libdir"
        make install libdir="$libdir"
    ) >"$WORK/qat-engine.log" 2>&1 || { tail -60 "$WORK/qat-engine.log" >&2; exit 1; }
}

MODULES=("$PREFIX/lib/ossl-modules/qatprovider.so" "$PREFIX/debug/lib/ossl-modules/qatprovider.so")
if ! grep -q 'GenuineIntel' /proc/cpuinfo 2>/dev/null; then
    log "building QAT_Engine $QAT_ENGINE_VERSION provider as released (qat_sw off on this CPU)"
    build_provider "$PREFIX/stock/lib/ossl-modules"
    MODULES+=("$PREFIX/stock/lib/ossl-modules/qatprovider.so")
fi

# QAT_Engine's qat_sw_cpu_support() accepts only a "GenuineIntel" vendor string, so on an
# AMD CPU with the same instructions (AVX-512 IFMA, VAES, VPCLMULQDQ) the stock build
# registers its algorithms but switches qat_sw off. The fixture drops that one vendor test
# (the feature-bit tests stay) so the multi-buffer code really runs here. On an Intel Xeon
# the patched and the released code behave the same.
if ! grep -q 'GenuineIntel' /proc/cpuinfo 2>/dev/null; then
    log "non-Intel CPU: relaxing the vendor test in qat_sw_cpu_support() (feature bits still checked)"
    sed -i 's/if (\*ebx != Genu || \*ecx != ntel || \*edx != ineI)/if (0 \&\& (*ebx != Genu || *ecx != ntel || *edx != ineI))/' \
        "$WORK/qat-engine/e_qat.c"
    grep -q 'if (0 && (\*ebx != Genu' "$WORK/qat-engine/e_qat.c" \
        || { log "the vendor test in e_qat.c was not found: QAT_Engine changed, update this script"; exit 1; }
fi

# The sed above edits a tracked file, which `git clean` keeps; both builds get it.
log "building QAT_Engine $QAT_ENGINE_VERSION provider (qat_sw, release)"
build_provider "$PREFIX/lib/ossl-modules"
log "building QAT_Engine $QAT_ENGINE_VERSION provider (qat_sw, --enable-qat_debug)"
build_provider "$PREFIX/debug/lib/ossl-modules" --enable-qat_debug

# Every module must have been installed (each finds crypto_mb and ipsec-mb through the
# RUNPATH libtool gave it: no LD_LIBRARY_PATH needed).
for module in "${MODULES[@]}"; do
    [[ -f $module ]] || { log "$module was not installed"; exit 1; }
done

openssl list -providers -provider-path "$PREFIX/lib/ossl-modules" -provider qatprovider >"$WORK/list.txt" 2>&1 || true
grep -q 'QAT Provider' "$WORK/list.txt" || {
    log "openssl cannot load the built provider:"
    cat "$WORK/list.txt" >&2
    exit 1
}
echo "$STAMP_TEXT" >"$PREFIX/.built"
log "ready: $(grep -m1 'QAT Provider' "$WORK/list.txt" | sed 's/^ *//')"
if ! grep -qw avx512ifma /proc/cpuinfo 2>/dev/null; then
    # The provider loads and enables qat_sw on AVX2 + VAES, but crypto_mb's RSA and ECDSA
    # need AVX-512 IFMA: every signature would fail inside the provider.
    log "warning: this CPU has no AVX-512 IFMA: qat_sw cannot sign RSA or ECDSA here, so the"
    log "warning: fixture's offload tests cannot run on this machine (the stock-build test can)"
fi
echo "$PREFIX"
