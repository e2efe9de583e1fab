//! `proxy`: a TLS terminator for vector-database ingestion.
//!
//! It accepts TLS with rustls, using a crypto provider chosen at run time (ring, aws-lc-rs,
//! OpenSSL, OpenSSL + QAT), and forwards to an upstream such as Qdrant: HTTP/1.1 for REST,
//! HTTP/2 for gRPC (h2c, or h2 over TLS to `https://` nodes), or raw bytes in tcp mode. It
//! exports Prometheus metrics on an admin port, and reloads without dropping connections.
//!
//! Module map, in the order a connection meets them:
//! - [`cli`] the command line; [`config`] the file format; [`plan`] the configuration
//!   checked and decided, per listener;
//! - [`server`] start-up and shutdown; [`upgrade`] the in-place upgrade on SIGUSR2 and the
//!   listening sockets handed over to a new process; [`assemble`] a listener's serving state built from
//!   its plan (start-up and reloads); [`reload`] SIGHUP and replaced files applied to the
//!   running proxy; [`switch`] the run-time TLS switch;
//! - [`listener`] the accept loop and each connection's path; [`proxy_protocol`] the PROXY
//!   header from a trusted balancer; [`trust`] trusted sources;
//! - [`tls`] server configurations and the handshake; [`crypto`] providers, keys,
//!   certificates and QAT;
//! - [`http`] L7 forwarding; [`tcp`] the L4 splice; `postgres` PostgreSQL's opening of a
//!   TLS connection (SSLRequest, direct TLS, cancel requests) on tcp listeners; [`upstream`] the nodes, balancing,
//!   health checks and upstream TLS; [`liveness`] what connection deadlines read and byte
//!   accounting; `rapid_reset` premature stream resets counted and the flood flag they
//!   raise;
//! - `rate_limit` request rate limits per API key and client address, the per-client
//!   connection cap; `trace` W3C trace context and OpenTelemetry spans over OTLP;
//! - [`admin`] /metrics, /healthz, /readyz and the switch API; [`metrics`] every metric
//!   (per API method too); [`access_log`] one line per request; [`ratelog`] rate-limited
//!   peer log lines;
//! - [`allocator`] the C allocator's thresholds, so connections reuse freed buffers;
//! - `fuzzing` (hidden) the fuzz targets' entry points, with the invariants they check;
//! - [`launch`] starting a `proxy run` process from typed settings and reading its ready
//!   file: the one launcher of loadgen, the examples and the tests.

// Unsafe code is confined to the OpenSSL calls that rustls-openssl and the openssl crate
// do not expose, all in `crypto::qat`: `ffi` (the provider and ASYNC job bindings) and
// `signer` (the asynchronous signing thread that drives them), to glibc's `mallopt`
// in `allocator`, and to the descriptors an in-place upgrade hands over in `upgrade`; each
// allows it for itself and says why at the block.
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod access_log;
pub mod admin;
pub mod allocator;
pub mod assemble;
pub mod cli;
pub mod config;
pub mod crypto;
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod launch;
pub mod listener;
pub mod liveness;
pub mod metrics;
pub mod plan;
pub(crate) mod postgres;
pub mod proxy_protocol;
pub(crate) mod rapid_reset;
pub(crate) mod rate_limit;
pub mod ratelog;
pub mod reload;
pub mod server;
pub mod switch;
pub mod tcp;
pub mod tls;
pub(crate) mod trace;
pub mod trust;
pub mod upgrade;
pub mod upstream;

/// "outer: inner: innermost": an error with its sources, each said once, for messages that
/// say what actually happened (hyper's and reqwest's own messages rarely do).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}
