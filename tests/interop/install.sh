#!/usr/bin/env bash
# Installs the third-party clients tests/tools/interop.rs drives, each in its own virtualenv from
# PyPI (pinned, so a new release cannot change a verdict unnoticed):
#   $DIR/qdrant-client: the official Python qdrant-client, its newest 1.x (REST via httpx,
#                       gRPC via grpcio)
#   $DIR/sslyze:        sslyze, whose --mozilla_config checks a server against Mozilla's
#                       TLS guidelines
#   $DIR/milvus:        Milvus Lite (milvus-lite server: Milvus's gRPC API, the database
#                       behind the proxy) and pymilvus, Milvus's own client
#   $DIR/chroma:        chromadb (`chroma run`: Chroma's server, REST over HTTP/1.1, and
#                       chromadb.HttpClient, Chroma's own client)
#   $DIR/postgres:      psycopg 3 with its binary package (which bundles a recent libpq:
#                       sslnegotiation=direct and the encrypted cancel of libpq 17+)
# DIR is $INTEROP_CLIENTS, else ~/.cache/vector-tls-proxy/interop. Idempotent.
set -euo pipefail
dir="${INTEROP_CLIENTS:-$HOME/.cache/vector-tls-proxy/interop}"
python=${PYTHON:-python3}
qdrant_client_version=1.20.0
sslyze_version=6.3.1
milvus_lite_version=3.2.2
pymilvus_version=3.0.2
chromadb_version=1.5.9
psycopg_version=3.3.9
mkdir -p "$dir"
if ! "$python" -c "import venv, ensurepip" 2>/dev/null && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
fi
if ! "$dir/qdrant-client/bin/python" -c "import qdrant_client" 2>/dev/null \
  || [ "$("$dir/qdrant-client/bin/pip" show qdrant-client 2>/dev/null | sed -n 's/^Version: //p')" != "$qdrant_client_version" ]; then
  rm -rf "$dir/qdrant-client"
  "$python" -m venv "$dir/qdrant-client"
  "$dir/qdrant-client/bin/pip" install -q "qdrant-client==$qdrant_client_version"
fi
if [ "$("$dir/sslyze/bin/pip" show sslyze 2>/dev/null | sed -n 's/^Version: //p')" != "$sslyze_version" ]; then
  rm -rf "$dir/sslyze"
  "$python" -m venv "$dir/sslyze"
  "$dir/sslyze/bin/pip" install -q "sslyze==$sslyze_version"
fi
if [ "$("$dir/milvus/bin/pip" show milvus-lite 2>/dev/null | sed -n 's/^Version: //p')" != "$milvus_lite_version" ] \
  || [ "$("$dir/milvus/bin/pip" show pymilvus 2>/dev/null | sed -n 's/^Version: //p')" != "$pymilvus_version" ]; then
  rm -rf "$dir/milvus"
  "$python" -m venv "$dir/milvus"
  "$dir/milvus/bin/pip" install -q "milvus-lite==$milvus_lite_version" "pymilvus==$pymilvus_version"
fi
if [ "$("$dir/chroma/bin/pip" show chromadb 2>/dev/null | sed -n 's/^Version: //p')" != "$chromadb_version" ]; then
  rm -rf "$dir/chroma"
  "$python" -m venv "$dir/chroma"
  "$dir/chroma/bin/pip" install -q "chromadb==$chromadb_version"
fi
if [ "$("$dir/postgres/bin/pip" show psycopg 2>/dev/null | sed -n 's/^Version: //p')" != "$psycopg_version" ]; then
  rm -rf "$dir/postgres"
  "$python" -m venv "$dir/postgres"
  "$dir/postgres/bin/pip" install -q "psycopg[binary]==$psycopg_version"
fi
echo "interop clients in $dir: qdrant-client $("$dir/qdrant-client/bin/pip" show qdrant-client | sed -n 's/^Version: //p'), sslyze $("$dir/sslyze/bin/pip" show sslyze | sed -n 's/^Version: //p'), milvus-lite $milvus_lite_version, pymilvus $pymilvus_version, chromadb $chromadb_version, psycopg $psycopg_version"
