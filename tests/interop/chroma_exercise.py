"""Drives Chroma through the proxy with its own client, chromadb.HttpClient, as a new user would.

usage: chroma_exercise.py HOST PORT CA exercise|oversized|heartbeat|no_ca
  exercise:  create a 384-d collection (cosine), add 2,000 vectors in batches of 100, count,
             a top-5 query (the stored vector first), get by id, delete 50, count, drop;
             errors (missing collection, duplicate, wrong dimension) must arrive as
             Chroma's own.
  oversized: one add of 5,000 x 1,536-d vectors (41 MB: chromadb sends embeddings as
             base64 float32), over the proxy's default 32 MiB and under Chroma's own limit
             (it takes it direct; its client sends at most 5,461 records per call): prints the error's type, its text, how
             long the client took and the count after it.
  heartbeat: one heartbeat: prints the error it got, if any (the upstream down, say).
  no_ca:     a TLS client that trusts only the system's CAs, not CA: prints its error.
Prints one JSON object with what it saw. TLS is verified against CA (chromadb's
chroma_server_ssl_verify); an empty CA means plaintext (direct runs).
"""
import json
import random
import sys
import time

import chromadb
from chromadb.config import Settings

host, port, ca, mode = sys.argv[1:5]
settings = Settings(anonymized_telemetry=False)
if ca:
    settings = Settings(anonymized_telemetry=False, chroma_server_ssl_verify=ca)
out = {}
rng = random.Random(7)


def vec(dim):
    return [rng.random() for _ in range(dim)]


def error_text(e):
    return f"{type(e).__name__}: {e}"[:300]


if mode in ("heartbeat", "no_ca"):
    if mode == "no_ca":
        settings = Settings(anonymized_telemetry=False)
    try:
        chromadb.HttpClient(host=host, port=int(port), ssl=True, settings=settings).heartbeat()
        out["error"] = None
    except Exception as e:  # the client wraps TLS and HTTP failures in its own types
        out["error"] = error_text(e)
    print(json.dumps(out))
    sys.exit(0)

client = chromadb.HttpClient(host=host, port=int(port), ssl=bool(ca), settings=settings)
if mode == "exercise":
    name = "through_proxy"
    try:
        client.delete_collection(name)
    except Exception:
        pass
    col = client.create_collection(name, metadata={"hnsw:space": "cosine"})
    vectors = [vec(384) for _ in range(2000)]
    started = time.monotonic()
    for start in range(0, 2000, 100):
        col.add(
            ids=[str(i) for i in range(start, start + 100)],
            embeddings=vectors[start : start + 100],
        )
    out["insert_seconds"] = time.monotonic() - started
    out["count"] = col.count()
    hits = col.query(query_embeddings=[vectors[42]], n_results=5)
    out["top_id"] = hits["ids"][0][0]
    out["hits"] = len(hits["ids"][0])
    got = col.get(ids=["7"], include=["embeddings"])
    out["got_id"] = got["ids"][0]
    out["got_dim"] = len(got["embeddings"][0])
    col.delete(ids=[str(i) for i in range(50)])
    out["count_after_delete"] = col.count()
    try:
        col.add(ids=["wrong"], embeddings=[vec(3)])
        out["wrong_dim"] = "accepted"
    except Exception as e:
        out["wrong_dim"] = error_text(e)
    try:
        client.create_collection(name)
        out["duplicate"] = "accepted"
    except Exception as e:
        out["duplicate"] = error_text(e)
    try:
        client.get_collection("no_such_collection")
        out["missing"] = "found"
    except Exception as e:
        out["missing"] = error_text(e)
    client.delete_collection(name)
    out["dropped"] = name not in [c.name for c in client.list_collections()]
elif mode == "oversized":
    name = "oversized"
    try:
        client.delete_collection(name)
    except Exception:
        pass
    col = client.create_collection(name)
    ids = [str(i) for i in range(5000)]
    embeddings = [vec(1536) for _ in range(5000)]
    started = time.monotonic()
    try:
        col.add(ids=ids, embeddings=embeddings)
        out["error"] = None
    except Exception as e:
        out["error"] = error_text(e)
    out["seconds"] = time.monotonic() - started
    out["count"] = col.count()
    client.delete_collection(name)
print(json.dumps(out))
