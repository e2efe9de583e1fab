//! `proxy`: a TLS terminator for vector-database ingestion.
//!
//! It accepts TLS with rustls, using a crypto provider chosen at run time (ring, aws-lc-rs,
//! OpenSSL, OpenSSL + QAT), and forwards plaintext to a local upstream such as Qdrant:
//! HTTP/1.1 for REST, h2c for gRPC, or raw bytes in tcp mode. It exports Prometheus metrics
//! on a loopback admin port.
//!
//! Module map: [`crypto`] (providers, keys, certificates), [`tls`] (server configs and the
//! handshake path), [`http`] (L7 forwarding), [`tcp`] (L4 splice), [`admin`] (metrics and
//! health), [`config`] (the typed configuration), [`plan`] (the configuration checked and decided, per listener), [`server`] (listeners, limits, shutdown), [`switch`] (run-time TLS switching),
//! [`cli`] (the command line).

// Unsafe code is confined to the OpenSSL provider calls of `crypto::qat` (its `ffi` module).
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod access_log;
pub mod admin;
pub mod cli;
pub mod config;
pub mod crypto;
pub mod http;
pub mod io;
pub mod listener;
pub mod metrics;
pub mod plan;
pub mod proxy_protocol;
pub mod ratelog;
pub mod reload;
pub mod server;
pub mod switch;
pub mod tcp;
pub mod tls;
pub mod trust;
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
