//! The proxy's user-space instructions per unit of work, counted by valgrind's callgrind:
//! a new connection with a tiny GET (per certificate algorithm), a new connection carrying
//! one upsert (JSON over HTTP/1.1, gRPC over h2), and a keep-alive MB of each bulk kind.
//! Seconds of CPU on a shared machine move by several per cent from run to run; the
//! instructions the same binary executes for the same input do not, so a change worth a
//! few per cent shows in one run (and a figure here compares builds, not terminators).
//!
//! Each of our providers runs afresh under `valgrind --tool=callgrind` with one worker; per
//! row, the bench's own client sends a few unmeasured units, `callgrind_control --zero`
//! clears the counts, a fixed number of units goes through one at a time, and
//! `callgrind_control --dump` writes the counts of exactly those units. Only the proxy is
//! counted: the peers' columns have no figure here.
//!
//! valgrind comes from Debian's package, installed with apt-get when missing (as root).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use proxy::crypto::{CertAlgorithmName, ProviderName};

use super::{loop_config, Bench, ColumnStarter, Measure, Measuring, OwnRows, RowSet};
use crate::bench::table::Table;
use crate::bench::terminators::{ensure_tool, start_proxy, Setup, Terminator};
use crate::bench::workloads::{
    self, grpc_body, json_body, Bulk, TinyGet, Upload, BULK_JSON_BYTES, UPSERT_GRPC_BYTES,
    UPSERT_JSON_BYTES,
};
use crate::bench::BenchPlan;
use crate::driver::{self, ConnectionPolicy};
use crate::workload::RequestSource;

/// Why a column has no instruction count (rendered as a dash, not as a note).
pub const PROXY_ONLY: &str = "instructions: the proxy with one worker only";
/// Unmeasured units before the counts are cleared: connection pools, lazily built state.
const WARM_UNITS: u64 = 5;
/// How long callgrind_control may take to reach the process.
const CONTROL_LIMIT: Duration = Duration::from_secs(60);

/// What a row counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Counted {
    /// A new connection with a tiny GET, on this algorithm's listener.
    TinyGet(CertAlgorithmName),
    /// A new connection carrying one upsert of this kind (P-256, or the first algorithm).
    Upsert(Bulk),
    /// A keep-alive MB of this kind.
    KeepAlive(Bulk),
}

impl Counted {
    /// Units counted: enough that the few hundred thousand instructions of a dump and of the
    /// driver's own pacing are lost in the total; few enough that the slowest (RSA-4096
    /// signatures, emulated) stays within a minute.
    fn units(self) -> u64 {
        match self {
            Self::TinyGet(CertAlgorithmName::Rsa4096) => 20,
            Self::TinyGet(_) => 100,
            Self::Upsert(_) => 20,
            Self::KeepAlive(_) => 40,
        }
    }
}

struct Keys {
    counted: Counted,
    key: String,
}

/// The instruction rows.
pub struct Instructions {
    algorithms: Vec<CertAlgorithmName>,
    /// `--instruction-units`.
    units: Option<u64>,
    keys: Vec<Keys>,
    json_upsert: Bytes,
    json_bulk: Bytes,
    grpc: Bytes,
}

impl Instructions {
    /// For `--algorithms`.
    pub fn new(plan: &BenchPlan) -> Self {
        Self {
            algorithms: plan.algorithms().to_vec(),
            units: plan.flags.instruction_units,
            keys: Vec::new(),
            json_upsert: json_body(UPSERT_JSON_BYTES),
            json_bulk: json_body(BULK_JSON_BYTES),
            grpc: grpc_body(UPSERT_GRPC_BYTES),
        }
    }

    /// The algorithm of the rows that are not per algorithm: P-256 if measured.
    fn main_algorithm(&self) -> Option<CertAlgorithmName> {
        self.algorithms
            .iter()
            .copied()
            .find(|a| *a == CertAlgorithmName::EcdsaP256)
            .or_else(|| self.algorithms.first().copied())
    }
}

impl RowSet for Instructions {
    fn declare(&mut self, table: &mut Table) {
        let main_algorithm = self.main_algorithm();
        let mut declare = |counted: Counted, name: String, unit: &str| {
            self.keys.push(Keys {
                counted,
                key: table.declare(name, unit),
            });
        };
        for alg in self.algorithms.clone() {
            declare(
                Counted::TinyGet(alg),
                format!(
                    "instructions, new TLS connection + tiny GET, {}",
                    alg.as_str()
                ),
                "k instr",
            );
        }
        if let Some(alg) = main_algorithm {
            let a = alg.as_str();
            declare(
                Counted::Upsert(Bulk::H1Rest),
                format!("instructions, new TLS connection + one 800 KB JSON upsert, HTTP/1.1, {a}"),
                "k instr",
            );
            declare(
                Counted::Upsert(Bulk::Grpc),
                format!("instructions, new TLS connection + one 416 KB gRPC upsert, h2, {a}"),
                "k instr",
            );
        }
        for (kind, name) in [
            (
                Bulk::H2Rest,
                "instructions, keep-alive 763 KB JSON, h2 -> HTTP/1.1",
            ),
            (
                Bulk::H1Rest,
                "instructions, keep-alive 763 KB JSON, HTTP/1.1 -> HTTP/1.1",
            ),
            (
                Bulk::Grpc,
                "instructions, keep-alive 416 KB gRPC, h2 -> h2c",
            ),
        ] {
            declare(Counted::KeepAlive(kind), name.to_owned(), "k instr per MB");
        }
    }

    fn how(&self) -> Measure<'_> {
        Measure::OnItsOwn(self)
    }
}

impl OwnRows for Instructions {
    fn measure_on_its_own<'a>(
        &'a self,
        bench: &'a Bench<'a>,
        columns: &'a [ColumnStarter<'a>],
        table: &'a mut Table,
    ) -> Measuring<'a, ()> {
        Box::pin(async move {
            let keys: Vec<&String> = self.keys.iter().map(|k| &k.key).collect();
            let tools = ensure_tool("valgrind", "valgrind").and_then(|valgrind| {
                let control = valgrind.with_file_name("callgrind_control");
                if control.is_file() {
                    Ok((valgrind, control))
                } else {
                    Err(anyhow!(
                        "{} is missing (Debian's valgrind package has it)",
                        control.display()
                    ))
                }
            });
            let plan = bench.plan;
            for column in columns {
                let ours = plan
                    .providers
                    .iter()
                    .find(|p| column.label == crate::bench::proxy_label(**p, column.setup));
                let provider = match ours {
                    Some(p) if column.setup == Setup::OneWorker => *p,
                    _ => {
                        table.put_missing(&keys, column.label, PROXY_ONLY);
                        continue;
                    }
                };
                let (valgrind, control) = match &tools {
                    Ok(t) => t,
                    Err(e) => {
                        table.put_missing(&keys, column.label, &format!("{e:#}"));
                        continue;
                    }
                };
                if bench.stop.is_cancelled() {
                    return;
                }
                let started = start_under_callgrind(bench, valgrind, provider, column.label);
                let t = match started {
                    Ok(t) => t,
                    Err(e) => {
                        eprintln!("{}: not started under callgrind: {e:#}", column.label);
                        table.put_missing(
                            &keys,
                            column.label,
                            &format!("not started under callgrind: {e:#}"),
                        );
                        continue;
                    }
                };
                let counter = Counter::new(control, callgrind_out(bench, provider), t.pid());
                for k in &self.keys {
                    if bench.stop.is_cancelled() {
                        break;
                    }
                    let figure = self.count(bench, &t, &counter, k.counted).await;
                    match &figure {
                        Ok(v) => {
                            eprintln!("{} {:?}: {v:.0} k instructions", column.label, k.counted)
                        }
                        Err(e) => eprintln!("{} {:?}: {e:#}", column.label, k.counted),
                    }
                    table.put(&k.key, column.label, figure);
                }
                t.stop();
            }
        })
    }
}

/// Where callgrind writes for `provider`: `<this>.<pid>` at exit, `<this>.<pid>.<n>` for
/// the n-th dump asked for.
fn callgrind_out(bench: &Bench<'_>, provider: ProviderName) -> PathBuf {
    bench
        .plan
        .flags
        .out
        .join("work")
        .join("callgrind")
        .join(provider.as_str())
}

/// Our proxy with `provider` and one worker (or `--proxy-worker-threads`), started afresh
/// under callgrind, its dumps and files under `work/callgrind`.
fn start_under_callgrind(
    bench: &Bench<'_>,
    valgrind: &Path,
    provider: ProviderName,
    label: &str,
) -> Result<Terminator> {
    let plan = bench.plan;
    let out = callgrind_out(bench, provider);
    let work = out.parent().context("callgrind's folder")?;
    std::fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
    let launcher = [
        valgrind.display().to_string(),
        "--tool=callgrind".into(),
        format!("--callgrind-out-file={}.%p", out.display()),
    ];
    start_proxy(
        &plan.proxy_bin,
        provider,
        label,
        bench.certs,
        bench.sinks,
        work,
        plan.flags.proxy_worker_threads.max(1),
        plan.proxy_args(),
        &launcher,
    )
}

impl Instructions {
    /// Thousands of instructions per unit (per MB for keep-alive) of `counted`.
    async fn count(
        &self,
        bench: &Bench<'_>,
        t: &Terminator,
        counter: &Counter<'_>,
        counted: Counted,
    ) -> Result<f64> {
        let (alg, kind, policy) = match counted {
            Counted::TinyGet(alg) => (alg, Bulk::H1Rest, ConnectionPolicy::New),
            Counted::Upsert(kind) => (
                self.main_algorithm().context("no algorithm")?,
                kind,
                ConnectionPolicy::New,
            ),
            Counted::KeepAlive(kind) => (
                self.main_algorithm().context("no algorithm")?,
                kind,
                ConnectionPolicy::Reuse,
            ),
        };
        let addr = *t.addrs.get(&alg).context("no listener for the algorithm")?;
        let connector = workloads::connector(addr, bench.clients, kind).await?;
        let authority = workloads::authority(addr);
        let source: Arc<dyn RequestSource> =
            match counted {
                Counted::TinyGet(_) => Arc::new(TinyGet::new(&authority)?),
                Counted::Upsert(Bulk::Grpc) | Counted::KeepAlive(Bulk::Grpc) => Arc::new(
                    Upload::new(Bulk::Grpc, self.grpc.clone(), &authority, false)?,
                ),
                Counted::Upsert(kind) => Arc::new(Upload::new(
                    kind,
                    self.json_upsert.clone(),
                    &authority,
                    true,
                )?),
                Counted::KeepAlive(kind) => Arc::new(Upload::new(
                    kind,
                    self.json_bulk.clone(),
                    &authority,
                    false,
                )?),
            };
        let send = |units: u64| {
            let mut config = loop_config(policy, 1, Duration::ZERO);
            config.duration = None;
            config.requests = Some(units);
            driver::run(
                source.clone(),
                connector.clone(),
                config,
                bench.stop.clone(),
            )
        };
        let warm = send(WARM_UNITS).await;
        if warm.ok == 0 {
            bail!(
                "nothing succeeded in the warm-up: {:?}",
                warm.failure_examples.values().next()
            );
        }
        counter.zero().await?;
        let units = self.units.unwrap_or_else(|| counted.units());
        let out = send(units).await;
        let instructions = counter.dump().await?;
        if out.ok != units {
            bail!(
                "{} of {units} units succeeded: {:?}",
                out.ok,
                out.failure_examples.values().next()
            );
        }
        let per = match counted {
            Counted::KeepAlive(_) => out.ok_body_bytes as f64 / 1e6,
            _ => units as f64,
        };
        Ok(instructions as f64 / 1e3 / per)
    }
}

/// callgrind_control on one process under callgrind.
struct Counter<'a> {
    control: &'a Path,
    pid: u32,
    /// `<out file>.<pid>`: its dumps are this with `.1`, `.2`, ... appended.
    dumps: PathBuf,
    /// Dumps asked for so far.
    dumped: std::cell::Cell<u32>,
}

impl<'a> Counter<'a> {
    fn new(control: &'a Path, out: PathBuf, pid: u32) -> Self {
        let mut dumps = out.into_os_string();
        dumps.push(format!(".{pid}"));
        Self {
            control,
            pid,
            dumps: dumps.into(),
            dumped: std::cell::Cell::new(0),
        }
    }

    async fn control(&self, arg: &str) -> Result<String> {
        let run = tokio::process::Command::new(self.control)
            .arg(arg)
            .arg(self.pid.to_string())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(CONTROL_LIMIT, run)
            .await
            .map_err(|_| anyhow!("callgrind_control {arg} did not answer"))?
            .context("running callgrind_control")?;
        if !out.status.success() {
            bail!(
                "callgrind_control {arg} {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Clears the counts.
    async fn zero(&self) -> Result<()> {
        self.control("--zero").await.map(drop)
    }

    /// Writes the counts since the last zero and returns their total of instructions.
    async fn dump(&self) -> Result<u64> {
        let said = self.control("--dump").await?;
        self.dumped.set(self.dumped.get() + 1);
        let mut file = self.dumps.clone().into_os_string();
        file.push(format!(".{}", self.dumped.get()));
        let file = PathBuf::from(file);
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        total_instructions(&text).with_context(|| format!("{} ({said})", file.display()))
    }
}

/// The instruction total of a callgrind dump: its `totals:` line (`summary:` in older
/// dumps), whose first event is Ir.
fn total_instructions(dump: &str) -> Result<u64> {
    dump.lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no totals line")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dumps_total_is_its_first_event() {
        let dump = "version: 1\ncreator: callgrind-3.19.0\npid: 4242\ncmd: proxy run\npart: 2\n\n\
                    events: Ir\n\nfl=(1) a.rs\nfn=(1) main\n3 100\n\ntotals: 1234567\n";
        assert_eq!(total_instructions(dump).unwrap(), 1_234_567);
        assert_eq!(total_instructions("summary: 42 7\n").unwrap(), 42);
        assert!(total_instructions("events: Ir\n").is_err());
    }
}
