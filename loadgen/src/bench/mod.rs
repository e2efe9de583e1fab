//! `loadgen bench`: the terminator benchmark. Our proxy (per provider), nginx and HAProxy
//! are put side by side in front of one plaintext sink with the same certificates and TLS
//! policy (TLS 1.3, X25519, no resumption), and each terminator's own CPU (user + system,
//! its whole process tree, from /proc) is divided by the work it did: per new connection
//! with a tiny request per certificate algorithm, per MB of keep-alive bulk over HTTP/1.1,
//! h2 and gRPC; its resident memory per idle TLS connection; the first-response delay for a
//! client that keeps Nagle on; and the latency it adds to one large request at a time.
//! Every figure is printed with its ratio to nginx's, measured in the same run.
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
use terminators::{Certs, Peer, Terminator};
use workloads::{Bulk, Clients};

/// HTTP/2 windows of the sink and the bench's clients: as large as the proxy's own, so
/// neither end of the measurement throttles a bulk upload.
pub const H2_WINDOW: u32 = 4 * 1024 * 1024;

/// Body sizes of the bulk rows: an UPSERT_100 of 1024-d vectors as REST JSON (763 KB) and
/// as gRPC protobuf (416 KB), and the 800 KB upsert of the latency row.
/// Why a peer has no in-memory handshake figure (rendered as a dash, not as a note).
const NOT_RUSTLS: &str = "not rustls";
/// Why openssl-qat has none: its signatures need the QAT provider loaded and its signer
/// running, which only the proxy process has.
const NOT_IN_PROCESS: &str = "QAT provider not loaded in loadgen";

const REST_BODY: usize = 763 * 1024;
const GRPC_BODY: usize = 416 * 1024;
const LATENCY_BODY: usize = 800 * 1024;

/// The rows the benchmark can measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Part {
    /// A new TLS connection per tiny GET, per certificate algorithm.
    Handshake,
    /// Keep-alive uploads: h2 and HTTP/1.1 JSON to an HTTP/1.1 upstream, gRPC to h2c.
    Bulk,
    /// Resident memory per idle TLS connection.
    Idle,
    /// First response after the handshake from a client without TCP_NODELAY.
    FirstResponse,
    /// Mean time of one 800 KB h2 request at concurrency 1, against the direct path.
    Latency,
}

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
        default_value = "handshake,bulk,idle,first-response,latency"
    )]
    pub parts: Vec<Part>,
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
    /// The proxy's worker threads. One by default, as the peers run (nginx
    /// `worker_processes 1`, HAProxy `nbthread 1`), so every column is one worker's cost
    /// per unit of work; 0 is the proxy's own default, one per CPU.
    #[arg(long, default_value_t = 1)]
    pub proxy_worker_threads: usize,
    /// Rounds: every terminator is measured once per round, interleaved; each figure is
    /// the median over the rounds, every round's value in bench.json (idle memory is
    /// measured in the first round only).
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
    Value(f64),
    Missing { reason: String },
}

/// One row of the table.
#[derive(Debug, Serialize)]
pub struct Row {
    pub name: String,
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
        // of two medians from different rounds would not.
        if let Some(nginx) = self
            .by_round
            .get(NGINX)
            .filter(|_| !self.name.starts_with("  "))
        {
            for (c, values) in &self.by_round {
                let paired: Vec<f64> = values
                    .iter()
                    .filter_map(|(round, v)| Some(v / nginx.get(round).filter(|n| **n > 0.0)?))
                    .collect();
                if c != NGINX && !paired.is_empty() {
                    self.ratios_to_nginx.insert(c.clone(), median(&paired));
                }
            }
        }
        self
    }
}

/// The column every ratio is to.
const NGINX: &str = "nginx";

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
    pub columns: Vec<String>,
    pub rows: Vec<Row>,
    pub settings: serde_json::Value,
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
    let peers: Vec<Peer> = args
        .peers
        .iter()
        .filter(|p| p.as_str() != "none" && !p.is_empty())
        .map(|p| match p.as_str() {
            "nginx" => Ok(Peer::Nginx),
            "haproxy" => Ok(Peer::Haproxy),
            other => bail!("--peers: unknown peer {other:?} (nginx, haproxy or none)"),
        })
        .collect::<Result<_>>()?;
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
    let mut sinks = Vec::with_capacity(usize::from(args.upstream_nodes));
    for _ in 0..args.upstream_nodes {
        sinks.push(sink::start(sink_stop.clone()).await?);
    }
    // The direct path is measured against the first.
    let sink = sinks[0];
    eprintln!(
        "sink on {}",
        sinks
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );

    // Columns: our providers, then the peers.
    let mut columns: Vec<String> = args
        .providers
        .iter()
        .map(|p| format!("proxy {}", p.as_str()))
        .collect();
    let peer_bins: Vec<(Peer, Result<PathBuf>)> = peers
        .iter()
        .map(|&p| (p, terminators::ensure_installed(p)))
        .collect();
    columns.extend(peers.iter().map(|p| p.as_str().to_owned()));

    let mut rows = Rows::new();
    let mut order: Vec<String> = Vec::new();
    let mut row = |key: String, unit: &str| -> String {
        if !rows.contains_key(&key) {
            order.push(key.clone());
            rows.insert(key.clone(), Row::new(key.clone(), unit));
        }
        key
    };
    // Declare the rows in table order.
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
        for n in &args.idle {
            keys.idle.push((
                *n,
                row(format!("RSS per idle TLS connection, {n} open"), "KiB"),
                row(format!("RSS of {n} idle TLS connections"), "MiB"),
            ));
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

    let rest_body = json_body(REST_BODY);
    let grpc_body = grpc_body(GRPC_BODY);
    let latency_body = json_body(LATENCY_BODY);
    let direct_latency = if keys.latency.is_some() {
        let io = tokio::net::TcpStream::connect(sink).await?;
        io.set_nodelay(true)?;
        let mut sender = workloads::Sender::over(io, true).await?;
        let d = workloads::mean_latency(
            &mut sender,
            &latency_body,
            &sink.to_string(),
            20,
            args.latency_requests,
            args.duration * 3,
        )
        .await
        .context("the direct path to the sink")?;
        eprintln!("direct path: {:.3} ms per 800 KB request", ms(d));
        Some(d)
    } else {
        None
    };

    let policy = TlsPolicy {
        resumption: false,
        ..TlsPolicy::default()
    };
    let mut column_iter = Vec::new();
    for p in &args.providers {
        column_iter.push(Column::Ours(*p));
    }
    for (p, bin) in peer_bins {
        column_iter.push(Column::Peer(p, bin));
    }
    // Every terminator is started first and measured in interleaved rounds (each once per
    // round), so drift on a shared machine hits every column alike; an idle terminator
    // costs nothing meanwhile.
    let mut started: Vec<(String, Option<Terminator>)> = Vec::new();
    for col in column_iter {
        let label = match &col {
            Column::Ours(p) => format!("proxy {}", p.as_str()),
            Column::Peer(p, _) => p.as_str().to_owned(),
        };
        let t = match &col {
            Column::Ours(p) => terminators::start_proxy(
                &proxy_bin,
                *p,
                &certs,
                &sinks,
                &work,
                args.proxy_worker_threads,
                &args.proxy_args,
            ),
            Column::Peer(p, Ok(bin)) => terminators::start_peer(*p, bin, &certs, &sinks, &work),
            Column::Peer(p, Err(e)) => Err(anyhow::anyhow!("{}: {e:#}", p.as_str())),
        };
        match t {
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
                round,
                t,
                label,
                &keys,
                &mut rows,
                &clients,
                &certs,
                &policy,
                Bodies {
                    rest: &rest_body,
                    grpc: &grpc_body,
                    latency: &latency_body,
                },
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
    for (_, t) in started {
        if let Some(t) = t {
            t.stop();
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
        settings: serde_json::json!({
            "tls": "1.3", "kx": "x25519", "resumption": false,
            "client": "rustls aws-lc-rs, its stock cipher order (AES-256-GCM first)",
            "rounds": args.repeat.max(1), "duration_s": args.duration.as_secs_f64(), "warmup_s": args.warmup.as_secs_f64(),
            "concurrency": args.concurrency, "bulk_connections": args.bulk_connections,
            "idle": args.idle, "latency_requests": args.latency_requests,
            "proxy_worker_threads": args.proxy_worker_threads,
            "upstream_nodes": args.upstream_nodes,
            "workers": "proxy worker_threads as given; nginx worker_processes 1; HAProxy nbthread 1",
            "cpu": "user+system of the terminator's process tree from /proc",
        }),
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

enum Column {
    Ours(ProviderName),
    Peer(Peer, Result<PathBuf>),
}

#[derive(Default)]
struct RowKeys {
    handshake: Vec<HandshakeKeys>,
    /// Per workload: its row, and its kernel share's.
    bulk: Vec<(Bulk, String, String)>,
    idle: Vec<(usize, String, String)>,
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

struct Bodies<'a> {
    rest: &'a Bytes,
    grpc: &'a Bytes,
    latency: &'a Bytes,
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

/// Every row for one terminator.
#[allow(clippy::too_many_arguments)]
async fn measure(
    args: &BenchArgs,
    round: usize,
    t: &mut Terminator,
    label: &str,
    keys: &RowKeys,
    rows: &mut Rows,
    clients: &Clients,
    certs: &Certs,
    policy: &TlsPolicy,
    bodies: Bodies<'_>,
    direct_latency: Option<Duration>,
    stop: &CancellationToken,
) {
    for HandshakeKeys {
        alg,
        total: key,
        kernel: kernel_key,
        in_memory: mem_key,
        beyond: beyond_key,
    } in &keys.handshake
    {
        if stop.is_cancelled() {
            return;
        }
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
        // Our providers: the same handshake in memory, server side only (the floor).
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
                let d = proxy::tls::measure::mean_server_handshake(
                    &server,
                    &clients.in_memory,
                    n / 10,
                    n,
                )?;
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

    // The remaining rows use the P-256 listener (any certificate: no handshake is timed).
    let Some(addr) = t
        .addrs
        .get(&CertAlgorithmName::EcdsaP256)
        .or_else(|| t.addrs.values().next())
        .copied()
    else {
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
        workloads::bulk(
            addr,
            clients,
            *kind,
            body.clone(),
            args.bulk_connections,
            args.warmup,
        )
        .await;
        let measured = cpu_during(
            t,
            workloads::bulk(
                addr,
                clients,
                *kind,
                body.clone(),
                args.bulk_connections,
                args.duration,
            ),
        )
        .await;
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

    // Idle memory only in the first round: a process keeps what it freed (the allocator
    // reuses it), so later rounds would measure reuse, not what a connection costs.
    if round == 1 && !keys.idle.is_empty() && !stop.is_cancelled() {
        let mut held = Vec::new();
        // Settle first: memory freed by earlier rows must not count against idle connections.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let base = t.rss_kib();
        let mut opened = 0usize;
        for (n, per_key, total_key) in &keys.idle {
            let figure = async {
                let base = *base.as_ref().map_err(|e| anyhow::anyhow!("{e:#}"))?;
                if *n > t.max_connections {
                    bail!(
                        "configured for at most {} connections (the open-file limit)",
                        t.max_connections
                    );
                }
                workloads::open_idle(addr, &clients.http1, n - opened, 32, &mut held).await?;
                opened = *n;
                tokio::time::sleep(Duration::from_millis(1000)).await;
                let now = t.rss_kib()?;
                Ok::<_, anyhow::Error>((now.saturating_sub(base)) as f64)
            }
            .await;
            match figure {
                Ok(delta_kib) => {
                    eprintln!(
                        "{label}: {n} idle connections: +{:.1} MiB",
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
        // Let the terminator see the closes before the next row.
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }

    if let Some(key) = &keys.first_response {
        let mut delays = Vec::new();
        let mut error = None;
        for _ in 0..args.first_response_connections.max(1) {
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
        let figure = match delays.get(delays.len() / 2) {
            Some(d) => Ok(ms(*d)),
            None => Err(error.unwrap_or_else(|| anyhow::anyhow!("not measured"))),
        };
        eprintln!("{label}: first response {figure:?} ms (median)");
        put(rows, key, label, figure);
    }

    if let (Some((key, added_key)), Some(direct)) = (&keys.latency, direct_latency) {
        let figure = async {
            let mut sender = workloads::bulk_sender(addr, clients, Bulk::H2Rest).await?;
            workloads::mean_latency(
                &mut sender,
                bodies.latency,
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
        "\nRatios are to nginx in the same row (below 1.00x: less CPU, memory or time than nginx). \
         Each terminator runs as configured in `settings` of bench.json (one worker each by default); \
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
