#!/usr/bin/env bash
# Measure nginx and HAProxy (Debian's packages) as TLS terminators in front of the same kind
# of upstream, with the same certificates and the same loadgen workload as `loadgen compare`,
# and add them to that comparison's report as providers "nginx" and "haproxy".
#
#   loadgen compare --profile quick --out results/quick      # first, our providers
#   deploy/peers/run-peers.sh results/quick                  # then the peers, same folder
#
# Each peer runs one cell per algorithm: it is started with <algorithm>.crt/.key from
# COMPARE_DIR/certs, measured by `loadgen run` with its CPU attributed (all its processes),
# stopped, and its result written to COMPARE_DIR/cells/<peer>__<algorithm>__r<round>.json.
# Finally `loadgen report COMPARE_DIR` redraws the report with the peers beside our
# providers.
#
# The workload flags below default to the quick profile's; if the comparison used other
# settings, pass the same ones (environment variables, listed under "Settings").
#
# Needs: nginx and haproxy (installed with apt-get when missing and running as root), the
# workspace binaries (cargo build --release --workspace), and free loopback ports.
set -euo pipefail

usage() {
  sed -n "2,24p" "$0"
  exit 2
}
[ $# -ge 1 ] || usage
OUT=$(realpath "$1")
shift
[ "${1:-}" = "--" ] && shift # what follows goes to every `loadgen run`
[ -d "$OUT/certs" ] || { echo "error: $OUT/certs not found: run loadgen compare --out $OUT first" >&2; exit 2; }

# Settings (keep them equal to the comparison's).
ALGORITHMS=${ALGORITHMS:-rsa2048,rsa4096,ecdsa-p256,ecdsa-p384}
PEERS=${PEERS:-nginx,haproxy}
PROTOCOL=${PROTOCOL:-grpc}
CONCURRENCY=${CONCURRENCY:-4}
POLICY=${POLICY:-new}
RESUMPTION=${RESUMPTION:-off}
WARMUP=${WARMUP:-2s}
DURATION=${DURATION:-8s}
REPEAT=${REPEAT:-1}
PEER_WORKERS=${PEER_WORKERS:-auto}
BIN=${BIN:-$(dirname "$(realpath "$0")")/../../target/release}
LOADGEN=${LOADGEN:-$BIN/loadgen}
UPSTREAM_BIN=${UPSTREAM_BIN:-$BIN/embedded-qdrant}

for b in "$LOADGEN" "$UPSTREAM_BIN"; do
  [ -x "$b" ] || { echo "error: $b not found: cargo build --release --workspace (or set BIN)" >&2; exit 2; }
done

need=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
  else
    echo "error: missing ${need[*]}: sudo apt-get install ${need[*]}" >&2
    exit 2
  fi
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
# The packages start system services; ours run from private configs on other ports.
systemctl stop nginx haproxy >/dev/null 2>&1 || true

WORK=$(mktemp -d "${TMPDIR:-/tmp}/peers.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_port() { # host port
  for _ in $(seq 1 300); do
    (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && { exec 3>&- 3<&-; return 0; }
    sleep 0.1
  done
  echo "error: nothing listening on $1:$2" >&2
  return 1
}

# The upstream: embedded-qdrant on loopback, like compare's local mode.
"$UPSTREAM_BIN" --rest 127.0.0.1:0 --grpc 127.0.0.1:0 --data "$WORK/upstream-data" \
  --ready-file "$WORK/upstream.ready" >"$WORK/upstream.log" 2>&1 &
UPSTREAM_PID=$!
PIDS+=("$UPSTREAM_PID")
for _ in $(seq 1 600); do [ -s "$WORK/upstream.ready" ] && break; sleep 0.1; done
[ -s "$WORK/upstream.ready" ] || { echo "error: embedded-qdrant did not start: $(tail -3 "$WORK/upstream.log")" >&2; exit 1; }
UP_KEY=$([ "$PROTOCOL" = grpc ] && echo grpc || echo rest)
UPSTREAM=$(sed -E "s/.*\"$UP_KEY\":\"([^\"]+)\".*/\1/" "$WORK/upstream.ready")
echo "upstream: embedded-qdrant $PROTOCOL at $UPSTREAM"

start_nginx() { # alg port
  local alg=$1 port=$2 dir="$WORK/nginx-$1"
  mkdir -p "$dir/logs"
  local location
  if [ "$PROTOCOL" = grpc ]; then
    location="grpc_pass grpc://$UPSTREAM;"
  else
    location="proxy_pass http://$UPSTREAM; proxy_http_version 1.1; proxy_set_header Connection \"\";"
  fi
  cat >"$dir/nginx.conf" <<EOF
worker_processes $PEER_WORKERS;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_max_body_size 64m;
  client_body_buffer_size 4m;
  grpc_buffer_size 4m;
  upstream up { server $UPSTREAM; keepalive 64; }
  server {
    listen 127.0.0.1:$port ssl http2;
    ssl_certificate $OUT/certs/$alg.crt;
    ssl_certificate_key $OUT/certs/$alg.key;
    ssl_protocols TLSv1.3;
    ssl_ecdh_curve X25519;
    ssl_session_cache $( [ "$RESUMPTION" = on ] && echo "shared:SSL:10m" || echo "off" );
    ssl_session_tickets $( [ "$RESUMPTION" = on ] && echo on || echo off );
    location / { $location }
  }
}
EOF
  "$NGINX" -p "$dir" -c "$dir/nginx.conf" -g 'daemon off;' >"$dir/stderr.log" 2>&1 &
  echo $!
}

start_haproxy() { # alg port
  local alg=$1 port=$2 dir="$WORK/haproxy-$1"
  mkdir -p "$dir"
  cat "$OUT/certs/$alg.crt" "$OUT/certs/$alg.key" >"$dir/combined.pem"
  local threads=""
  [ "$PEER_WORKERS" != auto ] && threads="nbthread $PEER_WORKERS"
  local proto="" alpn="alpn http/1.1"
  [ "$PROTOCOL" = grpc ] && { proto="proto h2"; alpn="alpn h2"; }
  cat >"$dir/haproxy.cfg" <<EOF
global
  $threads
  tune.ssl.cachesize $( [ "$RESUMPTION" = on ] && echo 20000 || echo 0 )
  ssl-default-bind-ciphersuites TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend fe
  bind 127.0.0.1:$port ssl crt $dir/combined.pem $alpn ssl-min-ver TLSv1.3 curves X25519 $( [ "$RESUMPTION" = on ] || echo no-tls-tickets )
  default_backend be
backend be
  server s1 $UPSTREAM $proto
EOF
  "$HAPROXY" -db -f "$dir/haproxy.cfg" >"$dir/stderr.log" 2>&1 &
  echo $!
}

IFS=, read -r -a ALGS <<<"$ALGORITHMS"
IFS=, read -r -a PEER_LIST <<<"$PEERS"
for round in $(seq 1 "$REPEAT"); do
  for alg in "${ALGS[@]}"; do
    for peer in "${PEER_LIST[@]}"; do
      port=$(free_port)
      case "$peer" in
        nginx) pid=$(start_nginx "$alg" "$port") ;;
        haproxy) pid=$(start_haproxy "$alg" "$port") ;;
        *) echo "error: unknown peer $peer (nginx or haproxy)" >&2; exit 2 ;;
      esac
      PIDS+=("$pid")
      out="$OUT/cells/${peer}__${alg}__r${round}.json"
      if ! wait_port 127.0.0.1 "$port"; then
        cat "$WORK/$peer-$alg/stderr.log" >&2 || true
        printf '{"schema":"loadgen.cell-failure/v1","cell":{"provider":"%s","algorithm":"%s","repeat":%s},"reason":"%s did not start"}\n' \
          "$peer" "$alg" "$round" "$peer" >"$out"
        kill "$pid" 2>/dev/null || true
        continue
      fi
      # Every process of the peer (nginx master + workers) is attributed as "proxy".
      pids=$(pgrep -d, -P "$pid" || true)
      pids=${pids:+$pid,$pids}
      pids=${pids:-$pid}
      echo "[$peer $alg round $round] port $port, pids $pids"
      "$LOADGEN" run --target "localhost:$port" --ca "$OUT/certs/ca.crt" --protocol "$PROTOCOL" \
        --collection compare --recreate --concurrency "$CONCURRENCY" --connection-policy "$POLICY" \
        --resumption "$RESUMPTION" --tls-version 1.3 --kx x25519 --warmup "$WARMUP" --duration "$DURATION" \
        --watch-pid "proxy=$pids" --watch-pid "upstream=$UPSTREAM_PID" --quiet \
        --cell-provider "$peer" --cell-algorithm "$alg" --cell-repeat "$round" --out "$out" "$@" \
        2>"$WORK/loadgen.err" | sed 's/^/    /' || true
      if [ ! -s "$out" ]; then
        reason=$(tr -d '"\\' <"$WORK/loadgen.err" | tr '\n' ' ' | cut -c1-300)
        echo "    FAILED: $reason"
        printf '{"schema":"loadgen.cell-failure/v1","cell":{"provider":"%s","algorithm":"%s","repeat":%s},"reason":"loadgen: %s"}\n' \
          "$peer" "$alg" "$round" "$reason" >"$out"
      fi
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    done
  done
done
"$LOADGEN" report "$OUT"
