//! `loadgen run`'s flags (`RunArgs`), their checks that need neither the network nor the
//! target, and how a result records them (`RunConfig::of`).

use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};
use clap::{ArgAction, Args, ValueEnum};
use proxy::crypto::{KxGroupName, ProviderName};
use serde::Serialize;

use crate::client::{Protocol, Target};
use crate::driver::ConnectionPolicy;
use crate::probe;
use crate::result::*;

/// Where the vectors of the upserts come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum VectorSource {
    /// Seeded, reproducible, unit-length vectors.
    Synthetic,
    /// An OpenAI-compatible embeddings endpoint (OVMS), fed the --corpus.
    Embeddings,
    /// A vectors file written by the embeddings cache.
    File,
}

/// Where energy is read (`--power`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PowerChoice {
    /// Redfish or Prometheus when their flags are given, else RAPL when readable, else none
    /// with the reason.
    Auto,
    /// This host's RAPL counters.
    Rapl,
    /// A BMC's Redfish Power resource (`--redfish`).
    Redfish,
    /// A Prometheus query in watts (`--prometheus`, `--prometheus-query`).
    Prometheus,
    /// Not read.
    None,
}

fn redact_secret<S: serde::Serializer>(v: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(_) => s.serialize_some("(set)"),
        None => s.serialize_none(),
    }
}

/// Headers may carry credentials (authorization): only their names are recorded.
fn header_names_only<S: serde::Serializer>(v: &[String], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(v.len()))?;
    for h in v {
        let name = h.split_once(':').map_or(h.as_str(), |(n, _)| n.trim());
        seq.serialize_element(&format!("{name}: (redacted)"))?;
    }
    seq.end()
}

/// Everything a run is configured by; recorded whole in the result (secrets redacted).
#[derive(Clone, Debug, Args, Serialize)]
pub struct RunArgs {
    /// HOST:PORT (TLS), https://HOST:PORT, or http://HOST:PORT for a plaintext baseline.
    #[arg(long)]
    pub target: String,
    /// Default: grpc for port 6334, rest otherwise.
    #[arg(long, value_enum)]
    pub protocol: Option<Protocol>,
    /// Qdrant collection the points are written to (created when missing).
    #[arg(long, default_value = "loadgen")]
    pub collection: String,
    /// Drop and create the collection before the run.
    #[arg(long)]
    pub recreate: bool,
    /// Points per upsert request (UPSERT_100: 100).
    #[arg(long, default_value_t = 100)]
    pub points_per_request: usize,
    /// Vector dimensions (1024: Qwen3-Embedding-0.6B). Taken from the vectors when they
    /// come from an endpoint or a file.
    #[arg(long, default_value_t = 1024)]
    pub dim: usize,
    /// Ask Qdrant to answer after the write is applied (true) or on acceptance (false).
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    pub wait: bool,
    /// Decimals per coordinate in REST JSON (4 gives the reference's ~8 KB per 1024-d
    /// vector); 0 writes the shortest exact f32 form.
    #[arg(long, default_value_t = 4)]
    pub json_decimals: usize,

    /// Where the vectors come from.
    #[arg(long, value_enum, default_value_t = VectorSource::Synthetic)]
    pub vectors: VectorSource,
    /// Seed of the synthetic vectors (same seed, same vectors).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Vectors file: read with --vectors file; the cache written by --vectors embeddings.
    #[arg(long)]
    pub vectors_file: Option<PathBuf>,
    /// Embeddings server base URL (OVMS), e.g. http://127.0.0.1:8000.
    #[arg(long)]
    pub embeddings_url: Option<String>,
    /// Model name sent to the embeddings endpoint.
    #[arg(long, default_value = "Qwen/Qwen3-Embedding-0.6B")]
    pub embeddings_model: String,
    /// Text corpus: a file, or a directory of files.
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Texts per embeddings request while preparing vectors (before the timed phase).
    #[arg(long, default_value_t = 32)]
    pub embed_batch: usize,
    /// Characters per corpus chunk embedded as one vector.
    #[arg(long, default_value_t = 1000)]
    pub chunk_chars: usize,
    /// Use at most this many corpus chunks (0: all).
    #[arg(long, default_value_t = 0)]
    pub max_chunks: usize,
    /// Also send embedding requests at this fixed rate (batches/s) during the run: a
    /// background load of known size.
    #[arg(long)]
    pub embed_live: Option<f64>,
    /// The pipeline's first stage live beside ingestion, closed loop: this many embedding
    /// calls in flight (each --embed-batch corpus chunks), the next sent as soon as one is
    /// answered, so the embedder gets all the host leaves it (the study's maximum-throughput
    /// mode). Its embeddings/s and latency are recorded, and its CPU with
    /// --watch-pid embedder=PID.
    #[arg(long, conflicts_with = "embed_live")]
    pub embed_concurrency: Option<usize>,
    /// An embeddings call not answered by then has failed (a stalled server): while
    /// preparing vectors the run stops with that error and caches nothing.
    #[arg(long, default_value = "120s")]
    #[serde(serialize_with = "serialize_duration")]
    pub embed_timeout: humantime::Duration,

    /// new | reuse | per-n=N: a new TLS connection per request, keep-alive, or a new one
    /// every N requests.
    #[arg(long, default_value = "reuse")]
    #[serde(serialize_with = "serialize_display")]
    pub connection_policy: ConnectionPolicy,
    /// TLS session resumption on the client (off: a full handshake per new connection).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub resumption: OnOff,
    /// Offer only this TLS version, 1.2 or 1.3 (default: 1.3 and 1.2).
    #[arg(long)]
    pub tls_version: Option<TlsVersion>,
    /// The client's own crypto provider: ring, aws-lc-rs or openssl.
    #[arg(long, default_value = "aws-lc-rs")]
    pub client_provider: ProviderName,
    /// Key-exchange groups the client offers, in order (comma-separated): x25519,
    /// secp256r1, secp384r1, x25519mlkem768.
    #[arg(long, value_delimiter = ',', num_args = 1.., default_value = "x25519")]
    #[serde(serialize_with = "serialize_joined")]
    pub kx: Vec<KxGroupName>,
    /// CA bundle that verifies the target (default: the system bundle).
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// Do not verify the target's certificate (recorded in the result).
    #[arg(long)]
    pub insecure: bool,
    /// TLS server name (default: the target host).
    #[arg(long)]
    pub server_name: Option<String>,
    /// TCP congestion control of every connection to the target (Linux, e.g. cubic, bbr),
    /// or `host` for the host's default (the default). `loadgen compare` sets cubic for the
    /// proxies it starts on this machine: on loopback a pacing client's timer would run on
    /// the proxy's CPU (see `loadgen bench --client-congestion-control`).
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub congestion_control: Option<String>,
    /// The database's API key, sent as an `api-key` header (gRPC metadata) on every
    /// request, as Qdrant's clients do. Recorded in the result only as "(set)".
    #[arg(long, env = "LOADGEN_API_KEY", hide_env_values = true)]
    #[serde(serialize_with = "redact_secret")]
    pub api_key: Option<String>,
    /// The API key read from this file (trailing whitespace trimmed): a mounted Secret,
    /// a systemd credential, compose's generated key. The path is recorded, the key not.
    #[arg(long, env = "LOADGEN_API_KEY_FILE", conflicts_with = "api_key")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_file: Option<PathBuf>,
    /// A further header on every request (gRPC metadata too), `name: value`, repeatable,
    /// e.g. `--header 'authorization: Bearer <jwt>'`. Recorded by name only.
    #[arg(long = "header", value_name = "NAME: VALUE")]
    #[serde(serialize_with = "header_names_only")]
    pub headers: Vec<String>,

    /// Closed loop: workers, each with one request in flight.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// gRPC with --connection-policy reuse: the --concurrency workers share this many HTTP/2
    /// connections, one stream per request (as a gRPC channel multiplexes). Default: one
    /// connection per worker.
    #[arg(long)]
    pub connections: Option<usize>,
    /// Open loop: requests per second on a fixed schedule. Without it: closed loop.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Measured phase length (default 10s unless --requests is given).
    #[arg(long)]
    #[serde(serialize_with = "serialize_opt_duration")]
    pub duration: Option<humantime::Duration>,
    /// Measured requests.
    #[arg(long)]
    pub requests: Option<u64>,
    /// Unmeasured load before the measured phase (connections, caches, the upstream).
    #[arg(long, default_value = "2s")]
    #[serde(serialize_with = "serialize_duration")]
    pub warmup: humantime::Duration,
    /// Start the load (its warm-up) at this wall-clock time, RFC 3339 (e.g.
    /// 2026-12-01T10:00:00Z): several loadgen processes, on one host or many, then measure
    /// the same window, and `loadgen merge` makes one result of theirs.
    #[arg(long, value_parser = humantime::parse_rfc3339_weak)]
    #[serde(serialize_with = "serialize_time")]
    pub start_at: Option<std::time::SystemTime>,
    /// A request without a complete answer by then counts as a timeout error.
    #[arg(long, default_value = "30s")]
    #[serde(serialize_with = "serialize_duration")]
    pub request_timeout: humantime::Duration,

    /// Write the JSON result here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Attribute processes' CPU: PID, NAME=PID or NAME=PID,PID,... (repeatable). The name
    /// `proxy` marks the TLS terminator (its CPU per request is reported).
    #[arg(long)]
    pub watch_pid: Vec<String>,
    /// Attribute the CPU of every process with this command name (repeatable).
    #[arg(long)]
    pub watch_process: Vec<String>,
    /// Give the watched proxy (`--watch-pid proxy=PID` or `--watch-process proxy`) this CPU
    /// budget, in cores, for the run: a cgroup quota on it alone (cgroup v2 cpu.max or v1
    /// cpu.cfs_quota_us), read back and recorded, lifted at the end (the process goes back
    /// to its own cgroup). Needs a writable cgroup tree (root). `loadgen compare` sets its
    /// own proxies' budget.
    #[arg(long)]
    pub proxy_cpu_budget: Option<crate::budget::BudgetChoice>,
    /// Where energy is read.
    #[arg(long, value_enum, default_value_t = PowerChoice::Auto)]
    pub power: PowerChoice,
    /// Root of the powercap sysfs tree read for RAPL energy counters.
    #[arg(long, default_value = probe::rapl::POWERCAP_ROOT)]
    pub rapl_root: PathBuf,
    /// Redfish Power resource, e.g. https://idrac/redfish/v1/Chassis/System.Embedded.1/Power.
    #[arg(long)]
    pub redfish: Option<String>,
    /// BMC user for --redfish.
    #[arg(long, env = "LOADGEN_REDFISH_USER")]
    pub redfish_user: Option<String>,
    /// BMC password for --redfish (better in the environment; never written to the result).
    #[arg(long, env = "LOADGEN_REDFISH_PASSWORD", hide_env_values = true)]
    #[serde(skip)]
    pub redfish_password: Option<String>,
    /// CA (PEM) that signed the BMC's certificate.
    #[arg(long)]
    pub redfish_ca: Option<PathBuf>,
    /// Accept any BMC certificate (BMCs often ship self-signed ones); the result says so.
    #[arg(long)]
    pub redfish_insecure: bool,
    /// A Prometheus server that scrapes the machine's power, e.g. http://prometheus:9090;
    /// sampled through the run with --prometheus-query.
    #[arg(long)]
    pub prometheus: Option<String>,
    /// PromQL instant query whose value is the power in watts (a vector is summed), e.g.
    /// 'ipmi_dcmi_power_consumption_watts{instance="db1:9290"}'.
    #[arg(long)]
    pub prometheus_query: Option<String>,
    /// CA for an https:// Prometheus server (default: the system's roots).
    #[arg(long)]
    pub prometheus_ca: Option<PathBuf>,
    /// Basic-auth user for the Prometheus server (password in LOADGEN_PROMETHEUS_PASSWORD).
    #[arg(long, env = "LOADGEN_PROMETHEUS_USER")]
    pub prometheus_user: Option<String>,
    /// Password for --prometheus-user (better in the environment; never written to the
    /// result).
    #[arg(long, env = "LOADGEN_PROMETHEUS_PASSWORD", hide_env_values = true)]
    #[serde(skip)]
    pub prometheus_password: Option<String>,
    /// A file holding a bearer token for the Prometheus server (Grafana Cloud, Mimir, Thanos
    /// behind an auth proxy).
    #[arg(long, conflicts_with = "prometheus_user")]
    pub prometheus_bearer_token_file: Option<PathBuf>,
    /// The proxy host's node_exporter as Prometheus labels it (`instance`, e.g.
    /// proxy-host:9100): its CPU over the measured window, asked through --prometheus at the
    /// end, becomes the system CPU figure (for a proxy on another host).
    #[arg(long, requires = "prometheus")]
    pub target_node_exporter: Option<String>,
    /// The proxy's Prometheus endpoint, scraped before and after, e.g. http://127.0.0.1:9090/metrics.
    #[arg(long)]
    pub proxy_metrics: Option<String>,
    /// Count the collection's points before and after and check the difference equals the
    /// acknowledged points.
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    pub verify_count: bool,
    /// Tokio worker threads for the load generator (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// No live progress line.
    #[arg(long)]
    pub quiet: bool,

    /// Comparison cell this run belongs to (set by `compare` and the peers script).
    #[arg(long, hide = true)]
    pub cell_provider: Option<CellProvider>,
    /// The cell's certificate algorithm (set with `--cell-provider`).
    #[arg(long, hide = true)]
    pub cell_algorithm: Option<String>,
    /// The cell's 1-based round.
    #[arg(long, hide = true, default_value_t = 1)]
    pub cell_repeat: u32,
}

/// A list as its comma-separated names, as the command line wrote it (and results record).
pub(crate) fn serialize_joined<T: std::fmt::Display, S: serde::Serializer>(
    v: &[T],
    s: S,
) -> Result<S::Ok, S::Error> {
    let names: Vec<String> = v.iter().map(ToString::to_string).collect();
    s.serialize_str(&names.join(","))
}

pub(crate) fn serialize_display<T: std::fmt::Display, S: serde::Serializer>(
    v: &T,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

fn serialize_time<S: serde::Serializer>(
    t: &Option<std::time::SystemTime>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.collect_str(&humantime::format_rfc3339_millis(*t)),
        None => s.serialize_none(),
    }
}

fn serialize_duration<S: serde::Serializer>(
    v: &humantime::Duration,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

pub(crate) fn serialize_opt_duration<S: serde::Serializer>(
    v: &Option<humantime::Duration>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(d) => s.collect_str(d),
        None => s.serialize_none(),
    }
}

impl RunConfig {
    /// The configuration of a run given by `args`, as its result records it.
    pub fn of(args: &RunArgs) -> serde_json::Result<Self> {
        serde_json::from_value(serde_json::to_value(args)?)
    }
}

impl RunArgs {
    /// The headers every request carries besides the protocol's own: `--header` values
    /// and the API key.
    pub fn request_headers(&self) -> Result<http::HeaderMap> {
        let mut map = http::HeaderMap::new();
        for h in &self.headers {
            let (name, value) = h
                .split_once(':')
                .ok_or_else(|| anyhow!("--header {h:?}: expected `name: value`"))?;
            let name = http::HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|e| anyhow!("--header {h:?}: bad name: {e}"))?;
            let mut value = http::HeaderValue::from_str(value.trim())
                .map_err(|e| anyhow!("--header {name}: bad value: {e}"))?;
            value.set_sensitive(true);
            map.append(name, value);
        }
        let from_file = match &self.api_key_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| anyhow!("--api-key-file {}: {e}", path.display()))?
                    .trim_end()
                    .to_owned(),
            ),
            None => None,
        };
        let flag = if from_file.is_some() {
            "--api-key-file"
        } else {
            "--api-key"
        };
        if let Some(key) = from_file.as_ref().or(self.api_key.as_ref()) {
            if key.is_empty() {
                bail!("{flag}: the key is empty");
            }
            let mut value = http::HeaderValue::from_str(key)
                .map_err(|e| anyhow!("{flag}: not a valid header value: {e}"))?;
            value.set_sensitive(true);
            map.insert("api-key", value);
        }
        Ok(map)
    }

    /// Every check that needs neither the network nor the target: run before anything is
    /// changed (the collection recreated, vectors embedded), and by `compare` for every
    /// cell's flags before the first cell starts.
    /// The congestion control to set on each connection: `None` for the host's default.
    pub fn congestion_control(&self) -> Option<&str> {
        self.congestion_control
            .as_deref()
            .filter(|name| *name != crate::client::HOST_CONGESTION_CONTROL)
    }

    /// What every use of the embeddings endpoint needs: its URL and the corpus.
    fn check_embeddings_flags(&self, what: &str) -> Result<()> {
        if self.embeddings_url.is_none() {
            bail!("{what} needs --embeddings-url URL");
        }
        if self.corpus.is_none() {
            bail!("{what} needs --corpus FILE|DIR");
        }
        if self.embed_batch == 0 {
            bail!("--embed-batch must be at least 1");
        }
        Ok(())
    }

    /// Checks what the flags cannot say alone, before anything starts.
    pub fn check(&self) -> Result<()> {
        self.request_headers()?;
        let target = Target::parse(&self.target)?;
        let protocol = self.protocol.unwrap_or_else(|| target.default_protocol());
        if self.kx.is_empty() {
            bail!("--kx: name at least one group");
        }
        if let Some(r) = self.rate {
            if !(r > 0.0 && r.is_finite()) {
                bail!("--rate {r}: must be above 0");
            }
        }
        if let Some(n) = self.connections {
            if protocol != Protocol::Grpc || self.connection_policy != ConnectionPolicy::Reuse {
                bail!("--connections shares HTTP/2 connections: it needs --protocol grpc and --connection-policy reuse");
            }
            if n == 0 {
                bail!("--connections must be at least 1");
            }
        }
        if self.requests == Some(0) {
            bail!("--requests must be at least 1");
        }
        if let Some(name) = &self.congestion_control {
            crate::client::congestion_control_choice(name)
                .map_err(|e| anyhow::anyhow!("--congestion-control {e}"))?;
        }
        if self.points_per_request == 0 {
            bail!("--points-per-request must be at least 1");
        }
        match self.vectors {
            VectorSource::File if self.vectors_file.is_none() => {
                bail!("--vectors file needs --vectors-file PATH")
            }
            VectorSource::Embeddings => self.check_embeddings_flags("--vectors embeddings")?,
            _ => {}
        }
        if let Some(rate) = self.embed_live {
            if !(rate.is_finite() && rate > 0.0) {
                bail!("--embed-live must be a rate above 0 calls per second");
            }
        }
        if self.embed_concurrency == Some(0) {
            bail!("--embed-concurrency must be at least 1");
        }
        if self.embed_live.is_some() {
            self.check_embeddings_flags("--embed-live")?;
        }
        if self.embed_concurrency.is_some() {
            self.check_embeddings_flags("--embed-concurrency")?;
        }
        if self.embed_timeout.is_zero() {
            bail!("--embed-timeout must be above 0");
        }
        match self.power {
            PowerChoice::Redfish if self.redfish.is_none() => {
                bail!("--power redfish needs --redfish URL")
            }
            PowerChoice::Prometheus
                if self.prometheus.is_none() || self.prometheus_query.is_none() =>
            {
                bail!("--power prometheus needs --prometheus URL and --prometheus-query PROMQL")
            }
            _ => {}
        }
        Ok(())
    }

    /// Worker threads the runtime should use.
    pub fn worker_threads(&self) -> usize {
        self.threads
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            })
            .max(1)
    }
}
