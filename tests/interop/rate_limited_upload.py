"""The official Python qdrant-client uploading through a rate-limited proxy: its uploader
(`upload_points`) waits as long as the proxy's answer says (REST 429 Retry-After, gRPC
RESOURCE_EXHAUSTED with retry-after) and goes on, so the ingestion slows down instead of
failing.

Run by tests/tools/interop.rs through the proxy (TLS, verified against the test CA), once
over REST and once over gRPC. Prints one JSON line:
{"points": N uploaded, "count": points stored, "seconds": the upload's time,
 "waits": how often the client waited for the limit, "error": the error, if it failed}.

    python rate_limited_upload.py --host localhost --port 6333 --ca ca.crt --api-key K \
        --points 300 --batch 10 [--grpc]
"""

import argparse
import json
import ssl
import time
import warnings

from qdrant_client import QdrantClient, models

DIM = 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ca", required=True)
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--points", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--grpc", action="store_true")
    args = ap.parse_args()
    with open(args.ca, "rb") as f:
        root = f.read()
    client = QdrantClient(
        host=args.host,
        port=args.port,
        grpc_port=args.port,
        prefer_grpc=args.grpc,
        https=True,
        api_key=args.api_key,
        verify=ssl.create_default_context(cafile=args.ca),
        grpc_options={"root_certificates": root},
        timeout=30,
    )
    name = "rate_limited_" + ("grpc" if args.grpc else "rest")
    out = {"points": args.points}
    waits = 0
    try:
        # Creating the collection is a request too: the limit answers it the same way, and
        # outside the uploader nobody retries, so wait as the answer says here.
        for _ in range(30):
            try:
                if client.collection_exists(name):
                    client.delete_collection(name)
                client.create_collection(name, vectors_config=models.VectorParams(size=DIM, distance=models.Distance.DOT))
                break
            except Exception as e:  # noqa: BLE001 (the client's rate-limit exception)
                retry = getattr(e, "retry_after_s", None)
                if retry is None:
                    raise
                waits += 1
                time.sleep(retry)
        points = [
            models.PointStruct(id=i, vector=[float((i + d) % 7) for d in range(DIM)])
            for i in range(args.points)
        ]
        started = time.perf_counter()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            client.upload_points(name, points, batch_size=args.batch, parallel=1, wait=True)
        out["seconds"] = round(time.perf_counter() - started, 2)
        waits += sum("rate limit" in str(w.message) for w in seen)
        for _ in range(30):
            try:
                out["count"] = client.count(name, exact=True).count
                break
            except Exception as e:  # noqa: BLE001
                retry = getattr(e, "retry_after_s", None)
                if retry is None:
                    raise
                time.sleep(retry)
        out["error"] = None
    except Exception as e:  # noqa: BLE001: reported, the test decides
        out["error"] = f"{type(e).__name__}: {e}"
    out["waits"] = waits
    print(json.dumps(out))


if __name__ == "__main__":
    main()
