//! `loadgen run`: one measured run, from vectors to the JSON result and the summary.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{ArgAction, Args, ValueEnum};
use proxy::crypto::{KxGroupName, Provider, ProviderName};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::client::http::{trust_config, Options};
use crate::client::qdrant::Admin;
use crate::client::{Connector, Protocol, Target};
use crate::driver::{self, ConnectionPolicy, DriverConfig, Mode};
use crate::probe::{self, PowerSource, ProbeConfig, Watched, WattMeter};
use crate::result::*;
use crate::vectors::{self, EmbeddingsClient, EmbeddingsOptions, LiveEmbedder, VectorSet};
use crate::workload::{id_base_for_run, UpsertSpec, Workload};

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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PowerChoice {
    /// Redfish or Prometheus when their flags are given, else RAPL when readable, else none
    /// with the reason.
    Auto,
    Rapl,
    Redfish,
    Prometheus,
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
    /// Also send embedding requests at this rate (batches/s) during the measured phase.
    #[arg(long)]
    pub embed_live: Option<f64>,

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
    #[arg(long, default_value = "x25519")]
    pub kx: String,
    /// CA bundle that verifies the target (default: the system bundle).
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// Do not verify the target's certificate (recorded in the result).
    #[arg(long)]
    pub insecure: bool,
    /// TLS server name (default: the target host).
    #[arg(long)]
    pub server_name: Option<String>,
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
    #[arg(long, hide = true)]
    pub cell_algorithm: Option<String>,
    #[arg(long, hide = true, default_value_t = 1)]
    pub cell_repeat: u32,
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
    pub fn check(&self) -> Result<()> {
        self.request_headers()?;
        let target = Target::parse(&self.target)?;
        let protocol = self.protocol.unwrap_or_else(|| target.default_protocol());
        self.kx
            .parse::<KxGroupName>()
            .map_err(|e| anyhow!("--kx: {e}"))?;
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
        if self.points_per_request == 0 {
            bail!("--points-per-request must be at least 1");
        }
        match self.vectors {
            VectorSource::File if self.vectors_file.is_none() => {
                bail!("--vectors file needs --vectors-file PATH")
            }
            VectorSource::Embeddings => {
                embeddings_options(self)?;
            }
            _ => {}
        }
        if self.embed_live.is_some() {
            embeddings_options(self)?;
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

/// Vectors for the run, prepared before anything is timed.
async fn prepare_vectors(args: &RunArgs, needed: usize) -> Result<VectorSet> {
    match args.vectors {
        VectorSource::Synthetic => Ok(vectors::synthetic(needed, args.dim, args.seed)),
        VectorSource::File => {
            let path = args
                .vectors_file
                .as_ref()
                .ok_or_else(|| anyhow!("--vectors file needs --vectors-file PATH"))?;
            Ok(vectors::read_vectors_file(path)?.0)
        }
        VectorSource::Embeddings => {
            let (set, cached) =
                vectors::load_or_embed(&embeddings_options(args)?, embeddings_http(args)?).await?;
            if !args.quiet {
                eprintln!(
                    "vectors: {} x {}-d from {}{}",
                    set.len(),
                    set.dim,
                    set.source,
                    if cached { " (cached)" } else { "" }
                );
            }
            Ok(set)
        }
    }
}

fn embeddings_options(args: &RunArgs) -> Result<EmbeddingsOptions> {
    let url = args
        .embeddings_url
        .clone()
        .ok_or_else(|| anyhow!("--vectors embeddings needs --embeddings-url URL"))?;
    let corpus = args
        .corpus
        .clone()
        .ok_or_else(|| anyhow!("--vectors embeddings needs --corpus FILE|DIR"))?;
    Ok(EmbeddingsOptions {
        url,
        model: args.embeddings_model.clone(),
        corpus,
        batch: args.embed_batch,
        chunk_chars: args.chunk_chars,
        max_chunks: args.max_chunks,
        cache: args
            .vectors_file
            .clone()
            .unwrap_or_else(|| PathBuf::from("vectors-cache.bin")),
    })
}

fn embeddings_http(args: &RunArgs) -> Result<Options> {
    let https = args
        .embeddings_url
        .as_deref()
        .is_some_and(|u| u.starts_with("https://"));
    Ok(Options {
        tls: if https {
            Some(trust_config(None, false)?)
        } else {
            None
        },
        headers: Vec::new(),
        timeout: Some(Duration::from_secs(120)),
        ..Default::default()
    })
}

/// The Prometheus server of `--prometheus`, with its TLS trust and credentials.
fn prometheus_server(args: &RunArgs) -> Result<Option<Arc<probe::prometheus::Prometheus>>> {
    let Some(url) = &args.prometheus else {
        return Ok(None);
    };
    let tls = if url.starts_with("https://") {
        Some(trust_config(args.prometheus_ca.as_deref(), false)?)
    } else {
        None
    };
    let auth = match (&args.prometheus_user, &args.prometheus_bearer_token_file) {
        (Some(user), _) => Some(probe::prometheus::Auth::Basic {
            user: user.clone(),
            password: args.prometheus_password.clone().unwrap_or_default(),
        }),
        (None, Some(file)) => Some(probe::prometheus::Auth::Bearer(
            std::fs::read_to_string(file)
                .with_context(|| format!("--prometheus-bearer-token-file {}", file.display()))?
                .trim()
                .to_owned(),
        )),
        (None, None) => None,
    };
    Ok(Some(Arc::new(probe::prometheus::Prometheus::new(
        url, tls, auth,
    ))))
}

fn power_source(args: &RunArgs) -> Result<PowerSource> {
    let redfish = || -> Result<PowerSource> {
        let url = args
            .redfish
            .as_deref()
            .ok_or_else(|| anyhow!("--power redfish needs --redfish URL"))?;
        let tls = if url.starts_with("https://") {
            Some(trust_config(
                args.redfish_ca.as_deref(),
                args.redfish_insecure,
            )?)
        } else {
            None
        };
        Ok(PowerSource::Meter(Arc::new(WattMeter::Redfish(
            probe::redfish::Redfish::new(
                url,
                args.redfish_user.as_deref(),
                args.redfish_password.as_deref(),
                tls,
            ),
        ))))
    };
    let prometheus = || -> Result<PowerSource> {
        let (Some(server), Some(query)) = (prometheus_server(args)?, &args.prometheus_query) else {
            bail!("--power prometheus needs --prometheus URL and --prometheus-query PROMQL");
        };
        Ok(PowerSource::Meter(Arc::new(WattMeter::Prometheus(
            probe::prometheus::PrometheusPower::new(server, query),
        ))))
    };
    Ok(match args.power {
        PowerChoice::None => PowerSource::None("power measurement off (--power none)".to_owned()),
        PowerChoice::Rapl => PowerSource::Rapl(args.rapl_root.clone()),
        PowerChoice::Redfish => redfish()?,
        PowerChoice::Prometheus => prometheus()?,
        PowerChoice::Auto if args.redfish.is_some() => redfish()?,
        PowerChoice::Auto if args.prometheus.is_some() || args.prometheus_query.is_some() => {
            prometheus()?
        }
        PowerChoice::Auto => match probe::rapl::Rapl::open(&args.rapl_root) {
            Ok(_) => PowerSource::Rapl(args.rapl_root.clone()),
            Err(reason) => PowerSource::None(reason),
        },
    })
}

fn watched(args: &RunArgs, proc_root: &std::path::Path) -> Result<Vec<Watched>> {
    let mut out = Vec::new();
    for spec in &args.watch_pid {
        let (name, pids) = match spec.split_once('=') {
            Some((n, p)) => (n.to_owned(), p),
            None => (format!("pid {spec}"), spec.as_str()),
        };
        let pids = pids
            .split(',')
            .map(|p| p.trim().parse::<u32>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| {
                anyhow!("--watch-pid {spec:?}: expected PID, NAME=PID or NAME=PID,PID,...")
            })?;
        out.push(Watched { name, pids });
    }
    for name in &args.watch_process {
        let pids = probe::cpu::find_processes(proc_root, name);
        if pids.is_empty() {
            bail!("--watch-process {name}: no running process has that name");
        }
        out.push(Watched {
            name: name.clone(),
            pids,
        });
    }
    Ok(out)
}

/// A run, decided before anything is changed: every flag checked (`RunArgs::check`) and
/// turned into what the run uses, typed (the target, protocol, client TLS configuration,
/// request headers, the driver's settings, the processes to watch, the power source).
/// Building it touches neither the target nor the collection.
pub struct RunPlan {
    /// Where the load goes.
    pub target: Target,
    /// REST or gRPC.
    pub protocol: Protocol,
    /// The client's provider and its library, for the record.
    pub client_provider: ProviderName,
    client_library: String,
    /// The client's TLS configuration (none: a plaintext baseline).
    tls: Option<Arc<rustls::ClientConfig>>,
    /// `--header` values and the API key.
    headers: http::HeaderMap,
    /// The measured phase: loop, concurrency, connection policy, duration or count.
    pub driver: DriverConfig,
    /// Processes whose CPU is measured.
    watched: Vec<Watched>,
    /// Where watts come from, or why they do not.
    power: PowerSource,
    /// The target host's CPU through Prometheus and node_exporter.
    target_host: Option<(Arc<probe::prometheus::Prometheus>, String)>,
    /// /proc, where this host's CPU is read.
    proc_root: PathBuf,
}

impl RunPlan {
    /// Checks `args` and decides everything that can be decided without the network.
    pub fn new(args: &RunArgs) -> Result<Self> {
        args.check()?;
        let target = Target::parse(&args.target)?;
        let protocol = args.protocol.unwrap_or_else(|| target.default_protocol());
        let client_provider = args.client_provider;
        let kx: KxGroupName = args.kx.parse().map_err(|e| anyhow!("--kx: {e}"))?;
        let client_library = Provider::new(client_provider, &[kx])
            .context("--client-provider")?
            .library_version();
        let tls = if target.tls {
            Some(
                proxy::tls::client::ClientTls {
                    provider: client_provider,
                    kx_groups: vec![kx],
                    versions: args.tls_version.into_iter().collect(),
                    trust: crate::client::tls::trust(
                        client_provider,
                        args.ca.as_deref(),
                        args.insecure,
                    )?,
                    resumption: args.resumption == OnOff::On,
                    alpn: vec![match protocol {
                        Protocol::Rest => b"http/1.1".to_vec(),
                        Protocol::Grpc => b"h2".to_vec(),
                    }],
                    ..Default::default()
                }
                .build()?,
            )
        } else {
            None
        };
        let proc_root = PathBuf::from("/proc");
        let driver = DriverConfig {
            mode: match args.rate {
                Some(r) => Mode::Open(r),
                None => Mode::Closed,
            },
            concurrency: args.concurrency.max(1),
            policy: args.connection_policy,
            duration: match (args.duration, args.requests) {
                (Some(d), _) => Some(Duration::from(d)),
                (None, Some(_)) => None,
                (None, None) => Some(Duration::from_secs(10)),
            },
            requests: args.requests,
            warmup: args.warmup.into(),
            request_timeout: args.request_timeout.into(),
            shared_connections: args.connections,
            progress: !args.quiet,
        };
        Ok(Self {
            watched: watched(args, &proc_root)?,
            power: power_source(args)?,
            target_host: match (&args.target_node_exporter, prometheus_server(args)?) {
                (Some(instance), Some(server)) => Some((server, instance.clone())),
                _ => None,
            },
            headers: args.request_headers()?,
            target,
            protocol,
            client_provider,
            client_library,
            tls,
            driver,
            proc_root,
        })
    }
}

/// What is ready before the clock starts: vectors encoded into request bodies, the
/// connector, the collection, and the point count to verify against.
struct Prepared {
    vectors: VectorSet,
    connector: Arc<Connector>,
    workload: Arc<Workload>,
    count_before: Option<Result<u64>>,
}

/// Everything that can be prepared is, outside any timing: vectors (embedded if asked),
/// bodies, the control connection (which also proves the target speaks TLS), the
/// collection (recreated if asked) and its count before the run.
async fn prepare(args: &RunArgs, plan: &RunPlan) -> Result<Prepared> {
    let vectors = prepare_vectors(args, 8 * args.points_per_request).await?;
    let mut connector = Connector::new(
        plan.target.clone(),
        plan.protocol,
        plan.tls.clone(),
        args.server_name.as_deref(),
    )
    .await
    .with_context(|| format!("--target {}", args.target))?;
    connector.extra_headers = plan.headers.clone();
    let connector = Arc::new(connector);
    // Picks this run's id range. Random, not the clock: processes started side by side
    // (--start-at, an indexed Job) prepare in the same millisecond, and equal ranges would
    // overwrite each other's points. (RandomState is seeded randomly per process.)
    let nonce = {
        use std::hash::BuildHasher;
        std::collections::hash_map::RandomState::new().hash_one((
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        ))
    };
    let spec = UpsertSpec {
        protocol: plan.protocol,
        collection: args.collection.clone(),
        points_per_request: args.points_per_request,
        wait: args.wait,
        json_decimals: args.json_decimals,
    };
    let mut workload = Workload::build(
        spec,
        &vectors,
        id_base_for_run(nonce),
        if plan.target.tls { "https" } else { "http" },
        connector.authority().as_str(),
    )?;
    workload.extra_headers = plan.headers.clone();
    let mut admin = Admin::connect(&connector).await.with_context(|| {
        format!(
            "cannot reach {} over {}",
            plan.target,
            plan.protocol.as_str()
        )
    })?;
    admin
        .ensure_collection(&args.collection, vectors.dim, args.recreate)
        .await
        .with_context(|| format!("preparing collection {:?}", args.collection))?;
    let count_before = if args.verify_count {
        Some(admin.count(&args.collection).await)
    } else {
        None
    };
    Ok(Prepared {
        vectors,
        connector,
        workload: Arc::new(workload),
        count_before,
    })
}

/// Waits for `--start-at`, the barrier of processes started side by side.
async fn wait_for_start(at: Option<std::time::SystemTime>, stop: &CancellationToken) -> Result<()> {
    let Some(at) = at else {
        return Ok(());
    };
    match at.duration_since(std::time::SystemTime::now()) {
        Ok(wait) => {
            tokio::select! {
                _ = tokio::time::sleep(wait) => Ok(()),
                _ = stop.cancelled() => bail!("interrupted while waiting for --start-at"),
            }
        }
        Err(late) => bail!(
            "--start-at is {:.1} s in the past once the run was prepared: give a later time",
            late.duration().as_secs_f64()
        ),
    }
}

/// Runs the whole thing: plan, set-up, warm-up, measured phase, read-out.
pub async fn execute(args: &RunArgs, stop: CancellationToken) -> Result<RunResult> {
    let plan = RunPlan::new(args)?;
    let prepared = prepare(args, &plan).await?;
    // Everything is prepared; the barrier is the last thing before the load.
    wait_for_start(args.start_at, &stop).await?;
    let started_at = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    // The measured phase starts when the warm-up ends, on the wall clock too.
    let measured_from = (std::time::SystemTime::now() + plan.driver.warmup)
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let (outcome, finished, embed_live) = measure(args, &plan, &prepared, &stop).await?;
    let verification = match &prepared.count_before {
        None => Measured::missing("--verify-count false"),
        Some(Err(e)) => Measured::missing(format!("counting before the run: {e:#}")),
        Some(Ok(before)) => {
            verify(
                &prepared.connector,
                &args.collection,
                *before,
                outcome.points_acknowledged,
                args.wait,
            )
            .await
        }
    };
    let result = read_out(
        args,
        &plan,
        &prepared,
        Measurements {
            started_at,
            measured_from,
            outcome,
            finished,
            embed_live,
            verification,
        },
    )?;
    if let Some(path) = &args.out {
        write_json(path, &result)?;
    }
    Ok(result)
}

/// The warm-up and the measured phase, with the probes around the measured phase and the
/// live embedding load beside it.
async fn measure(
    args: &RunArgs,
    plan: &RunPlan,
    prepared: &Prepared,
    stop: &CancellationToken,
) -> Result<(driver::Outcome, probe::Finished, Option<EmbedLiveRecord>)> {
    let proxy_metrics = args.proxy_metrics.clone().map(|url| {
        (
            url,
            Options {
                timeout: Some(Duration::from_secs(5)),
                ..Default::default()
            },
        )
    });
    let live = match args.embed_live {
        Some(rate) => {
            let opts = embeddings_options(args)?;
            let texts = vectors::chunk_corpus(&opts.corpus, opts.chunk_chars)?;
            let client = EmbeddingsClient::new(&opts.url, &opts.model, embeddings_http(args)?);
            Some((rate, LiveEmbedder::start(client, texts, opts.batch, rate)))
        }
        None => None,
    };

    // Warm-up runs inside the driver; probes start when the measured phase does. Without a
    // warm-up they start before the first request, so the proxy's counters match exactly.
    let warmup = plan.driver.warmup;
    let probe_config = ProbeConfig {
        proc_root: plan.proc_root.clone(),
        target_host: plan.target_host.clone(),
        power: plan.power.clone(),
        watched: plan.watched.clone(),
        proxy_metrics,
        sample_interval: Duration::from_secs(1),
    };
    let (probes, outcome) = if warmup.is_zero() {
        let probes = probe_config.start().await;
        let outcome = driver::run(
            prepared.workload.clone(),
            prepared.connector.clone(),
            plan.driver.clone(),
            stop.clone(),
        )
        .await;
        (probes, outcome)
    } else {
        let driver_task = tokio::spawn(driver::run(
            prepared.workload.clone(),
            prepared.connector.clone(),
            plan.driver.clone(),
            stop.clone(),
        ));
        tokio::select! {
            _ = tokio::time::sleep(warmup) => {}
            _ = stop.cancelled() => {}
        }
        let probes = probe_config.start().await;
        (probes, driver_task.await.context("driver task")?)
    };
    let finished = probes.finish(outcome.ok).await;
    let embed_live = match live {
        Some((rate, l)) => {
            let (ok, failed) = l.stop().await;
            Some(EmbedLiveRecord {
                rate_per_s: rate,
                ok,
                failed,
            })
        }
        None => None,
    };
    Ok((outcome, finished, embed_live))
}

/// What the measured phase produced, for [`read_out`].
struct Measurements {
    started_at: String,
    measured_from: f64,
    outcome: driver::Outcome,
    finished: probe::Finished,
    embed_live: Option<EmbedLiveRecord>,
    verification: Measured<Verification>,
}

/// The result: figures derived from the measurements, warnings about what may have bounded
/// the run, and the configuration and environment it ran in.
fn read_out(
    args: &RunArgs,
    plan: &RunPlan,
    prepared: &Prepared,
    m: Measurements,
) -> Result<RunResult> {
    let (target, protocol, mode) = (&plan.target, plan.protocol, plan.driver.mode);
    let (vectors, workload) = (&prepared.vectors, &prepared.workload);
    let proc_root = &plan.proc_root;
    let secs = m.outcome.elapsed.as_secs_f64();
    let rate = |n: f64| if secs > 0.0 { n / secs } else { 0.0 };
    let failed: u64 = m.outcome.failures.values().sum();
    let mut warnings = m.finished.warnings;
    let threads = args.worker_threads();
    if m.finished.cpu.loadgen.percent_of_core > 80.0 * threads as f64 {
        warnings.push(format!(
            "loadgen used {:.0}% of a core with {threads} worker thread(s): the load generator, not the target, may be the bottleneck",
            m.finished.cpu.loadgen.percent_of_core
        ));
    }
    if let Some(lag) = m.outcome.schedule_lag_us.as_ref().filter(|h| !h.is_empty()) {
        let p99_ms = lag.value_at_quantile(0.99) as f64 / 1000.0;
        if let Mode::Open(r) = mode {
            if p99_ms > 1000.0 / r + 10.0 {
                warnings.push(format!(
                    "the target could not keep up with {r} requests/s: p99 send lag {p99_ms:.1} ms behind the schedule (latencies include that queueing)"
                ));
            }
        }
    }
    if failed > 0 {
        warnings.push(format!("{failed} requests failed; see failures"));
    }
    if let Some(v) = m.verification.as_ref().filter(|v| !v.matches) {
        warnings.push(format!(
            "collection grew by {} points but {} were acknowledged",
            v.count_after as i64 - v.count_before as i64,
            v.points_acknowledged
        ));
    }
    if m.outcome.interrupted {
        warnings.push("interrupted: the figures cover the time until the stop".to_owned());
    }
    let result = RunResult {
        schema: SCHEMA.to_owned(),
        cell: args.cell_provider.as_ref().map(|p| Cell {
            provider: p.clone(),
            algorithm: args.cell_algorithm.clone().unwrap_or_default(),
            repeat: args.cell_repeat,
        }),
        started_at: m.started_at,
        target: target.to_string(),
        config: RunConfig::of(args)?,
        environment: {
            let (cpu_model, cores, kernel) = probe::cpu::machine_facts(proc_root);
            Environment {
                host: probe::cpu::host_name(proc_root),
                cpu_model,
                cores,
                kernel,
                loadgen_version: env!("CARGO_PKG_VERSION").to_owned(),
                client_provider: plan.client_provider.to_string(),
                client_library: plan.client_library.clone(),
                proxy_listeners: m.finished.proxy_listeners,
            }
        },
        workload: WorkloadRecord {
            protocol: protocol.as_str().to_owned(),
            collection: args.collection.clone(),
            points_per_request: args.points_per_request,
            dim: vectors.dim,
            wait: args.wait,
            vectors_source: vectors.source.clone(),
            request_body_bytes: workload.body_bytes(),
            request_body_bytes_min: workload.body_bytes_range().0,
            request_body_bytes_max: workload.body_bytes_range().1,
            json_decimals: args.json_decimals,
        },
        tls_verification: target.tls && !args.insecure,
        measured_seconds: secs,
        requests_ok: m.outcome.ok,
        requests_failed: failed,
        failures: m
            .outcome
            .failures
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
        failure_examples: m
            .outcome
            .failure_examples
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        warmup_requests: m.outcome.warmup_ok + m.outcome.warmup_failed,
        requests_per_second: rate(m.outcome.ok as f64),
        points_per_second: rate((m.outcome.ok * args.points_per_request as u64) as f64),
        payload_mb_per_second: rate(m.outcome.ok_body_bytes as f64) / 1e6,
        latency_ms: Percentiles::from_us(&m.outcome.latency_us),
        handshakes: HandshakeRecord {
            count: m.outcome.handshakes,
            resumed: m.outcome.resumed_handshakes,
            latency_ms: Percentiles::from_us(&m.outcome.handshake_us),
        },
        schedule_lag_ms: m
            .outcome
            .schedule_lag_us
            .as_ref()
            .and_then(Percentiles::from_us),
        cpu: m.finished.cpu,
        power: m.finished.power,
        proxy_metrics: m.finished.proxy,
        verification: m.verification,
        embed_live: m.embed_live,
        warnings,
        interrupted: m.outcome.interrupted,
        window: Some(MeasuredWindow {
            from_unix_s: m.measured_from,
            until_unix_s: m.measured_from + secs,
        }),
        histograms: Some(Histograms::encode(
            &m.outcome.latency_us,
            &m.outcome.handshake_us,
        )),
        payload_bytes: Some(m.outcome.ok_body_bytes),
        merged_from: Vec::new(),
    };
    Ok(result)
}

async fn verify(
    connector: &Connector,
    collection: &str,
    before: u64,
    acknowledged: u64,
    wait: bool,
) -> Measured<Verification> {
    let mut admin = match Admin::connect(connector).await {
        Ok(a) => a,
        Err(e) => return Measured::missing(format!("counting after the run: {e:#}")),
    };
    // With wait=false the last writes may still be applying; give them a few seconds.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(if wait { 0 } else { 10 });
    loop {
        match admin.count(collection).await {
            Ok(after) => {
                let matches = after.checked_sub(before) == Some(acknowledged);
                if matches || tokio::time::Instant::now() >= deadline {
                    return Measured::ok(Verification {
                        count_before: before,
                        count_after: after,
                        points_acknowledged: acknowledged,
                        matches,
                    });
                }
            }
            Err(e) => return Measured::missing(format!("counting after the run: {e:#}")),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub fn write_json<T: Serialize>(path: &std::path::Path, value: &T) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = path.with_extension("json.partial");
    std::fs::write(&tmp, serde_json::to_vec_pretty(value)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
