"""Drives Milvus through the proxy with its own client, pymilvus, as a new user would.

usage: milvus_exercise.py URI CA SERVER_NAME exercise|oversized
  exercise:  create a 384-d collection, insert 2,000 vectors in batches of 100, count, a
             top-5 search (the stored vector first), get by id, delete 50, count, drop;
             errors (missing collection, wrong dimension) must arrive as Milvus's own.
  oversized: one insert of 10,000 x 1,024-d vectors (about 41 MB), over the proxy's body
             limit: prints the error's code and message and how long the client took.
Prints one JSON object with what it saw. TLS is verified against CA (pymilvus's
server_pem_path) for the name SERVER_NAME; an empty CA means plaintext (direct runs).
"""
import json
import random
import sys
import time

from pymilvus import MilvusClient, DataType  # noqa: F401  (DataType: pymilvus API shape)
from pymilvus.exceptions import MilvusException

uri, ca, server_name, mode = sys.argv[1:5]
kwargs = {"uri": uri}
if ca:
    kwargs.update(server_pem_path=ca, server_name=server_name, secure=True)
client = MilvusClient(**kwargs)
out = {}
rng = random.Random(7)


def vec(dim):
    return [rng.random() for _ in range(dim)]


if mode == "exercise":
    name = "through_proxy"
    if client.has_collection(name):
        client.drop_collection(name)
    client.create_collection(name, dimension=384, metric_type="COSINE")
    vectors = [vec(384) for _ in range(2000)]
    started = time.monotonic()
    for start in range(0, 2000, 100):
        client.insert(name, [{"id": i, "vector": vectors[i]} for i in range(start, start + 100)])
    out["insert_seconds"] = time.monotonic() - started
    out["count"] = client.query(name, filter="", output_fields=["count(*)"])[0]["count(*)"]
    hits = client.search(name, data=[vectors[42]], limit=5)[0]
    out["top_id"] = hits[0]["id"]
    out["hits"] = len(hits)
    got = client.get(name, ids=[7])
    out["got_id"] = got[0]["id"]
    out["got_dim"] = len(got[0]["vector"])
    client.delete(name, ids=list(range(50)))
    out["count_after_delete"] = client.query(name, filter="", output_fields=["count(*)"])[0][
        "count(*)"
    ]
    try:
        client.insert(name, [{"id": 9999, "vector": vec(3)}])
        out["wrong_dim"] = "accepted"
    except MilvusException as e:
        out["wrong_dim"] = str(e.message)[:200]
    try:
        client.describe_collection("no_such_collection")
        out["missing"] = "found"
    except MilvusException as e:
        out["missing"] = str(e.message)[:200]
    client.drop_collection(name)
    out["dropped"] = not client.has_collection(name)
elif mode == "oversized":
    name = "oversized"
    if client.has_collection(name):
        client.drop_collection(name)
    client.create_collection(name, dimension=1024, metric_type="COSINE")
    rows = [{"id": i, "vector": vec(1024)} for i in range(10000)]
    started = time.monotonic()
    try:
        client.insert(name, rows)
        out["error"] = None
    except MilvusException as e:
        out["error"] = str(e.message)[:300]
        out["code"] = e.code
    except Exception as e:  # grpc errors pymilvus does not wrap
        out["error"] = str(e)[:300]
    out["seconds"] = time.monotonic() - started
    client.drop_collection(name)
print(json.dumps(out))
