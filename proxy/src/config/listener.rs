//! A `[[listener]]` table as written: its mode and the protocols on both sides, its nodes,
//! its TLS and per-listener limits, with their defaults.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{is_default, HealthCheckConfig, RateLimitConfig, TlsPolicy, UpstreamTlsConfig};
use super::{Balance, DEFAULT_UPSTREAM_IDLE_TIMEOUT};
use crate::crypto::ProviderName;

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
