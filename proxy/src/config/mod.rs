//! One typed configuration for the proxy: a TOML file, overridden by command-line flags,
//! validated as a whole at start-up (every problem reported, not just the first).
//!
//! Every default is a named constant with the reason for its value.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::crypto::ProviderName;

mod listener;
mod sparse;

pub use listener::*;
// A listener's TLS and upstream settings are `tls`'s and `upstream`'s types, read here
// from the file.
pub use crate::rate_limit::{LimitKey, RateLimitConfig};
pub use crate::tls::{server_name_matches, HandshakeOffload, TlsPolicy, TlsVersion};
pub use crate::upstream::{Balance, HealthCheckConfig, HealthCheckKind, UpstreamTlsConfig};

/// Admin listener default: loopback only, so metrics and the admin API are never exposed
/// by accident; operators opt in to a wider bind.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9900";
/// aws-lc-rs is the fastest software provider in our trial builds and the baseline of the
/// reference study.
pub const DEFAULT_PROVIDER: ProviderName = ProviderName::AwsLcRs;
/// Beyond this many open client connections, new ones wait in the kernel's accept queue.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// A client that has not finished its handshake by then is holding a slot for nothing.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time allowed to receive a complete request head (slowloris defence); generous for
/// clients on slow links.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// A connection with no bytes moving for this long is closed gracefully.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Request heads larger than this get 431; Qdrant's own requests are far below it.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;
/// One UPSERT_100 of 1024-d vectors is about 800 KB of JSON; 32 MiB leaves room for
/// large batches while still bounding memory per request.
pub const DEFAULT_MAX_REQUEST_BODY_BYTES: u64 = 32 * 1024 * 1024;
/// The upstream is local: if connecting takes longer than this it is not coming.
pub const DEFAULT_UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Time to the upstream's response headers. Large `wait=true` upserts into a busy Qdrant
/// can take seconds; a minute separates slow from stuck.
pub const DEFAULT_UPSTREAM_RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);
/// HTTP/2 streams per client connection; gRPC clients multiplex, and this bounds the
/// work one connection can queue.
pub const DEFAULT_H2_MAX_CONCURRENT_STREAMS: u32 = 256;
/// The largest HTTP/2 frame a client may send (SETTINGS_MAX_FRAME_SIZE). Clients send
/// DATA frames as large as the server allows, and each frame is one body chunk through
/// the proxy. At the protocol's default 16 KiB (and at 64 or 256 KiB) an 800 KB upsert
/// over h2 cost about a third more CPU per MB in `loadgen bench` than with 1 MiB, where
/// it fits one frame: the profile showed the difference in copying the decrypted records
/// and faulting in fresh buffer pages. nginx advertises 16 MiB. A frame is buffered whole
/// whatever its type, so connections are offered it only out of their request buffer
/// grant, and every upstream request's floor counts one such frame in hand.
pub const DEFAULT_H2_MAX_FRAME_SIZE: u32 = 1024 * 1024;
/// In-flight requests get this long to finish after SIGTERM.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// After SIGTERM the proxy reports not ready (`/readyz` 503) but keeps accepting and
/// serving for this long before it drains: a load balancer or Kubernetes removes the
/// endpoint only after it sees the readiness fail, and connections that arrive in between
/// would be refused. 0 by default (a proxy with no balancer in front stops accepting at
/// once); the Kubernetes manifests set it, with a termination grace that covers it and
/// `shutdown_grace`.
pub const DEFAULT_ACCEPT_GRACE: Duration = Duration::ZERO;
/// A connection that has sent no request this long after its handshake (or the idle timeout,
/// if shorter) is closed: an h2 client that never sends its preface, or only PINGs, holds a
/// slot for nothing.
pub const DEFAULT_FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A connection with requests in flight on which nothing moved this long (no body data
/// either way, no response) is closed at once: its client reads nothing (a zero window, a
/// reader that stopped). At least the upstream response timeout, so a slow upstream gets
/// its 504 first.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Idle upstream connections are closed after this, unless a listener sets
/// `upstream_idle_timeout`. An upstream closes idle keep-alive connections on its own clock
/// (Qdrant's REST server, actix-web, after 5 s; Node and uvicorn after 5 s too); a pooled
/// connection picked just as the upstream closes it loses the request written to it, so
/// the pool lets connections go first. Under Qdrant's 5 s with a second to spare.
pub const DEFAULT_UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(4);
/// A connection asked to close (idle, too old, resetting too many streams) that has not
/// closed by then is closed hard: a client that never acknowledges the GOAWAY's PING, or
/// never reads the last response, cannot keep its slot.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// SO_KEEPALIVE on accepted sockets: the kernel probes a silent peer after this long and
/// closes a dead one after a few unanswered probes.
pub const DEFAULT_TCP_KEEPALIVE: Duration = Duration::from_secs(60);
/// HTTP/2 keep-alive PINGs on a connection that has been silent this long; an
/// unanswered one closes the connection (a dead peer behind a NAT). On client
/// connections, and on upstream h2 connections while requests are in flight.
pub const DEFAULT_H2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// Time to answer a keep-alive PING.
pub const DEFAULT_H2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Concurrent requests forwarded to one upstream; beyond it the proxy answers 503 (gRPC
/// RESOURCE_EXHAUSTED) at once. HTTP/1.1 upstreams get one connection per request in
/// flight, so this also caps their connections. Qdrant serves a few hundred concurrent
/// requests per node well; thousands only queue inside it. With the default connection
/// limit, the floors of both fit the default request buffer budget derived from them.
pub const DEFAULT_MAX_UPSTREAM_REQUESTS: usize = 512;
/// Rapid reset (CVE-2023-44487) at any pace: a connection whose premature resets (streams
/// the client reset within 1 s of opening them, answered or not) are more than half of its
/// streams, counted over at least this many, gets GOAWAY ENHANCE_YOUR_CALM and is closed.
/// A flood costs the upstream about half this many requests per connection.
pub const DEFAULT_H2_MAX_RESET_STREAMS: u64 = 100;
/// Request bytes the proxy may hold across all connections (HTTP/2 receive windows,
/// HTTP/1.1 read buffers, bodies on their way upstream); enforced by the flow-control
/// windows it advertises, so clients are slowed, never buffered beyond it. When not set:
/// this, or if more, what `max_connections` (64 KiB each) and `max_upstream_requests`
/// (400 KiB and one frame each: 1.4 MiB by default) need at their floors plus an eighth of
/// this for larger windows (see [`Limits::request_buffer_budget()`]).
pub const DEFAULT_REQUEST_BUFFER_BUDGET: u64 = 1024 * 1024 * 1024;

/// The whole proxy configuration.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Default crypto provider for every listener.
    #[serde(default = "default_provider")]
    pub provider: ProviderName,
    /// Log filter (tracing EnvFilter syntax); RUST_LOG wins when set.
    #[serde(default = "default_log_level")]
    pub log_level: String,
    /// Log lines as text or as JSON objects, one per line.
    #[serde(default)]
    pub log_format: LogFormat,
    /// One line per request; off by default.
    #[serde(default)]
    pub access_log: crate::access_log::AccessLogConfig,
    /// Reactor worker threads; 0 means one per CPU.
    #[serde(default)]
    pub worker_threads: usize,
    /// Where and how the TLS handshake's signing runs (default inline). openssl-qat
    /// listeners always wait for the asynchronous QAT signer on blocking threads instead.
    #[serde(default)]
    pub handshake: HandshakeConfig,
    /// Limits and timeouts, for every listener.
    #[serde(default)]
    pub limits: Limits,
    /// Peers that are proxies themselves (addresses or CIDR blocks): their
    /// X-Forwarded-For is extended with their address. Anybody else's is replaced with
    /// the peer's address and their Forwarded and X-Real-IP headers dropped.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// How often every listener's certificate and key files are checked for replacement
    /// (cert-manager and ACME clients replace them in place, Kubernetes swaps a `..data`
    /// symlink); a change reloads them as SIGHUP does. `0s` turns the watch off.
    #[serde(default = "default_cert_watch_interval", with = "humantime_serde")]
    pub cert_watch_interval: Duration,
    /// The admin listener (/metrics, /healthz, /readyz).
    #[serde(default)]
    pub admin: AdminConfig,
    /// The OpenSSL + QAT provider (`openssl-qat` listeners only).
    #[serde(default)]
    pub qat: crate::crypto::qat::QatConfig,
    /// `[otel]`: W3C trace context and OpenTelemetry span export (off by default).
    #[serde(default, skip_serializing_if = "is_default")]
    pub otel: crate::trace::OtelConfig,
    /// Client-facing listeners.
    #[serde(default, rename = "listener")]
    pub listeners: Vec<ListenerConfig>,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (time, level, fields, message).
    Json,
}

fn default_provider() -> ProviderName {
    DEFAULT_PROVIDER
}
fn default_log_level() -> String {
    "info".to_owned()
}
/// One check a second: a replaced certificate is in use within two seconds, for the cost of
/// two `stat` calls per listener a second.
fn default_cert_watch_interval() -> Duration {
    Duration::from_secs(1)
}

/// Where the handshake runs.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandshakeConfig {
    /// `inline` signs on the reactor thread that accepted the connection; `pool` hands the
    /// step that signs to a dedicated thread pool so a slow signature never stalls
    /// established connections.
    #[serde(default)]
    pub offload: Option<HandshakeOffload>,
    /// Threads in the handshake pool; 0 means one per CPU.
    #[serde(default)]
    pub pool_threads: usize,
}

/// Limits and timeouts.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// See [`DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// See [`DEFAULT_HANDSHAKE_TIMEOUT`].
    #[serde(with = "humantime_serde")]
    pub handshake_timeout: Duration,
    /// See [`DEFAULT_HEADER_READ_TIMEOUT`].
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// See [`DEFAULT_IDLE_TIMEOUT`].
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// See [`DEFAULT_MAX_HEADER_BYTES`].
    pub max_header_bytes: usize,
    /// See [`DEFAULT_MAX_REQUEST_BODY_BYTES`].
    pub max_request_body_bytes: u64,
    /// See [`DEFAULT_UPSTREAM_CONNECT_TIMEOUT`].
    #[serde(with = "humantime_serde")]
    pub upstream_connect_timeout: Duration,
    /// See [`DEFAULT_UPSTREAM_RESPONSE_TIMEOUT`].
    #[serde(with = "humantime_serde")]
    pub upstream_response_timeout: Duration,
    /// See [`DEFAULT_H2_MAX_CONCURRENT_STREAMS`].
    pub h2_max_concurrent_streams: u32,
    /// See [`DEFAULT_H2_MAX_FRAME_SIZE`].
    pub h2_max_frame_size: u32,
    /// See [`DEFAULT_SHUTDOWN_GRACE`].
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// See [`DEFAULT_ACCEPT_GRACE`].
    #[serde(with = "humantime_serde")]
    pub accept_grace: Duration,
    /// See [`DEFAULT_FIRST_REQUEST_TIMEOUT`].
    #[serde(with = "humantime_serde")]
    pub first_request_timeout: Duration,
    /// See [`DEFAULT_STALL_TIMEOUT`].
    #[serde(with = "humantime_serde")]
    pub stall_timeout: Duration,
    /// See [`DEFAULT_DRAIN_TIMEOUT`].
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Connections older than this are asked to close (then closed after the drain
    /// timeout), so long-lived clients rebalance across proxies; none by default.
    #[serde(with = "humantime_serde")]
    pub max_connection_age: Option<Duration>,
    /// See [`DEFAULT_TCP_KEEPALIVE`].
    #[serde(with = "humantime_serde")]
    pub tcp_keepalive: Duration,
    /// See [`DEFAULT_H2_KEEPALIVE_INTERVAL`].
    #[serde(with = "humantime_serde")]
    pub h2_keepalive_interval: Duration,
    /// See [`DEFAULT_H2_KEEPALIVE_TIMEOUT`].
    #[serde(with = "humantime_serde")]
    pub h2_keepalive_timeout: Duration,
    /// See [`DEFAULT_MAX_UPSTREAM_REQUESTS`].
    pub max_upstream_requests: usize,
    /// See [`DEFAULT_H2_MAX_RESET_STREAMS`].
    pub h2_max_reset_streams: u64,
    /// See [`DEFAULT_REQUEST_BUFFER_BUDGET`]; `None`: derived from the other limits.
    pub request_buffer_budget: Option<u64>,
}

/// Request bytes one connection can hold at least: HTTP/2's initial window (RFC 9113
/// 6.9.2), which every connection may be sent before any WINDOW_UPDATE; HTTP/1.1
/// connections are promised hyper's read buffer of `max_header_bytes`.
pub const CONNECTION_BUFFER_FLOOR: u64 = 65_535;
/// hyper's upstream client write queue: request bytes accepted from the client and not
/// yet written to the upstream socket, per upstream request. hyper's own default, set
/// explicitly because the budget counts on it: 64 KiB made 800 KB uploads take more
/// writes, ~10 % more CPU per MB and ~5 % more latency in `loadgen bench`.
pub const UPSTREAM_WRITE_BUFFER: usize = 400 * 1024;
/// The least a request body chunk in hand is counted at.
const CHUNK_FLOOR: u64 = 64 * 1024;

impl Limits {
    /// Bytes of the request buffer budget set aside for every connection's and upstream
    /// request's floor (see `http::budget`).
    pub fn request_buffer_floors(&self) -> u64 {
        let per_connection = CONNECTION_BUFFER_FLOOR.max(self.max_header_bytes as u64);
        // Saturating: the limits are checked after this is computed (`Plan::new`), so any
        // values a configuration file holds must add up without a panic.
        (self.max_connections as u64)
            .saturating_mul(per_connection)
            .saturating_add(
                (self.max_upstream_requests as u64).saturating_mul(self.upstream_request_floor()),
            )
    }

    /// Request bytes one upstream request can hold: hyper's write queue and the chunk in
    /// hand, an HTTP/2 frame (whose window is released as soon as it is handed on) or an
    /// HTTP/1.1 read (hyper's read buffer: `max_header_bytes`, or more when the budget
    /// grants it, never more than [`Self::upstream_chunk_floor`]).
    pub fn upstream_request_floor(&self) -> u64 {
        (UPSTREAM_WRITE_BUFFER as u64).saturating_add(self.upstream_chunk_floor())
    }

    /// The body chunk in hand that every upstream request's floor counts: no chunk the
    /// proxy reads may be larger (an HTTP/1.1 read buffer grown by a budget grant included).
    pub fn upstream_chunk_floor(&self) -> u64 {
        CHUNK_FLOOR
            .max(self.max_header_bytes as u64)
            .max(u64::from(self.h2_max_frame_size))
    }

    /// The request buffer budget in effect: the configured one, or the default grown to
    /// fit the floors of `max_connections` and `max_upstream_requests`, so raising those
    /// alone never makes a configuration invalid.
    pub fn request_buffer_budget(&self) -> u64 {
        self.request_buffer_budget.unwrap_or_else(|| {
            DEFAULT_REQUEST_BUFFER_BUDGET.max(
                self.request_buffer_floors()
                    .saturating_add(DEFAULT_REQUEST_BUFFER_BUDGET / 8),
            )
        })
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_request_body_bytes: DEFAULT_MAX_REQUEST_BODY_BYTES,
            upstream_connect_timeout: DEFAULT_UPSTREAM_CONNECT_TIMEOUT,
            upstream_response_timeout: DEFAULT_UPSTREAM_RESPONSE_TIMEOUT,
            h2_max_concurrent_streams: DEFAULT_H2_MAX_CONCURRENT_STREAMS,
            h2_max_frame_size: DEFAULT_H2_MAX_FRAME_SIZE,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            accept_grace: DEFAULT_ACCEPT_GRACE,
            first_request_timeout: DEFAULT_FIRST_REQUEST_TIMEOUT,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            max_connection_age: None,
            tcp_keepalive: DEFAULT_TCP_KEEPALIVE,
            h2_keepalive_interval: DEFAULT_H2_KEEPALIVE_INTERVAL,
            h2_keepalive_timeout: DEFAULT_H2_KEEPALIVE_TIMEOUT,
            max_upstream_requests: DEFAULT_MAX_UPSTREAM_REQUESTS,
            h2_max_reset_streams: DEFAULT_H2_MAX_RESET_STREAMS,
            request_buffer_budget: None,
        }
    }
}

/// The admin listener.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Bind address; see [`DEFAULT_ADMIN_LISTEN`].
    #[serde(default = "default_admin_listen")]
    pub listen: String,
    /// File holding the bearer token that authorises `POST /admin/tls` (switching a
    /// listener's provider and certificate at run time). Without it that endpoint is off.
    #[serde(default)]
    pub token_file: Option<std::path::PathBuf>,
    /// Open admin connections at most; more are closed at once (a scraper needs one).
    #[serde(default = "default_admin_max_connections")]
    pub max_connections: usize,
    /// Time to receive a request head, and the longest an idle keep-alive connection
    /// stays open (hyper's header timer runs while a connection waits for its next
    /// request); request bodies get as long.
    #[serde(
        default = "default_admin_header_read_timeout",
        with = "humantime_serde"
    )]
    pub header_read_timeout: std::time::Duration,
    /// Certificate chain (PEM) for serving the admin port over TLS (remote mode sends the
    /// bearer token; over plain HTTP anybody on the path reads it). With `tls_key`.
    #[serde(default)]
    pub tls_cert: Option<std::path::PathBuf>,
    /// Private key (PEM) for `tls_cert`.
    #[serde(default)]
    pub tls_key: Option<std::path::PathBuf>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: default_admin_listen(),
            token_file: None,
            max_connections: default_admin_max_connections(),
            header_read_timeout: default_admin_header_read_timeout(),
            tls_cert: None,
            tls_key: None,
        }
    }
}

/// Admin connections: a Prometheus or two, an operator, a health checker.
pub const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = 64;
/// Admin requests are small and local; a head that takes longer is not a scraper.
pub const DEFAULT_ADMIN_HEADER_READ_TIMEOUT: std::time::Duration =
    std::time::Duration::from_secs(10);

fn default_admin_max_connections() -> usize {
    DEFAULT_ADMIN_MAX_CONNECTIONS
}
fn default_admin_header_read_timeout() -> std::time::Duration {
    DEFAULT_ADMIN_HEADER_READ_TIMEOUT
}

fn default_admin_listen() -> String {
    DEFAULT_ADMIN_LISTEN.to_owned()
}

pub(crate) fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// A configuration that failed validation: every problem, one per line.
#[derive(Debug, thiserror::Error)]
#[error("{}", problems.join("\n"))]
pub struct ConfigError {
    /// Each problem names the file or flag and the field.
    pub problems: Vec<String>,
}

impl ConfigError {
    fn one(problem: String) -> Self {
        Self {
            problems: vec![problem],
        }
    }
}

impl Config {
    /// Reads and parses a TOML file (not yet validated).
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::one(format!("cannot read config file {}: {e}", path.display()))
        })?;
        toml::from_str(&text).map_err(|e| {
            ConfigError::one(format!(
                "config file {} is not valid: {}",
                path.display(),
                e.to_string().trim_end()
            ))
        })
    }

    /// An empty configuration: every default, no listeners.
    pub fn empty() -> Self {
        toml::from_str("").expect("the empty document is a valid config: every field has a default")
    }

    /// The resolved configuration as TOML, for `check-config`.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparse_file_reads_back_as_the_configuration_and_holds_only_what_differs() {
        let mut config = Config::empty();
        config.provider = ProviderName::Ring;
        config.worker_threads = 1;
        config.limits.idle_timeout = Duration::from_secs(600);
        config.admin.listen = "127.0.0.1:0".into();
        let mut grpc = ListenerConfig::new(
            "127.0.0.1:0".into(),
            "/certs/a.crt".into(),
            "/certs/a.key".into(),
            vec!["http://127.0.0.1:6334".into()],
        );
        grpc.name = Some("grpc".into());
        grpc.upstream_protocol = UpstreamProtocol::H2c;
        grpc.tls.min_version = TlsVersion::Tls13;
        grpc.tls.resumption = false;
        config.listeners.push(grpc);
        config.listeners.push(ListenerConfig::new(
            "127.0.0.1:0".into(),
            "/certs/b.crt".into(),
            "/certs/b.key".into(),
            vec!["http://127.0.0.1:1".into(), "http://127.0.0.1:2".into()],
        ));
        let text = config.to_sparse_toml();
        let back: Config = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(
            serde_json::to_value(&back).unwrap(),
            serde_json::to_value(&config).unwrap(),
            "{text}"
        );
        // One node is a plain string (every proxy version reads it); defaults are absent.
        assert!(
            text.contains("upstream = \"http://127.0.0.1:6334\""),
            "{text}"
        );
        for default in [
            "max_version",
            "log_level",
            "handshake",
            "max_connections",
            "mode",
        ] {
            assert!(
                !text.contains(default),
                "{default} is at its default: {text}"
            );
        }
        assert_eq!(
            text.lines().filter(|l| l.contains('=')).count(),
            16,
            "{text}"
        );
    }

    #[test]
    fn the_example_configuration_parses_with_every_hardening_setting() {
        let c: Config = toml::from_str(include_str!("../../../config/proxy.toml"))
            .expect("config/proxy.toml parses");
        assert_eq!(c.listeners.len(), 2);
        assert_eq!(
            c.limits.max_upstream_requests,
            DEFAULT_MAX_UPSTREAM_REQUESTS
        );
        assert_eq!(c.limits.drain_timeout, DEFAULT_DRAIN_TIMEOUT);
        assert_eq!(c.admin.max_connections, DEFAULT_ADMIN_MAX_CONNECTIONS);
        assert!(c.trusted_proxies.is_empty());
    }

    #[test]
    fn empty_document_has_every_default() {
        let c = Config::empty();
        assert_eq!(c.provider, DEFAULT_PROVIDER);
        assert_eq!(
            c.limits.max_request_body_bytes,
            DEFAULT_MAX_REQUEST_BODY_BYTES
        );
        assert_eq!(c.admin.listen, DEFAULT_ADMIN_LISTEN);
    }

    #[test]
    fn unknown_fields_and_values_are_rejected() {
        assert!(toml::from_str::<Config>("provder = \"ring\"").is_err());
        let err = toml::from_str::<Config>("provider = \"boringssl\"").unwrap_err();
        assert!(err.to_string().contains("boringssl"), "{err}");
    }
}
