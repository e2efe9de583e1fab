//! A listener's serving state assembled from its plan, for start-up and for reloads alike:
//! its TLS built (QAT proof and fallback included), its socket bound, its nodes, their TLS
//! and the forwarder set up; what every listener shares; and why that can fail.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::{ClientProtocol, Limits};
use crate::crypto::qat::{QatError, QatState};
use crate::crypto::CryptoError;
use crate::http::{BufferBudget, ForwarderContext, HttpForwarder, OperatorControls};
use crate::listener::{bind, ListenerCtx, Mode};
use crate::metrics::Metrics;
use crate::plan::{ListenerPlan, ModePlan, Plan};
use crate::switch::SwitchableListener;
use crate::tls::{self, Offload};
use crate::tls::{build_listener_tls, ListenerLabels, TlsBuildError};
use crate::upstream::{UpstreamPool, UpstreamTlsPair};

/// Why the proxy could not start; each names the listener, file, address or setting.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// A listener's TLS: provider, certificate, key, SNI certificate or QAT proof.
    #[error("listener {name:?} (listener[{index}]): {source}")]
    ListenerTls {
        /// The listener's name.
        name: String,
        /// Its position in the configuration.
        index: usize,
        /// What failed (boxed: start-up's other errors are small).
        source: Box<TlsBuildError>,
    },
    /// A listener's `upstream_tls`: its CA, client certificate or key.
    #[error("listener {name:?} (listener[{index}]): upstream_tls: {source}")]
    UpstreamTls {
        /// The listener's name.
        name: String,
        /// Its position in the configuration.
        index: usize,
        /// What failed.
        source: CryptoError,
    },
    /// A socket could not be bound.
    #[error("{what}: cannot listen on {addr}: {source}")]
    Bind {
        /// The listener (`listener "rest" (listener[0])`, `admin listener`).
        what: String,
        /// The address.
        addr: SocketAddr,
        /// The operating system's answer.
        source: std::io::Error,
    },
    /// The QAT provider could not be activated (and `qat.fallback` is `none`).
    #[error("openssl-qat: {0}")]
    Qat(QatError),
    /// The access log's file could not be opened.
    #[error("access log: {0}")]
    AccessLog(std::io::Error),
    /// The handshake pool's threads could not be started.
    #[error("cannot start the handshake pool: {0}")]
    HandshakePool(std::io::Error),
    /// The admin token file is unreadable or too short.
    #[error("admin.token_file {}: {problem}", path.display())]
    AdminToken {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The admin port's certificate or key.
    #[error("admin TLS: {0}")]
    AdminTls(CryptoError),
}

/// What every listener of the process shares, made once at start-up (a reload keeps it:
/// these settings take effect at the next start).
pub(crate) struct Shared {
    pub(crate) metrics: Metrics,
    pub(crate) budget: Arc<BufferBudget>,
    pub(crate) offload: Offload,
    /// The QAT provider, when active for the listeners that asked for it.
    pub(crate) qat: Option<Arc<QatState>>,
    pub(crate) access_log: Option<Arc<crate::access_log::AccessLog>>,
    /// Rate limits and per-client connection counts, kept across reloads.
    pub(crate) rate_limits: Arc<crate::rate_limit::Registry>,
    /// `[otel]`, for the process's life (a change needs a restart).
    pub(crate) tracer: Option<Arc<crate::trace::Tracer>>,
}

/// One listener of `plan`: its TLS built (QAT proof and fallback included), its socket
/// bound, its nodes and forwarder set up.
pub(crate) fn start_listener(
    lp: &ListenerPlan,
    plan: &Plan,
    shared: &Shared,
) -> Result<(TcpListener, Arc<ListenerCtx>), StartupError> {
    let name = &lp.name;
    let labels = ListenerLabels {
        name: name.clone(),
        mode: lp.mode_label(),
        offload: shared.offload.label(),
    };
    let built = build_listener_tls(&lp.tls, &labels, shared.qat.as_deref(), &shared.metrics)
        .map_err(|source| StartupError::ListenerTls {
            name: name.clone(),
            index: lp.index,
            source: Box::new(source),
        })?;
    if let Some(proof) = &built.qat_proof {
        tracing::info!(listener = %name, "QAT start-up proof: {proof}");
    }
    if let Some(why) = &built.fell_back {
        tracing::warn!(listener = %name, reason = %why, "QAT offload is off for this listener: signing in software OpenSSL (qat.fallback = \"software\")");
    }
    for key in lp.tls.keys() {
        warn_if_key_readable_by_others(name, key);
    }
    let socket = bind(name, lp.listen, &plan.limits).map_err(|source| StartupError::Bind {
        what: format!("listener {name:?} (listener[{}])", lp.index),
        addr: lp.listen,
        source,
    })?;
    for (s, p) in built.tls.sni.iter().zip(&lp.tls.sni) {
        tracing::info!(listener = %name, server_names = %p.names.join(","), algorithm = s.algorithm, "SNI certificate ready");
    }
    let (provider, cert) = (built.provider, built.cert);
    let tls = Arc::new(SwitchableListener::new(labels, built.tls, &shared.metrics));
    let ctx = listener_ctx(lp, plan, shared, tls)?;
    let policy = &lp.tls.policy;
    tracing::info!(
        listener = %name,
        listen = %socket.local_addr().map_or(lp.listen, |a| a),
        upstream = %ctx.upstreams.describe(),
        proxy_protocol = lp.proxy_protocol.is_some(),
        upstream_tls = upstream_tls_label(lp),
        balance = ?lp.balance,
        health_check = ?lp.health_check.kind,
        mode = lp.mode_label(),
        provider = provider.name().as_str(),
        library = %provider.library_version(),
        certificate = %cert.algorithm,
        key_bits = cert.algorithm.key_bits(),
        subject = %cert.subject,
        tls = %format!("{}-{}", policy.min_version, policy.max_version),
        kx_groups = %provider.kx_group_names().join(","),
        resumption = policy.resumption,
        mtls = policy.client_ca.is_some(),
        handshake = tls::handshake_label(provider.name(), shared.offload.label()),
        "listener ready"
    );
    Ok((socket, Arc::new(ctx)))
}

/// How a listener reaches `https://` nodes, for its log line.
pub(crate) fn upstream_tls_label(lp: &ListenerPlan) -> &'static str {
    match &lp.upstream_tls {
        None => "off",
        Some(t) if t.ca.is_some() => "ca file",
        Some(_) => "system roots",
    }
}

/// What a listener serves with besides its socket: `tls` (built at start, or kept by a
/// reload), its nodes and their TLS, the forwarder, limits and PROXY protocol sources.
pub(crate) fn listener_ctx(
    lp: &ListenerPlan,
    plan: &Plan,
    shared: &Shared,
    tls: Arc<SwitchableListener>,
) -> Result<ListenerCtx, StartupError> {
    let lm = tls.current().metrics.clone();
    let upstream_tls = lp
        .upstream_tls
        .as_ref()
        .map(UpstreamTlsPair::new)
        .transpose()
        .map_err(|source| StartupError::UpstreamTls {
            name: lp.name.clone(),
            index: lp.index,
            source,
        })?;
    let upstreams = Arc::new(UpstreamPool::new(
        lp.nodes.clone(),
        lp.balance,
        &lp.health_check.settings,
        upstream_tls,
        &lm,
    ));
    let limits = Limits {
        // None only in tcp mode (the plan refuses it in http mode): zero, no limit.
        idle_timeout: lp.idle_timeout.unwrap_or(std::time::Duration::ZERO),
        ..plan.limits.clone()
    };
    let mode = match &lp.mode {
        ModePlan::Http(http) => Mode::Http(Arc::new(HttpForwarder::new(
            http,
            ForwarderContext {
                pool: upstreams.clone(),
                limits: limits.clone(),
                metrics: lm.clone(),
                budget: shared.budget.clone(),
                trusted: plan.trusted.clone(),
                access_log: shared.access_log.clone(),
                controls: OperatorControls {
                    rate_limits: shared.rate_limits.limiters(
                        &lp.name,
                        &http.rate_limits,
                        &shared.metrics,
                    ),
                    methods: shared.metrics.methods(&lp.name, &http.method_metrics),
                    tracer: shared.tracer.clone(),
                },
            },
        ))),
        ModePlan::Tcp(protocol) => Mode::Tcp(*protocol),
    };
    if lp.client_protocol() == ClientProtocol::Postgres {
        lm.postgres_openings_at_zero();
    }
    Ok(ListenerCtx {
        tls,
        offload: shared.offload.clone(),
        limits,
        metrics: lm,
        mode,
        upstreams,
        health_check: lp.health_check.clone(),
        proxy_protocol: lp.proxy_protocol.clone(),
        connection_slots: lp
            .max_connections
            .map(|n| Arc::new(tokio::sync::Semaphore::new(n))),
        client_connections: lp.max_connections_per_client.map(|cap| {
            shared
                .rate_limits
                .client_connections(&lp.name, cap, &shared.metrics)
        }),
    })
}

/// A private key anybody on the host can read is a key anybody on the host has.
pub(crate) fn warn_if_key_readable_by_others(listener: &str, key: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(key) {
        let mode = meta.permissions().mode();
        if mode & 0o004 != 0 {
            tracing::warn!(
                %listener,
                key = %key.display(),
                mode = %format!("{:o}", mode & 0o777),
                "the private key file is readable by every user of this host: chmod o-r (0600 or 0640)"
            );
        }
    }
}
