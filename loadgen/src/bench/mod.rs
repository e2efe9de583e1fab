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

pub mod rows;
pub mod sink;
pub mod table;
pub mod terminators;
pub mod workloads;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use proxy::crypto::{generate_cert_set, CertAlgorithmName, ProviderName};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::procs::sibling_binary;
use rows::{Bench, ColumnStarter, Round, When};
use sink::SinkMode;
use table::{Figure, Row, Table};
use terminators::{Certs, Peer, Setup, Terminator};
use workloads::Clients;

/// HTTP/2 windows of the sink: as large as the proxy's own, so neither end of the
/// measurement throttles a bulk upload.
pub const H2_WINDOW: u32 = 4 * 1024 * 1024;

/// The rows the benchmark can measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Part {
    /// A new TLS connection per tiny GET, per certificate algorithm.
    Handshake,
    /// A new TLS connection carrying one UPSERT_100 body, then closed, per certificate
    /// algorithm: 800 KB JSON over HTTP/1.1, and 416 KB gRPC over h2.
    Upsert,
    /// Keep-alive uploads: h2 and HTTP/1.1 JSON to an HTTP/1.1 upstream, gRPC to h2c.
    Bulk,
    /// Resident memory per idle TLS connection.
    Idle,
    /// First response after the handshake from a client without TCP_NODELAY.
    FirstResponse,
    /// Mean time of one 800 KB h2 request at concurrency 1, against the direct path.
    Latency,
    /// A new TLS connection carrying one UPSERT_100 into a real database (embedded-qdrant):
    /// each terminator at its defaults in front of it in plaintext, beside the database
    /// terminating TLS itself (rustls with ring, as Qdrant's `service.enable_tls`); CPU of
    /// terminator and database together per upsert, and upserts/s.
    InProcess,
}

/// A TLS client of the idle rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IdleClient {
    /// rustls with aws-lc-rs, as every other row's client.
    Rustls,
    /// OpenSSL's client at its stock settings.
    Openssl,
}

impl IdleClient {
    /// As the rows name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rustls => "rustls",
            Self::Openssl => "OpenSSL",
        }
    }
}

/// The flags of `loadgen bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Our providers to measure (each a proxy column).
    #[arg(long, value_delimiter = ',', default_value = "ring,aws-lc-rs,openssl")]
    pub providers: Vec<ProviderName>,
    /// Peer terminators (Debian's packages, installed with apt-get when missing); `none`
    /// for our proxy alone.
    #[arg(long, value_delimiter = ',', default_value = "nginx,haproxy")]
    pub peers: Vec<String>,
    /// A further `proxy run` flag for every proxy column, repeatable, e.g.
    /// `--proxy-arg=--qat-module-path=/opt/qat/lib/ossl-modules` for openssl-qat.
    #[arg(long = "proxy-arg", value_name = "FLAG", allow_hyphen_values = true)]
    pub proxy_args: Vec<String>,
    /// Certificate algorithms of the new-connection rows.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "rsa2048,ecdsa-p256,ecdsa-p384,rsa4096"
    )]
    pub algorithms: Vec<CertAlgorithmName>,
    /// Which rows to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "handshake,upsert,bulk,idle,first-response,latency,in-process"
    )]
    pub parts: Vec<Part>,
    /// The set-ups every terminator runs in, each a set of columns compared with nginx in
    /// the same set-up: one worker each, and each at its own defaults.
    #[arg(long, value_delimiter = ',', default_value = "one-worker,defaults")]
    pub setups: Vec<Setup>,
    /// The clients of the idle rows: rustls (the client of every other row) and OpenSSL
    /// (as Python's `ssl`, curl and most clients outside Rust).
    #[arg(long, value_delimiter = ',', default_value = "rustls,openssl")]
    pub idle_clients: Vec<IdleClient>,
    /// When the sink answers an upload: after reading it whole (as Qdrant does), or at once.
    #[arg(long, value_enum, default_value = "read-body")]
    pub sink: SinkMode,
    /// Measured time of each timed row, per terminator.
    #[arg(long, default_value = "4s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Unmeasured warm-up before each timed row.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Clients opening new connections at once in the new-connection rows.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Keep-alive connections of the bulk rows (requests one after another on each).
    #[arg(long, default_value_t = 2)]
    pub bulk_connections: usize,
    /// Idle connection counts, measured cumulatively (RSS after each).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    pub idle: Vec<usize>,
    /// Requests of the concurrency-1 latency row (after the warm-up, on the same
    /// connection).
    #[arg(long, default_value_t = 300)]
    pub latency_requests: usize,
    /// Connections of the first-response row (the median is reported).
    #[arg(long, default_value_t = 30)]
    pub first_response_connections: usize,
    /// The proxy binary (default: next to this loadgen).
    #[arg(long)]
    pub proxy_bin: Option<PathBuf>,
    /// The database of the in-process rows (default: embedded-qdrant next to this
    /// loadgen).
    #[arg(long)]
    pub upstream_bin: Option<PathBuf>,
    /// The proxy's worker threads in the one-worker set-up. One by default, as the peers
    /// run there (nginx `worker_processes 1`, HAProxy `nbthread 1`), so every column is one
    /// worker's cost per unit of work; 0 is the proxy's own default, one per CPU.
    #[arg(long, default_value_t = 1)]
    pub proxy_worker_threads: usize,
    /// Rounds: every terminator is measured once per round, interleaved; each figure is
    /// the median over the rounds, every round's value in bench.json (idle memory is
    /// measured once, after the rounds, on a freshly started terminator per client).
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Upstream nodes behind every terminator: that many sinks (one process, separate
    /// ports), balanced by least requests (ours), `least_conn` (nginx), `leastconn`
    /// (HAProxy). One by default; three measure what balancing costs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub upstream_nodes: u16,
    /// TCP congestion control of the bench's client sockets (Linux), or `host` for the
    /// host's default. On loopback a client's sending runs partly on the terminator's CPU:
    /// the ACK a terminator's read sends is processed at once by the client's socket, which
    /// then transmits what the window allows. A pacing algorithm (BBR) arms its pacing
    /// timer there, a cost that lands on the terminator here and on the client's own host in
    /// any deployment; cubic, the kernel's default, does not pace without an fq qdisc.
    #[arg(long, default_value = "cubic")]
    pub client_congestion_control: String,
    /// Where the table (bench.md), the figures (bench.json) and the logs go.
    #[arg(long, default_value = "results/bench")]
    pub out: PathBuf,
}

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
    let (congestion_control, congestion_record) =
        client_congestion_control(&args.client_congestion_control)?;
    let (_tcp_metrics, tcp_metrics) = TcpMetricsOff::apply();
    let nofile = raise_nofile();
    let max_idle = args.idle.iter().copied().max().unwrap_or(0) as u64;
    if args.parts.contains(&Part::Idle) && nofile < max_idle + 1000 {
        bail!("--idle {max_idle} needs more open files than this process may have ({nofile}): raise `ulimit -Hn`");
    }
    let peers = parse_peers(&args.peers)?;
    if args.setups.is_empty() {
        bail!("--setups: name at least one (one-worker, defaults)");
    }
    let proxy_bin = args
        .proxy_bin
        .clone()
        .unwrap_or_else(|| sibling_binary("proxy"));
    let work = args.out.join("work");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let cert_dir = std::fs::canonicalize(&args.out)?.join("certs");
    let set = generate_cert_set(&cert_dir, &args.algorithms, &[])?;
    let certs = Certs {
        dir: cert_dir,
        ca: set.ca_cert.clone(),
        algorithms: args.algorithms.clone(),
    };
    let clients = clients(&certs.ca, congestion_control)?;
    let sink_stop = stop.child_token();
    let sinks = start_sinks(args, &sink_stop).await?;
    let bench = Bench {
        args,
        clients: &clients,
        certs: &certs,
        sinks: &sinks,
        stop: &stop,
    };

    let specs = column_specs(args, &peers);
    let mut table = Table::default();
    let mut sets = rows::registered(args);
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
        set.prepare(&bench).await?;
    }

    let ctx = StartContext {
        args,
        proxy_bin: &proxy_bin,
        certs: &certs,
        sinks: &sinks,
        work: &work,
    };
    // Every terminator is started first and measured in interleaved rounds (each once per
    // round, every other round in reverse), so drift on a shared machine hits every column
    // alike; an idle terminator costs nothing meanwhile.
    let mut started = if sets.iter().any(|s| s.when() == When::EveryRound) {
        start_columns(&ctx, &specs, &mut table)
    } else {
        Vec::new()
    };
    for round in 1..=args.repeat.max(1) {
        if args.repeat > 1 {
            eprintln!("round {round} of {}", args.repeat);
        }
        table.set_round(round);
        for column in rows::round_order(started.len(), round) {
            let (label, t) = &mut started[column];
            let Some(t) = t.as_mut() else { continue };
            if stop.is_cancelled() || !t.alive() {
                continue;
            }
            let round = Round {
                bench: &bench,
                t,
                label,
            };
            for set in sets.iter().filter(|s| s.when() == When::EveryRound) {
                if stop.is_cancelled() {
                    break;
                }
                set.measure(&round, &mut table).await;
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
    table.set_round(1);
    for (set, set_rows) in sets.iter().zip(&rows_of_set) {
        if set.when() != When::Afresh {
            continue;
        }
        for spec in specs.iter().filter(|s| !failed_to_start.contains(&s.label)) {
            if stop.is_cancelled() {
                break;
            }
            measure_afresh(&ctx, &bench, spec, set.as_ref(), set_rows, &mut table).await;
        }
    }
    let starters: Vec<ColumnStarter> = specs
        .iter()
        .filter(|s| !failed_to_start.contains(&s.label))
        .map(|spec| ColumnStarter {
            label: &spec.label,
            setup: spec.setup,
            start: Box::new(|upstreams: &[std::net::SocketAddr]| {
                spec.start(&StartContext {
                    sinks: upstreams,
                    ..ctx
                })
            }),
        })
        .collect();
    for set in sets.iter().filter(|s| s.when() == When::OnItsOwn) {
        if !stop.is_cancelled() {
            set.measure_on_its_own(&bench, &starters, &mut table).await;
        }
    }
    sink_stop.cancel();

    let result = BenchResult {
        columns,
        rows: table.finish(),
        settings: settings_record(args, &tcp_metrics, &congestion_record),
        machine: {
            let (cpu, cores, kernel) =
                crate::probe::cpu::machine_facts(std::path::Path::new("/proc"));
            serde_json::json!({"cpu": cpu, "cores": cores, "kernel": kernel})
        },
    };
    let md = render(&result);
    std::fs::write(args.out.join("bench.md"), &md)?;
    std::fs::write(
        args.out.join("bench.json"),
        serde_json::to_string_pretty(&result)?,
    )?;
    Ok(result)
}

/// One row set's figures for one column, on a terminator started afresh for it alone.
async fn measure_afresh(
    ctx: &StartContext<'_>,
    bench: &Bench<'_>,
    spec: &ColumnSpec,
    set: &dyn rows::RowSet,
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
    args: &BenchArgs,
    stop: &CancellationToken,
) -> Result<Vec<std::net::SocketAddr>> {
    let mut sinks = Vec::with_capacity(usize::from(args.upstream_nodes));
    for _ in 0..args.upstream_nodes {
        sinks.push(sink::start(stop.clone(), args.sink).await?);
    }
    eprintln!(
        "sink on {} ({:?})",
        sinks
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        args.sink
    );
    Ok(sinks)
}

/// `--peers` as terminators (`none` or empty: none).
fn parse_peers(names: &[String]) -> Result<Vec<Peer>> {
    names
        .iter()
        .filter(|p| p.as_str() != "none" && !p.is_empty())
        .map(|p| match p.as_str() {
            "nginx" => Ok(Peer::Nginx),
            "haproxy" => Ok(Peer::Haproxy),
            other => bail!("--peers: unknown peer {other:?} (nginx, haproxy or none)"),
        })
        .collect()
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
fn column_specs(args: &BenchArgs, peers: &[Peer]) -> Vec<ColumnSpec> {
    let mut setups = args.setups.clone();
    setups.sort();
    setups.dedup();
    let peer_bins: Vec<(Peer, Result<PathBuf, String>)> = peers
        .iter()
        .map(|&p| {
            (
                p,
                terminators::ensure_installed(p).map_err(|e| format!("{e:#}")),
            )
        })
        .collect();
    let mut specs = Vec::new();
    for setup in setups {
        for p in &args.providers {
            specs.push(ColumnSpec {
                label: format!("proxy {}{}", p.as_str(), setup.suffix()),
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

/// What the bench pinned and how it ran, as bench.json records it.
/// `tcp_metrics_cache`: what the bench did with the kernel's TCP metrics cache;
/// `client_congestion_control`: its clients' congestion control.
fn settings_record(
    args: &BenchArgs,
    tcp_metrics_cache: &str,
    client_congestion_control: &str,
) -> serde_json::Value {
    serde_json::json!({
        "tls": "1.3", "kx": "x25519", "resumption": false,
        "client": "rustls aws-lc-rs, its stock cipher order (AES-256-GCM first)",
        "idle_clients": args.idle_clients,
        "sink": args.sink,
        "rounds": args.repeat.max(1), "duration_s": args.duration.as_secs_f64(), "warmup_s": args.warmup.as_secs_f64(),
        "concurrency": args.concurrency, "bulk_connections": args.bulk_connections,
        "idle": args.idle, "latency_requests": args.latency_requests,
        "proxy_worker_threads": args.proxy_worker_threads,
        "upstream_nodes": args.upstream_nodes,
        "setups": args.setups,
        "workers": "one-worker: proxy worker_threads as given, nginx worker_processes 1, HAProxy nbthread 1; \
                    defaults: proxy a worker per CPU, nginx worker_processes auto, HAProxy its default threads",
        "cpu": "user+system of the terminator's process tree from /proc",
        "tcp_metrics_cache": tcp_metrics_cache,
        "client_congestion_control": client_congestion_control,
        "in_process": args.parts.contains(&Part::InProcess).then_some(
            "each terminator of each set-up in front of embedded-qdrant in plaintext, and (with the \
             defaults set-up) embedded-qdrant terminating TLS itself (rustls with ring); CPU of terminator \
             and database together per upsert; UPSERT_100 of 1024-d vectors, wait=true, a new connection \
             each, ids recurring every 64 upserts"),
    })
}

/// What starting any column needs.
#[derive(Clone, Copy)]
struct StartContext<'a> {
    args: &'a BenchArgs,
    proxy_bin: &'a std::path::Path,
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
                ctx.proxy_bin,
                *p,
                &self.label,
                ctx.certs,
                ctx.sinks,
                ctx.work,
                match self.setup {
                    Setup::OneWorker => ctx.args.proxy_worker_threads,
                    Setup::Defaults => 0,
                },
                &ctx.args.proxy_args,
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

/// The table: each figure with its ratio to nginx's in the same row (below 1.00x is
/// cheaper or faster than nginx for every row here), then the notes for missing figures.
pub fn render(result: &BenchResult) -> String {
    let mut out = String::new();
    out.push_str("| work | unit |");
    for c in &result.columns {
        out.push_str(&format!(" {c} |"));
    }
    out.push_str("\n|---|---|");
    for _ in &result.columns {
        out.push_str("---:|");
    }
    out.push('\n');
    let mut notes = Vec::new();
    let rounds = result.settings["rounds"].as_u64().unwrap_or(1);
    if let Some(kx) = result.settings["kx"].as_str() {
        // The proxy's production default offers more (ML-KEM first where the provider has
        // it); a comparison pins one group for every terminator, and says so.
        notes.push(format!(
            "every terminator pinned to TLS {} and one key-exchange group, {kx}, without \
             resumption (the proxy's default offers x25519mlkem768 first where its provider has it)",
            result.settings["tls"].as_str().unwrap_or("?")
        ));
    }
    match result.settings["sink"].as_str() {
        Some("early-answer") => notes.push(
            "the sink answered every upload at once, before reading its body (`--sink early-answer`)"
                .to_owned(),
        ),
        Some(_) => notes.push(
            "the sink read every request body whole before it answered, as Qdrant does".to_owned(),
        ),
        None => {}
    }
    if let Some(cache) = result.settings["tcp_metrics_cache"]
        .as_str()
        .filter(|c| c.starts_with("on"))
    {
        notes.push(format!(
            "the kernel's TCP metrics cache was {cache}: each column's connections may have \
             started from what the previous column's left (run as root to turn it off)"
        ));
    }
    if let Some(cc) = result.settings["client_congestion_control"].as_str() {
        notes.push(format!(
            "the clients' TCP congestion control: {cc}; on loopback a client's sending runs \
             partly on the terminator's CPU, as each ACK the terminator sends is processed by \
             the client's socket at once"
        ));
    }
    if let Some(in_process) = result.settings["in_process"].as_str() {
        notes.push(format!("the rows into embedded-qdrant: {in_process}"));
    }
    if rounds > 1 {
        notes.push(format!(
            "median of {rounds} interleaved rounds, and each ratio the median of the {rounds} \
             rounds' own ratios; the spread of each figure is in bench.json"
        ));
    }
    for row in &result.rows {
        out.push_str(&format!("| {} | {} |", row.name, row.unit));
        for c in &result.columns {
            match row.figures.get(c) {
                Some(Figure::Value(v)) => {
                    let ratio = row
                        .ratios_to_nginx
                        .get(c)
                        .map(|r| format!(" ({r:.2}x)"))
                        .unwrap_or_default();
                    out.push_str(&format!(" {}{ratio} |", fmt_value(*v)));
                }
                Some(Figure::Missing { reason }) => {
                    let note = format!("{c}: {reason}");
                    if reason != rows::handshake::NOT_RUSTLS && !notes.contains(&note) {
                        notes.push(note);
                    }
                    out.push_str(" - |");
                }
                None => out.push_str(" - |"),
            }
        }
        out.push('\n');
    }
    out.push_str(
        "\nRatios are to nginx in the same row and set-up (below 1.00x: less CPU, memory or time than nginx): \
         columns without a suffix run one worker each, columns marked (defaults) each terminator at its \
         own defaults (the proxy a worker per CPU, nginx `worker_processes auto`, HAProxy its default \
         threads), as `settings` of bench.json records; \
         with several rounds (`--repeat`) each figure is the median, each ratio the median of the \
         ratios within a round, and bench.json holds every round; \
         CPU is the terminator's user+system time over its whole process tree, and \"in the \
         kernel\" its system time (on loopback that includes delivering each of its writes to \
         the receiving socket): the part no terminator's own code can remove; the in-memory \
         handshake is the same provider's server side of a full handshake with no sockets \
         (rustls only), so what lies beyond it includes the kernel's part.\n",
    );
    for n in notes {
        out.push_str(&format!("- {n}\n"));
    }
    out
}

fn fmt_value(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
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
