//! The running proxy: listeners bound, the connection limit, each connection's life from
//! accept through handshake to HTTP or TCP forwarding, and graceful shutdown.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntGauge;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin::{self, AdminGuards, AdminState, AdminToken};
use crate::config::{Config, HealthCheckConfig, HealthCheckKind, Limits, ListenerMode};
use crate::crypto::qat::{self, Fallback, QatState};
use crate::http::{BufferBudget, HttpForwarder, H2_CONNECTION_WINDOW};
use crate::io::{Activity, CountingIo, Quiet, QuietLimits};
use crate::metrics::{ListenerMetrics, Metrics};
use crate::switch::{ListenerTls, SwitchableListener, TlsSwitch};
use crate::tls::{self, HandshakePool, Offload};
use crate::trust::TrustedProxies;
use crate::upstream::{UpstreamAddr, UpstreamPool};

/// Pending connections the kernel queues per listener. A new-connection-per-request
/// benchmark opens connections in bursts; a short queue turns bursts into SYN retries
/// (a one-second stall) instead of waiting connections.
const LISTEN_BACKLOG: u32 = 4096;
/// TCP keep-alive probes: one every 10 s after `limits.tcp_keepalive` of silence, and the
/// connection is dropped after 3 unanswered ones.
const TCP_KEEPALIVE_PROBE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
const TCP_KEEPALIVE_PROBES: u32 = 3;

/// A start-up failure: one line that names the listener, file or flag.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StartupError(pub String);

/// What the connection task needs to know about its listener.
struct ListenerCtx {
    name: String,
    tls: Arc<SwitchableListener>,
    offload: Offload,
    limits: Limits,
    metrics: ListenerMetrics,
    mode: Mode,
    upstreams: Arc<UpstreamPool>,
    /// The active checks of `upstreams` (resolved: never `Auto`) and their settings.
    health_check: (HealthCheckKind, HealthCheckConfig),
}

enum Mode {
    Http(Arc<HttpForwarder>),
    Tcp,
}

/// A bound, ready-to-serve proxy.
pub struct Proxy {
    listeners: Vec<(TcpListener, Arc<ListenerCtx>)>,
    admin: TcpListener,
    switch: Arc<TlsSwitch>,
    admin_token: Option<AdminToken>,
    admin_guards: AdminGuards,
    metrics: Metrics,
    limits: Limits,
    pool: Option<HandshakePool>,
    cert_watch_interval: Duration,
    access_log: Option<Arc<crate::access_log::AccessLog>>,
}

impl Proxy {
    /// Loads every provider, certificate and key, builds the TLS configurations and binds
    /// every socket. Nothing is served yet; any failure is reported before a client sees it.
    pub async fn bind(config: &Config) -> Result<Self, StartupError> {
        config
            .validate()
            .map_err(|e| StartupError(e.problems.join("\n")))?;
        let metrics = Metrics::new();
        crate::ratelog::PEER.count_in(metrics.log_suppressed());
        let budget = BufferBudget::new(
            &config.limits,
            H2_CONNECTION_WINDOW,
            metrics.buffer_budget(config.limits.request_buffer_budget()),
        );
        let trusted = TrustedProxies::parse(&config.trusted_proxies).map_err(StartupError)?;
        let (offload, pool) =
            tls::offload_for(config.effective_offload(), config.handshake.pool_threads)
                .map_err(|e| StartupError(format!("cannot start the handshake pool: {e}")))?;
        let qat_state = if config.uses_qat() {
            activate_qat(config)?
        } else {
            None
        };
        let mut qat_offload_active = qat_state.is_some();

        let [lines, dropped, errors] = metrics.access_log();
        let access_log =
            crate::access_log::AccessLog::start(&config.access_log, lines, dropped, errors)
                .map_err(|e| StartupError(format!("access log: {e}")))?;
        if access_log.is_some() {
            tracing::info!(target = %config.access_log.target, format = ?config.access_log.format, sample = config.access_log.sample, "access log on");
        }
        let mut listeners = Vec::with_capacity(config.listeners.len());
        for (i, lc) in config.listeners.iter().enumerate() {
            let name = lc.display_name(i);
            let at = |what: &str, e: &dyn std::fmt::Display| {
                StartupError(format!("listener {name:?} (listener[{i}]): {what}{e}"))
            };
            let default_alpn = lc.mode.default_alpn();
            let resolved = tls::resolve_configured(config, lc, qat_state.as_deref())
                .map_err(|e| at("", &e))?;
            if let Some(proof) = &resolved.qat_proof {
                tracing::info!(listener = %name, "QAT start-up proof: {proof}");
            }
            if let Some(why) = &resolved.fell_back {
                tracing::warn!(listener = %name, reason = %why, "QAT offload is off for this listener: signing in software OpenSSL (qat.fallback = \"software\")");
                if qat_state.is_some() {
                    qat_offload_active = false;
                }
            }
            warn_if_key_readable_by_others(&name, &lc.key);
            let tls::ResolvedTls {
                provider,
                cert,
                config: tls_config,
                ..
            } = resolved;
            let provider_name = provider.name();
            let nodes = lc
                .upstream
                .iter()
                .map(|url| UpstreamAddr::parse(url, lc.mode == ListenerMode::Tcp))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| at("upstream: ", &e))?;
            let addr: SocketAddr = lc
                .listen
                .parse()
                .map_err(|e| at(&format!("listen address {:?}: ", lc.listen), &e))?;
            let socket = bind(addr, &config.limits)
                .map_err(|e| at(&format!("cannot listen on {addr}: "), &e))?;
            let mode_label = match lc.mode {
                ListenerMode::Http => "http",
                ListenerMode::Tcp => "tcp",
            };
            let lm = metrics.listener(
                &name,
                provider_name.as_str(),
                cert.algorithm.label(),
                mode_label,
                tls::handshake_label(provider_name, offload.label()),
            );
            let upstreams = Arc::new(UpstreamPool::new(nodes, lc.balance, &lc.health_check, &lm));
            let health_kind =
                lc.health_check
                    .effective_kind(lc.upstream.len(), lc.mode, lc.upstream_protocol);
            let mode = match lc.mode {
                ListenerMode::Http => Mode::Http(Arc::new(HttpForwarder::new(
                    upstreams.clone(),
                    lc.upstream_protocol,
                    config.limits.clone(),
                    lm.clone(),
                    budget.clone(),
                    trusted.clone(),
                    lc.security_headers,
                    access_log.clone(),
                ))),
                ListenerMode::Tcp => Mode::Tcp,
            };
            tracing::info!(
                listener = %name,
                listen = %socket.local_addr().map_or(addr, |a| a),
                upstream = %upstreams.describe(),
                balance = ?lc.balance,
                health_check = ?health_kind,
                mode = mode_label,
                provider = provider_name.as_str(),
                library = %provider.library_version(),
                certificate = %cert.algorithm,
                key_bits = cert.algorithm.key_bits(),
                subject = %cert.subject,
                tls = %format!("{}-{}", lc.tls.min_version, lc.tls.max_version),
                kx_groups = %lc.tls.kx_groups.iter().map(|g| g.as_str()).collect::<Vec<_>>().join(","),
                resumption = lc.tls.resumption,
                mtls = lc.tls.client_ca.is_some(),
                handshake = tls::handshake_label(provider_name, offload.label()),
                "listener ready"
            );
            metrics.set_certificate_expiry(&name, cert.not_after);
            let sni_sources: Vec<crate::switch::SniSource> = lc
                .sni
                .iter()
                .map(|s| (s.server_names.clone(), s.cert.clone(), s.key.clone()))
                .collect();
            let sni = crate::switch::build_sni(
                &sni_sources,
                provider_name,
                &crate::switch::ListenerTlsShape {
                    name: &name,
                    policy: &lc.tls,
                    default_alpn,
                    mode_label,
                    offload_label: offload.label(),
                },
                qat_state.as_deref(),
                &metrics,
            )
            .map_err(|e| at("", &e))?;
            crate::switch::list_sni(&metrics, &name, &sni);
            for s in &sni {
                warn_if_key_readable_by_others(&name, &s.key);
                tracing::info!(listener = %name, server_names = %s.names.join(","), certificate = %s.cert.display(), algorithm = s.algorithm, "SNI certificate ready");
            }
            if let Some(warning) = cert.expiry_warning() {
                tracing::warn!(listener = %name, certificate = %lc.cert.display(), "{warning}");
            }
            let switchable = Arc::new(SwitchableListener::new(
                name.clone(),
                ListenerTls {
                    config: tls_config,
                    metrics: lm.clone(),
                    provider: provider_name,
                    algorithm: cert.algorithm.label(),
                    cert: lc.cert.clone(),
                    key: lc.key.clone(),
                    sni,
                },
                lc.tls.clone(),
                default_alpn,
                mode_label,
                offload.label(),
            ));
            listeners.push((
                socket,
                Arc::new(ListenerCtx {
                    name,
                    tls: switchable,
                    offload: offload.clone(),
                    limits: config.limits.clone(),
                    metrics: lm,
                    mode,
                    upstreams,
                    health_check: (health_kind, lc.health_check.clone()),
                }),
            ));
        }
        if config.uses_qat() {
            match crate::crypto::qat::telemetry::read_all(
                &config.qat.telemetry_root,
                config.qat.enable_telemetry,
            ) {
                Ok(devices) => tracing::info!(devices = devices.len(), "QAT telemetry available"),
                Err(reason) => tracing::info!(%reason, "QAT telemetry unavailable"),
            }
            metrics.enable_qat(
                qat_state.clone().filter(|_| qat_offload_active),
                config.qat.telemetry_root.clone(),
                config.qat.enable_telemetry,
            );
        }
        let admin_addr: SocketAddr =
            config.admin.listen.parse().map_err(|e| {
                StartupError(format!("admin.listen {:?}: {e}", config.admin.listen))
            })?;
        let admin = bind(admin_addr, &config.limits).map_err(|e| {
            StartupError(format!(
                "admin listener: cannot listen on {admin_addr}: {e}"
            ))
        })?;
        let token = match &config.admin.token_file {
            Some(path) => Some(AdminToken::new(&read_token(path)?)),
            None => None,
        };
        let admin_tls = match (&config.admin.tls_cert, &config.admin.tls_key) {
            (Some(cert), Some(key)) => {
                let (_, _, tls) = tls::listener_tls(
                    crate::config::DEFAULT_PROVIDER,
                    cert,
                    key,
                    &crate::config::TlsPolicy::default(),
                    &[b"http/1.1"],
                )
                .map_err(|e| StartupError(format!("admin TLS: {e}")))?;
                warn_if_key_readable_by_others("admin", key);
                Some(tls)
            }
            _ => None,
        };
        if token.is_some() && admin_tls.is_none() && !admin_addr.ip().is_loopback() {
            tracing::warn!(admin = %admin_addr, "the admin port accepts the bearer token over plain HTTP on a non-loopback address: set admin.tls_cert and admin.tls_key");
        }
        let switch = Arc::new(TlsSwitch::new(
            listeners.iter().map(|(_, ctx)| ctx.tls.clone()).collect(),
            metrics.clone(),
            qat_state.filter(|_| qat_offload_active),
        ));
        Ok(Self {
            listeners,
            admin,
            switch,
            admin_token: token,
            admin_guards: AdminGuards {
                max_connections: config.admin.max_connections,
                header_read_timeout: config.admin.header_read_timeout,
                tls: admin_tls,
            },
            metrics,
            limits: config.limits.clone(),
            pool,
            cert_watch_interval: config.cert_watch_interval,
            access_log,
        })
    }

    /// The bound addresses: `(listener name, address)`, then the admin address.
    pub fn addresses(&self) -> (Vec<(String, SocketAddr)>, Option<SocketAddr>) {
        let listeners = self
            .listeners
            .iter()
            .filter_map(|(l, ctx)| Some((ctx.name.clone(), l.local_addr().ok()?)))
            .collect();
        (listeners, self.admin.local_addr().ok())
    }

    /// Serves until `shutdown` fires, then drains: stops accepting, marks not ready, lets
    /// in-flight requests finish up to the grace period, and returns.
    pub async fn serve(self, shutdown: CancellationToken) {
        let ready = Arc::new(AtomicBool::new(false));
        let admin_stop = CancellationToken::new();
        tokio::spawn(admin::serve(
            self.admin,
            AdminState {
                metrics: self.metrics.clone(),
                ready: ready.clone(),
                switch: self
                    .admin_token
                    .clone()
                    .map(|token| (self.switch.clone(), token)),
            },
            self.admin_guards,
            admin_stop.clone(),
        ));
        tokio::spawn(reload_on_sighup(self.switch.clone(), admin_stop.clone()));
        if !self.cert_watch_interval.is_zero() {
            tokio::spawn(reload_on_file_change(
                self.switch.clone(),
                self.cert_watch_interval,
                admin_stop.clone(),
            ));
        }
        let limit = Arc::new(Semaphore::new(self.limits.max_connections));
        let tracker = TaskTracker::new();
        let mut accept_loops = Vec::with_capacity(self.listeners.len());
        for (listener, ctx) in self.listeners {
            let (kind, settings) = &ctx.health_check;
            crate::upstream::health::spawn(&ctx.upstreams, *kind, settings, &admin_stop);
            accept_loops.push(tokio::spawn(accept_loop(
                listener,
                ctx,
                limit.clone(),
                tracker.clone(),
                shutdown.clone(),
            )));
        }
        ready.store(true, Ordering::Release);

        shutdown.cancelled().await;
        ready.store(false, Ordering::Release);
        for l in accept_loops {
            // The loops end on the same token; joining drops the listening sockets.
            let _ = l.await;
        }
        tracker.close();
        let open = tracker.len();
        tracing::info!(
            open_connections = open,
            grace = ?self.limits.shutdown_grace,
            "draining: no longer accepting"
        );
        if tokio::time::timeout(self.limits.shutdown_grace, tracker.wait())
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
        if let Some(log) = &self.access_log {
            // The lines of the requests that just drained, before the process exits.
            let log = log.clone();
            let _ = tokio::task::spawn_blocking(move || log.flush(Duration::from_secs(2))).await;
        }
    }
}

/// Certificate rotation: every SIGHUP reads each listener's certificate and key files again
/// (see [`TlsSwitch::reload`]) on a blocking thread, since key loading and the signing proof
/// are CPU work and file I/O. Failures are logged and counted; the old configuration stays.
async fn reload_on_sighup(switch: Arc<TlsSwitch>, stop: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGHUP: certificate reload is off");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            got = hangups.recv() => if got.is_none() { return },
        }
        let switch = switch.clone();
        reload(switch, "SIGHUP").await;
    }
}

/// Reloads every listener's certificate and key on a blocking thread (key loading and the
/// signing proof are CPU work and file I/O); failures are logged and counted, and the old
/// configuration stays.
/// Returns whether every listener reloaded.
async fn reload(switch: Arc<TlsSwitch>, trigger: &'static str) -> bool {
    let outcomes = match tokio::task::spawn_blocking(move || switch.reload()).await {
        Ok(o) => o,
        Err(e) => {
            tracing::error!(error = %e, trigger, "certificate reload panicked");
            return false;
        }
    };
    let mut all_ok = true;
    for (listener, outcome) in outcomes {
        if let Err(e) = outcome {
            all_ok = false;
            tracing::error!(%listener, error = %e, trigger, "certificate reload failed: the previous certificate stays in use");
        }
    }
    all_ok
}

/// Certificate rotation without a signal: every `interval` the certificate and key files
/// are stat'ed (following symlinks), and a change reloads them as SIGHUP does. Polling, not
/// inotify: it sees a Kubernetes `..data` symlink swap and a file replaced by rename alike,
/// costs two `stat` calls per listener per interval, and needs no watch to be re-armed
/// after a rename. A pair caught half-written fails its reload (the old pair stays, logged
/// and counted) and is reloaded again once the second file lands.
async fn reload_on_file_change(
    switch: Arc<TlsSwitch>,
    interval: Duration,
    stop: CancellationToken,
) {
    let stamps = |switch: &Arc<TlsSwitch>| {
        let switch = switch.clone();
        tokio::task::spawn_blocking(move || switch.file_stamps())
    };
    let Ok(mut seen) = stamps(&switch).await else {
        return;
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let Ok(now) = stamps(&switch).await else {
            return;
        };
        if now != seen {
            tracing::info!("certificate or key file replaced: reloading");
            seen = if reload(switch.clone(), "file change").await {
                // Taken after the reload: an admin switch to other files during it would
                // otherwise look like one more change.
                match stamps(&switch).await {
                    Ok(after) => after,
                    Err(_) => return,
                }
            } else {
                // A failed reload (a pair caught half-written) is tried again as soon as
                // anything changes after what it read.
                now
            };
        }
    }
}

/// Loads the QAT provider, or explains why not; `None` means software fallback was
/// configured and is in effect.
fn activate_qat(config: &Config) -> Result<Option<Arc<QatState>>, StartupError> {
    match qat::activate(&config.qat) {
        Ok(state) => {
            tracing::info!(
                provider = %state.name,
                signature_query = %state.property_query,
                settings = %state.settings,
                "QAT provider active: signatures only, asynchronous"
            );
            Ok(Some(state))
        }
        Err(e) if config.qat.fallback == Fallback::Software => {
            tracing::warn!(error = %e, "QAT offload is off: openssl-qat listeners sign in software OpenSSL (qat.fallback = \"software\")");
            Ok(None)
        }
        Err(e) => Err(StartupError(format!("openssl-qat: {e}"))),
    }
}

/// The admin bearer token: the file's content, trimmed; empty is refused.
fn read_token(path: &Path) -> Result<String, StartupError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| StartupError(format!("admin.token_file {}: {e}", path.display())))?;
    let token = text.trim().to_owned();
    if token.len() < 16 {
        return Err(StartupError(format!(
            "admin.token_file {}: the token must be at least 16 characters",
            path.display()
        )));
    }
    Ok(token)
}

fn bind(addr: SocketAddr, limits: &Limits) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // Lets a restarted proxy bind while old connections sit in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    set_connection_options(&socket, limits)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// TCP_NODELAY, so small responses (gRPC acks, JSON results) do not wait for Nagle, and
/// SO_KEEPALIVE, so the kernel finds a peer that vanished (power loss, a NAT that forgot
/// the connection) even between requests, when no deadline of ours runs. Set on the
/// listening socket, Linux copies both to every accepted connection for free.
fn set_connection_options(socket: &impl std::os::fd::AsFd, limits: &Limits) -> std::io::Result<()> {
    let socket = socket2::SockRef::from(socket);
    socket.set_tcp_nodelay(true)?;
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(limits.tcp_keepalive)
        .with_interval(TCP_KEEPALIVE_PROBE_INTERVAL)
        .with_retries(TCP_KEEPALIVE_PROBES);
    socket.set_tcp_keepalive(&keepalive)
}

async fn accept_loop(
    listener: TcpListener,
    ctx: Arc<ListenerCtx>,
    limit: Arc<Semaphore>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) {
    loop {
        // Take a slot before accepting: at the limit, new connections wait in the kernel's
        // queue instead of being accepted and starved.
        let permit = tokio::select! {
            p = limit.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = shutdown.cancelled() => return,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    // EMFILE and friends: back off briefly rather than spin.
                    tracing::warn!(listener = %ctx.name, error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => return,
        };
        tracker.spawn(handle_connection(
            ctx.clone(),
            stream,
            peer,
            permit,
            shutdown.clone(),
        ));
    }
}

/// Decrements the active-connections gauge however the connection task ends.
struct ActiveGuard(IntGauge);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

async fn handle_connection(
    ctx: Arc<ListenerCtx>,
    stream: TcpStream,
    peer: SocketAddr,
    _permit: OwnedSemaphorePermit,
    shutdown: CancellationToken,
) {
    let m = &ctx.metrics;
    m.accepted.inc();
    m.active.inc();
    let _active = ActiveGuard(m.active.clone());
    // Linux hands the listener's TCP_NODELAY and keep-alive settings to every accepted
    // socket (see `bind`); elsewhere they are set here, five system calls per connection.
    #[cfg(not(target_os = "linux"))]
    let _ = set_connection_options(&stream, &ctx.limits);
    let activity = Activity::new(
        matches!(ctx.mode, Mode::Tcp),
        ctx.limits.h2_max_reset_streams,
    );
    let io = CountingIo::new(stream, m.received.clone(), m.sent.clone(), activity.clone());
    let started = Instant::now();

    // Read once: a switch while this handshake runs does not affect it.
    let current = ctx.tls.current();
    // Until the ClientHello names a server, failures count against the default certificate.
    let m = &current.metrics;
    // The handshake's and the forwarding's state machines are boxed, so the task itself
    // (allocated for every connection at accept) holds only what an idle connection needs:
    // inline, they made it 11 KiB, most of an idle connection's memory.
    let handshake = tokio::time::timeout(
        ctx.limits.handshake_timeout,
        Box::pin(tls::accept(
            io,
            |server_name| current.config_for(server_name),
            &ctx.offload,
            current.waits_for_signer(),
        )),
    )
    .await;
    let tls_stream = match handshake {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            m.handshake_failed("error");
            m.connection_error("handshake");
            crate::peer_warn!(listener = %ctx.name, %peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            m.handshake_failed("timeout");
            m.connection_error("handshake_timeout");
            crate::peer_warn!(
                listener = %ctx.name,
                %peer,
                timeout = ?ctx.limits.handshake_timeout,
                "TLS handshake timed out"
            );
            return;
        }
    };
    let (version, resumed, h2) = tls::describe(&tls_stream);
    let m = current.metrics_for(tls_stream.get_ref().1.server_name());
    m.handshake_ok(version, resumed, started.elapsed());

    match &ctx.mode {
        Mode::Http(forwarder) => {
            let mut tls_stream = tls_stream;
            if !h2 {
                match first_request_bytes(
                    &mut tls_stream,
                    &activity,
                    forwarder.quiet_limits(),
                    &shutdown,
                )
                .await
                {
                    FirstBytes::Arrived => {}
                    FirstBytes::Quiet(why) => {
                        m.connection_closed(why.label());
                        return;
                    }
                    FirstBytes::Draining => return,
                }
            }
            if let Err(e) = Box::pin(forwarder.serve(
                tls_stream,
                h2,
                peer,
                crate::http::TlsFacts {
                    version,
                    resumed,
                    provider: current.provider.as_str(),
                },
                activity,
                shutdown,
            ))
            .await
            {
                if !is_benign_close(&e) {
                    m.connection_error("http");
                    crate::peer_warn!(listener = %ctx.name, %peer, error = %e, "connection error");
                }
            }
        }
        Mode::Tcp => {
            // The server has nothing to say first in tcp mode: see `acknowledge_finished`.
            acknowledge_finished(tls_stream.get_ref().0.get_ref());
            match Box::pin(crate::tcp::splice(
                tls_stream,
                &ctx.upstreams,
                ctx.limits.upstream_connect_timeout,
                activity,
                ctx.limits.idle_timeout,
            ))
            .await
            {
                Ok(_) => {}
                Err(e @ crate::tcp::SpliceError::Connect { .. }) => {
                    m.upstream_error("connect");
                    m.connection_error("upstream_connect");
                    crate::peer_warn!(listener = %ctx.name, %peer, error = %e, "connection error");
                }
                Err(crate::tcp::SpliceError::Copy(e)) => {
                    if !matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionReset
                            | std::io::ErrorKind::BrokenPipe
                            | std::io::ErrorKind::UnexpectedEof
                    ) {
                        m.connection_error("io");
                        crate::peer_warn!(listener = %ctx.name, %peer, error = %e, "connection error");
                    }
                }
            }
        }
    }
}

/// How the wait for an HTTP/1.1 client's first bytes ended.
enum FirstBytes {
    Arrived,
    Quiet(Quiet),
    Draining,
}

/// Waits until an HTTP/1.1 client has sent something after the handshake, at most the
/// first-request timeout. Until then the connection holds no HTTP state: hyper allocates
/// its 8 KiB read buffer as soon as it is polled, which was a third of an idle
/// connection's memory (nginx too allocates its buffer only when data arrives).
async fn first_request_bytes(
    stream: &mut tokio_rustls::server::TlsStream<CountingIo<TcpStream>>,
    activity: &Activity,
    limits: &QuietLimits,
    shutdown: &CancellationToken,
) -> FirstBytes {
    let (io, conn) = stream.get_mut();
    // The request may have come with the client's Finished and already sit in rustls.
    match conn.process_new_packets() {
        Ok(state) if state.plaintext_bytes_to_read() == 0 && !state.peer_has_closed() => {}
        // Data, a close or an error: hyper's first read sees it.
        _ => return FirstBytes::Arrived,
    }
    let tcp = io.get_ref();
    // Usually the request is already in the socket: one peek says so without the round trip
    // through the reactor that waiting for readiness would cost.
    let mut probe = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    match socket2::SockRef::from(tcp).peek(&mut probe) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        // Data, end of stream or an error: hyper's first read sees it.
        _ => return FirstBytes::Arrived,
    }
    // Nothing yet: the client may be waiting for the ACK of its Finished.
    acknowledge_finished(tcp);
    tokio::select! {
        _ = tcp.readable() => FirstBytes::Arrived,
        why = activity.wait_quiet(limits) => FirstBytes::Quiet(why),
        _ = shutdown.cancelled() => FirstBytes::Draining,
    }
}

/// A private key anybody on the host can read is a key anybody on the host has.
fn warn_if_key_readable_by_others(listener: &str, key: &Path) {
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

/// Sends the ACK of the client's Finished now. A client that keeps Nagle on holds its first
/// request until that ACK arrives; HTTP/2 answers the handshake with SETTINGS, which carries
/// it, but HTTP/1.1 and tcp mode have nothing to send (and no session tickets when
/// resumption is off), so the kernel would hold it for its delayed-ACK timer: the first
/// response came 41 ms after the handshake. Done only when the request is not already
/// there, so most clients never see the extra packet; `loadgen bench` showed no difference
/// in CPU per connection with it (waiting a millisecond first instead left Nagle clients at
/// 2.3 ms).
fn acknowledge_finished(tcp: &TcpStream) {
    let _ = socket2::SockRef::from(tcp).set_tcp_quickack(true);
}

/// A client that goes away between requests is normal, not an error worth a log line.
fn is_benign_close(e: &hyper::Error) -> bool {
    if e.is_incomplete_message() || e.is_canceled() {
        return false;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            );
        }
        source = s.source();
    }
    false
}

/// Writes the bound addresses as JSON to `path` (atomically), so scripts and the load
/// generator can use port 0 and find out what was bound.
pub fn write_ready_file(
    path: &Path,
    listeners: &[(String, SocketAddr)],
    admin: Option<SocketAddr>,
) -> std::io::Result<()> {
    let listeners: serde_json::Map<String, serde_json::Value> = listeners
        .iter()
        .map(|(n, a)| (n.clone(), serde_json::Value::String(a.to_string())))
        .collect();
    let doc = serde_json::json!({
        "pid": std::process::id(),
        "admin": admin.map(|a| a.to_string()),
        "listeners": listeners,
    });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, doc.to_string())?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Accepted connections get TCP_NODELAY and the keep-alive settings from the
    /// listening socket (on Linux by inheritance, elsewhere per connection).
    #[tokio::test]
    async fn accepted_sockets_have_nodelay_and_keepalive() {
        let limits = Limits {
            tcp_keepalive: std::time::Duration::from_secs(45),
            ..Limits::default()
        };
        let listener = bind("127.0.0.1:0".parse().unwrap(), &limits).unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        #[cfg(not(target_os = "linux"))]
        set_connection_options(&accepted, &limits).unwrap();
        let s = socket2::SockRef::from(&accepted);
        assert!(s.tcp_nodelay().unwrap());
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), limits.tcp_keepalive);
        assert_eq!(
            s.tcp_keepalive_interval().unwrap(),
            TCP_KEEPALIVE_PROBE_INTERVAL
        );
        assert_eq!(s.tcp_keepalive_retries().unwrap(), TCP_KEEPALIVE_PROBES);
    }
}
