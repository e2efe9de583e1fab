//! What is measured beside the requests: CPU (system-wide and per process), power (RAPL, a
//! BMC over Redfish, or a Prometheus query), and the proxy's own /metrics. Probes know
//! nothing of workloads: they are started when the measured phase starts, sampled on a
//! fixed interval, and read out when it ends.

pub mod cpu;
pub mod prometheus;
pub mod proxy_metrics;
pub mod rapl;
pub mod redfish;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::client::http::Options;
use crate::result::{CpuRecord, Measured, PowerRecord, ProcessCpu, ProxyMetricsDelta};

/// A process whose CPU time is attributed to the run.
#[derive(Clone, Debug)]
pub struct Watched {
    /// Its name in the result (`proxy`, `upstream`).
    pub name: String,
    /// Its process ids; their children count too.
    pub pids: Vec<u32>,
}

/// Where the energy of the measured phase is read.
#[derive(Clone)]
pub enum PowerSource {
    /// The RAPL counters under this powercap directory (this host's packages and DRAM).
    Rapl(PathBuf),
    /// A meter read in watts on every sample tick.
    Meter(Arc<WattMeter>),
    /// None, and why.
    None(String),
}

/// A power reading taken over the network, in watts; energy is the mean of the samples times
/// the measured time.
pub enum WattMeter {
    /// A BMC's Redfish Power resource.
    Redfish(redfish::Redfish),
    /// A Prometheus query in watts (an exporter of the BMC's or a PDU's readings).
    Prometheus(prometheus::PrometheusPower),
}

impl WattMeter {
    async fn watts(&self) -> anyhow::Result<(f64, String)> {
        match self {
            WattMeter::Redfish(r) => Ok((
                r.watts().await?,
                "PowerControl[0].PowerConsumedWatts, whole server".to_owned(),
            )),
            WattMeter::Prometheus(p) => {
                let reading = p.reading().await?;
                Ok((
                    reading.value,
                    format!(
                        "Prometheus query {:?}, {} series summed; as fresh as its scrape interval",
                        p.query(),
                        reading.series
                    ),
                ))
            }
        }
    }

    fn source(&self) -> &'static str {
        match self {
            WattMeter::Redfish(_) => "redfish",
            WattMeter::Prometheus(_) => "prometheus",
        }
    }
}

/// What the probes watch during the measured phase.
pub struct ProbeConfig {
    /// Where /proc is (a test points it at a fixture).
    pub proc_root: PathBuf,
    /// The target host's node_exporter instance, asked through this Prometheus at the end.
    pub target_host: Option<(Arc<prometheus::Prometheus>, String)>,
    /// Where energy is read.
    pub power: PowerSource,
    /// The processes whose CPU is recorded beside loadgen's own.
    pub watched: Vec<Watched>,
    /// The proxy's /metrics URL, scraped before and after, and how to reach it.
    pub proxy_metrics: Option<(String, Options)>,
    /// How often power is sampled.
    pub sample_interval: Duration,
}

struct PowerState {
    rapl: Option<rapl::Rapl>,
    metered_watts: Vec<f64>,
    /// What the meter said it measured, from its last reading.
    meter_detail: String,
    error: Option<String>,
}

/// Probes between start and finish.
pub struct Running {
    config: ProbeConfig,
    started: Instant,
    system_before: anyhow::Result<cpu::SystemTimes>,
    own_before: f64,
    watched_before: Vec<Vec<Option<f64>>>,
    proxy_before: Option<anyhow::Result<proxy_metrics::Snapshot>>,
    power: Arc<Mutex<PowerState>>,
    sampler: Option<tokio::task::JoinHandle<()>>,
    stop: CancellationToken,
}

impl ProbeConfig {
    /// Takes the before readings and starts sampling: call just before the measured phase.
    pub async fn start(self) -> Running {
        let proxy_before = match &self.proxy_metrics {
            Some((url, opts)) => Some(proxy_metrics::scrape(url, opts).await),
            None => None,
        };
        let mut power = PowerState {
            rapl: None,
            metered_watts: Vec::new(),
            meter_detail: String::new(),
            error: None,
        };
        if let PowerSource::Rapl(root) = &self.power {
            match rapl::Rapl::open(root) {
                Ok(r) => power.rapl = Some(r),
                Err(e) => power.error = Some(e),
            }
        }
        let power = Arc::new(Mutex::new(power));
        let stop = CancellationToken::new();
        let own_before =
            cpu::process_cpu_seconds(&self.proc_root, std::process::id()).unwrap_or(0.0);
        let watched_before = self
            .watched
            .iter()
            .map(|w| {
                w.pids
                    .iter()
                    .map(|&p| cpu::process_cpu_seconds(&self.proc_root, p).ok())
                    .collect()
            })
            .collect();
        let system_before = cpu::read_system(&self.proc_root);
        let mut running = Running {
            config: self,
            started: Instant::now(),
            system_before,
            own_before,
            watched_before,
            proxy_before,
            power,
            sampler: None,
            stop,
        };
        running.spawn_sampler();
        running
    }
}

impl Running {
    fn spawn_sampler(&mut self) {
        let interval = self.config.sample_interval;
        let power = self.power.clone();
        let stop = self.stop.clone();
        let meter = match &self.config.power {
            PowerSource::Meter(m) => Some(m.clone()),
            _ => None,
        };
        let has_rapl = power.lock().map(|p| p.rapl.is_some()).unwrap_or(false);
        if meter.is_none() && !has_rapl {
            return;
        }
        self.sampler = Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            loop {
                // The first tick fires at once: a meter reading at the start of the run.
                let stopping = tokio::select! {
                    _ = tick.tick() => false,
                    _ = stop.cancelled() => true,
                };
                if let Some(m) = &meter {
                    let reading = m.watts().await;
                    if let Ok(mut p) = power.lock() {
                        match reading {
                            Ok((w, detail)) => {
                                p.metered_watts.push(w);
                                p.meter_detail = detail;
                            }
                            Err(e) => {
                                p.error.get_or_insert_with(|| format!("{e:#}"));
                            }
                        }
                    }
                }
                if let Ok(mut p) = power.lock() {
                    if let Some(Err(e)) = p.rapl.as_mut().map(|r| r.sample()) {
                        p.error.get_or_insert(e);
                    }
                }
                if stopping {
                    return;
                }
            }
        }));
    }

    /// Reads everything out. `requests` is the measured request count the per-request
    /// figures divide by.
    pub async fn finish(mut self, requests: u64) -> Finished {
        let elapsed = self.started.elapsed().as_secs_f64().max(1e-9);
        let root = &self.config.proc_root;
        let system_after = cpu::read_system(root);
        let own_after =
            cpu::process_cpu_seconds(root, std::process::id()).unwrap_or(self.own_before);
        let per_request = |secs: f64| (requests > 0).then(|| secs / requests as f64);
        let process = |name: &str, pids: Vec<u32>, secs: f64| ProcessCpu {
            name: name.to_owned(),
            cpu_seconds: secs,
            cpu_seconds_per_request: per_request(secs),
            percent_of_core: 100.0 * secs / elapsed,
            cpus_allowed: pids.first().and_then(|&p| cpu::cpus_allowed(root, p)),
            cpu_quota: pids.first().and_then(|&p| quota_of(root, p)),
            pids,
        };
        let loadgen = process(
            "loadgen",
            vec![std::process::id()],
            own_after - self.own_before,
        );
        let mut warnings = Vec::new();
        let mut watched = Vec::new();
        for (w, before) in self.config.watched.iter().zip(&self.watched_before) {
            let mut secs = 0.0;
            for (&pid, b) in w.pids.iter().zip(before) {
                match (b, cpu::process_cpu_seconds(root, pid)) {
                    (Some(b), Ok(a)) => secs += a - b,
                    (_, Err(e)) => warnings.push(format!("{} (pid {pid}): {e:#}", w.name)),
                    (None, Ok(_)) => warnings.push(format!(
                        "{} (pid {pid}) was not readable at the start",
                        w.name
                    )),
                }
            }
            watched.push(process(&w.name, w.pids.clone(), secs));
        }
        let system = match (&self.system_before, &system_after) {
            (Ok(b), Ok(a)) => cpu::utilisation(*b, *a)
                .map(Measured::ok)
                .unwrap_or_else(|| Measured::missing("no CPU time passed")),
            (Err(e), _) | (_, Err(e)) => Measured::missing(format!("{e:#}")),
        };

        self.stop.cancel();
        if let Some(s) = self.sampler.take() {
            let _ = s.await;
        }
        let power = self.power_measured(elapsed);

        let target_host = match &self.config.target_host {
            Some((server, instance)) => Measured::from(
                prometheus::host_cpu_percent(server, instance, self.started.elapsed())
                    .await
                    .map_err(|e| format!("{e:#}")),
            ),
            None => crate::result::target_host_not_asked(),
        };
        let (proxy, listeners) = match (&self.config.proxy_metrics, self.proxy_before.take()) {
            (Some((url, opts)), Some(Ok(before))) => match proxy_metrics::scrape(url, opts).await {
                Ok(after) => {
                    let delta = proxy_delta(&before, &after, requests);
                    (Measured::ok(delta), after.listeners)
                }
                Err(e) => (
                    Measured::missing(format!("scraping {url} after the run: {e:#}")),
                    Vec::new(),
                ),
            },
            (Some((url, _)), Some(Err(e))) => (
                Measured::missing(format!("scraping {url} before the run: {e:#}")),
                Vec::new(),
            ),
            _ => (
                Measured::missing("no --proxy-metrics URL given"),
                Vec::new(),
            ),
        };
        Finished {
            cpu: CpuRecord {
                system_utilisation_percent: system,
                target_host_utilisation_percent: target_host,
                loadgen,
                watched,
            },
            power,
            proxy,
            proxy_listeners: listeners,
            warnings,
        }
    }

    /// The energy over the run from the source the run was given (RAPL, a meter), or why
    /// there is none. Called once the sampler has stopped.
    fn power_measured(&self, elapsed: f64) -> Measured<PowerRecord> {
        let p = self.power.lock().ok();
        match (&self.config.power, p) {
            (PowerSource::None(reason), _) => Measured::missing(reason.clone()),
            (_, None) => Measured::missing("power sampler failed"),
            (_, Some(p)) => {
                if let Some(e) = &p.error {
                    Measured::missing(e.clone())
                } else if let Some(r) = &p.rapl {
                    Measured::ok(PowerRecord {
                        source: "rapl".to_owned(),
                        joules: r.joules(),
                        mean_watts: r.joules() / elapsed,
                        samples: 0,
                        detail: format!(
                            "domains {}; counter wraps {}",
                            r.domain_names().join(","),
                            r.wraps()
                        ),
                    })
                } else if let (PowerSource::Meter(m), false) =
                    (&self.config.power, p.metered_watts.is_empty())
                {
                    let mean = p.metered_watts.iter().sum::<f64>() / p.metered_watts.len() as f64;
                    Measured::ok(PowerRecord {
                        source: m.source().to_owned(),
                        joules: mean * elapsed,
                        mean_watts: mean,
                        samples: p.metered_watts.len() as u64,
                        detail: p.meter_detail.clone(),
                    })
                } else {
                    Measured::missing("no power sample was taken")
                }
            }
        }
    }
}

/// What the proxy's own metrics say of the run: the difference of two scrapes.
fn proxy_delta(
    before: &proxy_metrics::Snapshot,
    after: &proxy_metrics::Snapshot,
    requests: u64,
) -> ProxyMetricsDelta {
    let per_request = |secs: f64| (requests > 0).then(|| secs / requests as f64);
    let handshakes = after.handshakes_ok - before.handshakes_ok;
    let cpu = since(before.cpu_seconds, after.cpu_seconds).filter(|_| before.cpu_seconds.is_some());
    ProxyMetricsDelta {
        handshakes,
        resumed_handshakes: after.handshakes_resumed - before.handshakes_resumed,
        handshake_failures: after.handshake_failures - before.handshake_failures,
        requests: after.requests - before.requests,
        cpu_seconds: cpu,
        cpu_seconds_per_request: cpu.and_then(per_request),
        cpu_seconds_per_handshake: cpu.filter(|_| handshakes > 0.0).map(|c| c / handshakes),
        qat_signatures_offloaded: since(before.qat_offloaded, after.qat_offloaded),
        qat_signatures_not_offloaded: since(before.qat_not_offloaded, after.qat_not_offloaded),
        qat_part_batches: since(before.qat_part_batches, after.qat_part_batches),
        qat_mode: after.qat_mode.as_ref().map(|(m, _)| m.clone()),
        qat_batch: after.qat_mode.as_ref().map(|(_, b)| *b),
    }
}

/// What the probes read over the measured phase.
pub struct Finished {
    /// CPU of the hosts and processes.
    pub cpu: CpuRecord,
    /// Energy, or why it was not read.
    pub power: Measured<PowerRecord>,
    /// The proxy's own counts, or why they were not read.
    pub proxy: Measured<ProxyMetricsDelta>,
    /// The labels of the proxy's `proxy_listener_info` series.
    pub proxy_listeners: Vec<std::collections::BTreeMap<String, String>>,
    /// What a reader of the figures must know.
    pub warnings: Vec<String>,
}

/// A counter's growth between two scrapes; None when the second has no such counter.
fn since(before: Option<f64>, after: Option<f64>) -> Option<f64> {
    after.map(|a| a - before.unwrap_or(0.0))
}

/// A process's CPU quota from its cgroup files; `None` where it has none or the cgroup
/// files cannot be read (a quota that cannot be read is not one that bound it).
fn quota_of(proc_root: &std::path::Path, pid: u32) -> Option<crate::budget::CpuQuota> {
    crate::budget::read_quota(&crate::budget::Cgroups::at(proc_root), pid)
        .ok()
        .flatten()
}
