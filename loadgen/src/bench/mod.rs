//! `loadgen bench`: the terminator benchmark. Our proxy (per provider), nginx and HAProxy
//! are put side by side in front of one plaintext sink with the same certificates and TLS
//! policy (TLS 1.3, X25519, no resumption), each with one worker and again at its own
//! defaults, and each terminator's own CPU (user + system, its whole process tree, from
//! /proc) is divided by the work it did: per new connection with a tiny request, and per
//! new connection carrying one UPSERT_100 body (the mission's unit of work), per
//! certificate algorithm; per MB of keep-alive bulk over HTTP/1.1, h2 and gRPC; its
//! resident memory per idle TLS connection, for a rustls and an OpenSSL client; the
//! first-response delay for a client that keeps Nagle on; and the latency it adds to one
//! large request at a time. Every figure is printed with its ratio to nginx's in the same
//! set-up, measured in the same run.
//!
//! The bench is a client of `loadgen run`'s parts: its timed rows are loops of the same
//! driver over a [`RequestSource`](crate::workload::RequestSource), its CPU figures probe
//! windows on each terminator's process tree. Submodules: [`sink`] (the upstream),
//! [`terminators`] (starting them), [`workloads`] (what the rows send), [`rows`] (one
//! module per kind of row, and the list of them), [`table`] (figures, rounds, ratios).

mod markdown;
pub mod plan;
pub mod rows;
pub mod sink;
pub mod table;
pub mod terminators;
pub mod workloads;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use proxy::crypto::{generate_cert_set, ProviderName};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

pub use markdown::render;
pub use plan::{BenchArgs, BenchPlan, IdleClient, Part};
use rows::{Bench, ColumnStarter, Measure, Round, TerminatorRows};
use table::{Row, Table};
use terminators::{Certs, Peer, Setup, Terminator};
use workloads::Clients;

/// HTTP/2 windows of the sink: as large as the proxy's own, so neither end of the
/// measurement throttles a bulk upload.
pub const H2_WINDOW: u32 = 4 * 1024 * 1024;

/// What a run of the benchmark measured.
#[derive(Debug, Serialize)]
pub struct BenchResult {
    /// Column labels, in table order.
    pub columns: Vec<String>,
    /// The rows, in table order.
    pub rows: Vec<Row>,
    /// What the bench pinned and how it ran.
    pub settings: serde_json::Value,
    /// CPU model, cores and kernel of the machine.
    pub machine: serde_json::Value,
}

/// The bench's TLS client: rustls with aws-lc-rs, TLS 1.3, X25519, no resumption, and the
/// cipher order clients ship with (AES-256-GCM first, as rustls, Go and OpenSSL list it),
/// not the proxy's server order: which suite is used is then the server's choice, as it is
/// with real clients.
fn bench_client(ca: &std::path::Path, alpn: &[u8]) -> Result<Arc<rustls::ClientConfig>> {
    use proxy::tls::client::{CipherOrder, ClientTls};
    Ok(ClientTls {
        versions: vec![proxy::config::TlsVersion::Tls13],
        alpn: if alpn.is_empty() {
            Vec::new()
        } else {
            vec![alpn.to_vec()]
        },
        cipher_order: CipherOrder::Shipped,
        ..ClientTls::trusting(ca)
    }
    .build()?)
}

fn clients(ca: &std::path::Path, congestion_control: Option<Arc<str>>) -> Result<Clients> {
    Ok(Clients {
        http1: bench_client(ca, b"http/1.1")?,
        h2: bench_client(ca, b"h2")?,
        in_memory: bench_client(ca, b"")?,
        congestion_control,
    })
}

/// The congestion control `--client-congestion-control` asks for, checked against the
/// kernel before anything starts, and how bench.json records it.
fn client_congestion_control(arg: &str) -> Result<(Option<Arc<str>>, String)> {
    let chosen = crate::client::congestion_control_choice(arg)
        .map_err(|e| anyhow!("--client-congestion-control {e}"))?;
    let host = crate::client::host_congestion_control();
    let record = match &chosen {
        None => format!("the host's default ({host})"),
        Some(name) => {
            format!(
                "{name}, set on every client socket of the timed rows (the host's default: {host})"
            )
        }
    };
    Ok((chosen, record))
}

/// Raises this process's open-file limit to its hard limit (10,000 idle connections need
/// more descriptors than the usual soft limit).
fn raise_nofile() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((_, hard)) => {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
            hard
        }
        Err(_) => 0,
    }
}

/// The kernel's per-destination TCP metrics (the cwnd, ssthresh and RTT a closed connection
/// leaves for the next one to the same address), kept out of the bench: every connection
/// here goes to 127.0.0.1, so each column's connections would start from what the
/// previous column's left behind, and the order of the columns would leak into the ratios
/// (the entry found for 127.0.0.1 on the development VM said an RTT of 7 ms and a
/// reordering of 10, where loopback's RTT is tens of microseconds). For the run, nothing is saved
/// (`net.ipv4.tcp_no_metrics_save = 1`) and what was saved for loopback is flushed; the
/// setting is put back when the bench ends. Needs root; without it the bench says so.
struct TcpMetricsOff {
    restore: Option<String>,
}

const NO_METRICS_SAVE: &str = "/proc/sys/net/ipv4/tcp_no_metrics_save";

impl TcpMetricsOff {
    /// Turns the cache off and flushes loopback's entries; what was done, for bench.json.
    fn apply() -> (Self, String) {
        let before = std::fs::read_to_string(NO_METRICS_SAVE).map(|v| v.trim().to_owned());
        let set = std::fs::write(NO_METRICS_SAVE, "1");
        let flushed = [
            ["-4", "tcp_metrics", "flush", "127.0.0.0/8"],
            ["-6", "tcp_metrics", "flush", "::1/128"],
        ]
        .iter()
        .all(|a| {
            // With no entry for the prefix, `ip` says so and exits with 2: nothing was left.
            std::process::Command::new("ip")
                .args(a)
                .output()
                .is_ok_and(|out| {
                    let said = String::from_utf8_lossy(&out.stderr);
                    out.status.success()
                        || said.contains("Nothing to flush")
                        || said.contains("No such process")
                })
        });
        match (before, set) {
            (Ok(before), Ok(())) => (
                Self {
                    restore: Some(before),
                },
                if flushed {
                    "off for the run (tcp_no_metrics_save = 1), loopback's entries flushed".into()
                } else {
                    "off for the run (tcp_no_metrics_save = 1); loopback's entries not flushed (`ip tcp_metrics` failed)".into()
                },
            ),
            (_, Err(e)) => {
                eprintln!(
                    "warning: cannot turn off the kernel's TCP metrics cache ({NO_METRICS_SAVE}: {e}): \
                     each column's connections may start from what the previous column's left"
                );
                (
                    Self { restore: None },
                    format!("on: {NO_METRICS_SAVE} not writable ({e})"),
                )
            }
            (Err(e), Ok(())) => (
                Self { restore: None },
                format!("off for the run; its previous value unreadable ({e}), left at 1"),
            ),
        }
    }
}

impl Drop for TcpMetricsOff {
    fn drop(&mut self) {
        if let Some(value) = self.restore.take() {
            let _ = std::fs::write(NO_METRICS_SAVE, value);
        }
    }
}

/// Runs the benchmark and writes `bench.md` and `bench.json` under `--out`.
pub async fn execute(args: &BenchArgs, stop: CancellationToken) -> Result<BenchResult> {
    let plan = BenchPlan::new(args)?;
    let (congestion_control, congestion_record) =
        client_congestion_control(&plan.flags.client_congestion_control)?;
    let (_tcp_metrics, tcp_metrics) = TcpMetricsOff::apply();
    let nofile = raise_nofile();
    let max_idle = plan.flags.idle.iter().copied().max().unwrap_or(0) as u64;
    if plan.parts.contains(&Part::Idle) && nofile < max_idle + 1000 {
        bail!("--idle {max_idle} needs more open files than this process may have ({nofile}): raise `ulimit -Hn`");
    }
    let work = plan.flags.out.join("work");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let cert_dir = std::fs::canonicalize(&plan.flags.out)?.join("certs");
    let set = generate_cert_set(&cert_dir, plan.algorithms(), &[])?;
    let certs = Certs {
        dir: cert_dir,
        ca: set.ca_cert.clone(),
        algorithms: plan.algorithms().to_vec(),
    };
    let clients = clients(&certs.ca, congestion_control)?;
    let sink_stop = stop.child_token();
    let sinks = start_sinks(&plan, &sink_stop).await?;
    let bench = Bench {
        plan: &plan,
        clients: &clients,
        certs: &certs,
        sinks: &sinks,
        stop: &stop,
    };
    let ctx = StartContext {
        plan: &plan,
        certs: &certs,
        sinks: &sinks,
        work: &work,
    };
    let specs = column_specs(&plan);
    let (columns, table) = measure(&bench, &ctx, &specs).await?;
    sink_stop.cancel();

    let result = BenchResult {
        columns,
        rows: table.finish(),
        settings: settings_record(&plan, &tcp_metrics, &congestion_record),
        machine: {
            let (cpu, cores, kernel) =
                crate::probe::cpu::machine_facts(std::path::Path::new("/proc"));
            serde_json::json!({"cpu": cpu, "cores": cores, "kernel": kernel})
        },
    };
    std::fs::write(plan.flags.out.join("bench.md"), render(&result))?;
    std::fs::write(
        plan.flags.out.join("bench.json"),
        serde_json::to_string_pretty(&result)?,
    )?;
    Ok(result)
}

/// Every row set over every column: the columns' labels and the table. The sets measured
/// in every round first, on terminators started once for all rounds; then those measured
/// afresh, then those that start their own (see [`Measure`]).
async fn measure(
    bench: &Bench<'_>,
    ctx: &StartContext<'_>,
    specs: &[ColumnSpec],
) -> Result<(Vec<String>, Table)> {
    let mut table = Table::default();
    let mut sets = rows::registered(bench.plan);
    let mut columns: Vec<String> = specs.iter().map(|c| c.label.clone()).collect();
    columns.extend(sets.iter().flat_map(|s| s.own_columns()));
    // Each set's rows, to mark them when its own terminator does not start.
    let mut rows_of_set = Vec::with_capacity(sets.len());
    for set in &mut sets {
        let mark = table.len();
        set.declare(&mut table);
        rows_of_set.push(table.declared_since(mark));
    }
    for set in &mut sets {
        set.prepare(bench).await?;
    }
    let failed_to_start = if sets.iter().any(|s| s.how().every_round()) {
        measure_rounds(bench, ctx, specs, &sets, &mut table).await
    } else {
        std::collections::BTreeSet::new()
    };
    let measured: Vec<&ColumnSpec> = specs
        .iter()
        .filter(|s| !failed_to_start.contains(&s.label))
        .collect();
    table.set_round(1);
    for (set, set_rows) in sets.iter().zip(&rows_of_set) {
        let Measure::Afresh(rows) = set.how() else {
            continue;
        };
        for spec in &measured {
            if bench.stop.is_cancelled() {
                break;
            }
            measure_afresh(ctx, bench, spec, rows, set_rows, &mut table).await;
        }
    }
    let starters: Vec<ColumnStarter> = measured
        .iter()
        .map(|spec| ColumnStarter {
            label: &spec.label,
            setup: spec.setup,
            start: Box::new(|upstreams: &[std::net::SocketAddr]| {
                spec.start(&StartContext {
                    sinks: upstreams,
                    ..*ctx
                })
            }),
        })
        .collect();
    for set in &sets {
        if let (Measure::OnItsOwn(rows), false) = (set.how(), bench.stop.is_cancelled()) {
            rows.measure_on_its_own(bench, &starters, &mut table).await;
        }
    }
    Ok((columns, table))
}

/// The sets measured in every round: every terminator started first and measured in
/// interleaved rounds (each once per round, every other round in reverse), so drift on a
/// shared machine hits every column alike; an idle terminator costs nothing meanwhile.
/// The labels of the columns whose terminator did not start.
async fn measure_rounds(
    bench: &Bench<'_>,
    ctx: &StartContext<'_>,
    specs: &[ColumnSpec],
    sets: &[Box<dyn rows::RowSet>],
    table: &mut Table,
) -> std::collections::BTreeSet<String> {
    let mut started = start_columns(ctx, specs, table);
    let rounds = bench.plan.rounds;
    for round in 1..=rounds {
        if rounds > 1 {
            eprintln!("round {round} of {rounds}");
        }
        table.set_round(round);
        for column in rows::round_order(started.len(), round) {
            let (label, t) = &mut started[column];
            let Some(t) = t.as_mut() else { continue };
            if bench.stop.is_cancelled() || !t.alive() {
                continue;
            }
            let round = Round { bench, t, label };
            for set in sets {
                let Measure::EveryRound(rows) = set.how() else {
                    continue;
                };
                if bench.stop.is_cancelled() {
                    break;
                }
                rows.measure(&round, table).await;
            }
            if !t.alive() {
                eprintln!("{label}: died during the benchmark: {}", t.log_tail());
                table.fail_column(label, &format!("died: {}", t.log_tail()));
            }
        }
    }
    let mut failed_to_start = std::collections::BTreeSet::new();
    for (label, t) in started {
        match t {
            Some(t) => t.stop(),
            None => {
                failed_to_start.insert(label);
            }
        }
    }
    failed_to_start
}

/// One row set's figures for one column, on a terminator started afresh for it alone.
async fn measure_afresh(
    ctx: &StartContext<'_>,
    bench: &Bench<'_>,
    spec: &ColumnSpec,
    set: &dyn TerminatorRows,
    set_rows: &[String],
    table: &mut Table,
) {
    let label = spec.label.as_str();
    match spec.start(ctx) {
        Ok(t) => {
            let round = Round {
                bench,
                t: &t,
                label,
            };
            set.measure(&round, table).await;
            t.stop();
        }
        Err(e) => {
            let msg = format!("did not start afresh: {e:#}");
            let keys: Vec<&String> = set_rows.iter().collect();
            table.put_missing(&keys, label, &msg);
        }
    }
}

/// The sinks every terminator forwards to (`--upstream-nodes` of them), until `stop`.
async fn start_sinks(
    plan: &BenchPlan,
    stop: &CancellationToken,
) -> Result<Vec<std::net::SocketAddr>> {
    let mut sinks = Vec::with_capacity(usize::from(plan.flags.upstream_nodes));
    for _ in 0..plan.flags.upstream_nodes {
        sinks.push(sink::start(stop.clone(), plan.flags.sink).await?);
    }
    eprintln!(
        "sink on {} ({:?})",
        sinks
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        plan.flags.sink
    );
    Ok(sinks)
}

/// Starts every column's terminator; one that does not start has every row marked with
/// why, and is listed with `None`.
fn start_columns(
    ctx: &StartContext,
    specs: &[ColumnSpec],
    table: &mut Table,
) -> Vec<(String, Option<Terminator>)> {
    let mut started: Vec<(String, Option<Terminator>)> = Vec::new();
    for spec in specs {
        let label = spec.label.clone();
        match spec.start(ctx) {
            Ok(t) => {
                eprintln!("{label}: pid {}", t.pid());
                started.push((label, Some(t)));
            }
            Err(e) => {
                eprintln!("{label}: not measured: {e:#}");
                table.fail_column(&label, &format!("did not start: {e:#}"));
                started.push((label, None));
            }
        }
    }
    started
}

/// The columns, in table order: per set-up, our providers, then the peers (each with its
/// binary, or why it is missing).
fn column_specs(plan: &BenchPlan) -> Vec<ColumnSpec> {
    let peer_bins: Vec<(Peer, Result<PathBuf, String>)> = plan
        .peers
        .iter()
        .map(|&p| {
            (
                p,
                terminators::ensure_installed(p).map_err(|e| format!("{e:#}")),
            )
        })
        .collect();
    let mut specs = Vec::new();
    for &setup in &plan.setups {
        for p in &plan.providers {
            specs.push(ColumnSpec {
                label: proxy_label(*p, setup),
                setup,
                which: Which::Ours(*p),
            });
        }
        for (p, bin) in &peer_bins {
            specs.push(ColumnSpec {
                label: format!("{}{}", p.as_str(), setup.suffix()),
                setup,
                which: Which::Peer(*p, bin.clone()),
            });
        }
    }
    specs
}

/// The column of our proxy with `provider` in `setup`.
pub(crate) fn proxy_label(provider: ProviderName, setup: Setup) -> String {
    format!("proxy {}{}", provider.as_str(), setup.suffix())
}

/// What the bench pinned and how it ran, as bench.json records it.
/// `tcp_metrics_cache`: what the bench did with the kernel's TCP metrics cache;
/// `client_congestion_control`: its clients' congestion control.
fn settings_record(
    plan: &BenchPlan,
    tcp_metrics_cache: &str,
    client_congestion_control: &str,
) -> serde_json::Value {
    serde_json::json!({
        "tls": "1.3", "kx": "x25519", "resumption": false,
        "client": "rustls aws-lc-rs, its stock cipher order (AES-256-GCM first)",
        "idle_clients": plan.idle_clients,
        "sink": plan.flags.sink,
        "rounds": plan.rounds, "duration_s": plan.flags.duration.as_secs_f64(), "warmup_s": plan.flags.warmup.as_secs_f64(),
        "concurrency": plan.flags.concurrency, "bulk_connections": plan.flags.bulk_connections,
        "idle": plan.flags.idle, "latency_requests": plan.flags.latency_requests,
        "proxy_worker_threads": plan.flags.proxy_worker_threads,
        "upstream_nodes": plan.flags.upstream_nodes,
        "setups": plan.setups,
        "workers": "one-worker: proxy worker_threads as given, nginx worker_processes 1, HAProxy nbthread 1; \
                    defaults: proxy a worker per CPU, nginx worker_processes auto, HAProxy its default threads",
        "cpu": "user+system of the terminator's process tree from /proc",
        "tcp_metrics_cache": tcp_metrics_cache,
        "client_congestion_control": client_congestion_control,
        "tools": plan.parts.contains(&Part::Tools).then(|| format!(
            "driven by those tools (Debian's apache2-utils and nghttp2-client: OpenSSL clients, TLS 1.3, \
             the host's TCP congestion control, {}), not by the bench's client; ab speaks HTTP/1.0 \
             and closes after each answer, h2load sends 16 KiB DATA frames; h2load has no connection per \
             request, so its new-connection row runs `h2load -c N -n N` (N = --concurrency) over and over",
            crate::client::host_congestion_control()
        )),
        "instructions": plan.parts.contains(&Part::Instructions).then(|| format!(
            "thousands of the proxy's user-space instructions per unit, counted by valgrind's callgrind \
             (`callgrind_control --zero`, then --dump around a fixed number of units sent one at a time \
             by the bench's client: {}), one worker; they compare builds of the proxy, not terminators \
             (peers not counted); a `rep movsb` copy counts one instruction per byte",
            plan.flags.instruction_units.map_or_else(|| "100 tiny GETs (20 with RSA-4096), 20 upserts, 40 keep-alive requests".to_owned(), |n| format!("{n} per row"))
        )),
        "in_process": plan.parts.contains(&Part::InProcess).then_some(
            "each terminator of each set-up in front of embedded-qdrant in plaintext, and (with the \
             defaults set-up) embedded-qdrant terminating TLS itself (rustls with ring); CPU of terminator \
             and database together per upsert; UPSERT_100 of 1024-d vectors, wait=true, a new connection \
             each, ids recurring every 64 upserts"),
    })
}

/// What starting any column needs.
#[derive(Clone, Copy)]
struct StartContext<'a> {
    plan: &'a BenchPlan,
    certs: &'a Certs,
    sinks: &'a [std::net::SocketAddr],
    work: &'a std::path::Path,
}

/// One column of the table: a terminator in a set-up.
struct ColumnSpec {
    label: String,
    setup: Setup,
    which: Which,
}

enum Which {
    Ours(ProviderName),
    /// A peer, and its binary or why there is none.
    Peer(Peer, Result<PathBuf, String>),
}

impl ColumnSpec {
    /// Starts this column's terminator afresh.
    fn start(&self, ctx: &StartContext<'_>) -> Result<Terminator> {
        match &self.which {
            Which::Ours(p) => terminators::start_proxy(
                &ctx.plan.proxy_bin,
                *p,
                &self.label,
                ctx.certs,
                ctx.sinks,
                ctx.work,
                match self.setup {
                    Setup::OneWorker => ctx.plan.flags.proxy_worker_threads,
                    Setup::Defaults => 0,
                },
                ctx.plan.proxy_args(),
                &[],
            ),
            Which::Peer(p, Ok(bin)) => terminators::start_peer(
                *p,
                self.setup,
                &self.label,
                bin,
                ctx.certs,
                ctx.sinks,
                ctx.work,
            ),
            Which::Peer(p, Err(e)) => Err(anyhow::anyhow!("{}: {e}", p.as_str())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clients_congestion_control_is_checked_before_the_run() {
        let (none, record) = client_congestion_control("host").unwrap();
        assert!(none.is_none());
        assert!(record.starts_with("the host's default ("), "{record}");
        if cfg!(target_os = "linux") {
            let (reno, record) = client_congestion_control("reno").unwrap();
            assert_eq!(reno.as_deref(), Some("reno"));
            assert!(
                record.starts_with("reno, set on every client socket"),
                "{record}"
            );
            let err = client_congestion_control("no-such-algorithm")
                .unwrap_err()
                .to_string();
            assert!(err.contains("the kernel refused it"), "{err}");
            assert!(err.contains("`host`"), "{err}");
        }
    }
}
