//! The plan: what the process and each of its listeners will be, decided once from the
//! configuration (the file merged with the flags) and then used by everything that acts on
//! it: `run` binds from it, `check-config` loads its key material, and SIGHUP, the
//! certificate watch and `POST /admin/tls` rebuild a listener's TLS from the [`TlsPlan`]
//! in effect.
//!
//! Building the plan checks everything that can be checked without binding sockets or
//! loading keys, reports every problem at once, and parses every address and URL exactly
//! once: the provider a listener asks for, its nodes, its health check and whether the
//! process needs the QAT provider are decided here and nowhere else. It opens no sockets
//! and reads no key material.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::access_log::AccessLogConfig;
use crate::config::{
    server_name_problem, Balance, ClientProtocol, Config, ConfigError, ErrorBody, HandshakeOffload,
    HealthCheckConfig, HealthCheckKind, Limits, ListenerMode, RateLimitConfig, UpstreamProtocol,
    UpstreamTlsConfig, MAX_UPSTREAM_NODES,
};
use crate::crypto::qat::QatConfig;
use crate::crypto::ProviderName;
use crate::trust::TrustedProxies;
use crate::upstream::UpstreamAddr;

pub use crate::tls::{SniPlan, TlsPlan};
pub use crate::upstream::HealthCheckPlan;

/// The whole process, checked and parsed.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Client-facing listeners, in configuration order.
    pub listeners: Vec<ListenerPlan>,
    /// The admin listener.
    pub admin: AdminPlan,
    /// Limits and timeouts shared by every listener.
    pub limits: Limits,
    /// Where software providers' handshakes sign (openssl-qat: see `tls::accept`).
    pub offload: HandshakeOffload,
    /// Threads of the handshake pool (0: one per CPU).
    pub pool_threads: usize,
    /// `[qat]`, when some listener asks for openssl-qat (else the provider is not loaded).
    pub qat: Option<QatConfig>,
    /// Peers whose X-Forwarded-For is extended rather than replaced.
    pub trusted: TrustedProxies,
    /// The access log.
    pub access_log: AccessLogConfig,
    /// Trace context and span export.
    pub otel: crate::trace::OtelConfig,
    /// How often certificate and key files are checked for replacement (zero: never).
    pub cert_watch_interval: Duration,
}

/// The admin listener, checked.
#[derive(Clone, Debug)]
pub struct AdminPlan {
    /// Where it listens.
    pub listen: SocketAddr,
    /// The bearer token's file (`POST /admin/tls` is off without it).
    pub token_file: Option<PathBuf>,
    /// Certificate chain and key when the admin port serves TLS.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Open admin connections at most.
    pub max_connections: usize,
    /// Time to receive a request head.
    pub header_read_timeout: Duration,
}

/// One client-facing listener, checked.
#[derive(Clone, Debug)]
pub struct ListenerPlan {
    /// Its position in the configuration (for messages that name `listener[i]`).
    pub index: usize,
    /// Its name in logs and metric labels.
    pub name: String,
    /// Where it listens.
    pub listen: SocketAddr,
    /// What it does with a connection after the handshake, with the settings that mean
    /// something only there.
    pub mode: ModePlan,
    /// Open connections on this listener at most, beside the process-wide limit.
    pub max_connections: Option<usize>,
    /// Open connections per client address at most.
    pub max_connections_per_client: Option<usize>,
    /// How long a connection may move nothing before it is closed; `None`: never (tcp
    /// mode only).
    pub idle_timeout: Option<Duration>,
    /// Upstream nodes, parsed, no duplicates, at least one.
    pub nodes: Vec<UpstreamAddr>,
    /// How a request (a connection in tcp mode) picks its node.
    pub balance: Balance,
    /// The active checks of the nodes.
    pub health_check: HealthCheckPlan,
    /// How `https://` nodes are verified and what is presented to them; `Some` exactly
    /// when some node is `https://`.
    pub upstream_tls: Option<UpstreamTlsConfig>,
    /// The sources a PROXY protocol header is read from; `None`: no header.
    pub proxy_protocol: Option<TrustedProxies>,
    /// What it handshakes with.
    pub tls: TlsPlan,
}

/// A listener's mode (`mode` in the file) with its own settings.
#[derive(Clone, Debug)]
pub enum ModePlan {
    /// L7: requests forwarded one by one.
    Http(HttpPlan),
    /// L4: the decrypted bytes spliced to a node, the connection opened as the protocol
    /// says (the ClientHello first, or PostgreSQL's negotiation).
    Tcp(ClientProtocol),
}

/// What an http listener forwards with.
#[derive(Clone, Debug)]
pub struct HttpPlan {
    /// How requests reach the upstream.
    pub upstream_protocol: UpstreamProtocol,
    /// How long idle upstream connections are kept (zero: none are).
    pub upstream_idle_timeout: Duration,
    /// Whether HSTS and nosniff are added to responses.
    pub security_headers: bool,
    /// The body of the proxy's own REST error answers.
    pub error_body: ErrorBody,
    /// Request rate limits, checked (names unique).
    pub rate_limits: Vec<RateLimitConfig>,
    /// Per-method metrics.
    pub method_metrics: crate::metrics::MethodMetricsConfig,
}

impl ListenerPlan {
    /// `http` or `tcp`, as metric labels say it.
    pub fn mode_label(&self) -> &'static str {
        match self.mode {
            ModePlan::Http(_) => "http",
            ModePlan::Tcp(_) => "tcp",
        }
    }

    /// How clients open their connections.
    pub fn client_protocol(&self) -> ClientProtocol {
        match self.mode {
            ModePlan::Http(_) => ClientProtocol::Tls,
            ModePlan::Tcp(protocol) => protocol,
        }
    }
}

impl Plan {
    /// Checks `config` as a whole and turns it into a plan; every problem is reported,
    /// each naming its field.
    pub fn new(config: &Config) -> Result<Self, ConfigError> {
        let mut problems = Vec::new();
        if config.listeners.is_empty() {
            problems.push(
                "no listener configured: give --listen, --upstream, --cert and --key, or a [[listener]] table in the config file".to_owned(),
            );
        }
        let admin = admin_plan(config, &mut problems);
        let trusted = TrustedProxies::parse(&config.trusted_proxies)
            .map_err(|e| problems.push(e))
            .ok();
        let uses_qat = config
            .listeners
            .iter()
            .any(|l| asked_provider(config, l) == ProviderName::OpensslQat);
        if uses_qat {
            problems.extend(config.qat.problems());
        }
        limits_problems(&config.limits, &mut problems);
        problems.extend(config.access_log.problems());
        problems.extend(config.otel.problems());
        let mut names = std::collections::HashSet::new();
        let mut listeners = Vec::with_capacity(config.listeners.len());
        for i in 0..config.listeners.len() {
            if let Some(l) = listener_plan(config, i, &mut names, &mut problems) {
                listeners.push(l);
            }
        }
        match (admin, trusted) {
            (Some(admin), Some(trusted)) if problems.is_empty() => Ok(Self {
                listeners,
                admin,
                limits: config.limits.clone(),
                offload: config.handshake.offload.unwrap_or(HandshakeOffload::Inline),
                pool_threads: config.handshake.pool_threads,
                qat: uses_qat.then(|| config.qat.clone()),
                trusted,
                access_log: config.access_log.clone(),
                otel: config.otel.clone(),
                cert_watch_interval: config.cert_watch_interval,
            }),
            _ => Err(ConfigError { problems }),
        }
    }
}

/// The provider a listener asks for: its own, else the top-level one.
fn asked_provider(config: &Config, listener: &crate::config::ListenerConfig) -> ProviderName {
    listener.provider.unwrap_or(config.provider)
}

fn admin_plan(config: &Config, problems: &mut Vec<String>) -> Option<AdminPlan> {
    let a = &config.admin;
    let before = problems.len();
    let listen = a.listen.parse::<SocketAddr>().ok();
    if listen.is_none() {
        problems.push(format!(
            "admin.listen: {:?} is not an IP:port address",
            a.listen
        ));
    }
    if a.max_connections == 0 {
        problems.push("admin.max_connections must be at least 1".to_owned());
    }
    if a.header_read_timeout.is_zero() {
        problems.push("admin.header_read_timeout must be greater than zero".to_owned());
    }
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(c), Some(k)) => Some((c.clone(), k.clone())),
        (None, None) => None,
        _ => {
            problems.push(
                "admin.tls_cert and admin.tls_key go together: give both or neither".to_owned(),
            );
            None
        }
    };
    (problems.len() == before).then(|| AdminPlan {
        listen: listen.expect("checked above"),
        token_file: a.token_file.clone(),
        tls,
        max_connections: a.max_connections,
        header_read_timeout: a.header_read_timeout,
    })
}

/// The largest `limits.max_header_bytes` accepted.
const MAX_HEADER_BYTES_CEILING: usize = 16 * 1024 * 1024;

fn limits_problems(l: &Limits, problems: &mut Vec<String>) {
    if l.max_connections == 0 {
        problems.push("limits.max_connections must be at least 1".to_owned());
    }
    if l.max_header_bytes < 8192 {
        problems.push(format!(
            "limits.max_header_bytes = {} is below hyper's minimum buffer of 8192",
            l.max_header_bytes
        ));
    }
    // HTTP/2 carries the limit as SETTINGS_MAX_HEADER_LIST_SIZE, a 32-bit value; above
    // 16 MiB a header block is no request any Qdrant client sends, and the floors it
    // would reserve per connection could not be met.
    if l.max_header_bytes > MAX_HEADER_BYTES_CEILING {
        problems.push(format!(
            "limits.max_header_bytes = {} is above {MAX_HEADER_BYTES_CEILING} (16 MiB)",
            l.max_header_bytes
        ));
    }
    if l.h2_max_concurrent_streams == 0 {
        problems.push("limits.h2_max_concurrent_streams must be at least 1".to_owned());
    }
    for (name, d) in [
        ("limits.handshake_timeout", l.handshake_timeout),
        ("limits.header_read_timeout", l.header_read_timeout),
        ("limits.idle_timeout", l.idle_timeout),
        (
            "limits.upstream_connect_timeout",
            l.upstream_connect_timeout,
        ),
        (
            "limits.upstream_response_timeout",
            l.upstream_response_timeout,
        ),
        ("limits.first_request_timeout", l.first_request_timeout),
        ("limits.stall_timeout", l.stall_timeout),
        ("limits.drain_timeout", l.drain_timeout),
        ("limits.tcp_keepalive", l.tcp_keepalive),
        ("limits.h2_keepalive_interval", l.h2_keepalive_interval),
        ("limits.h2_keepalive_timeout", l.h2_keepalive_timeout),
    ] {
        if d.is_zero() {
            problems.push(format!("{name} must be greater than zero"));
        }
    }
    if l.max_connection_age.is_some_and(|d| d.is_zero()) {
        problems.push("limits.max_connection_age must be greater than zero".to_owned());
    }
    if l.stall_timeout < l.upstream_response_timeout {
        problems.push(format!(
            "limits.stall_timeout ({:?}) must be at least limits.upstream_response_timeout ({:?}): a slow upstream's request would be cut as a stall before its 504",
            l.stall_timeout, l.upstream_response_timeout
        ));
    }
    if l.max_upstream_requests == 0 {
        problems.push("limits.max_upstream_requests must be at least 1".to_owned());
    }
    // RFC 9113 6.5.2: SETTINGS_MAX_FRAME_SIZE is between 2^14 and 2^24 - 1.
    if !(16_384..=16_777_215).contains(&l.h2_max_frame_size) {
        problems.push(format!(
            "limits.h2_max_frame_size = {} must be between 16384 and 16777215 (RFC 9113)",
            l.h2_max_frame_size
        ));
    }
    let floors = l.request_buffer_floors();
    if floors > l.request_buffer_budget() {
        problems.push(format!(
            "limits.request_buffer_budget = {} bytes cannot hold the floors of limits.max_connections = {} connections (64 KiB or max_header_bytes each) and limits.max_upstream_requests = {} upstream requests ({} bytes each: a 400 KiB write queue and a chunk in hand, the larger of 64 KiB, max_header_bytes and h2_max_frame_size): {floors} bytes; raise the budget or lower the limits (limits.h2_max_frame_size = 16384 gives back the floors of before 1 MiB frames)",
            l.request_buffer_budget(),
            l.max_connections,
            l.max_upstream_requests,
            l.upstream_request_floor()
        ));
    }
}

/// The probe in effect for a listener with `nodes` nodes: `auto` decided by the mode and
/// the upstream protocol, and off for a single node (it gets every request whatever its
/// state).
fn effective_health_check(
    hc: &HealthCheckConfig,
    nodes: usize,
    mode: ListenerMode,
    protocol: UpstreamProtocol,
) -> HealthCheckKind {
    match hc.kind {
        HealthCheckKind::Auto if nodes < 2 => HealthCheckKind::Off,
        HealthCheckKind::Auto => match (mode, protocol) {
            (ListenerMode::Tcp, _) => HealthCheckKind::Connect,
            (ListenerMode::Http, UpstreamProtocol::H2c) => HealthCheckKind::Grpc,
            (ListenerMode::Http, _) => HealthCheckKind::Http,
        },
        kind => kind,
    }
}

/// A listener's `upstream_tls`, checked: `Some` when some node is `https://`. Settings
/// without such a node are refused rather than ignored: an operator who wrote them believes
/// the hop is encrypted.
fn upstream_tls_plan(
    lc: &crate::config::ListenerConfig,
    nodes: &[UpstreamAddr],
    field: &dyn Fn(&str) -> String,
    problems: &mut Vec<String>,
) -> Option<UpstreamTlsConfig> {
    let t = &lc.upstream_tls;
    if !nodes.iter().any(|n| n.tls) {
        if !t.is_unset() {
            problems.push(format!(
                "{}: set, but no upstream node is https://: the nodes are reached in plaintext",
                field("upstream_tls")
            ));
        }
        return None;
    }
    for (f, path) in [("ca", &t.ca), ("cert", &t.cert), ("key", &t.key)] {
        if let Some(path) = path.as_ref().filter(|p| !p.is_file()) {
            problems.push(format!(
                "{}: file not found: {}",
                field(&format!("upstream_tls.{f}")),
                path.display()
            ));
        }
    }
    if t.cert.is_some() != t.key.is_some() {
        problems.push(format!(
            "{}: cert and key go together: give both or neither",
            field("upstream_tls")
        ));
    }
    if let Some(name) = &t.server_name {
        if rustls_pki_types::ServerName::try_from(name.as_str()).is_err() {
            problems.push(format!(
                "{}: {name:?} is not a DNS name or an IP address",
                field("upstream_tls.server_name")
            ));
        }
    }
    Some(t.clone())
}

/// A listener's health-check timings, thresholds and path.
fn check_health_check(
    hc: &HealthCheckConfig,
    field: &dyn Fn(&str) -> String,
    problems: &mut Vec<String>,
) {
    if hc.interval.is_zero() || hc.timeout.is_zero() {
        problems.push(format!(
            "{}: interval and timeout must be above zero",
            field("health_check")
        ));
    }
    if hc.unhealthy_threshold == 0 || hc.healthy_threshold == 0 {
        problems.push(format!(
            "{}: unhealthy_threshold and healthy_threshold must be at least 1",
            field("health_check")
        ));
    }
    if hc.ejection_base.is_zero() || hc.ejection_base > hc.ejection_max {
        problems.push(format!(
            "{}: ejection_base must be above zero and at most ejection_max",
            field("health_check")
        ));
    }
    if !hc.path.starts_with('/') {
        problems.push(format!(
            "{}: path {:?} must start with /",
            field("health_check"),
            hc.path
        ));
    }
}

/// A listener's certificate and key files, its SNI certificates (names valid and served by
/// one certificate each) and its TLS policy's client CA, versions and groups.
fn check_tls(
    lc: &crate::config::ListenerConfig,
    field: &dyn Fn(&str) -> String,
    problems: &mut Vec<String>,
) {
    for (f, path) in [("cert", &lc.cert), ("key", &lc.key)] {
        if !path.is_file() {
            problems.push(format!("{}: file not found: {}", field(f), path.display()));
        }
    }
    let mut sni_names = std::collections::HashSet::new();
    for (j, entry) in lc.sni.iter().enumerate() {
        let at = field(&format!("sni[{j}]"));
        if entry.server_names.is_empty() {
            problems.push(format!("{at}.server_names: at least one name is needed"));
        }
        for name in &entry.server_names {
            if let Some(p) = server_name_problem(name) {
                problems.push(format!("{at}.server_names: {p}"));
            } else if !sni_names.insert(name.to_ascii_lowercase()) {
                problems.push(format!(
                    "{at}.server_names: {name:?} is already served by another certificate"
                ));
            }
        }
        for (f, path) in [("cert", &entry.cert), ("key", &entry.key)] {
            if !path.is_file() {
                problems.push(format!("{at}.{f}: file not found: {}", path.display()));
            }
        }
    }
    if let Some(ca) = &lc.tls.client_ca {
        if !ca.is_file() {
            problems.push(format!(
                "{}: file not found: {}",
                field("tls.client_ca"),
                ca.display()
            ));
        }
    }
    if lc.tls.min_version > lc.tls.max_version {
        problems.push(format!(
            "{}: min_version is above max_version",
            field("tls")
        ));
    }
    if lc.tls.kx_groups.as_ref().is_some_and(Vec::is_empty) {
        problems.push(format!(
            "{}: at least one group is needed",
            field("tls.kx_groups")
        ));
    }
}

/// The settings that bound a listener's clients: how they open connections (`protocol`),
/// how many and how long (`max_connections`, `max_connections_per_client`,
/// `idle_timeout`), how fast (`rate_limit`), and what is counted per method.
fn check_client_bounds(
    lc: &crate::config::ListenerConfig,
    field: &dyn Fn(&str) -> String,
    problems: &mut Vec<String>,
) {
    if lc.protocol != ClientProtocol::Tls && lc.mode != ListenerMode::Tcp {
        problems.push(format!(
            "{}: {:?} needs mode = \"tcp\" (the bytes after the handshake are spliced)",
            field("protocol"),
            lc.protocol
        ));
    }
    if lc.max_connections == Some(0) {
        problems.push(format!(
            "{}: must be at least 1 (leave it unset for no per-listener limit)",
            field("max_connections")
        ));
    }
    if lc.max_connections_per_client == Some(0) {
        problems.push(format!(
            "{}: must be at least 1 (leave it unset for no per-client limit)",
            field("max_connections_per_client")
        ));
    }
    if lc.mode == ListenerMode::Tcp && !lc.rate_limit.is_empty() {
        problems.push(format!(
            "{}: a tcp listener sees no requests; limit its connections per client with max_connections_per_client",
            field("rate_limit")
        ));
    }
    let mm = &lc.method_metrics;
    if mm.max_methods == 0 || (mm.collection_label && mm.max_collections == 0) {
        problems.push(format!(
            "{}: max_methods and max_collections must be at least 1",
            field("method_metrics")
        ));
    }
    let mut limit_names = std::collections::BTreeSet::new();
    for (j, limit) in lc.rate_limit.iter().enumerate() {
        let at = |f: &str| field(&format!("rate_limit[{j}].{f}"));
        problems.extend(limit.problems(&at));
        if !limit_names.insert(limit.display_name()) {
            problems.push(format!(
                "{}: {:?} is used twice: give each limit its own name",
                at("name"),
                limit.display_name()
            ));
        }
    }
    if lc.mode == ListenerMode::Http && lc.idle_timeout.is_some_and(|d| d.is_zero()) {
        problems.push(format!(
            "{}: must be greater than zero in http mode",
            field("idle_timeout")
        ));
    }
}

/// Listener `i`, checked; `None` when it has a problem (each pushed to `problems`).
fn listener_plan(
    config: &Config,
    i: usize,
    names: &mut std::collections::HashSet<String>,
    problems: &mut Vec<String>,
) -> Option<ListenerPlan> {
    let lc = &config.listeners[i];
    let before = problems.len();
    let field = |f: &str| format!("listener[{i}].{f}");
    let name = lc.display_name(i);
    if !names.insert(name.clone()) {
        problems.push(format!(
            "{}: duplicate listener name {name:?}",
            field("name")
        ));
    }
    let listen = lc.listen.parse::<SocketAddr>().ok();
    if listen.is_none() {
        problems.push(format!(
            "{}: {:?} is not an IP:port address",
            field("listen"),
            lc.listen
        ));
    }
    if lc.upstream.is_empty() {
        problems.push(format!(
            "{}: at least one node is needed",
            field("upstream")
        ));
    }
    if lc.upstream.len() > MAX_UPSTREAM_NODES {
        problems.push(format!(
            "{}: {} nodes; at most {MAX_UPSTREAM_NODES} per listener",
            field("upstream"),
            lc.upstream.len()
        ));
    }
    let mut nodes: Vec<UpstreamAddr> = Vec::with_capacity(lc.upstream.len());
    for url in &lc.upstream {
        match UpstreamAddr::parse(url, lc.mode == ListenerMode::Tcp) {
            Ok(addr) if nodes.iter().any(|n| n.authority == addr.authority) => {
                problems.push(format!("{}: {addr} is listed twice", field("upstream")))
            }
            Ok(addr) => nodes.push(addr),
            Err(e) => problems.push(format!("{}: {e}", field("upstream"))),
        }
    }
    let hc = &lc.health_check;
    check_health_check(hc, &field, problems);
    let health_kind = effective_health_check(hc, lc.upstream.len(), lc.mode, lc.upstream_protocol);
    if lc.mode == ListenerMode::Tcp
        && matches!(health_kind, HealthCheckKind::Http | HealthCheckKind::Grpc)
    {
        problems.push(format!(
            "{}: a tcp listener's nodes can only be checked with kind = \"connect\"",
            field("health_check.kind")
        ));
    }
    check_tls(lc, &field, problems);
    let upstream_tls = upstream_tls_plan(lc, &nodes, &field, problems);
    let proxy_protocol = lc.proxy_protocol.as_ref().and_then(|pp| {
        if pp.trusted.is_empty() {
            problems.push(format!(
                "{}: empty: name the load balancers' addresses or CIDR blocks",
                field("proxy_protocol.trusted")
            ));
            return None;
        }
        TrustedProxies::parse(&pp.trusted)
            .map_err(|e| problems.push(format!("{}: {e}", field("proxy_protocol"))))
            .ok()
    });
    check_client_bounds(lc, &field, problems);
    if lc.mode == ListenerMode::Tcp && lc.upstream_protocol != UpstreamProtocol::Auto {
        problems.push(format!(
            "{}: only meaningful in http mode (this listener is tcp)",
            field("upstream_protocol")
        ));
    }
    if problems.len() != before {
        return None;
    }
    Some(ListenerPlan {
        index: i,
        name,
        listen: listen.expect("checked above"),
        mode: mode_plan(lc),
        max_connections: lc.max_connections,
        max_connections_per_client: lc.max_connections_per_client,
        idle_timeout: match (lc.idle_timeout, lc.protocol) {
            (Some(d), _) => Some(d).filter(|d| !d.is_zero()),
            (None, ClientProtocol::Postgres) => None,
            (None, ClientProtocol::Tls) => Some(config.limits.idle_timeout),
        },
        nodes,
        balance: lc.balance,
        health_check: HealthCheckPlan {
            kind: health_kind,
            settings: hc.clone(),
        },
        upstream_tls,
        proxy_protocol,
        tls: tls_plan(config, lc),
    })
}

/// What a listener handshakes with: the provider it asks for, its certificates and policy,
/// the ALPN its protocol needs.
fn tls_plan(config: &Config, lc: &crate::config::ListenerConfig) -> TlsPlan {
    TlsPlan {
        provider: asked_provider(config, lc),
        cert: lc.cert.clone(),
        key: lc.key.clone(),
        sni: lc
            .sni
            .iter()
            .map(|s| SniPlan {
                names: s
                    .server_names
                    .iter()
                    .map(|n| n.to_ascii_lowercase())
                    .collect(),
                cert: s.cert.clone(),
                key: s.key.clone(),
            })
            .collect(),
        policy: lc.tls.clone(),
        default_alpn: match lc.protocol {
            // PostgreSQL's own server refuses direct TLS without this ALPN, so a TLS
            // connection made for another protocol cannot be talked into speaking to it.
            ClientProtocol::Postgres => &[crate::postgres::ALPN],
            ClientProtocol::Tls => lc.mode.default_alpn(),
        },
        fallback: config.qat.fallback,
    }
}

/// A listener's mode with the settings that mean something only there.
fn mode_plan(lc: &crate::config::ListenerConfig) -> ModePlan {
    match lc.mode {
        ListenerMode::Http => ModePlan::Http(HttpPlan {
            upstream_protocol: lc.upstream_protocol,
            upstream_idle_timeout: lc.upstream_idle_timeout,
            security_headers: lc.security_headers,
            error_body: lc.error_body,
            rate_limits: lc.rate_limit.clone(),
            method_metrics: lc.method_metrics.clone(),
        }),
        ListenerMode::Tcp => ModePlan::Tcp(lc.protocol),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::qat::Fallback;

    /// A certificate and key file that exist (the plan checks only that they do).
    fn placeholder_cert_files(tag: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (c, k) = (dir.join("a.crt"), dir.join("a.key"));
        std::fs::write(&c, "x").unwrap();
        std::fs::write(&k, "x").unwrap();
        (c, k)
    }

    fn plan_of(text: &str) -> Result<Plan, ConfigError> {
        Plan::new(&toml::from_str::<Config>(text).unwrap())
    }

    #[test]
    fn full_listener_parses_and_every_problem_is_reported() {
        let text = r#"
            provider = "ring"
            [limits]
            handshake_timeout = "2s"
            max_connections = 0
            max_header_bytes = 6511111111111432
            h2_max_frame_size = 8192
            [[listener]]
            name = "grpc"
            listen = "127.0.0.1:6334"
            cert = "/nonexistent/a.crt"
            key = "/nonexistent/a.key"
            upstream = "http://127.0.0.1:16334"
            upstream_protocol = "h2c"
            [listener.tls]
            min_version = "1.3"
            kx_groups = ["x25519", "secp256r1"]
            resumption = false
        "#;
        let c: Config = toml::from_str(text).unwrap();
        assert_eq!(c.limits.handshake_timeout, Duration::from_secs(2));
        assert_eq!(c.listeners[0].tls.kx_groups.as_ref().map(Vec::len), Some(2));
        let all = Plan::new(&c).unwrap_err().to_string();
        assert!(all.contains("limits.max_connections"), "{all}");
        assert!(all.contains("limits.h2_max_frame_size = 8192"), "{all}");
        // Found by the config_text fuzzer: the floors overflowed before this was checked.
        assert!(
            all.contains("limits.max_header_bytes = 6511111111111432 is above"),
            "{all}"
        );
        assert!(all.contains("listener[0].cert: file not found"), "{all}");
        assert!(all.contains("listener[0].key: file not found"), "{all}");
    }

    #[test]
    fn upstream_is_one_url_or_a_list_and_every_node_is_checked() {
        let all = plan_of(
            r#"
            [[listener]]
            listen = "127.0.0.1:1"
            cert = "c"
            key = "k"
            upstream = ["http://n1:6334", "http://n2:6334", "n1:6334", "ftp://n3:6334"]
            upstream_protocol = "h2c"
            balance = "round-robin"
            [listener.health_check]
            interval = "500ms"
            unhealthy_threshold = 0
        "#,
        )
        .unwrap_err()
        .to_string();
        assert!(all.contains("n1:6334 is listed twice"), "{all}");
        assert!(all.contains("ftp://n3:6334"), "{all}");
        assert!(all.contains("unhealthy_threshold"), "{all}");
    }

    /// The decisions taken once, here: the provider a listener asks for, the probe in
    /// effect, the nodes parsed, whether QAT is needed, the mode's ALPN default.
    #[test]
    fn a_good_configuration_becomes_one_plan_with_every_decision_taken() {
        let (c, k) = placeholder_cert_files("plan-test");
        let text = format!(
            r#"
            provider = "ring"
            [qat]
            fallback = "software"
            [[listener]]
            name = "rest"
            listen = "127.0.0.1:6333"
            cert = "{c}"
            key = "{k}"
            upstream = ["http://n1:6333", "n2:6333"]
            [[listener]]
            listen = "[::1]:6334"
            cert = "{c}"
            key = "{k}"
            provider = "openssl-qat"
            upstream = "http://127.0.0.1:6334"
            upstream_protocol = "h2c"
            [[listener.sni]]
            server_names = ["Vectors.Example.com"]
            cert = "{c}"
            key = "{k}"
        "#,
            c = c.display(),
            k = k.display()
        );
        let plan = plan_of(&text).unwrap();
        let [rest, grpc] = &plan.listeners[..] else {
            panic!("two listeners")
        };
        assert_eq!(rest.name, "rest");
        assert_eq!(rest.tls.provider, ProviderName::Ring);
        assert_eq!(rest.nodes.len(), 2);
        assert_eq!(rest.nodes[1].to_string(), "n2:6333");
        assert_eq!(rest.health_check.kind, HealthCheckKind::Http);
        let ModePlan::Http(http) = &rest.mode else {
            panic!("rest is an http listener")
        };
        assert_eq!(http.upstream_protocol, UpstreamProtocol::Auto);
        assert_eq!(rest.tls.default_alpn, ListenerMode::Http.default_alpn());
        assert_eq!(grpc.name, "listener1");
        assert_eq!(grpc.listen, "[::1]:6334".parse::<SocketAddr>().unwrap());
        assert_eq!(grpc.tls.provider, ProviderName::OpensslQat);
        assert_eq!(grpc.tls.fallback, Fallback::Software);
        assert_eq!(grpc.health_check.kind, HealthCheckKind::Off, "one node");
        assert_eq!(grpc.tls.sni[0].names, ["vectors.example.com"]);
        assert!(plan.qat.is_some(), "a listener asks for openssl-qat");
        assert_eq!(plan.offload, HandshakeOffload::Inline);
        assert_eq!(grpc.tls.files().count(), 4);
        // A switch keeps the SNI certificates and never falls back.
        let switched = grpc
            .tls
            .switched(ProviderName::AwsLcRs, "n.crt".into(), "n.key".into());
        assert_eq!(switched.fallback, Fallback::None);
        assert_eq!(switched.sni, grpc.tls.sni);
        std::fs::remove_dir_all(c.parent().unwrap()).ok();
    }

    #[test]
    fn a_postgres_listener_is_tcp_with_its_own_alpn_and_no_idle_limit() {
        let (c, k) = placeholder_cert_files("plan-pg-test");
        let base = format!(
            "[[listener]]\nlisten = \"127.0.0.1:5432\"\ncert = \"{}\"\nkey = \"{}\"\n",
            c.display(),
            k.display()
        );
        let plan = plan_of(&format!(
            "{base}mode = \"tcp\"\nprotocol = \"postgres\"\nupstream = \"tcp://127.0.0.1:15432\"\nmax_connections = 5\n"
        ))
        .unwrap();
        let l = &plan.listeners[0];
        assert!(matches!(l.mode, ModePlan::Tcp(ClientProtocol::Postgres)));
        assert_eq!(l.tls.default_alpn, &[b"postgresql".as_slice()]);
        assert_eq!(l.idle_timeout, None);
        assert_eq!(l.max_connections, Some(5));
        let tcp = plan_of(&format!(
            "{base}mode = \"tcp\"\nupstream = \"tcp://127.0.0.1:15432\"\n"
        ))
        .unwrap();
        assert_eq!(
            tcp.listeners[0].idle_timeout,
            Some(Limits::default().idle_timeout)
        );

        let e = plan_of(&format!(
            "{base}protocol = \"postgres\"\nupstream = \"http://127.0.0.1:6333\"\nmax_connections = 0\nidle_timeout = \"0s\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("protocol: Postgres needs mode = \"tcp\""), "{e}");
        assert!(e.contains("max_connections: must be at least 1"), "{e}");
        assert!(
            e.contains("idle_timeout: must be greater than zero in http mode"),
            "{e}"
        );
    }
}
