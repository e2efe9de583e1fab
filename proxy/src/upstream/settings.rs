//! The settings of a listener's upstream nodes, as the configuration file spells them:
//! how a request picks a node ([`Balance`]), how nodes are checked
//! ([`HealthCheckConfig`]) and how `https://` nodes are verified ([`UpstreamTlsConfig`]). They belong to this module, which acts on them; `config` reads
//! them from the file.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How a request picks its upstream node among the healthy ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Balance {
    /// The node with the fewest requests in flight (ties go round the nodes): a slow node
    /// gets less, as Envoy's and nginx's least-request balancers do.
    #[default]
    LeastRequests,
    /// Each node in turn.
    RoundRobin,
}

/// How a listener checks its upstream nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum HealthCheckKind {
    /// With several nodes: `grpc` for h2c listeners, `connect` in tcp mode, `http`
    /// otherwise; with one node: `off` (it gets every request whatever its state).
    #[default]
    Auto,
    /// `GET {path}` over HTTP/1.1 (Qdrant's `/readyz`); any 2xx is healthy.
    Http,
    /// `grpc.health.v1.Health/Check` over h2c; SERVING is healthy.
    Grpc,
    /// A TCP connect.
    Connect,
    /// No active checks (connect failures still eject a node for a while).
    Off,
}

/// Active health checks (one probe per node per interval) and passive ejection (a node
/// whose connect failed is skipped for a backoff that doubles up to a maximum).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct HealthCheckConfig {
    /// What a probe is.
    pub kind: HealthCheckKind,
    /// The HTTP probe's path.
    pub path: String,
    /// Time between two probes of one node.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// A probe that has not answered in this time failed.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Consecutive failed probes that take a node out.
    pub unhealthy_threshold: u32,
    /// Consecutive good probes that bring it back.
    pub healthy_threshold: u32,
    /// First ejection after a failed connect; each further failure doubles it.
    #[serde(with = "humantime_serde")]
    pub ejection_base: Duration,
    /// The longest ejection.
    #[serde(with = "humantime_serde")]
    pub ejection_max: Duration,
}

impl Default for HealthCheckConfig {
    fn default() -> Self {
        Self {
            kind: HealthCheckKind::Auto,
            path: "/readyz".to_owned(),
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            unhealthy_threshold: 2,
            healthy_threshold: 2,
            ejection_base: Duration::from_secs(1),
            ejection_max: Duration::from_secs(30),
        }
    }
}

/// TLS from the proxy to its `https://` upstream nodes: a Qdrant with
/// `service.enable_tls`, or one on another node or in another cluster, so the hop is
/// encrypted end to end. Made with aws-lc-rs whatever the listener's provider (it is the
/// client side: verification only, no private-key operation to offload), TLS 1.3 and
/// 1.2, the production key-exchange groups, ALPN `h2` or `http/1.1` by
/// `upstream_protocol`, and session resumption (pooled connections are rarely new).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsConfig {
    /// CA certificates (PEM) that the nodes' certificates must chain to. Unset: the
    /// system's trust store (a public CA, e.g. Qdrant Cloud).
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// Certificate chain presented to nodes that ask for one (mTLS), with `key`.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// The private key of `cert`.
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// The name sent as SNI and verified in every node's certificate. Unset: each node's
    /// host from its URL (a name, or an IP address matched against IP SANs).
    #[serde(default)]
    pub server_name: Option<String>,
}

impl UpstreamTlsConfig {
    /// Nothing set: no upstream TLS settings (they apply only to `https://` nodes).
    pub fn is_unset(&self) -> bool {
        *self == Self::default()
    }
}

/// The active checks of a listener's nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct HealthCheckPlan {
    /// The probe in effect: never `Auto` (decided by the mode, the upstream protocol and
    /// the number of nodes).
    pub kind: HealthCheckKind,
    /// Its interval, timeout, thresholds and path.
    pub settings: HealthCheckConfig,
}
