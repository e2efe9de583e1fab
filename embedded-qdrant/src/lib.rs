//! embedded-qdrant as a library: the Qdrant-compatible servers (REST on HTTP/1.1 in
//! `rest`, gRPC on h2c in `grpc`, both with the conversions of `convert`),
//! the store on Qdrant's engine (`store`), the API key check (`auth`) and in-process TLS
//! (`tls`). The binary (`main.rs`) wires them to its command line; the fuzz targets
//! (`tests/fuzz`) reach the request decoding through `fuzzing`.

// No unsafe code of its own: Qdrant's engine and the TLS stack carry theirs.
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod auth;
mod convert;
#[doc(hidden)]
pub mod fuzzing;
pub mod grpc;
pub mod rest;
pub mod store;
pub mod tls;

/// The Qdrant API version this server answers as: the protocol of the qdrant-client crate
/// it is built on (its messages and service traits). The official clients compare it
/// with their own (same major, minor within one) and warn on every start otherwise.
pub const QDRANT_API_VERSION: &str = "1.20.0";

/// `title` of `GET /` and of gRPC HealthCheck: Qdrant's own, and which server this is.
pub const SERVER_TITLE: &str = concat!(
    "qdrant - vector search engine (embedded-qdrant ",
    env!("CARGO_PKG_VERSION"),
    " on qdrant-edge 0.7.0)"
);
