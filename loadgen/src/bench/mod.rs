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
//! Submodules: [`sink`] (the upstream), [`terminators`] (starting and measuring them),
//! [`workloads`] (the client side of each row).

pub mod sink;
pub mod terminators;
pub mod workloads;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use proxy::config::TlsPolicy;
use proxy::crypto::{generate_cert_set, CertAlgorithmName, ProviderName};
use serde::Serialize;
use tokio_rustls::TlsConnector;
use tokio_util::sync::CancellationToken;

use crate::compare::procs::sibling_binary;
use crate::probe::cpu::CpuSplit;
use sink::SinkMode;
use terminators::{Certs, Peer, Setup, Terminator};
use workloads::{Bulk, Clients};

/// HTTP/2 windows of the sink and the bench's clients: as large as the proxy's own, so
/// neither end of the measurement throttles a bulk upload.
pub const H2_WINDOW: u32 = 4 * 1024 * 1024;

/// Why a peer has no in-memory handshake figure (rendered as a dash, not as a note).
const NOT_RUSTLS: &str = "not rustls";
/// Why openssl-qat has none: its signatures need the QAT provider loaded and its signer
/// running, which only the proxy process has.
const NOT_IN_PROCESS: &str = "QAT provider not loaded in loadgen";

/// Body sizes: an UPSERT_100 of 1024-d vectors as REST JSON (763 KB, the bulk rows) and as
/// gRPC protobuf (416 KB, the bulk and new-connection rows), and the 800 KB JSON upsert of
/// the new-connection and latency rows.
const REST_BODY: usize = 763 * 1024;
const GRPC_BODY: usize = 416 * 1024;
const LARGE_JSON_BODY: usize = 800 * 1024;

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
    fn as_str(self) -> &'static str {
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
        default_value = "handshake,upsert,bulk,idle,first-response,latency"
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
    /// Requests of the concurrency-1 latency row (after 20 unmeasured ones).
    #[arg(long, default_value_t = 300)]
    pub latency_requests: usize,
    /// Connections of the first-response row (the median is reported).
    #[arg(long, default_value_t = 30)]
    pub first_response_connections: usize,
    /// The proxy binary (default: next to this loadgen).
    #[arg(long)]
    pub proxy_bin: Option<PathBuf>,
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
    /// Where the table (bench.md), the figures (bench.json) and the logs go.
    #[arg(long, default_value = "results/bench")]
    pub out: PathBuf,
}

/// One figure of one terminator, or why there is none.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Figure {
    /// The figure.
    Value(f64),
    /// None.
    Missing {
        /// Why.
        reason: String,
    },
}

/// One row of the table.
#[derive(Debug, Serialize)]
pub struct Row {
    /// What the row measures, as the table prints it.
    pub name: String,
    /// Its unit.
    pub unit: String,
    /// Column label -> figure (the median over the rounds).
    pub figures: BTreeMap<String, Figure>,
    /// Column label -> every round's value, in round order (from `by_round`, at the end).
    pub rounds: BTreeMap<String, Vec<f64>>,
    /// Column label -> its ratio to nginx: the median over the rounds of the two columns'
    /// ratio within each round (rows of their own, not the indented parts of one).
    pub ratios_to_nginx: BTreeMap<String, f64>,
    /// Work done per column (connections, MB, requests), for the reader's judgement.
    pub work: BTreeMap<String, String>,
    /// The first reason a round had no value, per column.
    #[serde(skip)]
    errors: BTreeMap<String, String>,
    /// The round being measured, and each column's value by round: the medians' and the
    /// paired ratios' source.
    #[serde(skip)]
    round: usize,
    #[serde(skip)]
    by_round: BTreeMap<String, BTreeMap<usize, f64>>,
}

impl Row {
    fn new(name: impl Into<String>, unit: &str) -> Self {
        Self {
            name: name.into(),
            unit: unit.to_owned(),
            figures: BTreeMap::new(),
            rounds: BTreeMap::new(),
            ratios_to_nginx: BTreeMap::new(),
            work: BTreeMap::new(),
            errors: BTreeMap::new(),
            round: 1,
            by_round: BTreeMap::new(),
        }
    }

    /// One round's value for `column`, or why there is none.
    fn set(&mut self, column: &str, figure: Result<f64>) {
        match figure {
            Ok(v) if v.is_finite() => {
                self.by_round
                    .entry(column.to_owned())
                    .or_default()
                    .insert(self.round, v);
            }
            Ok(v) => {
                self.errors
                    .entry(column.to_owned())
                    .or_insert_with(|| format!("not a number ({v})"));
            }
            Err(e) => {
                self.errors
                    .entry(column.to_owned())
                    .or_insert_with(|| format!("{e:#}"));
            }
        }
    }

    /// The figures: each column's median over its rounds, or the first reason it has none.
    fn finish(mut self) -> Self {
        self.rounds = self
            .by_round
            .iter()
            .map(|(c, values)| (c.clone(), values.values().copied().collect()))
            .collect();
        let columns: std::collections::BTreeSet<String> = self
            .rounds
            .keys()
            .chain(self.errors.keys())
            .cloned()
            .collect();
        for c in columns {
            let figure = match self.rounds.get(&c) {
                Some(values) if !values.is_empty() => Figure::Value(median(values)),
                _ => Figure::Missing {
                    reason: self.errors.get(&c).cloned().unwrap_or_default(),
                },
            };
            self.figures.insert(c, figure);
        }
        // Ratios pair the columns round by round: a machine that slows down between rounds
        // slows every column of that round alike, and the pairing cancels it, where a ratio
        // of two medians from different rounds would not. Each column is paired with nginx
        // in its own set-up.
        if self.name.starts_with("  ") {
            return self;
        }
        for (c, values) in &self.by_round {
            let baseline = baseline_of(c);
            let Some(nginx) = self.by_round.get(&baseline) else {
                continue;
            };
            let paired: Vec<f64> = values
                .iter()
                .filter_map(|(round, v)| Some(v / nginx.get(round).filter(|n| **n > 0.0)?))
                .collect();
            if *c != baseline && !paired.is_empty() {
                self.ratios_to_nginx.insert(c.clone(), median(&paired));
            }
        }
        self
    }
}

/// The column every ratio is to, in the one-worker set-up.
const NGINX: &str = "nginx";

/// The column `column`'s ratios are to: nginx in the same set-up.
fn baseline_of(column: &str) -> String {
    let suffix = Setup::Defaults.suffix();
    if column.ends_with(suffix) {
        format!("{NGINX}{suffix}")
    } else {
        NGINX.to_owned()
    }
}

/// The median (the mean of the middle two for an even count).
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    }
}

/// The table's rows by name, declared before anything is measured.
type Rows = BTreeMap<String, Row>;

/// Sets `column`'s figure in the row `key`.
fn put(rows: &mut Rows, key: &str, column: &str, figure: Result<f64>) {
    if let Some(row) = rows.get_mut(key) {
        row.set(column, figure);
    }
}

/// The same reason for several rows of one column.
fn put_missing(rows: &mut Rows, keys: &[&String], column: &str, reason: &str) {
    for key in keys {
        put(rows, key, column, Err(anyhow::anyhow!("{reason}")));
    }
}

/// Records the work behind `column`'s figure in the row `key`.
fn note_work(rows: &mut Rows, key: &str, column: &str, work: String) {
    if let Some(row) = rows.get_mut(key) {
        row.work.insert(column.to_owned(), work);
    }
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

fn clients(ca: &std::path::Path) -> Result<Clients> {
    Ok(Clients {
        http1: TlsConnector::from(bench_client(ca, b"http/1.1")?),
        h2: TlsConnector::from(bench_client(ca, b"h2")?),
        in_memory: bench_client(ca, b"")?,
    })
}

/// A JSON array of floats of about `size` bytes: the bulk rows' REST body.
fn json_body(size: usize) -> Bytes {
    let mut s = String::with_capacity(size + 32);
    s.push_str("{\"points\":[{\"id\":1,\"vector\":[");
    let mut i = 0u32;
    while s.len() + 16 < size {
        s.push_str(&format!("0.{:04},", (i * 7919) % 10_000));
        i += 1;
    }
    s.push_str("0.5]}]}");
    Bytes::from(s)
}

/// A gRPC frame of about `size` bytes (uncompressed, opaque payload).
fn grpc_body(size: usize) -> Bytes {
    let payload: Vec<u8> = (0..size - 5).map(|i| (i * 31 % 251) as u8).collect();
    Bytes::from(crate::client::grpc_frame(&payload))
}

/// Runs the terminator's CPU meter around `work`: CPU-seconds used while it ran, in user
/// space and in the kernel.
async fn cpu_during<T>(
    t: &Terminator,
    work: impl std::future::Future<Output = T>,
) -> Result<(CpuSplit, T)> {
    let before = t.cpu_seconds()?;
    let out = work.await;
    let after = t.cpu_seconds()?;
    Ok((after - before, out))
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

/// Runs the benchmark and writes `bench.md` and `bench.json` under `--out`.
pub async fn execute(args: &BenchArgs, stop: CancellationToken) -> Result<BenchResult> {
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
    let clients = clients(&certs.ca)?;
    let sink_stop = stop.child_token();
    let sinks = start_sinks(args, &sink_stop).await?;
    // The direct path is measured against the first.
    let sink = sinks[0];

    let specs = column_specs(args, &peers);
    let columns: Vec<String> = specs.iter().map(|c| c.label.clone()).collect();

    let (keys, mut rows, order) = declare_rows(args);
    let rest_body = json_body(REST_BODY);
    let grpc_body = grpc_body(GRPC_BODY);
    let large_json_body = json_body(LARGE_JSON_BODY);
    let direct_latency = if keys.latency.is_some() {
        Some(direct_path_latency(args, sink, &large_json_body).await?)
    } else {
        None
    };

    let policy = TlsPolicy {
        resumption: false,
        ..TlsPolicy::default()
    };
    let ctx = StartContext {
        args,
        proxy_bin: &proxy_bin,
        certs: &certs,
        sinks: &sinks,
        work: &work,
    };
    // Every terminator is started first and measured in interleaved rounds (each once per
    // round), so drift on a shared machine hits every column alike; an idle terminator
    // costs nothing meanwhile.
    let mut started = start_columns(&ctx, &specs, &mut rows);
    let bodies = Bodies {
        rest: &rest_body,
        grpc: &grpc_body,
        large_json: &large_json_body,
    };
    for round in 1..=args.repeat.max(1) {
        if args.repeat > 1 {
            eprintln!("round {round} of {}", args.repeat);
        }
        for row in rows.values_mut() {
            row.round = round;
        }
        for (label, t) in started.iter_mut() {
            let Some(t) = t.as_mut() else { continue };
            if stop.is_cancelled() || !t.alive() {
                continue;
            }
            measure(
                args,
                t,
                label,
                &keys,
                &mut rows,
                &clients,
                &certs,
                &policy,
                &bodies,
                direct_latency,
                &stop,
            )
            .await;
            if !t.alive() {
                eprintln!("{label}: died during the benchmark: {}", t.log_tail());
                for r in rows.values_mut() {
                    r.set(label, Err(anyhow::anyhow!("died: {}", t.log_tail())));
                }
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
    for row in rows.values_mut() {
        row.round = 1;
    }
    for (client, per_n) in &keys.idle {
        for spec in specs.iter().filter(|s| !failed_to_start.contains(&s.label)) {
            if stop.is_cancelled() {
                break;
            }
            measure_idle(&ctx, spec, *client, per_n, &mut rows, &clients).await;
        }
    }
    sink_stop.cancel();

    let result = BenchResult {
        columns,
        rows: order
            .iter()
            .filter_map(|k| rows.remove(k))
            .map(Row::finish)
            .collect(),
        settings: settings_record(args),
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
    rows: &mut Rows,
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
                for r in rows.values_mut() {
                    r.set(&label, Err(anyhow::anyhow!("did not start: {e:#}")));
                }
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

/// The sink's own latency for an 800 KB request over plain TCP: what a terminator's
/// latency is compared with.
async fn direct_path_latency(
    args: &BenchArgs,
    sink: std::net::SocketAddr,
    large_json_body: &Bytes,
) -> Result<Duration> {
    let io = tokio::net::TcpStream::connect(sink).await?;
    io.set_nodelay(true)?;
    let mut sender = workloads::Sender::over(io, true).await?;
    let d = workloads::mean_latency(
        &mut sender,
        large_json_body,
        &sink.to_string(),
        20,
        args.latency_requests,
        args.duration * 3,
    )
    .await
    .context("the direct path to the sink")?;
    eprintln!("direct path: {:.3} ms per 800 KB request", ms(d));
    Ok(d)
}

/// What the bench pinned and how it ran, as bench.json records it.
fn settings_record(args: &BenchArgs) -> serde_json::Value {
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
    })
}

/// The rows `args` asks for, in table order, with the keys each kind of work fills.
fn declare_rows(args: &BenchArgs) -> (RowKeys, Rows, Vec<String>) {
    let mut rows = Rows::new();
    let mut order: Vec<String> = Vec::new();
    let mut row = |key: String, unit: &str| -> String {
        if !rows.contains_key(&key) {
            order.push(key.clone());
            rows.insert(key.clone(), Row::new(key.clone(), unit));
        }
        key
    };
    let mut keys = RowKeys::default();
    if args.parts.contains(&Part::Handshake) {
        for alg in &args.algorithms {
            keys.handshake.push(HandshakeKeys {
                alg: *alg,
                total: row(
                    format!("new TLS connection + tiny GET, {}", alg.as_str()),
                    "us CPU",
                ),
                kernel: row(
                    format!("  of which in the kernel, {}", alg.as_str()),
                    "us CPU",
                ),
                in_memory: row(
                    format!("  of which the in-memory handshake, {}", alg.as_str()),
                    "us CPU",
                ),
                beyond: row(
                    format!("  beyond the in-memory handshake, {}", alg.as_str()),
                    "us CPU",
                ),
            });
        }
    }
    if args.parts.contains(&Part::Upsert) {
        for alg in &args.algorithms {
            for (kind, name, short) in [
                (
                    Bulk::H1Rest,
                    "new TLS connection + one 800 KB JSON upsert, HTTP/1.1",
                    "JSON",
                ),
                (
                    Bulk::Grpc,
                    "new TLS connection + one 416 KB gRPC upsert, h2",
                    "gRPC",
                ),
            ] {
                keys.upsert.push(UpsertKeys {
                    alg: *alg,
                    kind,
                    total: row(format!("{name}, {}", alg.as_str()), "ms CPU"),
                    kernel: row(
                        format!("  of which in the kernel, {short} {}", alg.as_str()),
                        "ms CPU",
                    ),
                });
            }
        }
    }
    if args.parts.contains(&Part::Bulk) {
        for (kind, name, short) in [
            (
                Bulk::H2Rest,
                "keep-alive 763 KB JSON, h2 client -> HTTP/1.1 upstream",
                "h2 -> HTTP/1.1",
            ),
            (
                Bulk::H1Rest,
                "keep-alive 763 KB JSON, HTTP/1.1 client -> HTTP/1.1 upstream",
                "HTTP/1.1 -> HTTP/1.1",
            ),
            (
                Bulk::Grpc,
                "keep-alive 416 KB gRPC, h2 -> h2c upstream",
                "gRPC",
            ),
        ] {
            keys.bulk.push((
                kind,
                row(name.to_owned(), "ms CPU per MB"),
                row(
                    format!("  of which in the kernel, {short}"),
                    "ms CPU per MB",
                ),
            ));
        }
    }
    if args.parts.contains(&Part::Idle) {
        let mut idle_clients = args.idle_clients.clone();
        idle_clients.sort();
        idle_clients.dedup();
        for client in idle_clients {
            let per_n = args
                .idle
                .iter()
                .map(|n| {
                    (
                        *n,
                        row(
                            format!(
                                "RSS per idle TLS connection, {n} open, {} client",
                                client.as_str()
                            ),
                            "KiB",
                        ),
                        row(
                            format!(
                                "RSS of {n} idle TLS connections, {} client",
                                client.as_str()
                            ),
                            "MiB",
                        ),
                    )
                })
                .collect();
            keys.idle.push((client, per_n));
        }
    }
    if args.parts.contains(&Part::FirstResponse) {
        keys.first_response = Some(row(
            "first response after the handshake, client without TCP_NODELAY (median)".into(),
            "ms",
        ));
    }
    if args.parts.contains(&Part::Latency) {
        keys.latency = Some((
            row(
                "mean time of one 800 KB h2 request at concurrency 1".into(),
                "ms",
            ),
            row("  added over the direct path".into(), "ms"),
        ));
    }
    (keys, rows, order)
}

/// What starting any column needs.
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

#[derive(Default)]
struct RowKeys {
    handshake: Vec<HandshakeKeys>,
    upsert: Vec<UpsertKeys>,
    /// Per workload: its row, and its kernel share's.
    bulk: Vec<(Bulk, String, String)>,
    /// Per client, per count of open connections: the per-connection row and the total's.
    idle: Vec<(IdleClient, Vec<IdleKeys>)>,
    first_response: Option<String>,
    latency: Option<(String, String)>,
}

/// The rows of one certificate algorithm's new-connection figure.
struct HandshakeKeys {
    alg: CertAlgorithmName,
    /// CPU per connection.
    total: String,
    /// Its system time: what the kernel's TCP and socket work cost the terminator.
    kernel: String,
    /// The provider's handshake alone, in memory (ours only).
    in_memory: String,
    /// `total` minus `in_memory`.
    beyond: String,
}

/// The rows of one count of idle connections: (count, per-connection row, total's row).
type IdleKeys = (usize, String, String);

/// The rows of one certificate algorithm's new-connection-per-upsert figure, for one kind
/// of upsert.
struct UpsertKeys {
    alg: CertAlgorithmName,
    kind: Bulk,
    /// CPU per upsert.
    total: String,
    /// Its system time.
    kernel: String,
}

struct Bodies<'a> {
    rest: &'a Bytes,
    grpc: &'a Bytes,
    /// The 800 KB JSON upsert.
    large_json: &'a Bytes,
}

/// How a timed row turns CPU-seconds and the work done into its figure.
struct Unit {
    /// Figure units per CPU-second (1e6 for microseconds).
    scale: f64,
    /// The work one figure is per, from what the loop did: (count, description).
    work: fn(&workloads::Outcome) -> (f64, String),
    /// For the progress line.
    name: &'static str,
}

const PER_CONNECTION: Unit = Unit {
    scale: 1e6,
    work: |o| {
        (
            o.ok as f64,
            format!("{} connections, {} failed", o.ok, o.failed),
        )
    },
    name: "us CPU per connection",
};

const PER_MB: Unit = Unit {
    scale: 1e3,
    work: |o| {
        let mb = o.bytes as f64 / 1e6;
        (
            mb,
            format!("{} requests, {mb:.0} MB, {} failed", o.ok, o.failed),
        )
    },
    name: "ms CPU per MB",
};

const PER_UPSERT: Unit = Unit {
    scale: 1e3,
    work: |o| {
        (
            o.ok as f64,
            format!(
                "{} upserts on as many connections, {:.0} MB, {} failed",
                o.ok,
                o.bytes as f64 / 1e6,
                o.failed
            ),
        )
    },
    name: "ms CPU per upsert",
};

/// The figure of one timed loop (the terminator's CPU over it, per unit of work), with the
/// work behind it noted in the row and a progress line. The kernel's share of it goes to
/// the row `kernel_key`.
fn cpu_per_unit(
    rows: &mut Rows,
    (key, kernel_key): (&str, &str),
    label: &str,
    what: &str,
    measured: Result<(CpuSplit, workloads::Outcome)>,
    unit: &Unit,
) -> Result<f64> {
    let figure = match measured {
        Ok((cpu, out)) if out.ok > 0 => {
            let (count, work) = (unit.work)(&out);
            note_work(rows, key, label, work);
            if let Some(e) = &out.first_error {
                eprintln!("{label} {what}: {} failed, first: {e}", out.failed);
            }
            put(rows, kernel_key, label, Ok(cpu.system * unit.scale / count));
            Ok(cpu.total() * unit.scale / count)
        }
        Ok((_, out)) => Err(anyhow::anyhow!(
            "nothing succeeded: {}",
            out.first_error.unwrap_or_default()
        )),
        Err(e) => Err(e),
    };
    match &figure {
        Ok(v) => eprintln!("{label} {what}: {v:.3} {}", unit.name),
        Err(e) => {
            eprintln!("{label} {what}: {e:#}");
            // The kernel's share is missing for the same reason.
            put(rows, kernel_key, label, Err(anyhow::anyhow!("{e:#}")));
        }
    }
    figure
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Every timed row for one terminator, in one round.
#[allow(clippy::too_many_arguments)]
async fn measure(
    args: &BenchArgs,
    t: &mut Terminator,
    label: &str,
    keys: &RowKeys,
    rows: &mut Rows,
    clients: &Clients,
    certs: &Certs,
    policy: &TlsPolicy,
    bodies: &Bodies<'_>,
    direct_latency: Option<Duration>,
    stop: &CancellationToken,
) {
    for k in &keys.handshake {
        if stop.is_cancelled() {
            return;
        }
        measure_handshake(args, t, label, k, rows, clients, certs, policy).await;
    }
    for k in &keys.upsert {
        if stop.is_cancelled() {
            return;
        }
        let addr = t.addrs[&k.alg];
        let body = if k.kind == Bulk::Grpc {
            bodies.grpc
        } else {
            bodies.large_json
        };
        let run = |duration| {
            workloads::upserts_on_new_connections(
                addr,
                clients,
                k.kind,
                body.clone(),
                args.concurrency,
                duration,
            )
        };
        run(args.warmup).await;
        let measured = cpu_during(t, run(args.duration)).await;
        let what = format!("{:?} upsert, new connection, {}", k.kind, k.alg.as_str());
        let figure = cpu_per_unit(
            rows,
            (&k.total, &k.kernel),
            label,
            &what,
            measured,
            &PER_UPSERT,
        );
        put(rows, &k.total, label, figure);
    }

    // The remaining rows use the P-256 listener (any certificate: no handshake is timed).
    let Some(addr) = any_listener(t) else {
        return;
    };
    for (kind, key, kernel_key) in &keys.bulk {
        if stop.is_cancelled() {
            return;
        }
        let body = if *kind == Bulk::Grpc {
            bodies.grpc
        } else {
            bodies.rest
        };
        let run = |duration| {
            workloads::bulk(
                addr,
                clients,
                *kind,
                body.clone(),
                args.bulk_connections,
                duration,
            )
        };
        run(args.warmup).await;
        let measured = cpu_during(t, run(args.duration)).await;
        let figure = cpu_per_unit(
            rows,
            (key, kernel_key),
            label,
            &format!("{kind:?}"),
            measured,
            &PER_MB,
        );
        put(rows, key, label, figure);
    }

    if let Some(key) = &keys.first_response {
        let figure = first_response(addr, clients, args.first_response_connections, stop).await;
        eprintln!("{label}: first response {figure:?} ms (median)");
        put(rows, key, label, figure);
    }

    if let (Some((key, added_key)), Some(direct)) = (&keys.latency, direct_latency) {
        let figure = async {
            let mut sender = workloads::bulk_sender(addr, clients, Bulk::H2Rest).await?;
            workloads::mean_latency(
                &mut sender,
                bodies.large_json,
                &format!("localhost:{}", addr.port()),
                20,
                args.latency_requests,
                args.duration * 3,
            )
            .await
        }
        .await;
        eprintln!("{label}: 800 KB at concurrency 1: {figure:?}");
        match figure {
            Ok(d) => {
                put(rows, key, label, Ok(ms(d)));
                put(rows, added_key, label, Ok(ms(d) - ms(direct)));
            }
            Err(e) => {
                let msg = format!("{e:#}");
                put_missing(rows, &[key, added_key], label, &msg);
            }
        }
    }
}

/// The listener the rows that time no handshake use: P-256's, or any.
fn any_listener(t: &Terminator) -> Option<std::net::SocketAddr> {
    t.addrs
        .get(&CertAlgorithmName::EcdsaP256)
        .or_else(|| t.addrs.values().next())
        .copied()
}

/// The new-connection rows of one certificate algorithm: CPU per connection, and for our
/// providers the same handshake in memory, server side only (the floor).
#[allow(clippy::too_many_arguments)]
async fn measure_handshake(
    args: &BenchArgs,
    t: &Terminator,
    label: &str,
    keys: &HandshakeKeys,
    rows: &mut Rows,
    clients: &Clients,
    certs: &Certs,
    policy: &TlsPolicy,
) {
    let HandshakeKeys {
        alg,
        total: key,
        kernel: kernel_key,
        in_memory: mem_key,
        beyond: beyond_key,
    } = keys;
    let addr = t.addrs[alg];
    workloads::new_connections(addr, &clients.http1, args.concurrency, args.warmup).await;
    let measured = cpu_during(
        t,
        workloads::new_connections(addr, &clients.http1, args.concurrency, args.duration),
    )
    .await;
    let per_conn = cpu_per_unit(
        rows,
        (key, kernel_key),
        label,
        alg.as_str(),
        measured,
        &PER_CONNECTION,
    );
    let in_memory = t
        .provider
        .filter(|p| *p != ProviderName::OpensslQat)
        .map(|p| {
            let (_, _, server) = proxy::tls::listener_tls(
                p,
                &certs.dir.join(format!("{}.crt", alg.as_str())),
                &certs.dir.join(format!("{}.key", alg.as_str())),
                policy,
                &[],
            )?;
            let n = match alg {
                CertAlgorithmName::Rsa4096 => 200,
                _ => 1000,
            };
            let d =
                proxy::tls::measure::mean_server_handshake(&server, &clients.in_memory, n / 10, n)?;
            Ok::<f64, anyhow::Error>(d.as_secs_f64() * 1e6)
        });
    match (&per_conn, in_memory) {
        (_, None) => {
            let why = if t.provider.is_some() {
                NOT_IN_PROCESS
            } else {
                NOT_RUSTLS
            };
            put_missing(rows, &[mem_key, beyond_key], label, why);
        }
        (Ok(total), Some(Ok(mem))) => {
            let total = *total;
            put(rows, mem_key, label, Ok(mem));
            put(rows, beyond_key, label, Ok(total - mem));
        }
        (Err(_), Some(Ok(mem))) => {
            put(rows, mem_key, label, Ok(mem));
            put(
                rows,
                beyond_key,
                label,
                Err(anyhow::anyhow!("no connection figure")),
            );
        }
        (_, Some(Err(e))) => {
            let msg = format!("{e:#}");
            put_missing(rows, &[mem_key, beyond_key], label, &msg);
        }
    }
    put(rows, key, label, per_conn);
}

/// The median delay to the first response byte over `connections` new connections from a
/// client that keeps Nagle on.
async fn first_response(
    addr: std::net::SocketAddr,
    clients: &Clients,
    connections: usize,
    stop: &CancellationToken,
) -> Result<f64> {
    let mut delays = Vec::new();
    let mut error = None;
    for _ in 0..connections.max(1) {
        if stop.is_cancelled() {
            break;
        }
        match tokio::time::timeout(
            Duration::from_secs(5),
            workloads::tiny_request(addr, &clients.http1, false),
        )
        .await
        {
            Ok(Ok(d)) => delays.push(d),
            Ok(Err(e)) => error = Some(e),
            Err(_) => error = Some(anyhow::anyhow!("no answer within 5 s")),
        }
    }
    delays.sort();
    match delays.get(delays.len() / 2) {
        Some(d) => Ok(ms(*d)),
        None => Err(error.unwrap_or_else(|| anyhow::anyhow!("not measured"))),
    }
}

/// Idle connections held open by one kind of client.
enum Held {
    Rustls(Vec<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
    Openssl(Vec<workloads::OpensslIdle>),
}

/// The idle rows of one column for one client, on a terminator started afresh for them:
/// memory a process freed stays resident and is reused, so a terminator that has served
/// other rows, or other idle clients, would show less than connections cost.
async fn measure_idle(
    ctx: &StartContext<'_>,
    spec: &ColumnSpec,
    client: IdleClient,
    per_n: &[IdleKeys],
    rows: &mut Rows,
    clients: &Clients,
) {
    let label = spec.label.as_str();
    let t = match spec.start(ctx) {
        Ok(t) => t,
        Err(e) => {
            let msg = format!("did not start for the idle rows: {e:#}");
            for (_, per_key, total_key) in per_n {
                put_missing(rows, &[per_key, total_key], label, &msg);
            }
            return;
        }
    };
    let Some(addr) = any_listener(&t) else {
        t.stop();
        return;
    };
    // Settle: the start-up's own allocations must not count against idle connections.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let base = t.rss_kib();
    let mut held = match client {
        IdleClient::Rustls => Held::Rustls(Vec::new()),
        IdleClient::Openssl => Held::Openssl(Vec::new()),
    };
    let mut opened = 0usize;
    for (n, per_key, total_key) in per_n {
        let figure = async {
            let base = *base.as_ref().map_err(|e| anyhow::anyhow!("{e:#}"))?;
            if *n > t.max_connections {
                bail!(
                    "configured for at most {} connections (the open-file limit)",
                    t.max_connections
                );
            }
            let more = n - opened;
            match &mut held {
                Held::Rustls(h) => workloads::open_idle(addr, &clients.http1, more, 32, h).await?,
                Held::Openssl(h) => {
                    workloads::open_idle_openssl(addr, &ctx.certs.ca, more, 8, h).await?
                }
            }
            opened = *n;
            tokio::time::sleep(Duration::from_millis(1000)).await;
            let now = t.rss_kib()?;
            Ok::<_, anyhow::Error>((now.saturating_sub(base)) as f64)
        }
        .await;
        match figure {
            Ok(delta_kib) => {
                eprintln!(
                    "{label}: {n} idle connections ({} client): +{:.1} MiB",
                    client.as_str(),
                    delta_kib / 1024.0
                );
                put(rows, per_key, label, Ok(delta_kib / *n as f64));
                put(rows, total_key, label, Ok(delta_kib / 1024.0));
            }
            Err(e) => {
                let msg = format!("{e:#}");
                eprintln!("{label}: {n} idle connections: {msg}");
                put_missing(rows, &[per_key, total_key], label, &msg);
                break;
            }
        }
    }
    drop(held);
    t.stop();
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
                    if reason != NOT_RUSTLS && !notes.contains(&note) {
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
    fn a_figure_is_the_median_of_its_rounds_and_a_failed_round_does_not_hide_the_others() {
        let mut row = Row::new("r", "us");
        for (round, v) in [(1, 30.0), (2, 10.0), (3, 20.0)] {
            row.round = round;
            row.set("a", Ok(v));
        }
        row.round = 1;
        row.set("b", Ok(4.0));
        row.round = 2;
        row.set("b", Err(anyhow::anyhow!("refused")));
        row.round = 3;
        row.set("b", Ok(2.0));
        row.set("c", Err(anyhow::anyhow!("did not start")));
        row.set("c", Ok(f64::NAN));
        let row = row.finish();
        assert!(matches!(row.figures["a"], Figure::Value(v) if v == 20.0));
        assert!(matches!(row.figures["b"], Figure::Value(v) if v == 3.0));
        assert!(
            matches!(&row.figures["c"], Figure::Missing { reason } if reason == "did not start")
        );
        assert_eq!(row.rounds["a"], [30.0, 10.0, 20.0]);
    }

    #[test]
    fn a_cpu_figure_and_its_kernel_share_are_set_together_or_missing_together() {
        let mut rows = Rows::new();
        for key in ["whole", "kernel"] {
            rows.insert(key.into(), Row::new(key, "us"));
        }
        let done = workloads::Outcome {
            ok: 10,
            failed: 0,
            bytes: 0,
            first_error: None,
        };
        let cpu = CpuSplit {
            user: 0.003,
            system: 0.001,
        };
        let whole = cpu_per_unit(
            &mut rows,
            ("whole", "kernel"),
            "ours",
            "test",
            Ok((cpu, done)),
            &PER_CONNECTION,
        );
        assert!((whole.unwrap() - 400.0).abs() < 1e-9);
        assert!((rows["kernel"].by_round["ours"][&1] - 100.0).abs() < 1e-9);

        let failed = cpu_per_unit(
            &mut rows,
            ("whole", "kernel"),
            "peer",
            "test",
            Err(anyhow::anyhow!("no /proc entry")),
            &PER_CONNECTION,
        );
        assert!(failed.is_err());
        let kernel = rows.remove("kernel").unwrap().finish();
        assert!(
            matches!(&kernel.figures["peer"], Figure::Missing { reason } if reason == "no /proc entry")
        );
    }

    #[test]
    fn ratios_pair_the_columns_round_by_round() {
        let mut row = Row::new("work", "us");
        let mut part = Row::new("  part of it", "us");
        // Round 2 ran on a slow machine for both; "b" failed in round 3.
        for (round, ours, nginx, b) in [
            (1, 10.0, 20.0, Some(30.0)),
            (2, 12.0, 13.0, Some(13.0)),
            (3, 30.0, 60.0, None),
        ] {
            for r in [&mut row, &mut part] {
                r.round = round;
                r.set("ours", Ok(ours));
                r.set(NGINX, Ok(nginx));
                r.set("b", b.ok_or_else(|| anyhow::anyhow!("refused")));
            }
        }
        let row = row.finish();
        // Per round 0.5, 0.92, 0.5: the median is 0.5, where the medians' ratio (12 / 20)
        // would say 0.6.
        assert_eq!(row.ratios_to_nginx["ours"], 0.5);
        // Only rounds both have count: 1.5 and 1.0.
        assert_eq!(row.ratios_to_nginx["b"], 1.25);
        assert!(!row.ratios_to_nginx.contains_key(NGINX));
        // An indented row is a part of the row above it: no ratio of its own.
        assert!(part.finish().ratios_to_nginx.is_empty());
    }
}
