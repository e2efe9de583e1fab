#!/usr/bin/env python3
"""Retrieval, end to end, as a RAG application runs it after ingestion: each query is
embedded by the same model that embedded the corpus (through the embeddings endpoint, OVMS's
API), then searched with the official Python qdrant-client through the proxy (REST, or gRPC
with --prefer-grpc; TLS verified against --ca). The document the query was written from,
loadgen's payload field "chunk", must come back first.

    python retrieve.py --embeddings-url http://127.0.0.1:8000 --model NAME \\
        --host localhost --rest-port P --grpc-port G --ca ca.crt --collection C \\
        --queries queries.json [--prefer-grpc]

queries.json: [{"query": "...", "chunk": N}, ...]. Prints one line per query (PASS or FAIL,
with the top hits), then "N passed, M failed"; exits 1 if any failed.
"""

import argparse
import json
import ssl
import sys
import urllib.request

from qdrant_client import QdrantClient


def embed(url, model, text):
    request = urllib.request.Request(
        url.rstrip("/") + "/v3/embeddings",
        data=json.dumps({"model": model, "input": [text]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.load(answer)["data"][0]["embedding"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--embeddings-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--rest-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--collection", required=True)
    parser.add_argument("--queries", required=True)
    parser.add_argument("--prefer-grpc", action="store_true")
    args = parser.parse_args()

    # As tests/interop/qdrant_client_calls.py: REST (httpx) verifies with an SSL context,
    # gRPC with the root certificates' bytes.
    with open(args.ca, "rb") as f:
        roots = f.read()
    client = QdrantClient(
        host=args.host,
        port=args.rest_port,
        grpc_port=args.grpc_port,
        prefer_grpc=args.prefer_grpc,
        https=True,
        verify=ssl.create_default_context(cafile=args.ca),
        grpc_options={"root_certificates": roots},
        timeout=30,
    )

    with open(args.queries) as f:
        queries = json.load(f)
    passed = failed = 0
    for q in queries:
        vector = embed(args.embeddings_url, args.model, q["query"])
        hits = client.query_points(args.collection, query=vector, limit=3, with_payload=True).points
        top = [(h.payload.get("chunk"), round(h.score, 3)) for h in hits]
        if hits and hits[0].payload.get("chunk") == q["chunk"]:
            passed += 1
            print(f"PASS {q['query']!r}: chunk {q['chunk']} first, top {top}")
        else:
            failed += 1
            print(f"FAIL {q['query']!r}: wanted chunk {q['chunk']} first, got {top}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
