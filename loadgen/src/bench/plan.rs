//! What the bench is asked and what it will do: the flags of `loadgen bench`
//! ([`BenchArgs`]), and the plan made of them once ([`BenchPlan`]): lists sorted and
//! deduplicated, peers named, binaries found, at least one round. Everything after the
//! command line (the driver in `bench`, every row set in `rows`) reads the plan.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use proxy::crypto::{CertAlgorithmName, ProviderName};
use serde::Serialize;

use super::sink::SinkMode;
use super::terminators::{Peer, Setup};
use crate::terminator_flags::{TerminatorFlags, DEFAULT_CLIENT_CONGESTION_CONTROL};

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
    /// The new-connection and bulk rows again, driven by users' load tools: ab (tiny GET and
    /// JSON upsert on new connections) and h2load (gRPC upsert on new connections, keep-alive
    /// bulk over h2, HTTP/1.1 and gRPC).
    Tools,
    /// Resident memory per idle TLS connection.
    Idle,
    /// First response after the handshake from a client without TCP_NODELAY.
    FirstResponse,
    /// Mean time of one 800 KB h2 request at concurrency 1, against the direct path.
    Latency,
    /// The proxy's instructions per unit of work (a new connection with a tiny GET, a new
    /// connection with an upsert, a keep-alive MB), counted by valgrind's callgrind: each of
    /// our providers with one worker, the peers not counted.
    Instructions,
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
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Our providers (each a proxy column), the algorithms of the new-connection rows, the
    /// proxy binary and the database of the in-process rows.
    #[command(flatten)]
    pub terminators: TerminatorFlags,
    /// Peer terminators (Debian's packages, installed with apt-get when missing); `none`
    /// for our proxy alone.
    #[arg(long, value_delimiter = ',', default_value = "nginx,haproxy")]
    pub peers: Vec<String>,
    /// Which rows to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "handshake,upsert,bulk,tools,idle,first-response,latency,instructions,in-process"
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
    /// Units counted per instruction row (default: each row's own, enough that a dump's
    /// own instructions are lost in the total: 100 new connections with a tiny GET, 20
    /// with RSA-4096, 20 upserts, 40 keep-alive requests).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub instruction_units: Option<u64>,
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
    #[arg(long, default_value = DEFAULT_CLIENT_CONGESTION_CONTROL)]
    pub client_congestion_control: String,
    /// Where the table (bench.md), the figures (bench.json) and the logs go.
    #[arg(long, default_value = "results/bench")]
    pub out: PathBuf,
}

/// The bench as it will run; see the module's doc. It holds what it derives from the flags
/// (the providers and binaries resolved, the peers parsed, the row kinds, set-ups and idle
/// clients in table order, the rounds) and the flags themselves for everything else.
#[derive(Debug, Clone)]
pub struct BenchPlan {
    /// The flags as given.
    pub flags: BenchArgs,
    /// Our providers, a proxy column each per set-up, in the order given.
    pub providers: Vec<ProviderName>,
    /// The peers, a column each per set-up.
    pub peers: Vec<Peer>,
    /// The row kinds, in table order, once each.
    pub parts: Vec<Part>,
    /// The set-ups, in table order, once each.
    pub setups: Vec<Setup>,
    /// The idle rows' clients, once each.
    pub idle_clients: Vec<IdleClient>,
    /// The proxy binary.
    pub proxy_bin: PathBuf,
    /// The database of the in-process rows.
    pub upstream_bin: PathBuf,
    /// Interleaved rounds, at least one.
    pub rounds: usize,
}

impl BenchPlan {
    /// The plan of `args`, or why they cannot run.
    pub fn new(args: &BenchArgs) -> Result<Self> {
        if args.setups.is_empty() {
            bail!("--setups: name at least one (one-worker, defaults)");
        }
        Ok(Self {
            providers: args.terminators.providers().to_vec(),
            peers: parse_peers(&args.peers)?,
            parts: sorted(args.parts.clone()),
            setups: sorted(args.setups.clone()),
            idle_clients: sorted(args.idle_clients.clone()),
            proxy_bin: args.terminators.proxy_bin(),
            upstream_bin: args.terminators.upstream_bin(),
            rounds: args.repeat.max(1),
            flags: args.clone(),
        })
    }

    /// Certificate algorithms of the new-connection rows.
    pub fn algorithms(&self) -> &[CertAlgorithmName] {
        &self.flags.terminators.algorithms
    }

    /// Further `proxy run` flags of every proxy column.
    pub fn proxy_args(&self) -> &[String] {
        &self.flags.terminators.proxy_args
    }
}

/// `v` in order, once each.
fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v.dedup();
    v
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
