//! `proxy`: a TLS terminator for vector-database ingestion.
//!
//! It accepts TLS with rustls, using a crypto provider chosen at run time (ring, aws-lc-rs,
//! OpenSSL, OpenSSL + QAT), and forwards to an upstream such as Qdrant: HTTP/1.1 for REST,
//! HTTP/2 for gRPC (h2c, or h2 over TLS to `https://` nodes), or raw bytes in tcp mode. It
//! exports Prometheus metrics on an admin port, and reloads without dropping connections.
//!
//! The public interface is what the load generator, the tests and the fuzz targets use:
//! [`crypto`] (providers, keys, certificates, QAT), [`tls`] (server and client
//! configurations, the handshake), [`config`] (the file format, written back sparsely for a
//! proxy another program starts), [`ready`] (the ready file `proxy run` writes once
//! listening), `fuzzing` (hidden: the fuzz targets' entry
//! points), [`error_chain`], and [`main`], the binary's entry point. Everything else is
//! private to the crate.
//!
//! Module map, in the order a connection meets them:
//! - `cli` the command line; [`config`] the file format; `plan` the configuration
//!   checked and decided, per listener;
//! - `server` start-up and shutdown; `upgrade` the in-place upgrade on SIGUSR2 and the
//!   listening sockets handed over to a new process; `assemble` a listener's serving state built from
//!   its plan (start-up and reloads); `reload` SIGHUP and replaced files applied to the
//!   running proxy; `switch` the run-time TLS switch;
//! - `listener` the accept loop and each connection's path; `proxy_protocol` the PROXY
//!   header from a trusted balancer; `trust` trusted sources;
//! - [`tls`] server configurations and the handshake; [`crypto`] providers, keys,
//!   certificates and QAT;
//! - `http` L7 forwarding; `tcp` the L4 splice; `postgres` PostgreSQL's opening of a
//!   TLS connection (SSLRequest, direct TLS, cancel requests) on tcp listeners; `upstream` the nodes, balancing,
//!   health checks and upstream TLS; `liveness` what connection deadlines read and byte
//!   accounting; `rapid_reset` premature stream resets counted and the flood flag they
//!   raise;
//! - `rate_limit` request rate limits per API key and client address, the per-client
//!   connection cap; `trace` W3C trace context and OpenTelemetry spans over OTLP;
//! - `admin` /metrics, /healthz, /readyz and the switch API; `metrics` every metric
//!   (per API method too); `access_log` one line per request; `ratelog` rate-limited
//!   peer log lines;
//! - `allocator` the C allocator's thresholds, so connections reuse freed buffers;
//! - `fuzzing` (hidden) the fuzz targets' entry points, with the invariants they check;
//! - [`ready`] the ready file: what `proxy run --ready-file` writes once every listener is
//!   bound, and what `proxy upgrade`, loadgen and the tests read.

// Unsafe code is confined to the OpenSSL calls that rustls-openssl and the openssl crate
// do not expose, all in `crypto::qat`: `ffi` (the provider and ASYNC job bindings) and
// `signer` (the asynchronous signing thread that drives them), to glibc's `mallopt`
// in `allocator`, and to the descriptors an in-place upgrade hands over in `upgrade`; each
// allows it for itself and says why at the block.
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub(crate) mod access_log;
pub(crate) mod admin;
pub(crate) mod allocator;
pub(crate) mod assemble;
pub(crate) mod cli;
pub mod config;
pub mod crypto;
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod http;
pub(crate) mod listener;
pub(crate) mod liveness;
pub(crate) mod metrics;
pub(crate) mod plan;
pub(crate) mod postgres;
pub(crate) mod proxy_protocol;
pub(crate) mod rapid_reset;
pub(crate) mod rate_limit;
pub(crate) mod ratelog;
pub mod ready;
pub(crate) mod reload;
pub(crate) mod server;
pub(crate) mod switch;
pub(crate) mod tcp;
pub mod tls;
pub(crate) mod trace;
pub(crate) mod trust;
pub(crate) mod upgrade;
pub(crate) mod upstream;

/// The `proxy` binary: parses the command line and runs the command (see `proxy --help`).
pub fn main() -> std::process::ExitCode {
    cli::main()
}

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
