//! What a comparison runs, decided once from its flags before anything starts: where the
//! proxy is (started here under its CPU budget, or running elsewhere behind its admin API),
//! the cells in run order, and the `loadgen run` settings every cell shares. `execute` then
//! acts on the plan and reads no flag again.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use proxy::crypto::{CertAlgorithmName, ProviderName};

use super::{CompareArgs, CONCURRENCY};
use crate::budget::{BudgetChoice, Cgroups, Prepared};
use crate::result::{Cell, CellProvider};
use crate::run::RunArgs;

/// Where the proxy of every cell is.
#[derive(Debug)]
pub enum Mode {
    /// Compare starts a fresh proxy per cell on this machine.
    Local {
        /// An upstream to use instead of starting embedded-qdrant.
        upstream: Option<String>,
        /// The proxy's CPU budget in cores; `None` runs it unbudgeted (`none`).
        budget: Option<f64>,
    },
    /// A running proxy on another host, switched between cells through `POST /admin/tls`.
    Remote {
        /// Its admin URL, without a trailing slash.
        admin: String,
        /// The admin bearer token.
        token: String,
        /// Its client-facing address, HOST:PORT.
        target: String,
        /// Where `<algorithm>.crt` and `.key` are on its host.
        cert_dir: PathBuf,
        /// The CA that verifies it.
        ca: PathBuf,
    },
}

/// The comparison, typed.
#[derive(Debug)]
pub struct ComparePlan {
    /// The flags with every default decided (what compare-args.json records).
    pub args: CompareArgs,
    /// Where the proxy is.
    pub mode: Mode,
    /// Every cell, in run order.
    pub cells: Vec<Cell>,
    /// The `loadgen run` settings every cell shares.
    pub base: RunArgs,
}

impl ComparePlan {
    /// Decides everything from `flags`: defaults, the mode and its settings (a remote
    /// proxy's token read, a local proxy's budget proved possible here), the cells and the
    /// flags after `--`. Every refusal comes from here, before any certificate, upstream or
    /// proxy exists.
    pub fn new(flags: &CompareArgs) -> Result<Self> {
        let args = flags.resolved();
        // Every cell's flags are parsed and checked once, up front.
        let base = base_run_args(&args)
            .map_err(|e| anyhow!("flags after -- are not valid `loadgen run` flags here: {e}"))?;
        let mode = match &args.proxy_admin {
            Some(admin) => remote_mode(&args, admin)?,
            None => {
                let budget = match args.proxy_cpu_budget {
                    Some(BudgetChoice::Cores(cores)) => {
                        prove_budget(cores)?;
                        Some(cores)
                    }
                    _ => None,
                };
                Mode::Local {
                    upstream: args.upstream.clone(),
                    budget,
                }
            }
        };
        let repeat = args.repeat.unwrap_or(args.profile.repeat());
        let cells = cells(args.providers(), &args.terminators.algorithms, repeat);
        Ok(Self {
            args,
            mode,
            cells,
            base,
        })
    }
}

/// A remote proxy's settings, each required flag named when missing.
fn remote_mode(args: &CompareArgs, admin: &str) -> Result<Mode> {
    if let Some(BudgetChoice::Cores(_)) = args.proxy_cpu_budget {
        bail!(
            "--proxy-cpu-budget applies to a proxy compare starts; a remote proxy's budget is set \
             on its host (systemd's CPUQuota=, docker --cpus, a Kubernetes CPU limit)"
        );
    }
    let admin = admin.trim_end_matches('/').to_owned();
    let target = args.target.clone().ok_or_else(|| {
        anyhow!("--proxy-admin needs --target HOST:PORT (the proxy's TLS listener)")
    })?;
    if admin.starts_with("http://") && !args.proxy_admin_plaintext && !is_loopback_url(&admin) {
        bail!(
            "--proxy-admin {admin}: plain HTTP to another host would send the bearer token in clear; serve the proxy's admin port over TLS (admin.tls_cert, admin.tls_key) and use https://, or pass --proxy-admin-plaintext"
        );
    }
    let token = match &args.proxy_admin_token_file {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("--proxy-admin-token-file {}", p.display()))?
            .trim()
            .to_owned(),
        None => bail!("--proxy-admin needs --proxy-admin-token-file"),
    };
    let ca = args.ca.clone().ok_or_else(|| {
        anyhow!("--proxy-admin needs --ca (the CA that signed the proxy's certificates)")
    })?;
    let cert_dir = args.remote_cert_dir.clone().ok_or_else(|| {
        anyhow!("--proxy-admin needs --remote-cert-dir (where <algorithm>.crt/.key are on the proxy host)")
    })?;
    Ok(Mode::Remote {
        admin,
        token,
        target,
        cert_dir,
        ca,
    })
}

/// Proves a budget of `cores` can be given here: a group made and removed (or, for a
/// systemd scope, a scope run), so that a machine without a mechanism stops the comparison
/// before its first cell with the reason, not after certificates and an upstream.
fn prove_budget(cores: f64) -> Result<()> {
    let name = format!("vtp-loadgen-{}-check", std::process::id());
    let prepared =
        Prepared::new(&Cgroups::default(), cores, &name).context("--proxy-cpu-budget")?;
    if let Prepared::SystemdScope { .. } = prepared {
        let status = prepared
            .command(std::process::Command::new("true"))
            .status()
            .context("--proxy-cpu-budget: running systemd-run")?;
        if !status.success() {
            bail!(
                "--proxy-cpu-budget: systemd-run could not start a scope with CPUQuota= ({status})"
            );
        }
    }
    prepared.remove();
    Ok(())
}

/// Every cell of the matrix, in run order: rounds outermost, then algorithms, then providers
/// (so the providers of one algorithm run back to back).
pub fn cells(
    providers: &[ProviderName],
    algorithms: &[CertAlgorithmName],
    repeat: u32,
) -> Vec<Cell> {
    let mut cells = Vec::new();
    for r in 1..=repeat.max(1) {
        for a in algorithms {
            for p in providers {
                cells.push(Cell {
                    provider: CellProvider::Proxy(*p),
                    algorithm: a.to_string(),
                    repeat: r,
                });
            }
        }
    }
    cells
}

/// The `run` flags compare decides for every cell; set after `--` they are refused
/// rather than silently overridden. (`--target` is refused by clap itself: it is given.)
const FLAGS_COMPARE_SETS: [&str; 17] = [
    "protocol",
    "collection",
    "recreate",
    "concurrency",
    "connection_policy",
    "resumption",
    "kx",
    "tls_version",
    "warmup",
    "duration",
    "requests",
    "quiet",
    "ca",
    "out",
    "proxy_metrics",
    "cell_repeat",
    "proxy_cpu_budget",
];

/// Stands for a cell's target until the cell knows it (a local cell's proxy picks its port).
const TARGET_PER_CELL: &str = "localhost:1";

/// What every cell runs, typed and checked once before anything starts: the flags after
/// `--` parsed (once, the only parse), compare's own settings applied over them. Each cell
/// then sets only what is its own (target, CA, output, cell, the proxy's metrics).
pub(super) fn base_run_args(args: &CompareArgs) -> Result<RunArgs> {
    use clap::{CommandFactory, FromArgMatches};
    let argv = ["loadgen", "run", "--target", TARGET_PER_CELL]
        .into_iter()
        .map(str::to_owned)
        .chain(args.run_args.iter().cloned());
    let matches = RunWrapper::command()
        .try_get_matches_from(argv)
        .map_err(|e| anyhow!("{e}"))?;
    let sub = matches
        .subcommand_matches("run")
        .expect("the argument list starts with run");
    for id in FLAGS_COMPARE_SETS {
        if sub.value_source(id) == Some(clap::parser::ValueSource::CommandLine) {
            bail!(
                "--{} is set by compare for every cell; use compare's own flag (see loadgen compare --help)",
                id.replace('_', "-")
            );
        }
    }
    let mut run = RunArgs::from_arg_matches(sub).map_err(|e| anyhow!("{e}"))?;
    run.protocol = Some(args.protocol);
    // The same collection state for every cell: an index that grows across cells would
    // make later cells slower for reasons that have nothing to do with TLS.
    run.collection = "compare".to_owned();
    run.recreate = true;
    run.concurrency = args.concurrency.unwrap_or(CONCURRENCY);
    run.connection_policy = args.connection_policy;
    run.resumption = args.resumption;
    run.kx = args.kx.clone();
    run.tls_version = Some(args.tls_version);
    run.warmup = args.warmup.unwrap_or_else(|| args.profile.warmup().into());
    match (args.requests, args.duration) {
        (Some(n), _) => run.requests = Some(n),
        (None, d) => run.duration = Some(d.unwrap_or_else(|| args.profile.duration().into())),
    }
    run.quiet = true;
    run.check()?;
    Ok(run)
}

/// One cell's run: `base` with the cell's own settings.
pub(super) fn cell_run_args(
    base: &RunArgs,
    cell: &Cell,
    target: &str,
    ca: &Path,
    out: &Path,
) -> RunArgs {
    let mut run = base.clone();
    run.target = target.to_owned();
    run.ca = Some(ca.to_owned());
    run.out = Some(out.to_owned());
    run.cell_provider = Some(cell.provider.clone());
    run.cell_algorithm = Some(cell.algorithm.clone());
    run.cell_repeat = cell.repeat;
    run
}

/// clap wrapper so the `run` flags after `--` are parsed by the same definitions as
/// `loadgen run`'s.
#[derive(Parser)]
struct RunWrapper {
    #[command(subcommand)]
    cmd: RunCmd,
}

#[derive(clap::Subcommand)]
enum RunCmd {
    Run(Box<RunArgs>),
}

/// Whether `url`'s host is this machine (localhost or a loopback address).
pub(super) fn is_loopback_url(url: &str) -> bool {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return false;
    };
    match uri.host() {
        Some("localhost") => true,
        Some(h) => h
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::DEFAULT_PROXY_CPU_BUDGET;
    use crate::result::{OnOff, TlsVersion};
    use proxy::crypto::KxGroupName;
    use std::time::Duration;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: CompareArgs,
    }

    fn compare_args(extra: &[&str]) -> CompareArgs {
        Wrapper::try_parse_from(["compare"].iter().chain(extra))
            .unwrap()
            .args
    }

    /// An installed QAT provider joins openssl-qat to the default providers at the same
    /// concurrency and budget as every other provider, and its cells (only those) get the
    /// provider's directory; explicit flags win.
    #[test]
    fn an_installed_qat_provider_joins_the_matrix_at_the_same_concurrency_and_budget() {
        let dir = std::env::temp_dir().join(format!("qat-modules-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("qatprovider.so"), b"").unwrap();
        let path = dir.display().to_string();
        let args = compare_args(&["--qat-module-path", &path]).resolved();
        assert_eq!(args.providers(), &ProviderName::ALL);
        assert_eq!(args.concurrency, Some(CONCURRENCY));
        let without_qat = compare_args(&["--providers", "ring,aws-lc-rs"]).resolved();
        assert_eq!(without_qat.concurrency, args.concurrency);
        assert_eq!(without_qat.proxy_cpu_budget, args.proxy_cpu_budget);
        assert_eq!(
            args.proxy_cpu_budget,
            Some(BudgetChoice::Cores(DEFAULT_PROXY_CPU_BUDGET))
        );
        assert_eq!(
            args.proxy_args_for(ProviderName::OpensslQat),
            vec![format!("--qat-module-path={path}")]
        );
        assert!(args.proxy_args_for(ProviderName::Openssl).is_empty());

        let explicit = compare_args(&[
            "--qat-module-path",
            &path,
            "--providers",
            "openssl,openssl-qat",
            "--concurrency",
            "64",
        ])
        .resolved();
        assert_eq!(
            explicit.providers(),
            &[ProviderName::Openssl, ProviderName::OpensslQat]
        );
        assert_eq!(explicit.concurrency, Some(64));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Remote mode's flags are checked when the plan is made: each missing one named, a
    /// budget refused (it belongs to the proxy's host).
    #[test]
    fn a_remote_plan_names_what_it_lacks_and_refuses_a_budget() {
        let remote = [
            "--proxy-admin",
            "http://127.0.0.1:9900",
            "--proxy-cpu-budget",
            "none",
        ];
        let err = format!(
            "{:#}",
            ComparePlan::new(&compare_args(&remote)).unwrap_err()
        );
        assert!(err.contains("--target"), "{err}");
        let budgeted = [
            "--proxy-admin",
            "http://127.0.0.1:9900",
            "--proxy-cpu-budget",
            "0.5",
        ];
        let err = format!(
            "{:#}",
            ComparePlan::new(&compare_args(&budgeted)).unwrap_err()
        );
        assert!(err.contains("on its host"), "{err}");
        let plaintext = [
            "--proxy-admin",
            "http://proxy-host:9900",
            "--target",
            "proxy-host:6334",
        ];
        let err = format!(
            "{:#}",
            ComparePlan::new(&compare_args(&plaintext)).unwrap_err()
        );
        assert!(err.contains("in clear"), "{err}");
    }

    /// An unbudgeted local plan: every provider and algorithm in interleaved rounds, at
    /// one concurrency.
    #[test]
    fn a_local_plan_orders_its_cells_by_round_then_algorithm_then_provider() {
        let args = compare_args(&[
            "--providers",
            "ring,aws-lc-rs",
            "--algorithms",
            "rsa2048,ecdsa-p256",
            "--repeat",
            "2",
            "--proxy-cpu-budget",
            "none",
        ]);
        let plan = ComparePlan::new(&args).unwrap();
        assert!(matches!(plan.mode, Mode::Local { budget: None, .. }));
        let order: Vec<String> = plan
            .cells
            .iter()
            .map(|c| format!("{} {} {}", c.repeat, c.algorithm, c.provider))
            .collect();
        assert_eq!(
            order,
            [
                "1 rsa2048 ring",
                "1 rsa2048 aws-lc-rs",
                "1 ecdsa-p256 ring",
                "1 ecdsa-p256 aws-lc-rs",
                "2 rsa2048 ring",
                "2 rsa2048 aws-lc-rs",
                "2 ecdsa-p256 ring",
                "2 ecdsa-p256 aws-lc-rs"
            ]
        );
        assert_eq!(plan.base.concurrency, CONCURRENCY);
    }

    /// The flags after `--` are parsed once into typed settings, compare's own settings
    /// win over nothing (they cannot be given twice), and each cell only adds its own.
    #[test]
    fn every_cell_gets_one_typed_plan_and_its_own_settings() {
        let args = compare_args(&[
            "--concurrency",
            "6",
            "--resumption",
            "on",
            "--tls-version",
            "1.2",
            "--duration",
            "2s",
            "--",
            "--dim",
            "64",
            "--points-per-request",
            "10",
        ]);
        let base = base_run_args(&args).unwrap();
        assert_eq!(base.dim, 64);
        assert_eq!(base.points_per_request, 10);
        assert_eq!(base.concurrency, 6);
        assert_eq!(base.resumption, OnOff::On);
        assert_eq!(base.tls_version, Some(TlsVersion::Tls12));
        assert_eq!(
            base.duration.map(Duration::from),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            base.warmup,
            Duration::from_secs(1).into(),
            "the quick profile's"
        );
        assert_eq!(base.collection, "compare");
        assert!(base.recreate && base.quiet);
        let cell = Cell {
            provider: CellProvider::Proxy(ProviderName::Ring),
            algorithm: "rsa2048".into(),
            repeat: 2,
        };
        let run = cell_run_args(
            &base,
            &cell,
            "localhost:4433",
            Path::new("ca.crt"),
            Path::new("out.json"),
        );
        assert_eq!(run.target, "localhost:4433");
        assert_eq!(
            run.cell_provider,
            Some(CellProvider::Proxy(ProviderName::Ring))
        );
        assert_eq!(run.cell_algorithm.as_deref(), Some("rsa2048"));
        assert_eq!(run.cell_repeat, 2);
        assert_eq!(run.ca.as_deref(), Some(Path::new("ca.crt")));
        assert_eq!(run.dim, 64, "the flags after -- carry over");
    }

    /// `--kx` is a list of groups, typed once: every cell's client offers them in order,
    /// and results record them as the command line wrote them.
    #[test]
    fn key_exchange_groups_are_a_typed_list_recorded_as_written() {
        let args = compare_args(&["--kx", "x25519,secp256r1"]);
        assert_eq!(args.kx, [KxGroupName::X25519, KxGroupName::Secp256r1]);
        let base = base_run_args(&args).unwrap();
        assert_eq!(base.kx, args.kx);
        let recorded = crate::result::RunConfig::of(&base).unwrap();
        assert_eq!(recorded.kx, "x25519,secp256r1");
        assert!(
            Wrapper::try_parse_from(["compare", "--kx", "x25519,bogus"]).is_err(),
            "an unknown group is refused by the command line"
        );
    }

    #[test]
    fn flags_after_the_separator_that_compare_sets_are_refused_not_overridden() {
        for flag in [
            "--concurrency=8",
            "--resumption=on",
            "--out=x.json",
            "--target=h:1",
        ] {
            let err = base_run_args(&compare_args(&["--", flag])).unwrap_err();
            let text = format!("{err:#}");
            assert!(
                text.contains(flag.split('=').next().unwrap())
                    || text.contains("cannot be used multiple times"),
                "{flag}: {text}"
            );
        }
        // And a bad value fails before any cell starts.
        let err = base_run_args(&compare_args(&["--", "--rate", "0"])).unwrap_err();
        assert!(format!("{err:#}").contains("--rate"), "{err:#}");
    }

    #[test]
    fn only_this_machine_counts_as_loopback() {
        assert!(is_loopback_url("http://127.0.0.1:9900"));
        assert!(is_loopback_url("http://localhost:9900/"));
        assert!(is_loopback_url("http://[::1]:9900"));
        assert!(!is_loopback_url("http://10.0.0.5:9900"));
        assert!(!is_loopback_url("http://proxy-host:9900"));
    }
}
