"""The official Python qdrant-client upserting over gRPC with wait=true for a while: what an
ingestion job does while the proxy in front of the database is upgraded or restarted.

Run by tests/proxy/upgrade.rs through the proxy (TLS, verified against the test CA). One
point per upsert, ids counting up; at the end the collection is counted exactly. Prints one
JSON line: {"acked": N, "failed": M, "errors": [the first few], "count": points stored}.

    python upsert_until.py --host localhost --grpc-port 6334 --ca ca.crt --seconds 14
"""

import argparse
import json
import ssl
import time

from qdrant_client import QdrantClient, models

DIM = 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--ca", required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--collection", default="upsert_until")
    args = ap.parse_args()
    with open(args.ca, "rb") as f:
        root = f.read()
    client = QdrantClient(
        host=args.host,
        port=args.grpc_port,
        grpc_port=args.grpc_port,
        prefer_grpc=True,
        https=True,
        verify=ssl.create_default_context(cafile=args.ca),
        grpc_options={"root_certificates": root},
        timeout=30,
    )
    if client.collection_exists(args.collection):
        client.delete_collection(args.collection)
    client.create_collection(
        args.collection,
        vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE),
    )
    acked, failed, errors, i = 0, 0, [], 0
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        i += 1
        try:
            client.upsert(
                args.collection,
                points=[models.PointStruct(id=i, vector=[float((i + j) % 7 + 1) for j in range(DIM)])],
                wait=True,
            )
            acked += 1
        except Exception as e:  # every failure is counted and the first few shown
            failed += 1
            if len(errors) < 5:
                errors.append(repr(e)[:300])
    count = client.count(args.collection, exact=True).count
    print(json.dumps({"acked": acked, "failed": failed, "errors": errors, "count": count}))


if __name__ == "__main__":
    main()
