//! The process's lifecycle: a [`Plan`] turned into bound listeners (each assembled by
//! `assemble.rs`) and the admin port, served under one connection limit until SIGTERM, then
//! the accept grace and the drain. Reloads are `reload.rs`'s; accepting and each
//! connection's life are `listener.rs`'s.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin::{self, AdminGuards, AdminState, AdminToken};
pub use crate::assemble::StartupError;
use crate::assemble::{start_listener, warn_if_key_readable_by_others, Shared};
use crate::crypto::qat::{self, Activation, QatConfig, QatState};
use crate::http::{BufferBudget, H2_CONNECTION_WINDOW};
use crate::listener::{bind, ListenerCtx};
use crate::metrics::Metrics;
use crate::plan::{ListenerPlan, Plan};
use crate::reload::{ConfigSource, Reloader, Serving};
use crate::switch::TlsSwitch;
use crate::tls::{self, HandshakePool};

/// A bound, ready-to-serve proxy.
pub struct Proxy {
    listeners: Vec<(TcpListener, Arc<ListenerCtx>, ListenerPlan)>,
    admin: TcpListener,
    switch: Arc<TlsSwitch>,
    admin_token: Option<AdminToken>,
    admin_guards: AdminGuards,
    shared: Shared,
    plan: Plan,
    pool: Option<HandshakePool>,
    source: Option<ConfigSource>,
    config_file: Option<std::path::PathBuf>,
}

impl Proxy {
    /// Loads every provider, certificate and key of `plan`, builds the TLS configurations
    /// and binds every socket. Nothing is served yet; any failure is reported before a
    /// client sees it.
    pub async fn bind(plan: &Plan) -> Result<Self, StartupError> {
        let metrics = Metrics::new();
        crate::ratelog::PEER.count_in(metrics.log_suppressed());
        let budget = BufferBudget::new(
            &plan.limits,
            H2_CONNECTION_WINDOW,
            metrics.buffer_budget(plan.limits.request_buffer_budget()),
        );
        let (offload, pool) = tls::offload_for(plan.offload, plan.pool_threads)
            .map_err(StartupError::HandshakePool)?;
        let qat = match &plan.qat {
            Some(qat) => activate_qat(qat)?,
            None => None,
        };
        let [lines, dropped, errors] = metrics.access_log();
        let access_log =
            crate::access_log::AccessLog::start(&plan.access_log, lines, dropped, errors)
                .map_err(StartupError::AccessLog)?;
        if access_log.is_some() {
            tracing::info!(target = %plan.access_log.target, format = ?plan.access_log.format, sample = plan.access_log.sample, "access log on");
        }
        let tracer = crate::trace::Tracer::new(&plan.otel, &metrics).map(Arc::new);
        let mut shared = Shared {
            metrics,
            budget,
            offload,
            qat,
            access_log,
            rate_limits: Default::default(),
            tracer,
        };
        let mut listeners = Vec::with_capacity(plan.listeners.len());
        let mut qat_offload_active = shared.qat.is_some();
        for lp in &plan.listeners {
            let (socket, ctx) = start_listener(lp, plan, &shared)?;
            // openssl-qat fell back to software for this listener: the provider in effect is
            // not the one asked for.
            qat_offload_active &= ctx.tls.current().provider() == lp.tls.provider;
            listeners.push((socket, ctx, lp.clone()));
        }
        shared.qat = shared.qat.take().filter(|_| qat_offload_active);
        let (metrics, qat) = (shared.metrics.clone(), shared.qat.clone());
        if let Some(qat_config) = &plan.qat {
            match crate::crypto::qat::telemetry::read_all(
                &qat_config.telemetry_root,
                qat_config.enable_telemetry,
            ) {
                Ok(devices) => tracing::info!(devices = devices.len(), "QAT telemetry available"),
                Err(reason) => tracing::info!(%reason, "QAT telemetry unavailable"),
            }
            metrics.enable_qat(
                qat.clone(),
                qat_config.telemetry_root.clone(),
                qat_config.enable_telemetry,
            );
        }
        let (admin, admin_token, admin_guards) = bind_admin(plan)?;
        // A handed-over socket no listener of this configuration claimed would queue
        // connections nobody accepts.
        crate::upgrade::drop_unclaimed();
        let switch = Arc::new(TlsSwitch::new(
            listeners
                .iter()
                .map(|(_, ctx, _)| ctx.tls.clone())
                .collect(),
            metrics,
            qat,
        ));
        Ok(Self {
            listeners,
            admin,
            switch,
            admin_token,
            admin_guards,
            shared,
            plan: plan.clone(),
            pool,
            source: None,
            config_file: None,
        })
    }

    /// Reloads read the configuration from `source` (on SIGHUP, and when `config_file` is
    /// replaced); without one a reload re-reads certificate files only.
    pub fn reload_from(
        mut self,
        source: ConfigSource,
        config_file: Option<std::path::PathBuf>,
    ) -> Self {
        self.source = Some(source);
        self.config_file = config_file;
        self
    }

    /// The metrics registry (the upgrade's outcome is counted there).
    pub fn metrics(&self) -> Metrics {
        self.shared.metrics.clone()
    }

    /// The bound addresses: `(listener name, address)`, then the admin address.
    pub fn addresses(&self) -> (Vec<(String, SocketAddr)>, Option<SocketAddr>) {
        let listeners = self
            .listeners
            .iter()
            .filter_map(|(l, ctx, _)| Some((ctx.tls.labels.name.clone(), l.local_addr().ok()?)))
            .collect();
        (listeners, self.admin.local_addr().ok())
    }

    /// Serves until `shutdown` fires, then marks not ready, keeps accepting and serving
    /// for `accept_grace`, drains (stops accepting, lets in-flight requests finish up to
    /// `shutdown_grace`), and returns.
    pub async fn serve(self, shutdown: CancellationToken) {
        let ready = Arc::new(AtomicBool::new(false));
        let admin_stop = CancellationToken::new();
        tokio::spawn(admin::serve(
            self.admin,
            AdminState {
                metrics: self.shared.metrics.clone(),
                ready: ready.clone(),
                switch: self
                    .admin_token
                    .clone()
                    .map(|token| (self.switch.clone(), token)),
            },
            self.admin_guards,
            admin_stop.clone(),
        ));
        let limits = self.plan.limits.clone();
        let cert_watch_interval = self.plan.cert_watch_interval;
        let tracker = TaskTracker::new();
        // What the accept loops and connections drain on: SIGTERM, once `accept_grace`
        // has passed.
        let drain = CancellationToken::new();
        let serving = Serving {
            limit: Arc::new(Semaphore::new(limits.max_connections)),
            tracker: tracker.clone(),
            drain: drain.clone(),
            admin_stop: admin_stop.clone(),
        };
        let running = self
            .listeners
            .into_iter()
            .map(|(socket, ctx, lp)| serving.start(socket, ctx, lp))
            .collect();
        let access_log = self.shared.access_log.clone();
        let reloader = Arc::new(Reloader::new(
            self.source,
            self.config_file,
            self.shared,
            self.switch,
            serving,
            self.plan,
            running,
        ));
        tokio::spawn(crate::reload::on_sighup(
            reloader.clone(),
            admin_stop.clone(),
        ));
        if !cert_watch_interval.is_zero() {
            tokio::spawn(crate::reload::on_file_change(
                reloader.clone(),
                cert_watch_interval,
                admin_stop.clone(),
            ));
        }
        ready.store(true, Ordering::Release);

        shutdown.cancelled().await;
        ready.store(false, Ordering::Release);
        let grace = limits.accept_grace;
        if !grace.is_zero() {
            tracing::info!(accept_grace = ?grace, "not ready; still accepting until the endpoint is removed");
            tokio::time::sleep(grace).await;
        }
        drain.cancel();
        // The loops end on the same token; joining drops the listening sockets.
        for l in reloader.take_accept_loops() {
            let _ = l.await;
        }
        tracker.close();
        let open = tracker.len();
        tracing::info!(
            open_connections = open,
            grace = ?limits.shutdown_grace,
            "draining: no longer accepting"
        );
        if tokio::time::timeout(limits.shutdown_grace, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                open_connections = tracker.len(),
                "grace period over; closing the remaining connections"
            );
        } else {
            tracing::info!("drained");
        }
        admin_stop.cancel();
        if let Some(pool) = self.pool {
            pool.shutdown();
        }
        if let Some(log) = access_log {
            // The lines of the requests that just drained, before the process exits.
            let _ = tokio::task::spawn_blocking(move || log.flush(Duration::from_secs(2))).await;
        }
    }
}

/// The admin listener bound, its token read, its TLS built (served by aws-lc-rs, whatever
/// the listeners use).
fn bind_admin(plan: &Plan) -> Result<(TcpListener, Option<AdminToken>, AdminGuards), StartupError> {
    let a = &plan.admin;
    let admin = bind(crate::upgrade::ADMIN, a.listen, &plan.limits).map_err(|source| {
        StartupError::Bind {
            what: "admin listener".to_owned(),
            addr: a.listen,
            source,
        }
    })?;
    let token = match &a.token_file {
        Some(path) => Some(AdminToken::new(&read_token(path)?)),
        None => None,
    };
    let tls = match &a.tls {
        Some((cert, key)) => {
            let (_, _, tls) = tls::listener_tls(
                crate::config::DEFAULT_PROVIDER,
                cert,
                key,
                &crate::config::TlsPolicy::default(),
                &[b"http/1.1"],
            )
            .map_err(StartupError::AdminTls)?;
            warn_if_key_readable_by_others("admin", key);
            Some(tls)
        }
        None => None,
    };
    if token.is_some() && tls.is_none() && !a.listen.ip().is_loopback() {
        tracing::warn!(admin = %a.listen, "the admin port accepts the bearer token over plain HTTP on a non-loopback address: set admin.tls_cert and admin.tls_key");
    }
    let guards = AdminGuards {
        max_connections: a.max_connections,
        header_read_timeout: a.header_read_timeout,
        tls,
    };
    Ok((admin, token, guards))
}

/// Loads the QAT provider, or explains why not; `None` means software fallback was
/// configured and is in effect.
fn activate_qat(config: &QatConfig) -> Result<Option<Arc<QatState>>, StartupError> {
    match qat::activate_per_fallback(config).map_err(StartupError::Qat)? {
        Activation::Active(state) => {
            tracing::info!(
                provider = %state.name,
                signature_query = %state.property_query,
                polling = ?state.polling,
                settings = %state.settings,
                "QAT provider active: signatures only, asynchronous"
            );
            Ok(Some(state))
        }
        Activation::FellBack(e) => {
            tracing::warn!(error = %e, "QAT offload is off: openssl-qat listeners sign in software OpenSSL (qat.fallback = \"software\")");
            Ok(None)
        }
    }
}

/// The admin bearer token: the file's content, trimmed; empty is refused.
fn read_token(path: &Path) -> Result<String, StartupError> {
    let problem = |problem: String| StartupError::AdminToken {
        path: path.to_owned(),
        problem,
    };
    let text = std::fs::read_to_string(path).map_err(|e| problem(e.to_string()))?;
    let token = text.trim().to_owned();
    if token.len() < 16 {
        return Err(problem(
            "the token must be at least 16 characters".to_owned(),
        ));
    }
    Ok(token)
}

/// Writes the bound addresses as JSON to `path` (atomically), so scripts and the load
/// generator can use port 0 and find out what was bound.
pub fn write_ready_file(
    path: &Path,
    listeners: &[(String, SocketAddr)],
    admin: Option<SocketAddr>,
) -> std::io::Result<()> {
    crate::ready::Ready {
        pid: std::process::id(),
        admin,
        listeners: listeners.iter().cloned().collect(),
        upgrade_failed: None,
    }
    .write(path)
}
