#!/bin/bash
# testssl.sh (Debian's `testssl`) against the proxy, for every software provider and
# certificate algorithm: prints each finding of severity LOW or above, and exits 1 if
# there is any. Slow (about a minute per combination with --fast), so not part of CI.
#
#   tests/testssl.sh [PROXY_BINARY]      (default: target/release/proxy)
#
# The generated test CA is added to testssl's trust store (--add-ca), so the chain of
# trust is judged as a client that trusts it would judge it. Two findings are about the
# test environment, not the server, and are listed as such without failing the scan:
# cert_revocation (the generated CA publishes no CRL or OCSP responder; a real CA's
# certificates carry their URIs) and DNS_CAArecord (127.0.0.1 has no DNS name).
set -euo pipefail
cd "$(dirname "$0")/.."
proxy="${1:-${CARGO_TARGET_DIR:-target}/release/proxy}"
command -v testssl >/dev/null || { echo "testssl not installed: apt-get install testssl.sh" >&2; exit 2; }
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
"$proxy" gen-certs --out "$work/certs" >/dev/null
status=0
printf '%-10s %-11s %s\n' provider algorithm "findings (severity >= LOW)"
for provider in ring aws-lc-rs openssl; do
  for alg in rsa2048 rsa4096 ecdsa-p256 ecdsa-p384; do
    ready="$work/ready-$provider-$alg.json"
    "$proxy" run --listen 127.0.0.1:0 --admin 127.0.0.1:0 --upstream http://127.0.0.1:9 \
      --provider "$provider" --cert "$work/certs/$alg.crt" --key "$work/certs/$alg.key" \
      --ready-file "$ready" 2>"$work/proxy-$provider-$alg.log" &
    pid=$!
    for _ in $(seq 100); do [ -s "$ready" ] && break; sleep 0.1; done
    addr="$(sed -e 's/.*"listeners":{[^}]*:"\([^"]*\)".*/\1/' "$ready")"
    json="$work/testssl-$provider-$alg.json"
    testssl --fast --quiet --color 0 --warnings batch --add-ca "$work/certs/ca.crt" \
      --severity LOW --jsonfile "$json" "https://$addr" >/dev/null 2>&1 || true
    kill "$pid"; wait "$pid" 2>/dev/null || true
    findings="$(python3 - "$json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
environment = {"cert_revocation", "DNS_CAArecord"}
bad = [f"{r['id']}={r['severity']}: {r['finding']}" for r in rows
       if r.get("severity") in ("LOW", "MEDIUM", "HIGH", "CRITICAL")
       and r["id"] not in environment]
env = [r["id"] for r in rows if r["id"] in environment
       and r.get("severity") in ("LOW", "MEDIUM", "HIGH", "CRITICAL")]
print("; ".join(bad) + "\t" + ",".join(env))
PY
)"
    env="${findings#*$'\t'}"
    findings="${findings%%$'\t'*}"
    if [ -n "$findings" ]; then status=1; else findings="none"; fi
    printf '%-10s %-11s %s%s\n' "$provider" "$alg" "$findings" "${env:+ (environment: $env)}"
  done
done
exit $status
