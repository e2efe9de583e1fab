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

mod local;
mod plan;
mod qat;
mod remote;

use local::{cell_path_stem, run_local_cell};
use plan::cell_run_args;
pub use plan::{cells, ComparePlan, Mode};
use qat::{find_qat_provider, QAT_INSTALL_DIRS};
use remote::run_remote_cell;

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
    announce(&plan);
    let cells_dir = args.out.join("cells");
    std::fs::create_dir_all(&cells_dir)
        .with_context(|| format!("creating {}", args.out.display()))?;
    if !args.resume {
        remove_earlier_cells(&cells_dir)?;
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
    if let Some(upstream) = upstream {
        stop_upstream(upstream, args.keep_upstream_data)?;
    }
    let _ = std::fs::write(
        args.out.join("compare-args.json"),
        serde_json::to_vec_pretty(args)?,
    );
    eprintln!("matrix done in {:.0} s", started.elapsed().as_secs_f64());
    Ok(failures)
}

/// What the comparison runs with, said before the first cell: the QAT provider found (or
/// why none was), the proxy's CPU budget.
fn announce(plan: &ComparePlan) {
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
}

/// Removes the cell results an earlier run left in `cells_dir`.
fn remove_earlier_cells(cells_dir: &Path) -> Result<()> {
    // A new comparison starts clean: cells left from an earlier run with other settings
    // would otherwise be rendered into this report.
    let stale: Vec<PathBuf> = std::fs::read_dir(cells_dir)?
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
    Ok(())
}

/// Stops the upstream the comparison started and removes its data unless kept.
fn stop_upstream(upstream: Upstream, keep_data: bool) -> Result<()> {
    let Upstream { managed, data, .. } = upstream;
    if let Some(m) = managed {
        procs::stop(m)?;
    }
    if let Some(data) = data.filter(|_| !keep_data) {
        let bytes = dir_bytes(&data);
        std::fs::remove_dir_all(&data)
            .with_context(|| format!("removing the upstream's data {}", data.display()))?;
        eprintln!(
            "removed the upstream's data ({:.0} MB; --keep-upstream-data keeps it)",
            bytes as f64 / 1e6
        );
    }
    Ok(())
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
