//! `loadgen compare`: the provider x certificate-algorithm matrix, one identical workload
//! per cell, everything else held constant, one JSON per cell written as it finishes, then
//! the report.
//!
//! Local mode (default) generates the certificates once, starts the upstream once and a
//! fresh proxy per cell. Remote mode (`--proxy-admin`) switches a running proxy's provider
//! and certificate between cells through its authenticated `POST /admin/tls`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use proxy::config::UpstreamProtocol;
use proxy::config::{Config, ListenerConfig};
use proxy::crypto::{generate_cert_set, KxGroupName, ProviderName};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::client::http::{send, Options};
use crate::client::Protocol;
use crate::driver::ConnectionPolicy;
use crate::procs::{self, CpuList, Launched};
use crate::result::{Cell, CellFailure, FAILURE_SCHEMA};
use crate::result::{CellProvider, OnOff, TlsVersion};
use crate::run::{self, RunArgs};
use crate::terminator_flags::{TerminatorFlags, DEFAULT_CLIENT_CONGESTION_CONTROL};

mod plan;
mod qat;
use plan::cell_run_args;
pub use plan::{cells, ComparePlan, Mode};
use qat::{find_qat_provider, QAT_INSTALL_DIRS};

use crate::budget::{BudgetChoice, Cgroups, Prepared};

/// Every cell's clients, whatever the provider: the study's 32. With a new TLS connection
/// per request they keep more handshakes queued at a budgeted proxy than it can serve, so
/// its throughput is its own, and keep enough at once for qat_sw's batches of eight to fill.
pub const CONCURRENCY: usize = 32;

/// The proxy's CPU budget in local mode, in cores: small enough that the proxy, not the
/// database beside it (embedded-qdrant takes about 0.8 cores for 110 UPSERT_100/s on our
/// 2-core machines), bounds throughput at every algorithm, so requests/s ranks providers
/// as the study's CPU-bound proxy did. Requests/s divided by it is the figure that scales:
/// requests per proxy core-second.
pub const DEFAULT_PROXY_CPU_BUDGET: f64 = 0.1;

/// How long each cell runs, and how many rounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// 1 s warm-up + 3 s per cell, 3 interleaved rounds: the 3 x 4 matrix in about 3
    /// minutes, with a spread for every figure.
    Quick,
    /// 10 s warm-up + 60 s per cell, 3 interleaved rounds: sustained cells like the
    /// reference study.
    Full,
}

impl Profile {
    fn warmup(self) -> Duration {
        match self {
            Self::Quick => Duration::from_secs(1),
            Self::Full => Duration::from_secs(10),
        }
    }
    fn duration(self) -> Duration {
        match self {
            Self::Quick => Duration::from_secs(3),
            Self::Full => Duration::from_secs(60),
        }
    }
    fn repeat(self) -> u32 {
        match self {
            Self::Quick => 3,
            Self::Full => 3,
        }
    }
}

/// The flags of `loadgen compare`.
#[derive(Clone, Debug, Args, Serialize)]
pub struct CompareArgs {
    /// Providers, algorithms, the proxy and database binaries and further proxy flags.
    #[command(flatten)]
    #[serde(flatten)]
    pub terminators: TerminatorFlags,
    /// Output folder: cells/*.json, report.md, report.csv, report.html.
    #[arg(long, default_value = "results/compare")]
    pub out: PathBuf,
    /// How long each cell runs, and how many rounds.
    #[arg(long, value_enum, default_value_t = Profile::Quick)]
    pub profile: Profile,
    /// Overrides the profile's measured time per cell.
    #[arg(long)]
    #[serde(serialize_with = "crate::run::serialize_opt_duration")]
    pub duration: Option<humantime::Duration>,
    /// Overrides the profile's warm-up per cell.
    #[arg(long)]
    #[serde(serialize_with = "crate::run::serialize_opt_duration")]
    pub warmup: Option<humantime::Duration>,
    /// Measured requests per cell instead of a duration.
    #[arg(long)]
    pub requests: Option<u64>,
    /// Rounds; each round runs every cell once, so drift hits every cell alike.
    #[arg(long)]
    pub repeat: Option<u32>,
    /// Skip cells whose JSON already exists in --out.
    #[arg(long)]
    pub resume: bool,

    /// REST or gRPC, for every cell.
    #[arg(long, value_enum, default_value_t = Protocol::Grpc)]
    pub protocol: Protocol,
    /// Workers per cell, each with one request in flight, the same for every provider.
    /// Default: 32, the study's clients (enough handshakes queued at a budgeted proxy for
    /// its throughput to be its own, and at once for QAT batches of eight to fill).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// new: a full handshake per request (what the comparison is about); reuse; per-n=N.
    #[arg(long, default_value = "new")]
    #[serde(serialize_with = "crate::run::serialize_display")]
    pub connection_policy: ConnectionPolicy,
    /// Client session resumption in every cell: off (a full handshake per new
    /// connection, what the comparison measures) or on.
    #[arg(long, value_enum, default_value_t = OnOff::Off)]
    pub resumption: OnOff,
    /// Key-exchange groups of every cell, client and proxy alike (comma-separated).
    #[arg(long, value_delimiter = ',', num_args = 1.., default_value = "x25519")]
    #[serde(serialize_with = "run::serialize_joined")]
    pub kx: Vec<KxGroupName>,
    /// The TLS version of every cell, client and proxy alike: 1.2 or 1.3.
    #[arg(long, default_value_t = TlsVersion::Tls13)]
    pub tls_version: TlsVersion,

    /// The proxy's CPU budget, in cores (0.1, 0.5, 2) or none: a cgroup CPU quota on the
    /// proxy alone (cgroup v2 cpu.max, v1 cpu.cfs_quota_us, or a systemd scope), read back
    /// from its cgroup files and recorded in every cell. Under it, the proxy bounds
    /// throughput, as in the study (a proxy on a few cores with more clients than they
    /// serve), and requests/s ranks the providers. Default: 0.1 in local mode; a remote
    /// proxy's budget is set on its own host.
    #[arg(long)]
    pub proxy_cpu_budget: Option<BudgetChoice>,
    /// Reactor threads of each proxy (default: the proxy's own default, one per CPU).
    #[arg(long)]
    pub proxy_worker_threads: Option<usize>,
    /// Pin the proxy to these CPUs, e.g. 0 or 0-3 (sched_setaffinity).
    #[arg(long)]
    pub proxy_cpus: Option<CpuList>,
    /// Pin loadgen to these CPUs.
    #[arg(long)]
    pub loadgen_cpus: Option<CpuList>,
    /// Pin the embedded upstream to these CPUs.
    #[arg(long)]
    pub upstream_cpus: Option<CpuList>,
    /// Use this upstream instead of starting embedded-qdrant (the gRPC port for
    /// --protocol grpc, the REST port for rest).
    #[arg(long)]
    pub upstream: Option<String>,
    /// Keep the embedded upstream's data folder (OUT/work/upstream-data) after the matrix;
    /// by default it is removed, since the last cell's points alone take about 1.4 GB in the
    /// quick profile and 7 GB in the full one (measured with 1024-d vectors, wait=true).
    #[arg(long)]
    pub keep_upstream_data: bool,
    /// The `ossl-modules` directory of an installed QAT_Engine provider, for openssl-qat
    /// cells. Unset: QAT_PROVIDER_DIR, OPENSSL_MODULES, then the install directories
    /// deploy/QAT.md names are searched for qatprovider.so.
    #[arg(long)]
    pub qat_module_path: Option<PathBuf>,

    /// Remote mode: the admin URL of a running proxy (e.g. https://proxy-host:9900, served
    /// with the proxy's admin.tls_cert and verified with --ca); its provider and
    /// certificate are switched between cells. Plain http:// is accepted for loopback
    /// only, or with --proxy-admin-plaintext: the bearer token would cross the network in
    /// clear.
    #[arg(long)]
    pub proxy_admin: Option<String>,
    /// Send the admin bearer token over plain HTTP to a non-loopback --proxy-admin anyway.
    #[arg(long)]
    pub proxy_admin_plaintext: bool,
    /// Bearer token file for --proxy-admin (the proxy's admin.token_file).
    #[arg(long)]
    pub proxy_admin_token_file: Option<PathBuf>,
    /// Remote mode: the proxy's client-facing address, HOST:PORT.
    #[arg(long)]
    pub target: Option<String>,
    /// Remote mode: folder on the proxy's host holding `<algorithm>.crt` and `.key`.
    #[arg(long)]
    pub remote_cert_dir: Option<PathBuf>,
    /// Remote mode: CA that verifies the proxy (local mode uses the generated one).
    #[arg(long)]
    pub ca: Option<PathBuf>,

    /// Further `loadgen run` flags for every cell, after `--` (e.g. -- --dim 768 --wait false).
    #[arg(last = true)]
    #[serde(serialize_with = "redact_run_args")]
    pub run_args: Vec<String>,
}

/// The `--` flags as recorded in compare-args.json: the values of `--api-key` and
/// `--header` (credentials) replaced.
fn redact_run_args<S: serde::Serializer>(v: &[String], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(v.len()))?;
    let mut secret_next = false;
    for a in v {
        let shown = if secret_next {
            "(redacted)".to_owned()
        } else if let Some((flag, _)) = a
            .split_once('=')
            .filter(|(f, _)| matches!(*f, "--api-key" | "--header"))
        {
            format!("{flag}=(redacted)")
        } else {
            a.clone()
        };
        secret_next = matches!(a.as_str(), "--api-key" | "--header");
        seq.serialize_element(&shown)?;
    }
    seq.end()
}

impl CompareArgs {
    /// The flags with every default decided: providers (openssl-qat joins when a provider
    /// is installed), the QAT provider's directory, the concurrency, the proxy's budget.
    pub fn resolved(&self) -> CompareArgs {
        let mut args = self.clone();
        args.qat_module_path = find_qat_provider(self.qat_module_path.as_deref());
        let providers = self.terminators.providers.clone().unwrap_or_else(|| {
            let mut p = ProviderName::SOFTWARE.to_vec();
            if args.qat_module_path.is_some() {
                p.push(ProviderName::OpensslQat);
            }
            p
        });
        args.concurrency = Some(self.concurrency.unwrap_or(CONCURRENCY));
        if self.proxy_admin.is_none() {
            args.proxy_cpu_budget = Some(
                self.proxy_cpu_budget
                    .unwrap_or(BudgetChoice::Cores(DEFAULT_PROXY_CPU_BUDGET)),
            );
        }
        args.terminators.providers = Some(providers);
        args
    }

    /// The providers compared (after [`resolved`](Self::resolved)).
    pub fn providers(&self) -> &[ProviderName] {
        self.terminators.providers()
    }

    /// The proxy flags of a local cell with `provider`.
    fn proxy_args_for(&self, provider: ProviderName) -> Vec<String> {
        let mut args = self.terminators.proxy_args.clone();
        if let (ProviderName::OpensslQat, Some(dir)) = (provider, &self.qat_module_path) {
            if !args.iter().any(|a| a.starts_with("--qat-module-path")) {
                args.push(format!("--qat-module-path={}", dir.display()));
            }
        }
        args
    }
}

/// The file a cell's result goes to.
pub fn cell_path(out: &Path, cell: &Cell) -> PathBuf {
    out.join("cells")
        .join(format!("{}.json", cell_path_stem(cell)))
}

/// Pins loadgen itself, before any runtime thread exists.
pub fn pin_loadgen(args: &CompareArgs) -> Result<()> {
    if let Some(list) = &args.loadgen_cpus {
        procs::pin_current_thread(&list.cpus).context("--loadgen-cpus")?;
    }
    Ok(())
}

struct Upstream {
    url: String,
    managed: Option<Launched>,
    /// The embedded upstream's data folder, owned by this run.
    data: Option<PathBuf>,
}

fn start_upstream(args: &CompareArgs, given: Option<&str>, work: &Path) -> Result<Upstream> {
    if let Some(url) = given {
        return Ok(Upstream {
            url: url.to_owned(),
            managed: None,
            data: None,
        });
    }
    let data = work.join("upstream-data");
    let _ = std::fs::remove_dir_all(&data);
    let bin = args.terminators.upstream_bin();
    let mut cmd = Command::new(bin);
    cmd.args(["--rest", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data"])
        .arg(&data);
    let cpus = args.upstream_cpus.as_ref().map(|l| l.cpus.as_slice());
    let managed = procs::start(cmd, "embedded-qdrant", work, cpus)?;
    let key = match args.protocol {
        Protocol::Grpc => "grpc",
        Protocol::Rest => "rest",
    };
    let addr = managed.ready[key]
        .as_str()
        .ok_or_else(|| anyhow!("embedded-qdrant ready file has no {key} address"))?;
    Ok(Upstream {
        url: format!("http://{addr}"),
        managed: Some(managed),
        data: Some(data),
    })
}

/// Bytes of the regular files under `dir` (0 where it cannot be read), for the clean-up line.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

/// The clients' congestion control in cells whose proxy compare starts on this machine,
/// unless the flags after `--` name one: the bench's choice, for the bench's reason.
const LOCAL_CELL_CONGESTION_CONTROL: &str = DEFAULT_CLIENT_CONGESTION_CONTROL;

/// Runs the whole comparison; returns the cells that failed.
pub async fn execute(flags: &CompareArgs, stop: CancellationToken) -> Result<Vec<CellFailure>> {
    let plan = ComparePlan::new(flags)?;
    let args = &plan.args;
    if let Some(dir) = &args.qat_module_path {
        eprintln!("QAT provider: {} (openssl-qat cells)", dir.display());
    } else if args.providers().contains(&ProviderName::OpensslQat) {
        eprintln!(
            "no QAT provider found (--qat-module-path, QAT_PROVIDER_DIR, OPENSSL_MODULES, {}): \
             openssl-qat cells will say why they could not run",
            QAT_INSTALL_DIRS.join(", ")
        );
    }
    if let Mode::Local {
        budget: Some(cores),
        ..
    } = plan.mode
    {
        eprintln!("proxy CPU budget: {cores} cores (--proxy-cpu-budget)");
    }

    let cells_dir = args.out.join("cells");
    std::fs::create_dir_all(&cells_dir)
        .with_context(|| format!("creating {}", args.out.display()))?;
    if !args.resume {
        // A new comparison starts clean: cells left from an earlier run with other settings
        // would otherwise be rendered into this report.
        let stale: Vec<PathBuf> = std::fs::read_dir(&cells_dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        if !stale.is_empty() {
            eprintln!(
                "removing {} cell results of an earlier run from {} (--resume keeps them)",
                stale.len(),
                cells_dir.display()
            );
        }
        for p in stale {
            std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
        }
    }
    let work = args.out.join("work");
    std::fs::create_dir_all(&work)?;
    let (ca, cert_dir, upstream) = match &plan.mode {
        Mode::Remote { ca, cert_dir, .. } => (ca.clone(), cert_dir.clone(), None),
        Mode::Local { upstream, .. } => {
            let dir = args.out.join("certs");
            let set = tokio::task::spawn_blocking({
                let dir = dir.clone();
                let algorithms = args.terminators.algorithms.clone();
                move || generate_cert_set(&dir, &algorithms, &[])
            })
            .await?
            .context("generating certificates")?;
            let started = start_upstream(args, upstream.as_deref(), &work)?;
            (set.ca_cert, dir, Some(started))
        }
    };
    let (cells, base) = (&plan.cells, &plan.base);
    let started = Instant::now();
    let mut failures = Vec::new();
    for (i, cell) in cells.iter().enumerate() {
        if stop.is_cancelled() {
            break;
        }
        let path = cell_path(&args.out, cell);
        if args.resume && path.is_file() {
            eprintln!(
                "[{}/{}] {} {} round {}: done earlier, skipped",
                i + 1,
                cells.len(),
                cell.provider,
                cell.algorithm,
                cell.repeat
            );
            continue;
        }
        let _ = std::fs::remove_file(&path);
        eprintln!(
            "[{}/{}] {} {} round {} ({:.0} s so far)",
            i + 1,
            cells.len(),
            cell.provider,
            cell.algorithm,
            cell.repeat,
            started.elapsed().as_secs_f64()
        );
        let outcome = match (&plan.mode, &upstream) {
            (remote @ Mode::Remote { .. }, _) => {
                run_remote_cell(remote, base, cell, &cert_dir, &path, stop.clone()).await
            }
            (Mode::Local { budget, .. }, up) => {
                let up = up.as_ref().expect("local mode has an upstream");
                run_local_cell(
                    args,
                    *budget,
                    base,
                    cell,
                    &ca,
                    &cert_dir,
                    &up.url,
                    up.managed.as_ref().map(Launched::pid),
                    &work,
                    &path,
                    stop.clone(),
                )
                .await
            }
        };
        match outcome {
            Ok(summary) => eprintln!("    {summary}"),
            Err(e) => {
                let reason = format!("{e:#}");
                eprintln!("    FAILED: {reason}");
                let failure = CellFailure {
                    schema: FAILURE_SCHEMA.to_owned(),
                    cell: cell.clone(),
                    reason,
                };
                run::write_json(&path, &failure)?;
                failures.push(failure);
            }
        }
    }
    if let Some(Upstream { managed, data, .. }) = upstream {
        if let Some(m) = managed {
            procs::stop(m)?;
        }
        if let Some(data) = data.filter(|_| !args.keep_upstream_data) {
            let bytes = dir_bytes(&data);
            std::fs::remove_dir_all(&data)
                .with_context(|| format!("removing the upstream's data {}", data.display()))?;
            eprintln!(
                "removed the upstream's data ({:.0} MB; --keep-upstream-data keeps it)",
                bytes as f64 / 1e6
            );
        }
    }
    let _ = std::fs::write(
        args.out.join("compare-args.json"),
        serde_json::to_vec_pretty(args)?,
    );
    eprintln!("matrix done in {:.0} s", started.elapsed().as_secs_f64());
    Ok(failures)
}

/// One measured cell; the error is the cell's failure reason.
async fn measure(run_args: RunArgs, stop: CancellationToken) -> Result<String> {
    let result = run::execute(&run_args, stop).await?;
    if result.requests_ok == 0 {
        let first = result
            .failure_examples
            .iter()
            .next()
            .map(|(k, m)| format!("{k}: {m}"))
            .unwrap_or_else(|| "no request was sent".to_owned());
        bail!(
            "every request failed ({} failed; {first})",
            result.requests_failed
        );
    }
    Ok(format!(
        "{:.1} req/s, p50 {:.1} ms, proxy CPU {} ms/request, {} failed",
        result.requests_per_second,
        result
            .latency_ms
            .as_ref()
            .map(|l| l.p50)
            .unwrap_or(f64::NAN),
        result
            .proxy_cpu_seconds()
            .filter(|_| result.requests_ok > 0)
            .map(|c| format!("{:.3}", 1000.0 * c / result.requests_ok as f64))
            .unwrap_or_else(|| "n/a".into()),
        result.requests_failed
    ))
}

#[allow(clippy::too_many_arguments)]
async fn run_local_cell(
    args: &CompareArgs,
    budget: Option<f64>,
    base: &RunArgs,
    cell: &Cell,
    ca: &Path,
    cert_dir: &Path,
    upstream: &str,
    upstream_pid: Option<u32>,
    work: &Path,
    out: &Path,
    stop: CancellationToken,
) -> Result<String> {
    let bin = args.terminators.proxy_bin();
    let loopback_port_0: SocketAddr = ([127, 0, 0, 1], 0).into();
    let mut config = Config::empty();
    config.provider = match &cell.provider {
        CellProvider::Proxy(p) => *p,
        CellProvider::Peer(name) => bail!("{name} is not a provider of the proxy"),
    };
    if let Some(n) = args.proxy_worker_threads {
        config.worker_threads = n;
    }
    config.admin.listen = loopback_port_0.to_string();
    let mut listener = ListenerConfig::new(
        loopback_port_0.to_string(),
        cert_dir.join(format!("{}.crt", cell.algorithm)),
        cert_dir.join(format!("{}.key", cell.algorithm)),
        vec![upstream.to_owned()],
    );
    // The name the proxy gives an unnamed first listener, as when compare started it with
    // flags: results record the listener labels of its /metrics.
    listener.name = Some("listener0".to_owned());
    listener.upstream_protocol = match args.protocol {
        Protocol::Grpc => UpstreamProtocol::H2c,
        Protocol::Rest => UpstreamProtocol::Http1,
    };
    listener.tls.min_version = args.tls_version;
    listener.tls.max_version = args.tls_version;
    listener.tls.kx_groups = Some(args.kx.clone());
    listener.tls.resumption = args.resumption == OnOff::On;
    config.listeners.push(listener);
    let cmd = procs::proxy_command(
        &config,
        &bin,
        work,
        "proxy",
        &args.proxy_args_for(config.provider),
    )?;
    let cpus = args.proxy_cpus.as_ref().map(|l| l.cpus.as_slice());
    // The budget's group (or scope) is the cell's own: made before the proxy starts, removed
    // once it has exited.
    let budget = match budget {
        Some(cores) => {
            let name = format!(
                "vtp-loadgen-{}-{}",
                std::process::id(),
                cell_path_stem(cell)
            );
            Some((Prepared::new(&Cgroups::default(), cores, &name)?, cores))
        }
        None => None,
    };
    let cmd = match &budget {
        Some((prepared, _)) => prepared.command(cmd),
        None => cmd,
    };
    let started = tokio::task::block_in_place(|| procs::start(cmd, "proxy", work, cpus));
    let proxy = match started {
        Ok(p) => p,
        Err(e) => {
            if let Some((prepared, _)) = budget {
                prepared.remove();
            }
            return Err(e.context("the proxy would not start"));
        }
    };
    let result = budgeted_cell(base, cell, ca, upstream_pid, out, stop, &proxy, &budget).await;
    let stopped = tokio::task::block_in_place(|| procs::stop(proxy));
    if let Some((prepared, _)) = budget {
        tokio::task::block_in_place(|| prepared.remove());
    }
    let summary = result?;
    stopped?;
    Ok(summary)
}

/// A started local proxy's cell: its budget attached and read back, then measured.
#[allow(clippy::too_many_arguments)]
async fn budgeted_cell(
    base: &RunArgs,
    cell: &Cell,
    ca: &Path,
    upstream_pid: Option<u32>,
    out: &Path,
    stop: CancellationToken,
    proxy: &Launched,
    budget: &Option<(Prepared, f64)>,
) -> Result<String> {
    if let Some((prepared, cores)) = budget {
        let quota = prepared
            .attach(&Cgroups::default(), proxy.pid(), *cores)
            .context("the proxy's CPU budget")?;
        tracing::info!(
            "proxy budget: {:.2} cores ({}, {} of {} us, {})",
            quota.cores,
            quota.mechanism,
            quota.quota_us,
            quota.period_us,
            quota.file.display()
        );
    }
    let ready = proxy.proxy_ready()?;
    let (Some(listen), Some(admin)) = (ready.first_listener(), ready.admin) else {
        bail!("the proxy's ready file names no listener or no admin address");
    };
    wait_ready(&format!("http://{admin}/readyz")).await?;
    let mut run = cell_run_args(base, cell, &format!("localhost:{}", listen.port()), ca, out);
    if run.congestion_control.is_none() {
        // The proxy runs on this machine: a pacing client's timer (BBR) would run under the
        // proxy's reads and be counted as the proxy's CPU (`--congestion-control host` keeps
        // the host's default; the cell's result records which).
        run.congestion_control = Some(LOCAL_CELL_CONGESTION_CONTROL.to_owned());
    }
    run.proxy_metrics = Some(format!("http://{admin}/metrics"));
    run.watch_pid.push(format!("proxy={}", proxy.pid()));
    if let Some(pid) = upstream_pid {
        run.watch_pid.push(format!("upstream={pid}"));
    }
    measure(run, stop).await
}

/// A cell's name in file names: `provider__algorithm__rN`.
fn cell_path_stem(cell: &Cell) -> String {
    format!("{}__{}__r{}", cell.provider, cell.algorithm, cell.repeat)
}

/// One cell against a remote proxy: its provider and certificate switched, then measured.
async fn run_remote_cell(
    mode: &Mode,
    base: &RunArgs,
    cell: &Cell,
    cert_dir: &Path,
    out: &Path,
    stop: CancellationToken,
) -> Result<String> {
    let Mode::Remote {
        admin,
        token,
        target,
        ca,
        ..
    } = mode
    else {
        bail!("a remote cell needs remote mode");
    };
    let body = serde_json::json!({
        "provider": cell.provider,
        "cert": cert_dir.join(format!("{}.crt", cell.algorithm)),
        "key": cert_dir.join(format!("{}.key", cell.algorithm)),
    });
    let resp = send(
        http::Method::POST,
        &format!("{admin}/admin/tls"),
        Some(bytes::Bytes::from(body.to_string())),
        &Options {
            headers: vec![("authorization".into(), format!("Bearer {token}"))],
            timeout: Some(Duration::from_secs(30)),
            tls: if admin.starts_with("https://") {
                Some(crate::client::http::trust_config(Some(ca), false)?)
            } else {
                None
            },
            ..Default::default()
        },
    )
    .await?;
    if resp.status != 200 {
        bail!(
            "switching the proxy to {} {}: HTTP {}: {}",
            cell.provider,
            cell.algorithm,
            resp.status,
            resp.text()
        );
    }
    let mut run = cell_run_args(base, cell, target, ca, out);
    run.proxy_metrics = Some(format!("{admin}/metrics"));
    measure(run, stop).await
}

async fn wait_ready(url: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = send(http::Method::GET, url, None, &Options::default()).await {
            if r.status == 200 {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("{url} did not answer 200 within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn credentials_among_the_run_flags_are_not_recorded() {
        #[derive(serde::Serialize)]
        struct Recorded(#[serde(serialize_with = "super::redact_run_args")] Vec<String>);
        let flags = [
            "--dim",
            "768",
            "--api-key",
            "k",
            "--header=authorization: Bearer t",
        ];
        let json = serde_json::to_string(&Recorded(flags.map(String::from).to_vec())).unwrap();
        assert_eq!(
            json,
            r#"["--dim","768","--api-key","(redacted)","--header=(redacted)"]"#
        );
    }
}
