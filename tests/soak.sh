#!/bin/sh
# The proxy soak: ten minutes of mixed ingestion through the proxy (REST keep-alive and
# new-connection, gRPC, clients breaking off mid-body) with the upstream killed and
# restarted twice. Prints a JSON report (also written to $SOAK_REPORT) and fails if an
# acknowledged point is lost, a request fails outside the restarts, or the proxy's memory
# is not flat. Not part of CI. SOAK_SECONDS=120 for a shorter run.
set -eu
cd "$(dirname "$0")/.."
export SOAK_SECONDS="${SOAK_SECONDS:-600}"
export SOAK_REPORT="${SOAK_REPORT:-$PWD/results/soak/report.json}"
mkdir -p "$(dirname "$SOAK_REPORT")"
cargo build --workspace
exec cargo test -p e2e --test proxy soak -- --ignored --nocapture
