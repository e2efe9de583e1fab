//! The tools around the proxy, end to end: `loadgen` (`loadgen_run`, `loadgen_power`,
//! `loadgen_bench`, `loadgen_compare`, `loadgen_merge`), `embedded-qdrant` (`embedded_qdrant`), the
//! embedding pipeline with a real model (`embedding_pipeline`), and the clients and
//! checkers this project did not write (`qdrant_client_rust`, the Rust qdrant-client;
//! `interop`: the Python qdrant-client, openssl, sslyze; `other_databases`: Milvus and Chroma
//! with their own clients; `interop_rate_limit`: the Python client against a rate limit; `pgvector`:
//! PostgreSQL + pgvector with psycopg and psql). A new test goes into the module of the tool it runs.

mod embedded_qdrant;
mod embedding_pipeline;
mod interop;
mod interop_rate_limit;
mod loadgen_bench;
mod loadgen_compare;
mod loadgen_merge;
mod loadgen_power;
mod loadgen_run;
mod other_databases;
mod pgvector;
mod qdrant_client_rust;
