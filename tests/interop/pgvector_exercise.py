"""Drives PostgreSQL + pgvector with psycopg 3 (libpq), directly or through the proxy.

usage: pgvector_exercise.py CONNINFO exercise|cancel|restart|refused [ARG]
  exercise: CREATE EXTENSION vector, a 384-d table, 2,000 vectors by COPY and 2,000 by
            executemany, an HNSW index, the top 5 by <-> (the stored vector first), a
            prepared statement, LISTEN/NOTIFY between two connections, delete, count;
            Postgres's own errors (undefined table, wrong dimension) with their SQLSTATE.
  cancel:   SELECT pg_sleep(30) cancelled after 1 s, by libpq's legacy PQcancel (a
            CancelRequest in clear on a new connection: what libpq before 17 sends) and by
            the encrypted PQcancelCreate of libpq 17+ (cancel_safe); each must end the query
            at once with SQLSTATE 57014, and no pg_sleep may still run on the server.
  restart:  one query, then ARG (a JSON argv) run to restart PostgreSQL, then the same
            connection's next query (its error) and a new connection's (its answer).
  refused:  connects and reports the error it gets (a client that must be refused).
  copy:     ARG rounds of COPY of the 2,000 x 384-d vectors into an emptied table, each
            timed (docs/benchmarks.md: direct and through the proxy, interleaved).
Prints one JSON object with what it saw.
"""
import json
import random
import subprocess
import sys
import threading
import time

import psycopg

conninfo, mode = sys.argv[1:3]
arg = sys.argv[3] if len(sys.argv) > 3 else None
out = {"libpq": psycopg.pq.version(), "psycopg": psycopg.__version__}
DIM = 384


def vectors(seed, n):
    rng = random.Random(seed)
    return [[round(rng.uniform(-1, 1), 6) for _ in range(DIM)] for _ in range(n)]


def literal(v):
    return "[" + ",".join(str(x) for x in v) + "]"


def error_of(e):
    return {"sqlstate": e.sqlstate, "message": str(e).splitlines()[0]}


if mode == "exercise":
    with psycopg.connect(conninfo, autocommit=True) as conn:
        out["tls"] = conn.pgconn.ssl_in_use
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        out["vector_version"] = conn.execute(
            "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
        ).fetchone()[0]
        conn.execute("DROP TABLE IF EXISTS items, items_many")
        conn.execute(f"CREATE TABLE items (id bigint PRIMARY KEY, embedding vector({DIM}))")
        conn.execute(f"CREATE TABLE items_many (id bigint PRIMARY KEY, embedding vector({DIM}))")
        data = vectors(7, 2000)
        started = time.perf_counter()
        with conn.cursor() as cur:
            with cur.copy("COPY items (id, embedding) FROM STDIN") as copy:
                for i, v in enumerate(data):
                    copy.write_row((i, literal(v)))
        out["copy_seconds"] = time.perf_counter() - started
        started = time.perf_counter()
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO items_many (id, embedding) VALUES (%s, %s::vector)",
                [(i, literal(v)) for i, v in enumerate(data)],
            )
        out["executemany_seconds"] = time.perf_counter() - started
        out["count"] = conn.execute("SELECT count(*) FROM items").fetchone()[0]
        out["count_many"] = conn.execute("SELECT count(*) FROM items_many").fetchone()[0]
        conn.execute("CREATE INDEX ON items USING hnsw (embedding vector_l2_ops)")
        out["top5"] = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM items ORDER BY embedding <-> %s::vector LIMIT 5",
                (literal(data[42]),),
            )
        ]
        out["same_in_both"] = conn.execute(
            "SELECT count(*) FROM items a JOIN items_many b USING (id) WHERE a.embedding = b.embedding"
        ).fetchone()[0]
        # A server-side prepared statement (psycopg prepares on request).
        out["prepared"] = [
            conn.execute("SELECT id FROM items WHERE id = %s", (i,), prepare=True).fetchone()[0]
            for i in (1, 2, 3)
        ]
        with psycopg.connect(conninfo, autocommit=True) as listener:
            listener.execute("LISTEN vectors_loaded")
            conn.execute("NOTIFY vectors_loaded, 'items'")
            out["notify"] = [n.payload for n in listener.notifies(timeout=10, stop_after=1)]
        conn.execute("DELETE FROM items WHERE id % 40 = 0")
        out["count_after_delete"] = conn.execute("SELECT count(*) FROM items").fetchone()[0]
        try:
            conn.execute("SELECT * FROM no_such_table")
        except psycopg.Error as e:
            out["undefined_table"] = error_of(e)
        try:
            conn.execute("INSERT INTO items (id, embedding) VALUES (9999, '[1,2,3]')")
        except psycopg.Error as e:
            out["wrong_dimension"] = error_of(e)
        conn.execute("DROP TABLE items, items_many")
elif mode == "cancel":
    for how in ("cancel", "cancel_safe"):
        with psycopg.connect(conninfo, autocommit=True) as conn:
            timer = threading.Timer(1.0, getattr(conn, how))
            timer.start()
            started = time.perf_counter()
            try:
                conn.execute("SELECT pg_sleep(30)")
                out[how] = {"error": None}
            except psycopg.Error as e:
                out[how] = error_of(e)
            out[how]["seconds"] = round(time.perf_counter() - started, 2)
            timer.join()
        with psycopg.connect(conninfo, autocommit=True) as check:
            out[how]["still_sleeping"] = check.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%%' AND state = 'active'"
            ).fetchone()[0]
elif mode == "restart":
    conn = psycopg.connect(conninfo, autocommit=True)
    out["before"] = conn.execute("SELECT 1").fetchone()[0]
    subprocess.run(json.loads(arg), check=True, timeout=60)
    try:
        conn.execute("SELECT 1")
        out["after_restart"] = {"error": None}
    except psycopg.Error as e:
        out["after_restart"] = {
            "type": type(e).__name__,
            "operational": isinstance(e, psycopg.OperationalError),
            "sqlstate": e.sqlstate,
            "message": str(e).splitlines()[0],
        }
    conn.close()
    with psycopg.connect(conninfo, autocommit=True) as again:
        out["reconnected"] = again.execute("SELECT 1").fetchone()[0]
elif mode == "copy":
    data = [literal(v) for v in vectors(7, 2000)]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute(f"CREATE TABLE IF NOT EXISTS copy_rounds (id bigint, embedding vector({DIM}))")
        out["seconds"] = []
        for _ in range(int(arg or 5)):
            conn.execute("TRUNCATE copy_rounds")
            started = time.perf_counter()
            with conn.cursor() as cur:
                with cur.copy("COPY copy_rounds (id, embedding) FROM STDIN") as copy:
                    for i, v in enumerate(data):
                        copy.write_row((i, v))
            out["seconds"].append(round(time.perf_counter() - started, 4))
        conn.execute("DROP TABLE copy_rounds")
elif mode == "refused":
    try:
        with psycopg.connect(conninfo, connect_timeout=10) as conn:
            out["error"] = None
            out["answer"] = conn.execute("SELECT 1").fetchone()[0]
    except psycopg.Error as e:
        out["error"] = str(e)
else:
    sys.exit(f"unknown mode {mode}")
print(json.dumps(out))
