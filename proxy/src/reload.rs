//! Reloads without a restart. On SIGHUP, or when the configuration file is replaced, the
//! configuration is read and checked again (the same file and flags the process started
//! with) and applied to the running proxy; then every listener's certificate files are read
//! again. Replaced certificate files alone reload just the certificates.
//!
//! What a configuration reload changes, and how nothing is dropped:
//! - a listener that stays (same name, same address) keeps its socket, its accept loop and
//!   its TLS state; new connections get a new context (upstream nodes and their TLS,
//!   balancing, health checks, limits, PROXY protocol sources, header policy), while the
//!   connections already open finish on the context they started with. A changed
//!   certificate, provider or TLS policy is rebuilt in place, as a certificate reload is;
//! - a new listener is bound and served; a removed one stops accepting, and its open
//!   connections finish;
//! - a configuration that does not check, or a new listener that cannot start (its address
//!   taken, its key unreadable), refuses the whole reload: the configuration in effect
//!   stays, and the refusal is logged and counted (`proxy_config_reloads_total`).
//!
//! The process-wide settings (the admin port, `max_connections`, the request buffer
//! budget, the handshake pool, QAT, the access log, the watch interval, worker threads,
//! logging) take effect at the next start; a reload that changes them says so.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::assemble::{listener_ctx, start_listener, upstream_tls_label, Shared};
use crate::listener::{accept_loop, ListenerCtx};
use crate::plan::{ListenerPlan, Plan};
use crate::switch::{FileStamp, TlsSwitch};

/// Where a reload reads the configuration from: the file and flags the process started
/// with, read, merged and checked again (`cli` makes it).
pub type ConfigSource = Arc<dyn Fn() -> Result<Plan, String> + Send + Sync>;

/// What every accept loop shares: the connection limit, the connections' tracker, the
/// drain after SIGTERM, and the token that ends background work (health checks).
pub(crate) struct Serving {
    pub(crate) limit: Arc<Semaphore>,
    pub(crate) tracker: TaskTracker,
    pub(crate) drain: CancellationToken,
    pub(crate) admin_stop: CancellationToken,
}

/// A listener in service.
pub(crate) struct RunningListener {
    /// What it was configured with (compared on the next reload).
    plan: ListenerPlan,
    /// The context new connections take; a reload swaps it.
    ctx: Arc<ArcSwap<ListenerCtx>>,
    /// Ends its accept loop: the listener removed by a reload (or the drain, its parent).
    stop: CancellationToken,
    /// Ends the health checks of its current nodes.
    health: CancellationToken,
    accepting: Option<JoinHandle<()>>,
}

impl Serving {
    /// Serves `socket` with `ctx`: its accept loop and its health checks.
    pub(crate) fn start(
        &self,
        socket: TcpListener,
        ctx: Arc<ListenerCtx>,
        plan: ListenerPlan,
    ) -> RunningListener {
        let health = self.start_health(&ctx);
        let ctx = Arc::new(ArcSwap::new(ctx));
        let stop = self.drain.child_token();
        let accepting = tokio::spawn(accept_loop(
            socket,
            ctx.clone(),
            self.limit.clone(),
            self.tracker.clone(),
            stop.clone(),
            self.drain.clone(),
        ));
        RunningListener {
            plan,
            ctx,
            stop,
            health,
            accepting: Some(accepting),
        }
    }

    fn start_health(&self, ctx: &ListenerCtx) -> CancellationToken {
        let token = self.admin_stop.child_token();
        crate::upstream::health::spawn(&ctx.upstreams, &ctx.health_check, &token);
        token
    }
}

/// The running proxy as reloads see it.
pub(crate) struct Reloader {
    source: Option<ConfigSource>,
    config_file: Option<PathBuf>,
    shared: Shared,
    switch: Arc<TlsSwitch>,
    serving: Serving,
    /// One reload at a time; the configuration in effect and its listeners.
    state: Mutex<State>,
}

struct State {
    plan: Plan,
    running: Vec<RunningListener>,
}

/// A listener of the new configuration, ready to install.
enum Prepared {
    /// It keeps `running[index]`'s socket and TLS, with a new context.
    Kept {
        index: usize,
        ctx: Arc<ListenerCtx>,
        plan: ListenerPlan,
    },
    /// A new listener, bound.
    New {
        socket: TcpListener,
        ctx: Arc<ListenerCtx>,
        plan: ListenerPlan,
    },
}

impl Reloader {
    pub(crate) fn new(
        source: Option<ConfigSource>,
        config_file: Option<PathBuf>,
        shared: Shared,
        switch: Arc<TlsSwitch>,
        serving: Serving,
        plan: Plan,
        running: Vec<RunningListener>,
    ) -> Self {
        Self {
            source,
            config_file,
            shared,
            switch,
            serving,
            state: Mutex::new(State { plan, running }),
        }
    }

    /// The accept loops in service, to join once the drain has stopped them.
    pub(crate) fn take_accept_loops(&self) -> Vec<JoinHandle<()>> {
        self.lock()
            .running
            .iter_mut()
            .filter_map(|r| r.accepting.take())
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The configuration, then every listener's certificate files (module docs); each
    /// outcome logged and counted. Returns whether both went through.
    async fn reload_all(self: &Arc<Self>, trigger: &'static str) -> bool {
        let this = self.clone();
        let config = tokio::task::spawn_blocking(move || this.reload_config()).await;
        let (config_ok, rebuilt) = match config {
            Ok(Ok(Some((summary, rebuilt)))) => {
                self.shared.metrics.config_reloaded(true);
                tracing::info!(trigger, "configuration reloaded: {summary}");
                (true, rebuilt)
            }
            // Started without a configuration source: certificates only.
            Ok(Ok(None)) => (true, Vec::new()),
            Ok(Err(e)) => {
                self.shared.metrics.config_reloaded(false);
                tracing::error!(trigger, error = %e, "configuration reload refused: the configuration in effect stays");
                (false, Vec::new())
            }
            Err(e) => {
                self.shared.metrics.config_reloaded(false);
                tracing::error!(trigger, error = %e, "configuration reload panicked: the configuration in effect stays");
                (false, Vec::new())
            }
        };
        let certs_ok = reload_certificates(self.switch.clone(), rebuilt, trigger).await;
        config_ok && certs_ok
    }

    /// Reads, checks and applies the configuration (module docs): a summary and the
    /// listeners whose TLS it rebuilt; `None` without a source. Blocking: file reads, key
    /// loading, binding.
    fn reload_config(&self) -> Result<Option<(String, Vec<String>)>, String> {
        let Some(source) = &self.source else {
            return Ok(None);
        };
        let plan = source()?;
        let mut state = self.lock();
        warn_restart_only(&state.plan, &plan);
        let prepared = self.prepare(&state, &plan)?;
        Ok(Some(self.install(&mut state, plan, prepared)))
    }

    /// Builds every listener of `plan` without touching the running ones; any failure
    /// refuses the reload (sockets bound so far close as they drop).
    fn prepare(&self, state: &State, plan: &Plan) -> Result<Vec<Prepared>, String> {
        let mut taken = vec![false; state.running.len()];
        let mut prepared = Vec::with_capacity(plan.listeners.len());
        for lp in &plan.listeners {
            // The same address (with port 0, the same name too: every such listener has
            // its own port) keeps the socket and its accept loop.
            let same_address = state.running.iter().enumerate().position(|(i, r)| {
                !taken[i]
                    && r.plan.listen == lp.listen
                    && (lp.listen.port() != 0 || r.plan.name == lp.name)
            });
            match same_address {
                Some(i) if state.running[i].plan.name == lp.name => {
                    taken[i] = true;
                    let running = state.running[i].ctx.load();
                    let mut ctx = listener_ctx(lp, plan, &self.shared, running.tls.clone())
                        .map_err(|e| e.to_string())?;
                    if state.running[i].plan.max_connections == lp.max_connections {
                        // The open connections hold slots of the running limit.
                        ctx.connection_slots = running.connection_slots.clone();
                    }
                    prepared.push(Prepared::Kept {
                        index: i,
                        ctx: Arc::new(ctx),
                        plan: lp.clone(),
                    });
                }
                Some(i) => {
                    return Err(format!(
                        "listener[{}]: renaming listener {:?} to {:?} on the same address {} needs a restart (its metrics and switch are by name)",
                        lp.index, state.running[i].plan.name, lp.name, lp.listen
                    ))
                }
                None => {
                    let (socket, ctx) =
                        start_listener(lp, plan, &self.shared).map_err(|e| e.to_string())?;
                    prepared.push(Prepared::New {
                        socket,
                        ctx,
                        plan: lp.clone(),
                    });
                }
            }
        }
        Ok(prepared)
    }

    /// Puts `prepared` in service and retires the listeners `plan` no longer has.
    fn install(
        &self,
        state: &mut State,
        plan: Plan,
        prepared: Vec<Prepared>,
    ) -> (String, Vec<String>) {
        let mut old: Vec<Option<RunningListener>> = std::mem::take(&mut state.running)
            .into_iter()
            .map(Some)
            .collect();
        let mut running = Vec::with_capacity(prepared.len());
        let (mut kept, mut added, mut removed, mut rebuilt) =
            (0, Vec::new(), Vec::new(), Vec::new());
        for p in prepared {
            match p {
                Prepared::Kept {
                    index,
                    ctx,
                    plan: lp,
                } => {
                    // `prepare` takes each running listener at most once.
                    let Some(mut r) = old[index].take() else {
                        continue;
                    };
                    r.health.cancel();
                    r.health = self.serving.start_health(&ctx);
                    tracing::info!(
                        listener = %lp.name,
                        upstream = %ctx.upstreams.describe(),
                        upstream_tls = upstream_tls_label(&lp),
                        proxy_protocol = lp.proxy_protocol.is_some(),
                        balance = ?lp.balance,
                        health_check = ?lp.health_check.kind,
                        "listener reconfigured: new connections use it, open ones finish as they are"
                    );
                    r.ctx.store(ctx);
                    if r.plan.tls != lp.tls {
                        let tls = r.ctx.load().tls.clone();
                        rebuilt.push(lp.name.clone());
                        if let Err(e) = self.switch.rebuild(&tls, &lp.tls) {
                            tracing::error!(listener = %lp.name, error = %e, "TLS rebuild failed: the previous certificate and provider stay in use");
                        }
                    }
                    r.plan = lp;
                    kept += 1;
                    running.push(r);
                }
                Prepared::New {
                    socket,
                    ctx,
                    plan: lp,
                } => {
                    added.push(lp.name.clone());
                    running.push(self.serving.start(socket, ctx, lp));
                }
            }
        }
        for r in old.into_iter().flatten() {
            r.stop.cancel();
            r.health.cancel();
            tracing::info!(listener = %r.plan.name, "listener removed: no longer accepting; its open connections finish");
            removed.push(r.plan.name);
        }
        self.switch
            .set_listeners(running.iter().map(|r| r.ctx.load().tls.clone()).collect());
        state.running = running;
        state.plan = plan;
        (
            format!("{kept} listener(s) kept, added {added:?}, removed {removed:?}"),
            rebuilt,
        )
    }

    /// What a change of the configuration file looks like (see [`TlsSwitch::file_stamps`]).
    fn config_stamp(&self) -> Option<FileStamp> {
        self.config_file.as_deref().map(FileStamp::of)
    }
}

/// The settings a reload cannot change in a running process: said when they differ.
fn warn_restart_only(old: &Plan, new: &Plan) {
    let mut changed = Vec::new();
    let mut check = |name: &'static str, differs: bool| {
        if differs {
            changed.push(name);
        }
    };
    check(
        "admin",
        format!("{:?}", old.admin) != format!("{:?}", new.admin),
    );
    check(
        "limits.max_connections",
        old.limits.max_connections != new.limits.max_connections,
    );
    check(
        "limits.request_buffer_budget",
        old.limits.request_buffer_budget() != new.limits.request_buffer_budget(),
    );
    check(
        "handshake",
        old.offload != new.offload || old.pool_threads != new.pool_threads,
    );
    check("qat", format!("{:?}", old.qat) != format!("{:?}", new.qat));
    check("access_log", old.access_log != new.access_log);
    check("otel", old.otel != new.otel);
    check(
        "cert_watch_interval",
        old.cert_watch_interval != new.cert_watch_interval,
    );
    if !changed.is_empty() {
        tracing::warn!(settings = ?changed, "changed settings that take effect at the next restart; the rest of the configuration is applied");
    }
}

/// Reloads every listener's certificate and key but `skip` (rebuilt just now) on a
/// blocking thread (key loading and the signing proof are CPU work and file I/O); failures
/// are logged and counted, and the old certificate stays. Returns whether every listener
/// reloaded.
async fn reload_certificates(
    switch: Arc<TlsSwitch>,
    skip: Vec<String>,
    trigger: &'static str,
) -> bool {
    let outcomes = match tokio::task::spawn_blocking(move || switch.reload(&skip)).await {
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

/// SIGHUP: the configuration and the certificates (module docs).
pub(crate) async fn on_sighup(reloader: Arc<Reloader>, stop: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGHUP: reloads are off");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            got = hangups.recv() => if got.is_none() { return },
        }
        reloader.reload_all("SIGHUP").await;
    }
}

/// Reloads without a signal: every `interval` the configuration file and the certificate
/// and key files are stat'ed (following symlinks). A replaced configuration file reloads
/// everything, as SIGHUP does; replaced certificate files reload the certificates. Polling,
/// not inotify: it sees a Kubernetes `..data` symlink swap and a file replaced by rename
/// alike, costs a few `stat` calls per interval, and needs no watch to be re-armed after a
/// rename. A pair caught half-written fails its reload (the old pair stays, logged and
/// counted) and is reloaded again once the second file lands; so is a configuration that
/// does not check yet.
pub(crate) async fn on_file_change(
    reloader: Arc<Reloader>,
    interval: Duration,
    stop: CancellationToken,
) {
    let stamps = |reloader: &Arc<Reloader>| {
        let reloader = reloader.clone();
        tokio::task::spawn_blocking(move || {
            (reloader.config_stamp(), reloader.switch.file_stamps())
        })
    };
    let Ok(mut seen) = stamps(&reloader).await else {
        return;
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let Ok(now) = stamps(&reloader).await else {
            return;
        };
        if now == seen {
            continue;
        }
        let ok = if now.0 != seen.0 {
            tracing::info!("configuration file replaced: reloading");
            reloader.reload_all("configuration file replaced").await
        } else {
            tracing::info!("certificate or key file replaced: reloading");
            reload_certificates(reloader.switch.clone(), Vec::new(), "file change").await
        };
        seen = if ok {
            // Taken after the reload: an admin switch to other files during it would
            // otherwise look like one more change.
            match stamps(&reloader).await {
                Ok(after) => after,
                Err(_) => return,
            }
        } else {
            // A failed reload is tried again as soon as anything changes after what it
            // read.
            now
        };
    }
}
