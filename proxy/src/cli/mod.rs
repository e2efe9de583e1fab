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

use crate::config::{Config, ConfigError};
use crate::crypto::{generate_cert_set_valid_for, CertAlgorithmName};
use crate::plan::Plan;
use crate::server::{write_ready_file, Proxy};

mod config_flags;
mod listener_flags;
mod process_flags;
use listener_flags::ListenerFlags;
use process_flags::ProcessFlags;

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
    #[command(after_long_help = ConfigFlags::key_table())]
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
    flags: ConfigFlags,
    /// Write the bound addresses as JSON here once listening (useful with port 0).
    #[arg(long, value_name = "FILE")]
    ready_file: Option<PathBuf>,
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
    let read = || -> Result<crate::ready::Ready, String> {
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

/// Every flag of `proxy run` that sets a configuration key: the listener's, then the
/// process's.
#[derive(Clone, Debug, Args)]
pub struct ConfigFlags {
    #[command(flatten)]
    listener: ListenerFlags,
    #[command(flatten)]
    process: ProcessFlags,
}

impl ConfigFlags {
    /// The flags with the configuration keys they set, for `proxy run --help`.
    fn key_table() -> String {
        let mut table = String::from("Configuration keys (flags override the file's):\n");
        let groups = [(ProcessFlags::KEYS, ""), (ListenerFlags::KEYS, "listener.")];
        for (flags, prefix) in groups {
            for flag in flags {
                let name = format!("--{}", flag.field.replace('_', "-"));
                table.push_str(&format!("  {name:<30} {prefix}{}\n", flag.dotted()));
            }
        }
        table
    }

    /// Merges the file (if any) and the flags into one configuration (checked by
    /// [`Plan::new`], not here).
    pub fn resolve(&self, config_file: Option<&PathBuf>) -> Result<Config, ConfigError> {
        let mut cfg = match config_file {
            Some(path) => Config::from_file(path)?,
            None => Config::empty(),
        };
        self.process.set(&mut cfg);
        self.listener.apply(&mut cfg)?;
        // A listener given by flags that overrides the file's provider for the whole process
        // must not be shadowed by the listener's own provider setting.
        if self.process.provider.is_some() && self.listener.is_set() {
            cfg.listeners[0].provider = None;
        }
        Ok(cfg)
    }
}

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
    let config = match args.flags.resolve(args.config.as_ref()) {
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
    let (file, flags) = (args.config.clone(), args.flags.clone());
    let source: crate::reload::ConfigSource = std::sync::Arc::new(move || {
        let config = flags.resolve(file.as_ref()).map_err(|e| e.to_string())?;
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
                    let note = |mut ready: crate::ready::Ready| {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use clap::CommandFactory;

    use super::config_flags::{schema::knows, FlagKey};
    use super::*;

    /// A `[[listener]]` entry with its required keys, for the listener flags' keys.
    const LISTENER: &str =
        "[[listener]]\nlisten = \"a:1\"\ncert = \"c\"\nkey = \"k\"\nupstream = []";

    fn groups() -> [(&'static [FlagKey], &'static str, &'static str); 2] {
        [
            (ProcessFlags::KEYS, "", ""),
            (ListenerFlags::KEYS, LISTENER, "listener."),
        ]
    }

    /// Both ways: every flag's key is a key of the file, and no flag is named like a key
    /// of the file other than the one it sets (or a table on its way).
    #[test]
    fn every_flag_sets_a_key_of_the_file_and_is_named_for_no_other() {
        for (flags, prefix, shown) in groups() {
            for flag in flags {
                let key = flag.dotted();
                assert!(
                    knows::<Config>(prefix, flag.key),
                    "--{} sets {shown}{key}, which a config file cannot have",
                    flag.field.replace('_', "-")
                );
                if flag.key.contains(&flag.field) {
                    continue;
                }
                for depth in 0..flag.key.len() {
                    let mut namesake = flag.key[..depth].to_vec();
                    namesake.push(flag.field);
                    assert!(
                        !knows::<Config>(prefix, &namesake),
                        "--{} sets {shown}{key}, but the file has a key {shown}{} of its name",
                        flag.field.replace('_', "-"),
                        namesake.join(".")
                    );
                }
            }
        }
    }

    /// The table is every flag of `proxy run` but the two that are not settings.
    #[test]
    fn the_table_holds_every_setting_flag_of_proxy_run() {
        let cli = Cli::command();
        let run = cli.find_subcommand("run").expect("proxy run");
        let flags: BTreeSet<&str> = run
            .get_arguments()
            .map(|a| a.get_id().as_str())
            .filter(|id| !["config", "ready_file", "help"].contains(id))
            .collect();
        for arg in run
            .get_arguments()
            .filter(|a| flags.contains(a.get_id().as_str()))
        {
            assert_eq!(
                arg.get_long().map(|l| l.replace('-', "_")).as_deref(),
                Some(arg.get_id().as_str()),
                "the table and --help name a flag by its field"
            );
        }
        let table: Vec<&str> = groups()
            .iter()
            .flat_map(|(flags, _, _)| flags.iter().map(|f| f.field))
            .collect();
        assert_eq!(flags, table.iter().copied().collect::<BTreeSet<_>>());
        assert_eq!(table.len(), flags.len(), "a flag in both groups: {table:?}");
    }

    /// docs/proxy.md's table of flags names each of them.
    #[test]
    fn the_docs_name_every_flag() {
        let docs = include_str!("../../../docs/proxy.md");
        let cli = Cli::command();
        let run = cli.find_subcommand("run").expect("proxy run");
        let undocumented: Vec<String> = run
            .get_arguments()
            .filter_map(|a| a.get_long())
            .map(|long| format!("`--{long}"))
            .filter(|flag| !docs.contains(flag.as_str()))
            .collect();
        assert!(
            undocumented.is_empty(),
            "not in docs/proxy.md: {undocumented:?}"
        );
    }

    /// Flags whose name is not their key set the key the table names, over the file's value.
    #[test]
    fn flags_set_their_keys_over_the_files() {
        let file = std::env::temp_dir().join(format!("cli-flags-{}.toml", std::process::id()));
        std::fs::write(
            &file,
            format!("[limits]\nupstream_response_timeout = \"9s\"\nidle_timeout = \"1m\"\n{LISTENER}\n[listener.tls]\nmin_version = \"1.2\"\n"),
        )
        .unwrap();
        let cli = Cli::parse_from([
            "proxy",
            "run",
            "--upstream-timeout",
            "3s",
            "--request-buffer-budget",
            "123",
            "--admin",
            "127.0.0.1:1",
            "--qat-batch-wait",
            "2ms",
            "--tls-min",
            "1.3",
            "--proxy-protocol-from",
            "10.0.0.0/8",
            "--upstream-ca",
            "ca.pem",
        ]);
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        let cfg = args.flags.resolve(Some(&file)).unwrap();
        std::fs::remove_file(&file).unwrap();
        assert_eq!(cfg.limits.upstream_response_timeout, Duration::from_secs(3));
        assert_eq!(
            cfg.limits.idle_timeout,
            Duration::from_secs(60),
            "the file's"
        );
        assert_eq!(cfg.limits.request_buffer_budget, Some(123));
        assert_eq!(cfg.admin.listen, "127.0.0.1:1");
        assert_eq!(cfg.qat.batch_wait, Duration::from_millis(2));
        let l = &cfg.listeners[0];
        assert_eq!(l.tls.min_version, crate::config::TlsVersion::Tls13);
        assert_eq!(l.proxy_protocol.as_ref().unwrap().trusted, ["10.0.0.0/8"]);
        assert_eq!(
            l.upstream_tls.ca.as_deref(),
            Some(std::path::Path::new("ca.pem"))
        );
        assert_eq!(l.listen, "a:1", "the file's");
    }
}
