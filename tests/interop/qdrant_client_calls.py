"""The official Python qdrant-client against a Qdrant-compatible endpoint: every call that
ingestion, the README and the common integrations (LangChain's and LlamaIndex's Qdrant
stores) make, over REST or gRPC, each checked against what Qdrant answers.

Run by tests/qdrant_client_py.rs against embedded-qdrant directly and through the proxy
(TLS, verified against the test CA). Prints one line per call (PASS or FAIL with the
error), then "N passed, M failed"; exits 1 if any call failed.

    python qdrant_client_calls.py --host 127.0.0.1 --rest-port 6333 --grpc-port 6334 \
        [--prefer-grpc] [--ca ca.crt] [--api-key KEY]
"""

import argparse
import json
import ssl
import sys
import traceback
import uuid
import warnings

from pydantic import BaseModel
from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import UnexpectedResponse

DIM = 8


class SearchAnswer(BaseModel):
    """Qdrant's answer to POST /points/search, read with the client's own point model
    (qdrant-client 1.20 no longer generates one for this endpoint)."""

    result: list[models.ScoredPoint]
    status: str
    time: float


def vector(i):
    # Distinct, non-zero directions so that cosine scores order the points.
    return [float((i * 7 + j * 3) % 11 + 1) for j in range(DIM)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--rest-port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--prefer-grpc", action="store_true")
    ap.add_argument("--ca", help="verify the server against this CA (TLS on)")
    ap.add_argument("--api-key")
    args = ap.parse_args()

    kwargs = {}
    if args.ca:
        kwargs["verify"] = ssl.create_default_context(cafile=args.ca)
        with open(args.ca, "rb") as f:
            kwargs["grpc_options"] = {"root_certificates": f.read()}
    # A version the client cannot parse or does not match is a warning in qdrant-client;
    # here it is a failure, since real clients log it on every start.
    warnings.simplefilter("error", UserWarning)
    client = QdrantClient(
        host=args.host,
        port=args.rest_port,
        grpc_port=args.grpc_port,
        prefer_grpc=args.prefer_grpc,
        https=bool(args.ca),
        api_key=args.api_key,
        timeout=30,
        **kwargs,
    )
    proto = "grpc" if args.prefer_grpc else "rest"
    name = f"interop_{proto}_{uuid.uuid4().hex[:8]}"
    alias = f"{name}_alias"
    results = []

    def check(label, fn):
        try:
            fn()
            results.append((label, None))
            print(f"PASS {proto} {label}", flush=True)
        except Exception as e:  # every failure is reported, the run goes on
            detail = "".join(traceback.format_exception_only(type(e), e)).strip()
            results.append((label, detail))
            print(f"FAIL {proto} {label}: {detail}", flush=True)

    def expect(cond, what):
        if not cond:
            raise AssertionError(what)

    def info():
        v = client.info()
        expect(v.version and v.version.count(".") >= 2, f"version {v.version!r}")

    check("info (version, health)", info)

    def create():
        ok = client.create_collection(
            name, vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE)
        )
        expect(ok is True, f"create answered {ok!r}")

    check("create_collection", create)
    check("collection_exists", lambda: expect(client.collection_exists(name), "not found"))

    def get():
        c = client.get_collection(name)
        expect(c.config.params.vectors.size == DIM, f"size {c.config.params.vectors}")
        expect(c.config.params.vectors.distance == models.Distance.COSINE, "distance")
        expect(c.config.hnsw_config.m == 16, f"hnsw m {c.config.hnsw_config.m}")
        expect(c.config.hnsw_config.ef_construct == 100, "hnsw ef_construct")
        expect(c.config.optimizer_config.flush_interval_sec >= 0, "optimizer config")
        expect(c.status == models.CollectionStatus.GREEN, f"status {c.status}")

    check("get_collection", get)

    def listed():
        names = [c.name for c in client.get_collections().collections]
        expect(name in names, f"{name} not in {names}")

    check("get_collections", listed)

    def update():
        ok = client.update_collection(
            name, optimizers_config=models.OptimizersConfigDiff(indexing_threshold=20000)
        )
        expect(ok is True, f"update answered {ok!r}")
        c = client.get_collection(name)
        expect(
            c.config.optimizer_config.indexing_threshold == 20000,
            f"indexing_threshold {c.config.optimizer_config.indexing_threshold}",
        )

    check("update_collection", update)

    def index():
        r = client.create_payload_index(
            name, field_name="city", field_schema=models.PayloadSchemaType.KEYWORD, wait=True
        )
        expect(r.status == models.UpdateStatus.COMPLETED, f"status {r.status}")
        schema = client.get_collection(name).payload_schema
        expect("city" in schema, f"payload_schema {schema}")
        expect(schema["city"].data_type == models.PayloadSchemaType.KEYWORD, "index type")

    check("create_payload_index", index)

    cities = ["Berlin", "Paris", "Rome"]

    def upsert_wait():
        r = client.upsert(
            name,
            points=[
                models.PointStruct(id=i, vector=vector(i), payload={"city": cities[i % 3], "n": i})
                for i in range(1, 13)
            ],
            wait=True,
        )
        expect(r.status == models.UpdateStatus.COMPLETED, f"status {r.status}")

    check("upsert wait=true", upsert_wait)

    point_uuid = str(uuid.uuid4())

    def upsert_nowait():
        r = client.upsert(
            name,
            points=[
                models.PointStruct(id=point_uuid, vector=vector(13), payload={"city": "Oslo"}),
                models.PointStruct(id=14, vector=vector(14), payload={"city": "Oslo"}),
            ],
            wait=False,
        )
        expect(r.status == models.UpdateStatus.ACKNOWLEDGED, f"status {r.status}")

    check("upsert wait=false", upsert_nowait)

    def set_payload():
        r = client.set_payload(name, payload={"color": "red"}, points=[1], wait=True)
        expect(r.status == models.UpdateStatus.COMPLETED, f"status {r.status}")
        p = client.retrieve(name, ids=[1])[0].payload
        expect(p == {"city": cities[1], "n": 1, "color": "red"}, f"payload {p}")

    check("set_payload", set_payload)

    def overwrite_payload():
        client.overwrite_payload(name, payload={"city": "Berlin", "only": True}, points=[2], wait=True)
        p = client.retrieve(name, ids=[2])[0].payload
        expect(p == {"city": "Berlin", "only": True}, f"payload {p}")

    check("overwrite_payload", overwrite_payload)

    def retrieve():
        got = client.retrieve(name, ids=[3, point_uuid], with_payload=True, with_vectors=True)
        ids = sorted(str(p.id) for p in got)
        expect(ids == sorted(["3", point_uuid]), f"ids {ids}")
        for p in got:
            expect(len(p.vector) == DIM, f"vector of {p.id}: {p.vector}")

    check("retrieve", retrieve)

    def count_exact():
        n = client.count(name, exact=True).count
        expect(n == 14, f"count {n}")

    check("count exact", count_exact)

    def count_approx():
        n = client.count(name, exact=False).count
        expect(n >= 1, f"approximate count {n}")

    check("count approximate", count_approx)

    berlin = models.Filter(
        must=[models.FieldCondition(key="city", match=models.MatchValue(value="Berlin"))]
    )

    def count_filter():
        # Berlin: 3, 6, 9, 12 (i % 3 == 0) and point 2, overwritten to Berlin.
        n = client.count(name, count_filter=berlin, exact=True).count
        expect(n == 5, f"count Berlin {n}")

    check("count with filter", count_filter)

    def scroll():
        first, nxt = client.scroll(name, limit=5, with_payload=True)
        expect(len(first) == 5 and nxt is not None, f"first page {len(first)}, next {nxt}")
        rest, end = client.scroll(name, limit=100, offset=nxt)
        expect(len(first) + len(rest) == 14 and end is None, f"pages {len(first)}+{len(rest)}")

    check("scroll (two pages)", scroll)

    def scroll_filter():
        got, _ = client.scroll(name, scroll_filter=berlin, limit=100)
        expect(sorted(p.id for p in got) == [2, 3, 6, 9, 12], f"ids {[p.id for p in got]}")

    check("scroll with filter", scroll_filter)

    def query():
        got = client.query_points(name, query=vector(5), limit=3, with_payload=True).points
        expect(len(got) == 3 and got[0].id == 5, f"ids {[p.id for p in got]}")
        expect(got[0].score >= got[1].score, "scores ordered")

    check("query_points", query)

    def query_filter():
        got = client.query_points(name, query=vector(5), query_filter=berlin, limit=10).points
        expect(sorted(p.id for p in got) == [2, 3, 6, 9, 12], f"ids {[p.id for p in got]}")

    check("query_points with filter", query_filter)

    def query_by_id():
        got = client.query_points(name, query=7, limit=2).points
        expect(len(got) == 2, f"got {len(got)}")

    check("query_points by id", query_by_id)

    def search(with_filter):
        # qdrant-client 1.20 dropped the search() helper; the generated APIs remain.
        if args.prefer_grpc:
            from qdrant_client import grpc as pb

            req = pb.SearchPoints(collection_name=name, vector=vector(5), limit=10)
            if with_filter:
                cond = pb.Condition(
                    field=pb.FieldCondition(key="city", match=pb.Match(keyword="Berlin"))
                )
                req.filter.CopyFrom(pb.Filter(must=[cond]))
            got = client.grpc_points.Search(req, timeout=30).result
            ids = [p.id.num for p in got]
        else:
            # POST /points/search, which LangChain's older stores and many scripts still
            # call, through the client's own REST transport (its TLS, key and headers).
            body = {"vector": vector(5), "limit": 10}
            if with_filter:
                body["filter"] = berlin.model_dump(mode="json", exclude_none=True)
            got = client.http.client.request(
                type_=SearchAnswer,
                method="POST",
                url="/collections/{collection_name}/points/search",
                path_params={"collection_name": name},
                headers={"Content-Type": "application/json"},
                content=json.dumps(body),
            ).result
            ids = [p.id for p in got]
        want = [2, 3, 6, 9, 12] if with_filter else None
        if want:
            expect(sorted(ids) == want, f"ids {ids}")
        else:
            expect(len(ids) == 10 and ids[0] == 5, f"ids {ids}")

    check("search", lambda: search(False))
    check("search with filter", lambda: search(True))

    def aliases():
        client.update_collection_aliases(
            change_aliases_operations=[
                models.CreateAliasOperation(
                    create_alias=models.CreateAlias(collection_name=name, alias_name=alias)
                )
            ]
        )
        listed = [(a.alias_name, a.collection_name) for a in client.get_aliases().aliases]
        expect((alias, name) in listed, f"aliases {listed}")
        of = [a.alias_name for a in client.get_collection_aliases(name).aliases]
        expect(of == [alias], f"aliases of {name}: {of}")
        # An alias works wherever the collection's name does.
        n = client.count(alias, exact=True).count
        expect(n == 14, f"count through the alias {n}")
        renamed = alias + "_2"
        client.update_collection_aliases(
            change_aliases_operations=[
                models.RenameAliasOperation(
                    rename_alias=models.RenameAlias(old_alias_name=alias, new_alias_name=renamed)
                )
            ]
        )
        of = [a.alias_name for a in client.get_collection_aliases(name).aliases]
        expect(of == [renamed], f"after rename: {of}")
        client.update_collection_aliases(
            change_aliases_operations=[
                models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=renamed))
            ]
        )
        expect(client.get_collection_aliases(name).aliases == [], "alias left after delete")

    check("aliases (create, list, use, rename, delete)", aliases)

    def delete_ids():
        client.delete(name, points_selector=models.PointIdsList(points=[1, point_uuid]), wait=True)
        n = client.count(name, exact=True).count
        expect(n == 12, f"count after delete {n}")

    check("delete by ids", delete_ids)

    def delete_filter():
        paris = models.Filter(
            must=[models.FieldCondition(key="city", match=models.MatchValue(value="Paris"))]
        )
        client.delete(name, points_selector=models.FilterSelector(filter=paris), wait=True)
        n = client.count(name, count_filter=paris, exact=True).count
        expect(n == 0, f"Paris left: {n}")
        n = client.count(name, exact=True).count
        expect(n == 9, f"count after delete by filter {n}")

    check("delete by filter", delete_filter)

    def unsupported():
        try:
            client.create_snapshot(name)
        except (UnexpectedResponse, Exception) as e:
            text = str(e)
            expect("snapshot" in text.lower(), f"the refusal does not name the call: {text}")
            return
        raise AssertionError("create_snapshot succeeded on a server that has no snapshots")

    check("unsupported call names itself (create_snapshot)", unsupported)

    def delete_collection():
        expect(client.delete_collection(name) is True, "delete answered false")
        expect(not client.collection_exists(name), "still exists")

    check("delete_collection", delete_collection)

    def missing():
        try:
            client.get_collection(name)
        except Exception as e:
            expect("doesn't exist" in str(e) or "not found" in str(e).lower(), str(e))
            return
        raise AssertionError("a deleted collection was found")

    check("missing collection is a not-found error", missing)

    client.close()
    failed = [r for r in results if r[1]]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
