//! The command line: `proxy run`, `proxy gen-certs`, `proxy check-config`.
//!
//! Exit codes: 0 success (including a drained shutdown on SIGTERM/SIGINT), 1 a failure
//! while running or starting (bad key, port in use, ...), 2 a usage or configuration error.
//!
//! `listener_flags` holds the flags of the one listener the command line can describe.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConfigError, HandshakeOffload};
use crate::crypto::{generate_cert_set_valid_for, CertAlgorithmName, ProviderName};
use crate::plan::Plan;
use crate::server::{write_ready_file, Proxy};

mod listener_flags;
use listener_flags::ListenerFlags;

/// TLS terminator for vector-database ingestion (rustls with a run-time crypto provider).
#[derive(Debug, Parser)]
#[command(name = "proxy", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Terminate TLS and forward to the upstream.
    Run(Box<RunArgs>),
    /// Write a CA and a server certificate per algorithm (plus a client certificate).
    GenCerts(GenCertsArgs),
    /// Print the resolved configuration, or every error in it.
    CheckConfig(CheckConfigArgs),
    /// Upgrade a running proxy in place: SIGUSR2 to the pid in its ready file, then wait
    /// until the new process serves (exit 0) or the running one reports that the new one
    /// could not take over and keeps serving (exit 1).
    Upgrade(UpgradeArgs),
}

/// `proxy upgrade`.
#[derive(Debug, Args)]
pub struct UpgradeArgs {
    /// The ready file of the running proxy (`proxy run --ready-file`; the package's unit
    /// writes /run/vector-tls-proxy/ready.json).
    #[arg(long, value_name = "FILE")]
    ready_file: PathBuf,
    /// How long to wait for the outcome.
    #[arg(long, value_name = "DURATION", default_value = "90s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// `proxy run`: flags override the config file; with no file the flags alone are enough.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// TOML configuration file.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    overrides: Overrides,
    /// Write the bound addresses as JSON here once listening (useful with port 0).
    #[arg(long, value_name = "FILE")]
    ready_file: Option<PathBuf>,
}

/// Settings that can come from flags as well as from the file.
#[derive(Clone, Debug, Args, Default)]
pub struct Overrides {
    /// The listener's own settings.
    #[command(flatten)]
    listener: ListenerFlags,
    /// Crypto provider: ring, aws-lc-rs, openssl, openssl-qat.
    #[arg(long, value_name = "P")]
    provider: Option<ProviderName>,
    /// Admin listener (/metrics, /healthz, /readyz).
    #[arg(long, value_name = "ADDR")]
    admin: Option<String>,
    /// Bearer token file that enables POST /admin/tls (run-time provider/certificate switch).
    #[arg(long, value_name = "FILE")]
    admin_token_file: Option<PathBuf>,
    /// Certificate (PEM) to serve the admin port over TLS; with --admin-tls-key.
    #[arg(long, value_name = "FILE")]
    admin_tls_cert: Option<PathBuf>,
    /// Private key (PEM) for --admin-tls-cert.
    #[arg(long, value_name = "FILE")]
    admin_tls_key: Option<PathBuf>,
    /// Where handshakes sign: inline (on the reactor) or pool (dedicated threads).
    #[arg(long, value_enum)]
    handshake_offload: Option<HandshakeOffload>,
    /// Threads in the handshake pool (0: one per CPU).
    #[arg(long, value_name = "N")]
    handshake_threads: Option<usize>,
    /// OpenSSL provider name for openssl-qat.
    #[arg(long, value_name = "NAME")]
    qat_provider_name: Option<String>,
    /// Directory holding the provider module, or the module file itself.
    #[arg(long, value_name = "PATH")]
    qat_module_path: Option<PathBuf>,
    /// Who polls the QAT provider: internal (its own thread; the default, and what QAT
    /// hardware needs), external (qat_sw: the proxy's signer computes each batch itself with
    /// the module's qat_sw_poll) or inline (QAT hardware: the requesting thread).
    #[arg(long, value_enum)]
    qat_polling: Option<crate::crypto::qat::Polling>,
    /// If the QAT provider cannot be used: none (refuse to start) or software.
    #[arg(long, value_enum)]
    qat_fallback: Option<crate::crypto::qat::Fallback>,
    /// The QAT provider's batch width: 8 for qat_sw (the default), 1 for QAT hardware.
    #[arg(long, value_name = "N")]
    qat_batch: Option<usize>,
    /// The longest a part batch of QAT signatures waits to fill (default 5ms).
    #[arg(long, value_name = "DURATION")]
    qat_batch_wait: Option<humantime::Duration>,
    /// Send ECDSA P-256 signatures to the QAT provider too (off by default: qat_sw gains
    /// less on them than the hand-off costs).
    #[arg(long, value_name = "BOOL")]
    qat_offload_p256: Option<bool>,
    /// Generate X25519 key pairs ahead in QAT provider batches (off by default: see
    /// docs/proxy.md, qat.offload_x25519).
    #[arg(long, value_name = "BOOL")]
    qat_offload_x25519: Option<bool>,
    /// Root of the sysfs tree holding QAT telemetry (default /sys).
    #[arg(long, value_name = "DIR")]
    qat_telemetry_root: Option<PathBuf>,
    /// Reactor worker threads (0: one per CPU).
    #[arg(long, value_name = "N")]
    worker_threads: Option<usize>,
    /// Maximum open client connections.
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// Largest request body accepted, in bytes (larger ones get 413).
    #[arg(long, value_name = "BYTES")]
    max_request_body: Option<u64>,
    /// TLS handshake timeout (e.g. 10s, 500ms).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    handshake_timeout: Option<Duration>,
    /// Time allowed for the upstream's response headers.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    upstream_timeout: Option<Duration>,
    /// Idle connection timeout.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    idle_timeout: Option<Duration>,
    /// How long in-flight requests may take to finish after SIGTERM.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    shutdown_grace: Option<Duration>,
    /// After SIGTERM: how long to keep accepting, reporting not ready, before draining.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    accept_grace: Option<Duration>,
    /// How often certificate and key files are checked for replacement (0s: never; SIGHUP
    /// still reloads).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    cert_watch_interval: Option<Duration>,
    /// A connection that sends no request this long after its handshake is closed.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    first_request_timeout: Option<Duration>,
    /// A connection with requests in flight on which nothing moves this long is closed.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    stall_timeout: Option<Duration>,
    /// A connection asked to close that is still open after this is closed hard.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    drain_timeout: Option<Duration>,
    /// Connections older than this are asked to close (default: no maximum).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    max_connection_age: Option<Duration>,
    /// Concurrent requests forwarded to the upstream; beyond it 503 / RESOURCE_EXHAUSTED.
    #[arg(long, value_name = "N")]
    max_upstream_requests: Option<usize>,
    /// Request bytes the proxy may hold across all connections.
    #[arg(long, value_name = "BYTES")]
    request_buffer_budget: Option<u64>,
    /// The largest HTTP/2 frame clients may send (16384 to 16777215).
    #[arg(long, value_name = "BYTES")]
    h2_max_frame_size: Option<u32>,
    /// A peer (address or CIDR block) that is a proxy itself and may set X-Forwarded-For;
    /// repeatable.
    #[arg(long = "trusted-proxy", value_name = "CIDR")]
    trusted_proxies: Vec<String>,
    /// Log filter (overridden by RUST_LOG): error, warn, info, debug, trace.
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,
    /// Log lines as text (the default) or JSON, one object per line (for log shippers).
    #[arg(long, value_enum)]
    log_format: Option<crate::config::LogFormat>,
    /// Access log: off (the default), stdout, or a file to append to.
    #[arg(long, value_name = "TARGET")]
    access_log: Option<String>,
    /// Access log lines as JSON (the default) or the common log format.
    #[arg(long, value_enum, value_name = "FORMAT")]
    access_log_format: Option<crate::access_log::AccessLogFormat>,
    /// Log this share of the requests (0 < F <= 1).
    #[arg(long, value_name = "F")]
    access_log_sample: Option<f64>,
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "yes" => Ok(true),
        "off" | "false" | "no" => Ok(false),
        _ => Err(format!("expected on or off, got {s:?}")),
    }
}

#[derive(Debug, Args)]
struct GenCertsArgs {
    /// Output directory.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Extra subject alternative names (DNS names or IP addresses), beside localhost,
    /// 127.0.0.1 and ::1.
    #[arg(long = "san", value_name = "NAME")]
    sans: Vec<String>,
    /// Algorithms to generate (default: all four).
    #[arg(long, value_delimiter = ',', value_name = "ALGS")]
    algorithms: Option<Vec<CertAlgorithmName>>,
    /// Validity of the server and client certificates, in days (1 to 397).
    #[arg(long, value_name = "DAYS", default_value_t = crate::crypto::LEAF_VALIDITY_DAYS)]
    days: u32,
}

#[derive(Debug, Args)]
struct CheckConfigArgs {
    /// The TOML file to check.
    file: PathBuf,
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(*args),
        Command::GenCerts(args) => gen_certs(args),
        Command::CheckConfig(args) => check_config(args),
        Command::Upgrade(args) => upgrade(&args),
    }
}

/// `proxy upgrade`: the signal, then the ready file watched for the outcome.
fn upgrade(args: &UpgradeArgs) -> ExitCode {
    let read = || -> Result<crate::launch::Ready, String> {
        let text = std::fs::read_to_string(&args.ready_file)
            .map_err(|e| format!("{}: {e}", args.ready_file.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", args.ready_file.display()))
    };
    let before = match read() {
        Ok(r) => r,
        Err(e) => return fail(2, &e),
    };
    let pid = nix::unistd::Pid::from_raw(before.pid as i32);
    if let Err(e) = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR2) {
        return fail(1, &format!("SIGUSR2 to pid {}: {e}", before.pid));
    }
    let deadline = std::time::Instant::now() + args.timeout;
    while std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        match read() {
            Ok(now) if now.pid != before.pid => {
                println!("upgraded: pid {} -> {}", before.pid, now.pid);
                return ExitCode::SUCCESS;
            }
            Ok(now)
                if now.upgrade_failed.is_some() && now.upgrade_failed != before.upgrade_failed =>
            {
                return fail(
                    1,
                    &format!(
                        "the upgrade failed and pid {} keeps serving: {}",
                        before.pid,
                        now.upgrade_failed.unwrap_or_default()
                    ),
                );
            }
            // Mid-rename, or not yet changed.
            _ => {}
        }
    }
    fail(
        1,
        &format!(
            "no outcome within {:?}: pid {} still names itself in {}",
            args.timeout,
            before.pid,
            args.ready_file.display()
        ),
    )
}

fn fail(code: u8, msg: &dyn std::fmt::Display) -> ExitCode {
    for line in msg.to_string().lines() {
        eprintln!("proxy: error: {line}");
    }
    ExitCode::from(code)
}

/// Merges the file (if any) and the flags into one configuration (checked by
/// [`Plan::new`], not here).
pub fn resolve(config_file: Option<&PathBuf>, o: &Overrides) -> Result<Config, ConfigError> {
    let mut cfg = match config_file {
        Some(path) => Config::from_file(path)?,
        None => Config::empty(),
    };
    apply_process_flags(&mut cfg, o);
    o.listener.apply(&mut cfg)?;
    // A listener given by flags that overrides the file's provider for the whole process
    // must not be shadowed by the listener's own provider setting.
    if o.provider.is_some() && o.listener.is_set() {
        cfg.listeners[0].provider = None;
    }
    Ok(cfg)
}

/// The flags that set process-wide settings.
fn apply_process_flags(cfg: &mut Config, o: &Overrides) {
    if let Some(p) = o.provider {
        cfg.provider = p;
    }
    if let Some(f) = &o.admin_tls_cert {
        cfg.admin.tls_cert = Some(f.clone());
    }
    if let Some(f) = &o.admin_tls_key {
        cfg.admin.tls_key = Some(f.clone());
    }
    if let Some(f) = &o.admin_token_file {
        cfg.admin.token_file = Some(f.clone());
    }
    if let Some(a) = &o.admin {
        cfg.admin.listen = a.clone();
    }
    if let Some(l) = &o.log_level {
        cfg.log_level = l.clone();
    }
    if let Some(f) = o.log_format {
        cfg.log_format = f;
    }
    if let Some(t) = &o.access_log {
        cfg.access_log.target = t.clone();
    }
    if let Some(f) = o.access_log_format {
        cfg.access_log.format = f;
    }
    if let Some(s) = o.access_log_sample {
        cfg.access_log.sample = s;
    }
    if let Some(n) = o.worker_threads {
        cfg.worker_threads = n;
    }
    if let Some(h) = o.handshake_offload {
        cfg.handshake.offload = Some(h);
    }
    if let Some(v) = &o.qat_provider_name {
        cfg.qat.provider_name = v.clone();
    }
    if let Some(v) = &o.qat_module_path {
        cfg.qat.module_path = Some(v.clone());
    }
    if let Some(v) = o.qat_polling {
        cfg.qat.polling = v;
    }
    if let Some(v) = o.qat_fallback {
        cfg.qat.fallback = v;
    }
    if let Some(v) = o.qat_batch {
        cfg.qat.batch = v;
    }
    if let Some(v) = o.qat_batch_wait {
        cfg.qat.batch_wait = v.into();
    }
    if let Some(v) = o.qat_offload_x25519 {
        cfg.qat.offload_x25519 = v;
    }
    if let Some(v) = o.qat_offload_p256 {
        cfg.qat.offload_p256 = v;
    }

    if let Some(v) = &o.qat_telemetry_root {
        cfg.qat.telemetry_root = v.clone();
    }
    if let Some(n) = o.handshake_threads {
        cfg.handshake.pool_threads = n;
    }
    if let Some(n) = o.max_connections {
        cfg.limits.max_connections = n;
    }
    if let Some(n) = o.max_request_body {
        cfg.limits.max_request_body_bytes = n;
    }
    if let Some(d) = o.handshake_timeout {
        cfg.limits.handshake_timeout = d;
    }
    if let Some(d) = o.upstream_timeout {
        cfg.limits.upstream_response_timeout = d;
    }
    if let Some(d) = o.idle_timeout {
        cfg.limits.idle_timeout = d;
    }
    if let Some(d) = o.cert_watch_interval {
        cfg.cert_watch_interval = d;
    }
    if let Some(d) = o.shutdown_grace {
        cfg.limits.shutdown_grace = d;
    }
    if let Some(d) = o.accept_grace {
        cfg.limits.accept_grace = d;
    }
    if let Some(d) = o.first_request_timeout {
        cfg.limits.first_request_timeout = d;
    }
    if let Some(d) = o.stall_timeout {
        cfg.limits.stall_timeout = d;
    }
    if let Some(d) = o.drain_timeout {
        cfg.limits.drain_timeout = d;
    }
    if let Some(d) = o.max_connection_age {
        cfg.limits.max_connection_age = Some(d);
    }
    if let Some(n) = o.max_upstream_requests {
        cfg.limits.max_upstream_requests = n;
    }
    if let Some(n) = o.h2_max_frame_size {
        cfg.limits.h2_max_frame_size = n;
    }
    if let Some(n) = o.request_buffer_budget {
        cfg.limits.request_buffer_budget_bytes = Some(n);
    }
    if !o.trusted_proxies.is_empty() {
        cfg.trusted_proxies = o.trusted_proxies.clone();
    }
}

/// The flags that describe one listener: a new one when the file has none, else the
/// file's only listener (with several, they would be ambiguous).
fn init_logging(level: &str, format: crate::config::LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    match format {
        crate::config::LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        // One JSON object per line: time, level, the event's fields flattened beside the
        // message, and its span.
        crate::config::LogFormat::Json => logs.json().flatten_event(true).init(),
    }
}

/// Raises the soft limit on open files to the hard one, as Go's runtime and nginx's
/// `worker_rlimit_nofile` do: the soft default (1024 under systemd and Docker) caps a proxy
/// far below `max_connections`, while the hard limit is what the operator allowed. A
/// container engine or unit then needs no `ulimits` of its own (Docker refuses ulimits above
/// the host's hard limit). Says so when even the hard limit is below what the connection
/// limit needs (a client and an upstream descriptor per connection).
fn raise_open_file_limit(max_connections: usize) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft < hard {
        if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            tracing::warn!(soft, hard, error = %e, "cannot raise the open-file limit");
            return;
        }
    }
    let needed = 2 * max_connections as u64;
    if hard < needed {
        tracing::warn!(
            limit = hard,
            needed,
            "the open-file limit is below what limits.max_connections needs (a client and an upstream descriptor each): raise LimitNOFILE / ulimit -n, or lower max_connections"
        );
    }
}

fn run(args: RunArgs) -> ExitCode {
    // First, while this is the only thread: the sockets an upgrade (or systemd) handed over.
    let adopted = crate::upgrade::adopt_from_environment();
    let config = match resolve(args.config.as_ref(), &args.overrides) {
        Ok(c) => c,
        Err(e) => return fail(2, &e),
    };
    let plan = match Plan::new(&config) {
        Ok(p) => p,
        Err(e) => return fail(2, &e),
    };
    init_logging(&config.log_level, config.log_format);
    match &adopted {
        Ok(a) if a.upgrade => tracing::info!(
            sockets = a.sockets,
            "started by an in-place upgrade: taking over the listening sockets"
        ),
        Ok(a) if a.sockets > 0 => tracing::info!(
            sockets = a.sockets,
            "listening sockets handed over by systemd"
        ),
        Ok(_) => {}
        Err(e) => return fail(1, e),
    }
    if !crate::allocator::keep_connection_buffers() {
        tracing::debug!("allocator thresholds left as they are (set by MALLOC_* or not glibc)");
    }
    raise_open_file_limit(config.limits.max_connections);
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all().thread_name("proxy-worker");
    if config.worker_threads > 0 {
        rt.worker_threads(config.worker_threads);
    }
    let rt = match rt.build() {
        Ok(rt) => rt,
        Err(e) => return fail(1, &format!("cannot start the runtime: {e}")),
    };
    // Reloads read the same file and flags again, and check them as start-up did.
    let (file, overrides) = (args.config.clone(), args.overrides.clone());
    let source: crate::reload::ConfigSource = std::sync::Arc::new(move || {
        let config = resolve(file.as_ref(), &overrides).map_err(|e| e.to_string())?;
        Plan::new(&config).map_err(|e| e.to_string())
    });
    rt.block_on(async move {
        let proxy = match Proxy::bind(&plan).await {
            Ok(p) => p.reload_from(source, args.config.clone()),
            Err(e) => return fail(1, &e),
        };
        let (listeners, admin) = proxy.addresses();
        if let Some(path) = &args.ready_file {
            if let Err(e) = write_ready_file(path, &listeners, admin) {
                return fail(
                    1,
                    &format!("cannot write --ready-file {}: {e}", path.display()),
                );
            }
        }
        tracing::info!(
            admin = %admin.map_or_else(String::new, |a| a.to_string()),
            pid = std::process::id(),
            "proxy serving"
        );
        crate::upgrade::announce_ready();
        let shutdown = CancellationToken::new();
        let signal_token = shutdown.clone();
        tokio::spawn(async move {
            let name = wait_for_signal().await;
            tracing::info!(signal = name, "shutting down");
            signal_token.cancel();
        });
        // A failed upgrade is written into the ready file, where `proxy upgrade` reads it.
        let ready_file = args.ready_file.clone();
        tokio::spawn(crate::upgrade::on_sigusr2(
            shutdown.clone(),
            proxy.metrics(),
            move |outcome| {
                if let (crate::upgrade::Outcome::Failed(reason), Some(path)) = (outcome, &ready_file) {
                    let note = |mut ready: crate::launch::Ready| {
                        ready.upgrade_failed = Some(reason.clone());
                        ready.write(path)
                    };
                    let noted = std::fs::read_to_string(path)
                        .ok()
                        .and_then(|t| serde_json::from_str(&t).ok())
                        .map(note);
                    if !matches!(noted, Some(Ok(()))) {
                        tracing::warn!(path = %path.display(), "cannot note the failed upgrade in the ready file");
                    }
                }
            },
        ));
        proxy.serve(shutdown).await;
        ExitCode::SUCCESS
    })
}

async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

fn gen_certs(args: GenCertsArgs) -> ExitCode {
    let algorithms = args
        .algorithms
        .unwrap_or_else(|| CertAlgorithmName::ALL.to_vec());
    match generate_cert_set_valid_for(&args.out, &algorithms, &args.sans, args.days) {
        Ok(set) => {
            println!("CA certificate:     {}", set.ca_cert.display());
            for (alg, cert, key) in &set.servers {
                println!(
                    "{:<19} {} + {}",
                    format!("{alg}:"),
                    cert.display(),
                    key.display()
                );
            }
            println!(
                "client (mTLS):      {} + {}",
                set.client.0.display(),
                set.client.1.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(1, &e),
    }
}

fn check_config(args: CheckConfigArgs) -> ExitCode {
    let config = match Config::from_file(&args.file) {
        Ok(c) => c,
        Err(e) => return fail(2, &e),
    };
    let plan = match Plan::new(&config) {
        Ok(p) => p,
        Err(e) => return fail(2, &e),
    };
    let mut problems = Vec::new();
    // Beyond syntax: build every listener's TLS as `run` would (for openssl-qat that
    // includes loading the QAT provider and its start-up proof), into metrics of its own.
    let qat_state = match &plan.qat {
        Some(qat) => match crate::crypto::qat::activate_per_fallback(qat) {
            Ok(crate::crypto::qat::Activation::Active(state)) => Some(state),
            Ok(crate::crypto::qat::Activation::FellBack(e)) => {
                eprintln!("proxy: warning: QAT offload would be off (software fallback): {e}");
                None
            }
            Err(e) => {
                problems.push(format!("openssl-qat: {e}"));
                None
            }
        },
        None => None,
    };
    let scratch = crate::metrics::Metrics::new();
    // What each listener's provider really offers (ML-KEM only where it implements it),
    // printed after the configuration.
    let mut offered = Vec::new();
    for lp in &plan.listeners {
        let labels = crate::tls::ListenerLabels {
            name: lp.name.clone(),
            mode: lp.mode_label(),
            // Scratch metrics, never served: the label only has to be well-formed.
            offload: "check",
        };
        match crate::tls::build_listener_tls(&lp.tls, &labels, qat_state.as_deref(), &scratch) {
            Ok(built) => {
                offered.push(format!(
                    "# listener[{}] {}: provider {} ({}) offers key exchange {}\n",
                    lp.index,
                    lp.name,
                    built.provider.name(),
                    built.provider.library_version(),
                    built.provider.kx_group_names().join(", ")
                ));
                if let Some(warning) = built.cert.expiry_warning() {
                    eprintln!("proxy: warning: listener[{}]: {warning}", lp.index);
                }
                if let Some(why) = built.fell_back {
                    eprintln!(
                        "proxy: warning: listener[{}]: QAT offload would be off (software fallback): {why}",
                        lp.index
                    );
                }
            }
            Err(e) => problems.push(format!("listener[{}]: {e}", lp.index)),
        }
    }
    if !problems.is_empty() {
        return fail(2, &ConfigError { problems });
    }
    print!("{}", config.to_toml());
    print!("\n{}", offered.concat());
    if let Some(state) = &qat_state {
        // What the provider itself reads: its OpenSSL configuration section.
        match &state.settings {
            crate::crypto::qat::SettingsSource::Proxy(_) => print!(
                "\n# The OpenSSL configuration the proxy loads for the QAT provider:\n{}",
                config
                    .qat
                    .openssl_config(config.qat.module_path.as_deref().filter(|p| p.is_file()))
                    .lines()
                    .map(|l| format!("#   {l}\n"))
                    .collect::<String>()
            ),
            other => println!("\n# QAT provider settings: {other}"),
        }
    }
    ExitCode::SUCCESS
}
