//! The bench's rows, one module per kind of work. Each is a [`RowSet`]: it declares its
//! rows in the table, then measures them for one terminator at a time. [`registered`] is
//! the one list of them; a new row is a module here and a line there.
//!
//! The timed rows are loops of `loadgen run`'s own driver over a [`RequestSource`] of
//! `workloads`, with the terminator's CPU read over the loop by a probe window
//! ([`CpuWindow`](crate::probe::cpu::CpuWindow)); [`timed_figure`] and [`cpu_per_unit`]
//! are what they share.

pub mod bulk;
pub mod first_response;
pub mod handshake;
pub mod idle;
pub mod in_process;
pub mod instructions;
pub mod latency;
pub mod tools;
pub mod upsert;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use tokio_util::sync::CancellationToken;

use super::table::Table;
use super::terminators::{Certs, Setup, Terminator};
use super::workloads::{self, Bulk, Clients};
use super::{BenchPlan, Part};
use crate::client::Connector;
use crate::driver::{self, ConnectionPolicy, DriverConfig, Mode};
use crate::probe::cpu::CpuSplit;
use crate::workload::RequestSource;

/// How long one unit of work may take before it counts as failed (a terminator at its
/// connection limit leaves the rest waiting in its accept queue).
pub const UNIT_LIMIT: Duration = Duration::from_secs(10);
/// Most units a timed loop may send, whatever its duration: a bound on a runaway loop.
const MAX_UNITS_PER_LOOP: u64 = 1_000_000;

/// What every row may use, the same for the whole bench.
pub struct Bench<'a> {
    /// What the bench measures and how.
    pub plan: &'a BenchPlan,
    /// The TLS clients.
    pub clients: &'a Clients,
    /// The certificates every terminator serves.
    pub certs: &'a Certs,
    /// The sinks every terminator forwards to.
    pub sinks: &'a [SocketAddr],
    /// Ctrl-C.
    pub stop: &'a CancellationToken,
}

/// One terminator, measured by one row set.
pub struct Round<'a> {
    /// The bench.
    pub bench: &'a Bench<'a>,
    /// The terminator.
    pub t: &'a Terminator,
    /// Its column.
    pub label: &'a str,
}

impl Round<'_> {
    /// The listener of the rows that time no handshake: P-256's, or any.
    pub fn any_listener(&self) -> Option<SocketAddr> {
        self.t
            .addrs
            .get(&proxy::crypto::CertAlgorithmName::EcdsaP256)
            .or_else(|| self.t.addrs.values().next())
            .copied()
    }
}

/// A future a row set measures with.
pub type Measuring<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// A column a [`Measure::OnItsOwn`] set starts itself: its label, its set-up, and how to
/// start its terminator afresh in front of the given upstreams.
pub struct ColumnStarter<'a> {
    /// The column's label.
    pub label: &'a str,
    /// Its set-up.
    pub setup: Setup,
    /// Starts its terminator in front of these upstreams (blocking, as every start is).
    pub start: Box<StartInFrontOf<'a>>,
}

/// Starts a column's terminator in front of the given upstreams.
pub type StartInFrontOf<'a> = dyn Fn(&[SocketAddr]) -> Result<Terminator> + 'a;

/// A kind of work the bench measures: its rows, and how they are measured ([`Measure`]).
pub trait RowSet {
    /// Declares the rows, in table order.
    fn declare(&mut self, table: &mut Table);

    /// Once, before any terminator is measured (a baseline of its own, say).
    fn prepare<'a>(&'a mut self, _bench: &'a Bench<'a>) -> Measuring<'a, Result<()>> {
        Box::pin(async { Ok(()) })
    }

    /// When and by what it measures.
    fn how(&self) -> Measure<'_>;

    /// Columns of its own beside the terminators' (a database terminating TLS itself, say),
    /// each label ending in its set-up's suffix.
    fn own_columns(&self) -> Vec<String> {
        Vec::new()
    }
}

/// When a row set measures, and the part of it that does.
pub enum Measure<'s> {
    /// In every round, on the terminators started for the rounds, interleaved.
    EveryRound(&'s dyn TerminatorRows),
    /// After the rounds, on a terminator started afresh for this set alone: memory a
    /// process freed stays resident and is reused, so one that served other rows would
    /// show less than its connections cost.
    Afresh(&'s dyn TerminatorRows),
    /// After the rounds, by the set itself: it starts the columns' terminators in front of
    /// upstreams of its own (a real database rather than the sink), and may add columns of
    /// its own.
    OnItsOwn(&'s dyn OwnRows),
}

impl Measure<'_> {
    /// The set measures one terminator at a time, in every round.
    pub fn every_round(&self) -> bool {
        matches!(self, Self::EveryRound(_))
    }
}

/// A set measured one terminator at a time: it puts that terminator's figures (or why
/// there are none) in the table.
pub trait TerminatorRows {
    /// Measures one terminator.
    fn measure<'a>(&'a self, round: &'a Round<'a>, table: &'a mut Table) -> Measuring<'a, ()>;
}

/// A set that measures on its own: every round, every column (started with `columns`),
/// its own columns too.
pub trait OwnRows {
    /// The set's whole measurement.
    fn measure_on_its_own<'a>(
        &'a self,
        bench: &'a Bench<'a>,
        columns: &'a [ColumnStarter<'a>],
        table: &'a mut Table,
    ) -> Measuring<'a, ()>;
}

/// The row sets `plan` asks for, in table order (the order of [`Part`]).
pub fn registered(plan: &BenchPlan) -> Vec<Box<dyn RowSet>> {
    let mut sets: Vec<Box<dyn RowSet>> = Vec::new();
    for &part in &plan.parts {
        match part {
            Part::Handshake => sets.push(Box::new(handshake::TinyOnNewConnection::new(plan))),
            Part::Upsert => sets.push(Box::new(upsert::UpsertOnNewConnection::new(plan))),
            Part::Bulk => sets.push(Box::new(bulk::KeepAliveBulk::new())),
            Part::Tools => sets.push(Box::new(tools::ToolRows::new(plan))),
            Part::Idle => {
                use idle::{IdleProtocol, IdleState};
                for &client in &plan.idle_clients {
                    for protocol in [IdleProtocol::Http1, IdleProtocol::H2] {
                        for state in [IdleState::Fresh, IdleState::AfterRequest] {
                            sets.push(Box::new(idle::Idle::new(
                                client,
                                protocol,
                                state,
                                &plan.flags.idle,
                            )));
                        }
                    }
                }
            }
            Part::FirstResponse => sets.push(Box::new(first_response::FirstResponse::default())),
            Part::Latency => sets.push(Box::new(latency::Latency::new())),
            Part::Instructions => sets.push(Box::new(instructions::Instructions::new(plan))),
            Part::InProcess => sets.push(Box::new(in_process::InProcessTls::new(plan))),
        }
    }
    sets
}

/// Where and how a timed row's loop sends: the driver, `concurrency` clients each with one
/// unit in flight, a connection per unit or kept alive.
pub struct LoopPlan {
    /// The terminator's listener.
    pub addr: SocketAddr,
    /// What the client speaks.
    pub kind: Bulk,
    /// A connection per unit ([`ConnectionPolicy::New`]) or kept alive.
    pub policy: ConnectionPolicy,
    /// Clients at once.
    pub concurrency: usize,
}

/// One timed row's figure for `round`'s terminator: the loop `plan` sending what `source`
/// makes for the listener's authority, the terminator's CPU over it per `unit`, with the
/// kernel's share put in its row and the work noted (see [`cpu_per_unit`]). The caller
/// puts the figure, which a row may still combine with others.
pub async fn timed_figure(
    round: &Round<'_>,
    table: &mut Table,
    keys: (&str, &str),
    what: &str,
    plan: LoopPlan,
    source: impl FnOnce(&str) -> Result<Arc<dyn RequestSource>>,
    unit: &Unit,
) -> Result<f64> {
    let measured = async {
        let connector = workloads::connector(plan.addr, round.bench.clients, plan.kind).await?;
        let source = source(&workloads::authority(plan.addr))?;
        cpu_over_loop(round, &connector, &source, &plan).await
    }
    .await;
    cpu_per_unit(table, keys, round.label, what, measured, unit)
}

/// The loop's warm-up (`--warmup`), then its measured run (`--duration`) inside a CPU
/// window on the terminator's process tree.
async fn cpu_over_loop(
    round: &Round<'_>,
    connector: &Arc<Connector>,
    source: &Arc<dyn RequestSource>,
    plan: &LoopPlan,
) -> Result<(CpuSplit, driver::Outcome)> {
    let Bench {
        plan: bench, stop, ..
    } = round.bench;
    let run = |duration| {
        let config = loop_config(plan.policy, plan.concurrency, duration);
        driver::run(source.clone(), connector.clone(), config, (*stop).clone())
    };
    run(bench.flags.warmup).await;
    let window = round.t.cpu_window()?;
    let outcome = run(bench.flags.duration).await;
    Ok((window.close()?, outcome))
}

/// The driver's configuration of one bench loop: closed, `concurrency` clients each with
/// one unit in flight, for `duration` (and at most a million units); a warm-up is a loop
/// of its own.
pub fn loop_config(
    policy: ConnectionPolicy,
    concurrency: usize,
    duration: Duration,
) -> DriverConfig {
    DriverConfig {
        mode: Mode::Closed,
        concurrency: concurrency.max(1),
        policy,
        duration: Some(duration),
        requests: Some(MAX_UNITS_PER_LOOP),
        warmup: Duration::ZERO,
        request_timeout: UNIT_LIMIT,
        shared_connections: None,
        progress: false,
    }
}

/// The order the columns are measured in during `round` (from 1): as given in odd rounds,
/// reversed in even ones. The host's speed drifts within minutes, and a fixed order puts
/// the same column at the same point of that drift every round; alternating it (ABBA over
/// two rounds) lets a drift within a round fall on both ends alike.
pub fn round_order(columns: usize, round: usize) -> impl Iterator<Item = usize> {
    let reversed = round.is_multiple_of(2);
    (0..columns).map(move |i| if reversed { columns - 1 - i } else { i })
}

/// How a timed row turns CPU-seconds and the work done into its figure.
pub struct Unit {
    /// Figure units per CPU-second (1e6 for microseconds).
    scale: f64,
    /// The work one figure is per, from what the loop did: (count, description).
    work: fn(&driver::Outcome) -> (f64, String),
    /// For the progress line.
    name: &'static str,
}

/// Units that failed in a loop.
fn failed(o: &driver::Outcome) -> u64 {
    o.failures.values().sum()
}

/// The error of a loop in which no unit succeeded: the first failure it saw.
fn nothing_succeeded(out: &driver::Outcome) -> anyhow::Error {
    anyhow::anyhow!(
        "nothing succeeded: {}",
        out.failure_examples
            .values()
            .next()
            .cloned()
            .unwrap_or_default()
    )
}

/// Per new connection (µs).
pub const PER_CONNECTION: Unit = Unit {
    scale: 1e6,
    work: |o| {
        (
            o.ok as f64,
            format!("{} connections, {} failed", o.ok, failed(o)),
        )
    },
    name: "us CPU per connection",
};

/// Per MB of request bodies (ms).
pub const PER_MB: Unit = Unit {
    scale: 1e3,
    work: |o| {
        let mb = o.ok_body_bytes as f64 / 1e6;
        (
            mb,
            format!("{} requests, {mb:.0} MB, {} failed", o.ok, failed(o)),
        )
    },
    name: "ms CPU per MB",
};

/// Per upsert, each on its own connection (ms).
pub const PER_UPSERT: Unit = Unit {
    scale: 1e3,
    work: |o| {
        (
            o.ok as f64,
            format!(
                "{} upserts on as many connections, {:.0} MB, {} failed",
                o.ok,
                o.ok_body_bytes as f64 / 1e6,
                failed(o)
            ),
        )
    },
    name: "ms CPU per upsert",
};

/// The figure of one timed loop (the terminator's CPU over it, per unit of work), with the
/// work behind it noted in the row `key` and a progress line. The kernel's share of it goes
/// to the row `kernel_key`, now; the caller puts the figure itself.
pub fn cpu_per_unit(
    table: &mut Table,
    (key, kernel_key): (&str, &str),
    label: &str,
    what: &str,
    measured: Result<(CpuSplit, driver::Outcome)>,
    unit: &Unit,
) -> Result<f64> {
    let figure = match measured {
        Ok((cpu, out)) if out.ok > 0 => {
            let (count, work) = (unit.work)(&out);
            table.note_work(key, label, work);
            if let Some((kind, e)) = out.failure_examples.iter().next() {
                eprintln!(
                    "{label} {what}: {} failed, first ({kind}): {e}",
                    failed(&out)
                );
            }
            table.put(kernel_key, label, Ok(cpu.system * unit.scale / count));
            Ok(cpu.total() * unit.scale / count)
        }
        Ok((_, out)) => Err(nothing_succeeded(&out)),
        Err(e) => Err(e),
    };
    match &figure {
        Ok(v) => eprintln!("{label} {what}: {v:.3} {}", unit.name),
        Err(e) => {
            eprintln!("{label} {what}: {e:#}");
            // The kernel's share is missing for the same reason.
            table.put(kernel_key, label, Err(anyhow::anyhow!("{e:#}")));
        }
    }
    figure
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::table::Figure;

    fn outcome(ok: u64) -> driver::Outcome {
        driver::Outcome {
            latency_us: hdrhistogram::Histogram::new(3).unwrap(),
            handshake_us: hdrhistogram::Histogram::new(3).unwrap(),
            ok,
            failures: Default::default(),
            failure_examples: Default::default(),
            handshakes: ok,
            resumed_handshakes: 0,
            ok_body_bytes: 0,
            points_acknowledged: 0,
            warmup_ok: 0,
            warmup_failed: 0,
            elapsed: Duration::from_secs(1),
            schedule_lag_us: None,
            interrupted: false,
            per_second: Vec::new(),
        }
    }

    #[test]
    fn columns_run_in_reverse_every_other_round() {
        assert_eq!(round_order(3, 1).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(round_order(3, 2).collect::<Vec<_>>(), [2, 1, 0]);
        assert_eq!(round_order(3, 3).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(round_order(0, 2).count(), 0);
    }

    #[test]
    fn a_cpu_figure_and_its_kernel_share_are_set_together_or_missing_together() {
        let mut table = Table::default();
        for key in ["whole", "kernel"] {
            table.declare(key.into(), "us");
        }
        let cpu = CpuSplit {
            user: 0.003,
            system: 0.001,
        };
        let whole = cpu_per_unit(
            &mut table,
            ("whole", "kernel"),
            "ours",
            "test",
            Ok((cpu, outcome(10))),
            &PER_CONNECTION,
        );
        assert!((whole.unwrap() - 400.0).abs() < 1e-9);
        table.put("whole", "ours", Ok(400.0));

        let failed = cpu_per_unit(
            &mut table,
            ("whole", "kernel"),
            "peer",
            "test",
            Err(anyhow::anyhow!("no /proc entry")),
            &PER_CONNECTION,
        );
        assert!(failed.is_err());
        let nothing = cpu_per_unit(
            &mut table,
            ("whole", "kernel"),
            "idle",
            "test",
            Ok((cpu, outcome(0))),
            &PER_CONNECTION,
        );
        assert!(nothing.is_err(), "no unit done, no figure");
        let rows = table.finish();
        let kernel = &rows[1];
        assert!(matches!(kernel.figures["ours"], Figure::Value(v) if (v - 100.0).abs() < 1e-9));
        assert!(
            matches!(&kernel.figures["peer"], Figure::Missing { reason } if reason == "no /proc entry")
        );
        assert!(matches!(&kernel.figures["idle"], Figure::Missing { .. }));
        assert!(rows[0].work["ours"].starts_with("10 connections"));
    }
}
