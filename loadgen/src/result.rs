//! The run result: the JSON file every report is rendered from. Field names carry their
//! units. A figure that could not be measured is `{"value": null, "reason": "..."}` and
//! nothing is derived from it.

use std::collections::BTreeMap;

use clap::ValueEnum;
use hdrhistogram::Histogram;
use proxy::crypto::ProviderName;
use serde::{Deserialize, Serialize};

/// The value of a congestion-control flag (and of a result's `congestion_control`) that
/// keeps the host's default.
pub const HOST_CONGESTION_CONTROL: &str = "host";

/// The schema of run result files: `schema` of every [`RunResult`].
pub const SCHEMA: &str = "loadgen.run/v1";

/// A figure, or why it is missing.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Measured<T> {
    /// The figure; `None` when it could not be measured.
    pub value: Option<T>,
    /// Why it is missing (absent when it was measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl<T> Measured<T> {
    /// A measured figure.
    pub fn ok(value: T) -> Self {
        Self {
            value: Some(value),
            reason: None,
        }
    }

    /// A figure that could not be measured, and why.
    pub fn missing(reason: impl Into<String>) -> Self {
        Self {
            value: None,
            reason: Some(reason.into()),
        }
    }

    /// The figure, if measured.
    pub fn as_ref(&self) -> Option<&T> {
        self.value.as_ref()
    }
}

impl<T, E: std::fmt::Display> From<Result<T, E>> for Measured<T> {
    fn from(r: Result<T, E>) -> Self {
        match r {
            Ok(v) => Self::ok(v),
            Err(e) => Self::missing(e.to_string()),
        }
    }
}

/// Latency percentiles in milliseconds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    /// Samples.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
}

impl Percentiles {
    /// From a histogram of microseconds; None when it is empty.
    pub fn from_us(h: &Histogram<u64>) -> Option<Self> {
        if h.is_empty() {
            return None;
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Some(Self {
            count: h.len(),
            mean: h.mean() / 1000.0,
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
        })
    }
}

/// Which cell of a comparison this run is.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cell {
    /// Who terminated TLS: the proxy with one of its providers, or a peer.
    pub provider: CellProvider,
    /// The server certificate's algorithm (`rsa2048`, `ecdsa-p256`, ...).
    pub algorithm: String,
    /// 1-based repeat round.
    pub repeat: u32,
}

/// Where and with what the run was made.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Environment {
    /// The load generator's host name (merged results sum CPU per host).
    #[serde(default)]
    pub host: String,
    /// The load generator's CPU model, from /proc/cpuinfo.
    pub cpu_model: String,
    /// Its logical CPUs.
    pub cores: usize,
    /// Its kernel release.
    pub kernel: String,
    /// This load generator's version.
    pub loadgen_version: String,
    /// The client's crypto provider (ring, aws-lc-rs, openssl).
    pub client_provider: String,
    /// That provider's library and version, as it reports them.
    pub client_library: String,
    /// What the proxy's /metrics said about its listeners, when scraped.
    #[serde(default)]
    pub proxy_listeners: Vec<BTreeMap<String, String>>,
}

/// What every request carried.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkloadRecord {
    /// `rest` (JSON over HTTP) or `grpc`.
    pub protocol: String,
    /// The Qdrant collection written to.
    pub collection: String,
    /// Points per upsert (100 for UPSERT_100).
    pub points_per_request: usize,
    /// Vector dimensions.
    pub dim: usize,
    /// Whether each upsert waited for Qdrant to apply it (`wait=true`).
    pub wait: bool,
    /// Where the vectors came from (synthetic, an embeddings endpoint, a file).
    pub vectors_source: String,
    /// Mean request body size in bytes (the templates differ by a few bytes in JSON).
    pub request_body_bytes: u64,
    /// The smallest request body of the run, exactly.
    #[serde(default)]
    pub request_body_bytes_min: u64,
    /// The largest request body of the run, exactly.
    #[serde(default)]
    pub request_body_bytes_max: u64,
    /// Decimals each vector component is written with in JSON.
    pub json_decimals: usize,
}

/// The CPU time of one process (or several of one name) over the measured phase.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProcessCpu {
    /// Its name (`loadgen`, or as `--watch-pid NAME=PID` gave it).
    pub name: String,
    /// Its process ids.
    pub pids: Vec<u32>,
    /// User plus system CPU seconds.
    pub cpu_seconds: f64,
    /// Per acknowledged request; `None` when none was.
    pub cpu_seconds_per_request: Option<f64>,
    /// Percent of one core over the measured phase.
    pub percent_of_core: f64,
    /// CPUs the (first) process may run on, as /proc/PID/status lists them (pinning check).
    #[serde(default)]
    pub cpus_allowed: Option<String>,
    /// The CPU quota of the (first) process's cgroup, read back from its files at the end of
    /// the measured phase: a budget (`compare --proxy-cpu-budget`, systemd's `CPUQuota=`,
    /// `docker --cpus`); `None` where it had none.
    #[serde(default)]
    pub cpu_quota: Option<crate::budget::CpuQuota>,
}

/// CPU over the measured phase: the hosts' and the processes'.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CpuRecord {
    /// All cores together, 0..=100, of the host loadgen runs on.
    pub system_utilisation_percent: Measured<f64>,
    /// All cores of the target's host, 0..=100, from its node_exporter through Prometheus
    /// (`--target-node-exporter`): the system figure when the proxy runs on another host.
    #[serde(default = "target_host_not_asked")]
    pub target_host_utilisation_percent: Measured<f64>,
    /// This load generator.
    pub loadgen: ProcessCpu,
    /// The processes watched (`--watch-pid`: the proxy, the upstream).
    pub watched: Vec<ProcessCpu>,
}

/// The estimate of results written before there was one.
pub fn not_estimated() -> Measured<crate::power_estimate::PowerEstimate> {
    Measured::missing("not estimated by this version of loadgen")
}

/// The target host's utilisation where none was asked for (also the default of older results).
pub fn target_host_not_asked() -> Measured<f64> {
    Measured::missing("no --target-node-exporter given")
}

/// Energy over the measured phase.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PowerRecord {
    /// "rapl", "redfish" or "prometheus".
    pub source: String,
    /// Energy used.
    pub joules: f64,
    /// Mean power.
    pub mean_watts: f64,
    /// Readings it was computed from.
    pub samples: u64,
    /// What was read (RAPL domains, the Redfish resource, the Prometheus query).
    #[serde(default)]
    pub detail: String,
}

/// What the proxy's own /metrics counted over the measured phase.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProxyMetricsDelta {
    /// Completed TLS handshakes.
    pub handshakes: f64,
    /// Of which resumed.
    pub resumed_handshakes: f64,
    /// Failed TLS handshakes.
    pub handshake_failures: f64,
    /// Requests served.
    pub requests: f64,
    /// The proxy's CPU seconds (`process_cpu_seconds_total`).
    pub cpu_seconds: Option<f64>,
    /// Per request it served.
    pub cpu_seconds_per_request: Option<f64>,
    /// Per handshake it completed.
    pub cpu_seconds_per_handshake: Option<f64>,
    /// openssl-qat: signatures the QAT provider took asynchronously during the run.
    #[serde(default)]
    pub qat_signatures_offloaded: Option<f64>,
    /// openssl-qat: the other signatures (in software at low load, inline, failed).
    #[serde(default)]
    pub qat_signatures_not_offloaded: Option<f64>,
    /// openssl-qat: part batches submitted to the provider as they were during the run.
    #[serde(default)]
    pub qat_part_batches: Option<f64>,
    /// openssl-qat: what computed the provider's work: `qat_sw` (QAT_Engine's software
    /// mode) or `qat_hw` (a QuickAssist device).
    #[serde(default)]
    pub qat_mode: Option<String>,
    /// openssl-qat: the batch the provider was fed (8 for qat_sw, 1 for a device).
    #[serde(default)]
    pub qat_batch: Option<u32>,
}

/// The client's TLS handshakes over the measured phase.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HandshakeRecord {
    /// Handshakes.
    pub count: u64,
    /// Of which resumed.
    pub resumed: u64,
    /// TCP connect + TLS handshake, client side.
    pub latency_ms: Option<Percentiles>,
}

/// The collection counted before and after: did every acknowledged point arrive?
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Verification {
    /// Points before the measured phase.
    pub count_before: u64,
    /// Points after it.
    pub count_after: u64,
    /// Points in the upserts the server acknowledged.
    pub points_acknowledged: u64,
    /// count_after - count_before == points_acknowledged.
    pub matches: bool,
}

/// The co-located embedding load of the run (`--embed-live`, `--embed-concurrency`): what
/// the pipeline's first stage achieved on the same host during the measured phase. Its
/// CPU is the watched process named `embedder`, when one was given.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct EmbedLiveRecord {
    /// `rate` (a fixed rate of calls) or `closed-loop` (a fixed number in flight).
    pub mode: String,
    /// Calls per second asked for, in `rate` mode.
    pub rate_per_s: Option<f64>,
    /// Calls in flight, in `closed-loop` mode.
    pub concurrency: Option<usize>,
    /// Texts per call.
    pub batch: usize,
    /// Calls answered within the measured phase.
    pub ok: u64,
    /// Calls failed within the measured phase.
    pub failed: u64,
    /// Texts embedded by the answered calls.
    pub embeddings: u64,
    /// Seconds counted (the measured phase).
    pub seconds: f64,
    /// Texts embedded per second of the measured phase.
    pub embeddings_per_second: f64,
    /// Latency of the answered calls.
    pub latency_ms: Option<Percentiles>,
    /// The first failure, verbatim.
    pub first_error: Option<String>,
}

impl EmbedLiveRecord {
    /// How the load was paced, in words: "closed loop, 2 in flight" or "5 calls/s asked".
    pub fn pace(&self) -> String {
        match (self.rate_per_s, self.concurrency) {
            (Some(rate), _) => format!("{rate} calls/s asked"),
            (None, Some(n)) => format!("closed loop, {n} in flight"),
            (None, None) => self.mode.clone(),
        }
    }
}

/// How a run was configured, as its result records it: what reports read, typed, and
/// every other `loadgen run` flag as given (secrets redacted), for the record. Results
/// written before a field existed read as its default.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RunConfig {
    /// Workers, each with one request in flight.
    pub concurrency: usize,
    /// `new`, `reuse` or `per-n=N`.
    pub connection_policy: String,
    /// Client session resumption.
    pub resumption: Option<OnOff>,
    /// The one TLS version offered; none: 1.3 and 1.2.
    pub tls_version: Option<TlsVersion>,
    /// The client's key-exchange group.
    pub kx: String,
    /// The TCP congestion control set on the client's connections; none: the host's.
    pub congestion_control: Option<String>,
    /// Warm-up before the measured phase.
    pub warmup: String,
    /// Measured time, when the run was timed.
    pub duration: Option<String>,
    /// Measured requests, when the run was counted.
    pub requests: Option<u64>,
    /// Open-loop arrival rate, requests per second.
    pub rate: Option<f64>,
    /// The target host's node_exporter job, when its CPU came through Prometheus.
    pub target_node_exporter: Option<String>,
    /// Every other flag, as given.
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// A cell of a comparison that could not be measured: written in place of its result.
#[derive(Debug, Serialize, Deserialize)]
pub struct CellFailure {
    /// [`FAILURE_SCHEMA`].
    pub schema: String,
    /// Which cell.
    pub cell: Cell,
    /// Why, as the run said it.
    pub reason: String,
}

/// The schema of [`CellFailure`] files.
pub const FAILURE_SCHEMA: &str = "loadgen.cell-failure/v1";

/// One run's result: what every report is rendered from (schema [`SCHEMA`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunResult {
    /// [`SCHEMA`].
    pub schema: String,
    /// The comparison cell it belongs to; `None` for a run on its own.
    #[serde(default)]
    pub cell: Option<Cell>,
    /// When the measured phase started (RFC 3339).
    pub started_at: String,
    /// The target as given (`host:port`, a URL).
    pub target: String,
    /// The run's configuration, as given.
    pub config: RunConfig,
    /// Where and with what it ran.
    pub environment: Environment,
    /// What every request carried.
    pub workload: WorkloadRecord,
    /// Whether the client verified the server's certificate (off: `--insecure`).
    pub tls_verification: bool,
    /// Length of the measured phase.
    pub measured_seconds: f64,
    /// Requests acknowledged in the measured phase.
    pub requests_ok: u64,
    /// Requests that failed in it.
    pub requests_failed: u64,
    /// Failed requests by kind.
    pub failures: BTreeMap<String, u64>,
    /// The first message of each kind of failure.
    pub failure_examples: BTreeMap<String, String>,
    /// Requests sent in the warm-up (not counted above).
    pub warmup_requests: u64,
    /// Acknowledged requests per second.
    pub requests_per_second: f64,
    /// Acknowledged points per second.
    pub points_per_second: f64,
    /// Request body megabytes (10^6) per second, acknowledged requests only.
    pub payload_mb_per_second: f64,
    /// Request latency, send to acknowledgement.
    pub latency_ms: Option<Percentiles>,
    /// The client's handshakes.
    pub handshakes: HandshakeRecord,
    /// Open loop: how late each request was sent against its schedule.
    #[serde(default)]
    pub schedule_lag_ms: Option<Percentiles>,
    /// CPU of the hosts and processes.
    pub cpu: CpuRecord,
    /// Energy, or why it was not measured.
    pub power: Measured<PowerRecord>,
    /// Power estimated from this host's CPU utilisation by a published model
    /// ([`crate::power_estimate`]): never a measurement, and never mixed with `power`.
    #[serde(default = "not_estimated")]
    pub power_estimate: Measured<crate::power_estimate::PowerEstimate>,
    /// The proxy's own counts, or why they were not read.
    pub proxy_metrics: Measured<ProxyMetricsDelta>,
    /// The collection's count check, or why it was not made.
    pub verification: Measured<Verification>,
    /// Live embedding calls, when asked for.
    #[serde(default)]
    pub embed_live: Option<EmbedLiveRecord>,
    /// What a reader must know to trust the figures.
    pub warnings: Vec<String>,
    /// Whether the run was stopped before its end (the figures cover the time until then).
    pub interrupted: bool,
    /// The measured phase on the wall clock, for `loadgen merge`.
    #[serde(default)]
    pub window: Option<MeasuredWindow>,
    /// The measured phase's latency histograms, for `loadgen merge`.
    #[serde(default)]
    pub histograms: Option<Histograms>,
    /// Request body bytes of the acknowledged measured requests.
    #[serde(default)]
    pub payload_bytes: Option<u64>,
    /// A merged result: the files it was made of.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged_from: Vec<String>,
    /// Measured requests by the wall-clock second they ended in: when failures happened
    /// (a fault's window), not only how many. `loadgen merge` adds them up by second.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<SecondTally>,
}

/// The measured requests that ended within one second of the wall clock.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SecondTally {
    /// The second, since the Unix epoch.
    pub at_unix_s: u64,
    /// Requests acknowledged in it.
    pub ok: u64,
    /// Requests failed in it.
    pub failed: u64,
}

/// The runs of consecutive seconds of `timeline` with failures, as (first second, last
/// second, failed, ok) in order: where each fault fell, for the reports.
pub fn failure_windows(timeline: &[SecondTally]) -> Vec<(u64, u64, u64, u64)> {
    let mut windows: Vec<(u64, u64, u64, u64)> = Vec::new();
    for s in timeline.iter().filter(|s| s.failed > 0) {
        match windows.last_mut() {
            Some(w) if s.at_unix_s <= w.1 + 1 => {
                w.1 = s.at_unix_s;
                w.2 += s.failed;
                w.3 += s.ok;
            }
            _ => windows.push((s.at_unix_s, s.at_unix_s, s.failed, s.ok)),
        }
    }
    windows
}

/// When the measured phase ran, in seconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct MeasuredWindow {
    /// Start.
    pub from_unix_s: f64,
    /// End.
    pub until_unix_s: f64,
}

/// HDR histograms of microseconds (V2 with deflate, base64): what `loadgen merge` adds up,
/// so merged percentiles are those of the union of samples, never averages.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Histograms {
    /// Request latency.
    pub latency_us: String,
    /// Handshake latency.
    pub handshake_us: String,
}

impl Histograms {
    /// Encodes both histograms.
    pub fn encode(latency: &Histogram<u64>, handshake: &Histogram<u64>) -> Self {
        Self {
            latency_us: encode_histogram(latency),
            handshake_us: encode_histogram(handshake),
        }
    }
}

/// A histogram as base64 of its V2-deflate serialization (HdrHistogram's own format).
pub fn encode_histogram(h: &Histogram<u64>) -> String {
    use base64::Engine;
    use hdrhistogram::serialization::{Serializer, V2DeflateSerializer};
    let mut bytes = Vec::new();
    // Serialising into a Vec fails only on a histogram too large for the format's 32-bit
    // lengths, which a run's microsecond histogram never is.
    V2DeflateSerializer::new()
        .serialize(h, &mut bytes)
        .expect("a run's histogram serialises");
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The histogram [`encode_histogram`] wrote.
pub fn decode_histogram(text: &str) -> Result<Histogram<u64>, String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("not base64: {e}"))?;
    hdrhistogram::serialization::Deserializer::new()
        .deserialize(&mut std::io::Cursor::new(bytes))
        .map_err(|e| format!("not an HDR histogram: {e:?}"))
}

impl RunResult {
    /// The proxy's CPU-seconds for this run: from its own metrics when scraped, else from
    /// /proc for a watched process named like the proxy.
    pub fn proxy_cpu_seconds(&self) -> Option<f64> {
        self.proxy_metrics
            .as_ref()
            .and_then(|m| m.cpu_seconds)
            .or_else(|| {
                self.cpu
                    .watched
                    .iter()
                    .find(|w| w.name == "proxy")
                    .map(|w| w.cpu_seconds)
            })
    }
}

/// Who terminated TLS in a cell. Written as one string, the provider's name or the peer's
/// (`"aws-lc-rs"`, `"nginx"`), so results read the same as when it was a bare name; a name
/// the registry knows is the proxy's provider, any other a peer's (the peers script records
/// nginx and HAProxy cells through `loadgen run --cell-provider`).
///
/// Ordered as reports list cells: the registry's providers in its order, then peers by name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum CellProvider {
    /// The proxy, terminating with this provider.
    Proxy(ProviderName),
    /// Another terminator, by the name its cells carry.
    Peer(String),
}

impl CellProvider {
    /// The name results and reports write.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Proxy(p) => p.as_str(),
            Self::Peer(name) => name,
        }
    }

    /// A software provider of the proxy: where a ratio's baseline is chosen from.
    pub fn is_software_provider(&self) -> bool {
        matches!(self, Self::Proxy(p) if ProviderName::SOFTWARE.contains(p))
    }
}

impl From<String> for CellProvider {
    fn from(name: String) -> Self {
        match name.parse::<ProviderName>() {
            // Only the registry's own spelling: "aws_lc_rs" recorded by hand stays as written.
            Ok(p) if p.as_str() == name => Self::Proxy(p),
            _ => Self::Peer(name),
        }
    }
}

impl From<&str> for CellProvider {
    fn from(name: &str) -> Self {
        name.to_owned().into()
    }
}

impl PartialEq<&str> for CellProvider {
    fn eq(&self, name: &&str) -> bool {
        self.as_str() == *name
    }
}

impl From<CellProvider> for String {
    fn from(p: CellProvider) -> Self {
        match p {
            CellProvider::Proxy(p) => p.as_str().to_owned(),
            CellProvider::Peer(name) => name,
        }
    }
}

impl std::str::FromStr for CellProvider {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(s.to_owned().into())
    }
}

impl std::fmt::Display for CellProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Ord for CellProvider {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        match (self, other) {
            (Self::Proxy(a), Self::Proxy(b)) => ProviderName::ALL
                .iter()
                .position(|p| p == a)
                .cmp(&ProviderName::ALL.iter().position(|p| p == b)),
            (Self::Proxy(_), Self::Peer(_)) => Ordering::Less,
            (Self::Peer(_), Self::Proxy(_)) => Ordering::Greater,
            (Self::Peer(a), Self::Peer(b)) => a.cmp(b),
        }
    }
}

impl PartialOrd for CellProvider {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A TLS version as runs record it: the proxy's own type, so that a run, its result and the
/// proxy it starts spell a version one way ("1.2", "1.3").
pub use proxy::tls::TlsVersion;

/// On or off, as runs record a switch (resumption, TLS verification, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OnOff {
    /// On.
    On,
    /// Off.
    Off,
}

impl OnOff {
    /// As the command line and the proxy's flags write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::On => "on",
            Self::Off => "off",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_windows_are_the_runs_of_seconds_with_failures() {
        let second = |at: u64, ok: u64, failed: u64| SecondTally {
            at_unix_s: at,
            ok,
            failed,
        };
        let timeline = [
            second(100, 50, 0),
            second(101, 10, 4),
            second(102, 0, 9),
            second(103, 48, 0),
            second(104, 49, 0),
            second(105, 30, 2),
            second(107, 20, 1),
        ];
        assert_eq!(
            failure_windows(&timeline),
            [(101, 102, 13, 10), (105, 105, 2, 30), (107, 107, 1, 20)]
        );
        assert!(failure_windows(&timeline[3..5]).is_empty());
    }

    #[test]
    fn a_cell_provider_is_written_as_its_name_and_read_back_as_what_it_names() {
        let cell: Cell =
            serde_json::from_str(r#"{"provider":"aws-lc-rs","algorithm":"rsa2048","repeat":1}"#)
                .unwrap();
        assert_eq!(cell.provider, CellProvider::Proxy(ProviderName::AwsLcRs));
        let peer: Cell =
            serde_json::from_str(r#"{"provider":"nginx","algorithm":"rsa2048","repeat":1}"#)
                .unwrap();
        assert_eq!(peer.provider, CellProvider::Peer("nginx".into()));
        assert_eq!(
            serde_json::to_string(&cell).unwrap(),
            r#"{"provider":"aws-lc-rs","algorithm":"rsa2048","repeat":1}"#
        );
        // An alias the registry accepts stays as it was recorded, not renamed.
        assert_eq!(
            CellProvider::from("aws_lc_rs"),
            CellProvider::Peer("aws_lc_rs".into())
        );
    }

    #[test]
    fn cell_providers_sort_as_reports_list_them() {
        let mut v: Vec<CellProvider> = ["nginx", "openssl-qat", "haproxy", "ring", "aws-lc-rs"]
            .into_iter()
            .map(CellProvider::from)
            .collect();
        v.sort();
        let names: Vec<&str> = v.iter().map(CellProvider::as_str).collect();
        assert_eq!(
            names,
            ["ring", "aws-lc-rs", "openssl-qat", "haproxy", "nginx"]
        );
    }
}
