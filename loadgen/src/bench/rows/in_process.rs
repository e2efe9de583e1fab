//! The database's own TLS beside a terminator in front of it. Every column of every set-up
//! (one worker each, and each at its defaults: the proxy a worker per CPU, nginx
//! `worker_processes auto`, HAProxy its default threads) is started in front of
//! embedded-qdrant in plaintext, and embedded-qdrant terminating TLS itself with rustls and
//! ring, as Qdrant does with `service.enable_tls`, is a column of its own (with the
//! defaults set-up). On a small host the database keeps its cores busy, and a terminator
//! with one worker may serve it for less than one with a worker per CPU: both set-ups show
//! it. Each loop is the mission's unit
//! of work against a real database: a new TLS connection carrying one UPSERT_100 of
//! 1024-d vectors (REST JSON over HTTP/1.1, or gRPC), `wait=true`, then closed, at the
//! bench's concurrency. The figure is the CPU of terminator and database together per
//! upsert, since TLS in process is part of the database's own; the terminator's share and
//! the upserts/s stand beside it.
//!
//! The database's CPU is most of every figure here, so its rounds are interleaved per
//! algorithm: each column in turn, the in-process one last (the whole order reversed every
//! other round), then the next algorithm.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use proxy::crypto::CertAlgorithmName;

use super::{loop_config, Bench, ColumnStarter, Measure, Measuring, OwnRows, RowSet};
use crate::bench::table::Table;
use crate::bench::terminators::{Database, Setup, Terminator};
use crate::bench::workloads::{self, Bulk, Clients, RecurringUpserts};
use crate::bench::BenchPlan;
use crate::client::qdrant::Admin;
use crate::client::{Connector, Target};
use crate::driver::{self, ConnectionPolicy};
use crate::workload::{UpsertSpec, Workload, ID_MIN, TEMPLATE_VARIANTS};

/// The collection every loop upserts into, recreated on each database.
const COLLECTION: &str = "bench_in_process";
/// UPSERT_100 of 1024-d vectors, four decimals in JSON (~780 KB; ~416 KB as protobuf).
const DIM: usize = 1024;
const POINTS: usize = 100;
const JSON_DECIMALS: usize = 4;
/// Requests after which the point ids recur (a multiple of the template variants).
const RECURRING: u64 = 8 * TEMPLATE_VARIANTS as u64;

/// The column of the database terminating TLS itself.
pub fn own_tls_column() -> String {
    format!("embedded-qdrant own TLS{}", Setup::Defaults.suffix())
}

/// The rows of one algorithm and one protocol.
struct Keys {
    alg: CertAlgorithmName,
    kind: Bulk,
    /// Terminator and database CPU per upsert.
    total: String,
    /// The terminator's part of it.
    terminator: String,
    /// Upserts acknowledged per second.
    rate: String,
}

impl Keys {
    /// Why `label` has no figures in these rows.
    fn missing(&self, table: &mut Table, label: &str, why: &anyhow::Error) {
        for key in [&self.total, &self.terminator, &self.rate] {
            table.put(key, label, Err(anyhow!("{why:#}")));
        }
    }
}

/// The in-process TLS rows.
pub struct InProcessTls {
    algorithms: Vec<CertAlgorithmName>,
    /// The database's own TLS is a column (it belongs to the defaults set-up: the
    /// database runs at its own defaults).
    own_tls: bool,
    keys: Vec<Keys>,
}

impl InProcessTls {
    /// For `--algorithms`; the database's own TLS measured when `--setups` has the
    /// defaults set-up.
    pub fn new(plan: &BenchPlan) -> Self {
        Self {
            algorithms: plan.algorithms().to_vec(),
            own_tls: plan.setups.contains(&Setup::Defaults),
            keys: Vec::new(),
        }
    }
}

/// One database and what the loops against it need.
struct Upstream<'a> {
    db: &'a Database,
    kind: Bulk,
    vectors: &'a crate::vectors::VectorSet,
}

/// What one loop measured.
struct Cell {
    total_ms: f64,
    terminator_ms: Option<f64>,
    per_second: f64,
    work: String,
}

impl RowSet for InProcessTls {
    fn declare(&mut self, table: &mut Table) {
        for alg in &self.algorithms {
            for (kind, what) in [(Bulk::H1Rest, "JSON over HTTP/1.1"), (Bulk::Grpc, "gRPC")] {
                let a = alg.as_str();
                self.keys.push(Keys {
                    alg: *alg,
                    kind,
                    total: table.declare(
                        format!(
                            "new TLS connection + UPSERT_100 into embedded-qdrant, {what}, {a}: \
                             terminator + database"
                        ),
                        "ms CPU",
                    ),
                    terminator: table
                        .declare(format!("  of which the terminator, {what} {a}"), "ms CPU"),
                    rate: table.declare(format!("  upserts/s, {what} {a}"), "upserts/s"),
                });
            }
        }
    }

    fn own_columns(&self) -> Vec<String> {
        if self.own_tls {
            vec![own_tls_column()]
        } else {
            Vec::new()
        }
    }

    fn how(&self) -> Measure<'_> {
        Measure::OnItsOwn(self)
    }
}

impl OwnRows for InProcessTls {
    fn measure_on_its_own<'a>(
        &'a self,
        bench: &'a Bench<'a>,
        columns: &'a [ColumnStarter<'a>],
        table: &'a mut Table,
    ) -> Measuring<'a, ()> {
        Box::pin(async move {
            let binary = bench.plan.upstream_bin.clone();
            let work = bench.plan.flags.out.join("work");
            let vectors = crate::vectors::synthetic(TEMPLATE_VARIANTS * POINTS, DIM, 0x1b_5eed);
            for kind in [Bulk::H1Rest, Bulk::Grpc] {
                if bench.stop.is_cancelled() {
                    return;
                }
                self.measure_kind(bench, &binary, &work, &vectors, columns, kind, table)
                    .await;
            }
        })
    }
}

impl InProcessTls {
    /// Every column's rows of one protocol: a plaintext database for the terminators, all
    /// started in front of it, then per round and algorithm each column in turn and the
    /// database with its own TLS.
    #[allow(clippy::too_many_arguments)]
    async fn measure_kind(
        &self,
        bench: &Bench<'_>,
        binary: &Path,
        work: &Path,
        vectors: &crate::vectors::VectorSet,
        columns: &[ColumnStarter<'_>],
        kind: Bulk,
        table: &mut Table,
    ) {
        let keys: Vec<&Keys> = self.keys.iter().filter(|k| k.kind == kind).collect();
        let own = own_tls_column();
        let fail = |table: &mut Table, label: &str, e: &anyhow::Error| {
            eprintln!("{label} in front of embedded-qdrant, {kind:?}: {e:#}");
            for k in &keys {
                k.missing(table, label, e);
            }
        };
        let plain = match start_database(binary, work, "embedded-qdrant-plain", kind, None).await {
            Ok(db) => db,
            Err(e) => {
                for label in columns.iter().map(|c| c.label).chain([own.as_str()]) {
                    fail(table, label, &e);
                }
                return;
            }
        };
        let upstream = if kind == Bulk::Grpc {
            plain.grpc
        } else {
            plain.rest
        };
        let mut fronts: Vec<(&str, Option<Terminator>)> = Vec::new();
        for c in columns {
            match (c.start)(&[upstream]) {
                Ok(t) => fronts.push((c.label, Some(t))),
                Err(e) => {
                    fail(table, c.label, &e.context("did not start"));
                    fronts.push((c.label, None));
                }
            }
        }
        let behind = Upstream {
            db: &plain,
            kind,
            vectors,
        };
        for round in 1..=bench.plan.rounds {
            table.set_round(round);
            for k in &keys {
                // The database's own TLS is the last column, in the order's turn like the
                // others (last, or first every other round).
                let columns = fronts.len() + usize::from(self.own_tls);
                for column in super::round_order(columns, round) {
                    if bench.stop.is_cancelled() {
                        break;
                    }
                    let Some((label, t)) = fronts.get_mut(column) else {
                        let cell = measure_own_tls(bench, binary, work, kind, vectors, k.alg).await;
                        put(table, k, &own, kind, cell);
                        continue;
                    };
                    let Some(t) = t.as_mut() else { continue };
                    let cell = async {
                        let addr = *t
                            .addrs
                            .get(&k.alg)
                            .ok_or_else(|| anyhow!("no listener for {}", k.alg.as_str()))?;
                        measure_loop(bench, &behind, addr, Some(t)).await
                    }
                    .await;
                    put(table, k, label, kind, cell);
                    if !t.alive() {
                        eprintln!("{label}: died: {}", t.log_tail());
                    }
                }
            }
        }
        for (_, t) in fronts {
            if let Some(t) = t {
                t.stop();
            }
        }
        plain.stop();
    }
}

/// One loop against embedded-qdrant terminating TLS itself with `alg`'s certificate,
/// started for the loop and stopped after it.
async fn measure_own_tls(
    bench: &Bench<'_>,
    binary: &Path,
    work: &Path,
    kind: Bulk,
    vectors: &crate::vectors::VectorSet,
    alg: CertAlgorithmName,
) -> Result<Cell> {
    let pair = (bench.certs.cert(alg), bench.certs.key(alg));
    let db = start_database(
        binary,
        work,
        "embedded-qdrant-tls",
        kind,
        Some((pair, bench.clients)),
    )
    .await?;
    let addr = if kind == Bulk::Grpc { db.grpc } else { db.rest };
    let own_tls = Upstream {
        db: &db,
        kind,
        vectors,
    };
    let cell = measure_loop(bench, &own_tls, addr, None).await;
    db.stop();
    cell
}

/// Puts one loop's figures, or why there are none, in the rows of `k`.
fn put(table: &mut Table, k: &Keys, label: &str, kind: Bulk, cell: Result<Cell>) {
    match cell {
        Ok(c) => {
            eprintln!(
                "{label} {kind:?} upsert into embedded-qdrant, {}: {:.2} ms CPU per upsert \
                 with the database, {:.1} upserts/s",
                k.alg.as_str(),
                c.total_ms,
                c.per_second
            );
            table.note_work(&k.total, label, c.work);
            table.put(&k.total, label, Ok(c.total_ms));
            table.put(
                &k.terminator,
                label,
                c.terminator_ms
                    .ok_or_else(|| anyhow!("TLS terminated inside the database")),
            );
            table.put(&k.rate, label, Ok(c.per_second));
        }
        Err(e) => {
            eprintln!("{label} {kind:?} upsert into embedded-qdrant: {e:#}");
            k.missing(table, label, &e);
        }
    }
}

/// Starts embedded-qdrant, in plaintext or with its own TLS (a certificate and key, and
/// the bench's clients to reach it), and creates the collection on it over the port
/// `kind` uses.
async fn start_database(
    binary: &Path,
    work: &Path,
    name: &str,
    kind: Bulk,
    own_tls: Option<((PathBuf, PathBuf), &Clients)>,
) -> Result<Database> {
    let (binary, work, name) = (binary.to_owned(), work.to_owned(), name.to_owned());
    let files = own_tls.as_ref().map(|(pair, _)| pair.clone());
    let db = tokio::task::spawn_blocking(move || {
        Database::start(
            &binary,
            &work,
            &name,
            files.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
        )
    })
    .await??;
    let addr = if kind == Bulk::Grpc { db.grpc } else { db.rest };
    let connector = match own_tls {
        Some((_, clients)) => workloads::connector(addr, clients, kind).await?,
        None => Arc::new(
            Connector::new(
                Target {
                    host: addr.ip().to_string(),
                    port: addr.port(),
                    tls: false,
                },
                kind.protocol(),
                None,
                None,
            )
            .await?,
        ),
    };
    let created = async {
        Admin::connect(&connector)
            .await?
            .ensure_collection(COLLECTION, DIM, true)
            .await
    }
    .await;
    match created {
        Ok(_) => Ok(db),
        Err(e) => {
            let log = db.log_tail();
            db.stop();
            Err(e.context(format!("creating {COLLECTION}: {log}")))
        }
    }
}

/// One loop of new-connection upserts to `addr` (a terminator in front of `upstream`'s
/// database, or the database itself): the warm-up, then the measured run inside CPU
/// windows on the terminator (if any) and on the database.
async fn measure_loop(
    bench: &Bench<'_>,
    upstream: &Upstream<'_>,
    addr: SocketAddr,
    terminator: Option<&Terminator>,
) -> Result<Cell> {
    let connector = workloads::connector(addr, bench.clients, upstream.kind).await?;
    let spec = UpsertSpec {
        protocol: upstream.kind.protocol(),
        collection: COLLECTION.to_owned(),
        points_per_request: POINTS,
        wait: true,
        json_decimals: JSON_DECIMALS,
    };
    let upserts = Workload::build(
        spec,
        upstream.vectors,
        ID_MIN,
        "https",
        &workloads::authority(addr),
    )?;
    let source: Arc<dyn crate::workload::RequestSource> =
        Arc::new(RecurringUpserts::new(upserts, RECURRING));
    let run = |duration| {
        let config = loop_config(
            ConnectionPolicy::New,
            bench.plan.flags.concurrency,
            duration,
        );
        driver::run(
            source.clone(),
            connector.clone(),
            config,
            bench.stop.clone(),
        )
    };
    run(bench.plan.flags.warmup).await;
    let front = terminator.map(Terminator::cpu_window).transpose()?;
    let db = upstream.db.cpu_window()?;
    let out = run(bench.plan.flags.duration).await;
    let front = front.map(|w| w.close()).transpose()?;
    let db = db.close().context("the database's CPU")?;
    let failed = super::failed(&out);
    if out.ok == 0 {
        return Err(super::nothing_succeeded(&out));
    }
    if let Some((kind, e)) = out.failure_examples.iter().next() {
        eprintln!("{failed} failed, first ({kind}): {e}");
    }
    let per_upsert = |cpu_s: f64| cpu_s * 1e3 / out.ok as f64;
    let front_s = front.map(|c| c.total());
    Ok(Cell {
        total_ms: per_upsert(front_s.unwrap_or(0.0) + db.total()),
        terminator_ms: front_s.map(per_upsert),
        per_second: out.ok as f64 / out.elapsed.as_secs_f64().max(1e-9),
        work: format!(
            "{} upserts on as many connections, {:.0} MB, {failed} failed; database {:.2} ms per upsert",
            out.ok,
            out.ok_body_bytes as f64 / 1e6,
            per_upsert(db.total())
        ),
    })
}
