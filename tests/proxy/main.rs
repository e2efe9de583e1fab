//! The proxy end to end: the real `proxy` binary on loopback in front of real upstreams,
//! driven by real clients. One module per concern; a new test goes into the module of the
//! concern it checks, a new concern gets a module of its own named for it:
//!
//! - TLS: `tls` (versions, suites, groups, resumption, mTLS), `sni`, `matrix` (provider x
//!   algorithm x TLS version, one test per cell), `qat` (openssl-qat's set-up and refusals),
//!   `qat_engine` (against Intel's QAT_Engine in qat_sw mode; `--ignored`, needs the
//!   provider: `QAT_PROVIDER_DIR=... cargo test -p e2e --test proxy qat_engine -- --ignored`),
//!   `qat_engine_settings` (the provider's own settings, and one that loads but does not
//!   offload);
//! - connections: `deadlines` (first request, idle, stall, clients that read nothing),
//!   `idle_http1` (HTTP/1.1 connections parked between requests), `rapid_reset`,
//!   `hostile_framing` (HTTP/2 floods, HTTP/1.1 smuggling), `headers` (forwarded headers,
//!   CONNECT, framing errors), `proxy_protocol`;
//! - limits: `limits` (request body and head, every protocol and upstream kind),
//!   `bounded_resources` (the upstream request cap, the request buffer budget),
//!   `rate_limits` (per API key and client address, the per-client connection cap);
//! - upstreams: `upstreams` (nodes, balancing, health checks), `upstream_tls`,
//!   `upstream_keepalive`, `faults` (upstreams that fail), `grpc` (trailers, streaming,
//!   gRPC statuses), `gather` (request chunks gathered on their way up);
//! - operation: `lifecycle` (start-up, shutdown, drain), `upgrade` (the in-place upgrade
//!   on SIGUSR2 under load), `reload` (SIGHUP, certificate watch), `switch` (the run-time provider switch), `admin`, `metrics` (with a real
//!   Prometheus), `otel` (trace context and OTLP spans), `logs` (access log, rate-limited error log), `soak` (`--ignored`).
//!
//! Shared here: `h2_raw` (HTTP/2 frames by hand) and `counting_upstream`; everything the
//! other binaries share too is in `common/` (the crate `e2e`).

mod admin;
mod bounded_resources;
mod counting_upstream;
mod deadlines;
mod faults;
mod gather;
mod grpc;
mod h2_raw;
mod headers;
mod hostile_framing;
mod idle_http1;
mod lifecycle;
mod limits;
mod logs;
mod matrix;
mod metrics;
mod otel;
mod proxy_protocol;
mod qat;
mod qat_engine;
mod qat_engine_settings;
mod rapid_reset;
mod rate_limits;
mod reload;
mod sni;
mod soak;
mod switch;
mod tls;
mod upgrade;
mod upstream_keepalive;
mod upstream_tls;
mod upstreams;
