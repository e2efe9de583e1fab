//! One typed configuration for the proxy: a TOML file, overridden by command-line flags,
//! validated as a whole at start-up (every problem reported, not just the first).
//!
//! Every default is a named constant with the reason for its value.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::crypto::ProviderName;
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
/// unanswered one closes the connection (a dead peer behind a NAT).
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

/// What a listener does with the decrypted stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ListenerMode {
    /// HTTP/1.1 and HTTP/2 served by hyper; requests forwarded over pooled upstream
    /// connections.
    #[default]
    Http,
    /// Decrypt and splice bytes to the upstream: protocol-agnostic, lowest overhead.
    Tcp,
}

impl ListenerMode {
    /// ALPN protocols offered when the listener's policy names none: h2 and HTTP/1.1 in
    /// http mode; nothing in tcp mode, where the bytes are not ours to interpret.
    pub fn default_alpn(self) -> &'static [&'static [u8]] {
        match self {
            Self::Http => &[b"h2", b"http/1.1"],
            Self::Tcp => &[],
        }
    }
}

/// How a client opens its connection to a tcp listener, before the bytes are spliced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ClientProtocol {
    /// The client's TLS ClientHello comes first: any TLS client.
    #[default]
    Tls,
    /// PostgreSQL's: an SSLRequest answered `S`, then TLS (libpq's `sslmode`), or TLS at
    /// once with ALPN `postgresql` (`sslnegotiation=direct`, libpq 17 and later); a
    /// GSSENCRequest is answered `N`, a plaintext startup gets PostgreSQL's error 28000, a
    /// CancelRequest is passed on to the nodes (see `postgres.rs`).
    Postgres,
}

impl ClientProtocol {
    fn is_tls(&self) -> bool {
        *self == Self::Tls
    }
}

/// How requests travel to the upstream in `http` mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamProtocol {
    /// gRPC (content-type application/grpc*) over h2c, everything else over HTTP/1.1.
    #[default]
    Auto,
    /// Every request over HTTP/1.1.
    Http1,
    /// Every request over HTTP/2: cleartext with prior knowledge to `http://` nodes, h2
    /// negotiated by ALPN to `https://` ones (`h2` is the same setting).
    #[serde(alias = "h2")]
    #[value(alias = "h2")]
    H2c,
}

/// The body of the answers the proxy gives itself to REST clients (502, 504, 413, ...):
/// the shape the database behind the listener uses, so that its client shows the message.
/// gRPC clients always get a status code and message (trailers-only), whatever this says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ErrorBody {
    /// Qdrant's envelope, `{"status":{"error":"..."},"time":0.001}` (application/json):
    /// qdrant-client raises it with the message.
    #[default]
    Qdrant,
    /// The message and a newline as `text/plain`: what Chroma's, Milvus's REST and any other
    /// HTTP client shows as it is when the body is not the database's own error shape.
    Text,
}

/// A certificate chosen by the server name a client asks for.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SniCertificate {
    /// Names it answers to: `vectors.example.com`, or `*.example.com` for any one label
    /// in front of `example.com`. Exact names win over wildcards; case does not matter.
    pub server_names: Vec<String>,
    /// Certificate chain (PEM, end-entity first).
    pub cert: PathBuf,
    /// Private key (PEM).
    pub key: PathBuf,
}

pub(crate) fn server_name_problem(name: &str) -> Option<String> {
    let host = name.strip_prefix("*.").unwrap_or(name);
    let valid_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if host.is_empty() || host.len() > 253 || !host.split('.').all(valid_label) {
        Some(format!(
            "{name:?} is not a DNS name (or *. followed by one)"
        ))
    } else {
        None
    }
}

/// Reads `upstream` as one URL or a list of them.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

/// The most nodes one listener balances over (a request remembers the ones it tried in a
/// 64-bit set).
pub const MAX_UPSTREAM_NODES: usize = 64;

fn default_upstream_idle_timeout() -> Duration {
    DEFAULT_UPSTREAM_IDLE_TIMEOUT
}

fn default_true() -> bool {
    true
}

/// The PROXY protocol on a listener behind an L4 load balancer (see `proxy_protocol.rs`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyProtocolConfig {
    /// The balancers' addresses or CIDR blocks: they must send a v1 or v2 header, and
    /// nobody else may connect (a header from anybody could claim any client address).
    pub trusted: Vec<String>,
}

/// One client-facing listener.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    /// Name used in logs and metric labels; defaults to `listener<N>`.
    #[serde(default)]
    pub name: Option<String>,
    /// Bind address, e.g. `0.0.0.0:6334` or `[::]:6333`.
    pub listen: String,
    /// Certificate chain (PEM, end-entity first).
    pub cert: PathBuf,
    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Further certificates, each served to clients that ask for one of its names (SNI);
    /// `cert` and `key` are the default, for other names and for clients that send none.
    #[serde(default)]
    pub sni: Vec<SniCertificate>,
    /// Upstream nodes: `http://127.0.0.1:6333`, `https://qdrant-0.qdrant:6333` (verified
    /// as `upstream_tls` says), or `tcp://host:port` in tcp mode; one URL or a list of them
    /// (any node of a Qdrant cluster accepts any request).
    #[serde(deserialize_with = "one_or_many")]
    pub upstream: Vec<String>,
    /// How a request (a connection in tcp mode) picks its node among several.
    #[serde(default)]
    pub balance: Balance,
    /// Active health checks and passive ejection of the upstream nodes.
    #[serde(default)]
    pub health_check: HealthCheckConfig,
    /// `http` (default) or `tcp`.
    #[serde(default)]
    pub mode: ListenerMode,
    /// tcp mode: how clients open their connections, `tls` (default) or `postgres`.
    #[serde(default, skip_serializing_if = "ClientProtocol::is_tls")]
    pub protocol: ClientProtocol,
    /// Open connections on this listener at most (beyond them, new ones wait in the
    /// kernel's queue); unset: only the process-wide `limits.max_connections` applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<usize>,
    /// Open connections per client address at most (the PROXY header's address where the
    /// listener takes one); beyond it a new connection is closed before its handshake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections_per_client: Option<usize>,
    /// Metrics per API method (http mode): on by default, the collection label opt-in.
    #[serde(default, skip_serializing_if = "is_default")]
    pub method_metrics: crate::metrics::MethodMetricsConfig,
    /// Request rate limits, each by API key or by client address (http mode).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rate_limit: Vec<RateLimitConfig>,
    /// This listener's `limits.idle_timeout`; in tcp mode `0s` means never. Unset: the
    /// process-wide one, except on `protocol = "postgres"` listeners, where it is never (a
    /// query that runs for minutes moves no byte, and connection pools keep sessions idle
    /// on purpose; TCP keep-alive still finds peers that vanished).
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub idle_timeout: Option<Duration>,
    /// Upstream protocol in http mode.
    #[serde(default)]
    pub upstream_protocol: UpstreamProtocol,
    /// Idle upstream connections (http mode) are closed after this; keep it under the
    /// upstream's own keep-alive timeout. `0s`: no connection is reused. See
    /// [`DEFAULT_UPSTREAM_IDLE_TIMEOUT`].
    #[serde(default = "default_upstream_idle_timeout", with = "humantime_serde")]
    pub upstream_idle_timeout: Duration,
    /// How `https://` upstream nodes are verified, and the certificate presented to them.
    #[serde(default, skip_serializing_if = "UpstreamTlsConfig::is_unset")]
    pub upstream_tls: UpstreamTlsConfig,
    /// Read a PROXY protocol header (v1 or v2) before the handshake, from these sources
    /// only: the client address it names stands for the peer in logs, X-Forwarded-For and
    /// the access log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<ProxyProtocolConfig>,
    /// Overrides the top-level provider for this listener.
    #[serde(default)]
    pub provider: Option<ProviderName>,
    /// TLS policy.
    #[serde(default)]
    pub tls: TlsPolicy,
    /// http mode: add `Strict-Transport-Security: max-age=31536000` and
    /// `X-Content-Type-Options: nosniff` to responses that carry neither (Qdrant's web UI
    /// is served through the same port, and browsers should not be talked into plain HTTP
    /// or into sniffing JSON as HTML). The upstream's own values win.
    #[serde(default = "default_true")]
    pub security_headers: bool,
    /// http mode: the body of the proxy's own REST error answers; `qdrant` (default) in
    /// front of Qdrant, `text` in front of any other database.
    #[serde(default)]
    pub error_body: ErrorBody,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

impl ListenerConfig {
    /// A listener of its required keys, every other at the file's default (serde's, so
    /// the defaults are spelled once).
    pub fn new(listen: String, cert: PathBuf, key: PathBuf, upstream: Vec<String>) -> Self {
        let mut listener: Self =
            toml::from_str("listen = \"\"\ncert = \"\"\nkey = \"\"\nupstream = []")
                .expect("the required keys make a listener");
        listener.listen = listen;
        listener.cert = cert;
        listener.key = key;
        listener.upstream = upstream;
        listener
    }

    /// The listener's name for logs and metrics.
    pub fn display_name(&self, index: usize) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("listener{index}"))
    }
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

    /// The configuration as TOML with only what differs from the defaults (a listener's
    /// required keys always), for a proxy another program starts: the file reads back as
    /// this configuration, and a build older than a key it leaves at its default still
    /// reads it (a benchmark of the binary before a change, for before/after figures).
    pub fn to_sparse_toml(&self) -> String {
        let mut sparse = as_table(self);
        sparse.remove("listener");
        keep_what_differs(&mut sparse, &as_table(&Self::empty()));
        let listeners: Vec<toml::Value> = self
            .listeners
            .iter()
            .map(|l| {
                let required =
                    ListenerConfig::new(l.listen.clone(), l.cert.clone(), l.key.clone(), vec![]);
                let full = as_table(l);
                let mut table = full.clone();
                keep_what_differs(&mut table, &as_table(&required));
                for key in ["listen", "cert", "key", "upstream"] {
                    if let Some(value) = full.get(key) {
                        table.insert(key.to_owned(), value.clone());
                    }
                }
                // One node as a plain string, which every proxy version reads.
                if let Some(toml::Value::Array(nodes)) = table.get("upstream") {
                    if let [one] = nodes.as_slice() {
                        table.insert("upstream".to_owned(), one.clone());
                    }
                }
                toml::Value::Table(table)
            })
            .collect();
        if !listeners.is_empty() {
            sparse.insert("listener".to_owned(), toml::Value::Array(listeners));
        }
        toml::to_string(&sparse).expect("a table of TOML values renders")
    }
}

/// A configuration struct as a TOML table.
fn as_table<T: Serialize>(value: &T) -> toml::Table {
    toml::Table::try_from(value).expect("a configuration is plain TOML values")
}

/// Removes from `table` every entry equal to `defaults`'s, tables compared key by key (a
/// table left empty goes too).
fn keep_what_differs(table: &mut toml::Table, defaults: &toml::Table) {
    table.retain(|key, value| match (value, defaults.get(key)) {
        (_, None) => true,
        (toml::Value::Table(inner), Some(toml::Value::Table(default))) => {
            keep_what_differs(inner, default);
            !inner.is_empty()
        }
        (value, Some(default)) => value != default,
    });
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
            17,
            "{text}"
        );
    }

    #[test]
    fn the_example_configuration_parses_with_every_hardening_setting() {
        let c: Config = toml::from_str(include_str!("../../config/proxy.toml"))
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
