//! The figures a report derives from each run result: [`METRICS`], in table order, each
//! with its unit, which way it improves, and how it is read from a [`RunResult`] (or why
//! a run does not have it).

use crate::result::{Measured, RunResult};

/// Which way a metric improves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Better {
    /// More is better (requests per second).
    Higher,
    /// Less is better (latency, CPU per request).
    Lower,
}

/// One derived figure.
pub struct Metric {
    /// Its key in the CSV and in `Report::figures`.
    pub key: &'static str,
    /// Its name in tables and charts.
    pub title: &'static str,
    /// Its unit.
    pub unit: &'static str,
    /// Which way it improves: ratios are oriented so that above 1 is better.
    pub better: Better,
    /// Drawn as a chart in the HTML.
    pub charted: bool,
    /// Shown only when some cell measured it (the co-located embedding load is optional: a
    /// comparison without one gets no empty columns for it).
    pub optional: bool,
    /// Reads it from one result, or says why it cannot.
    pub extract: fn(&RunResult) -> Result<f64, String>,
}

fn proxy_cpu(r: &RunResult) -> Result<f64, String> {
    r.proxy_cpu_seconds().ok_or_else(|| {
        r.proxy_metrics
            .reason
            .clone()
            .unwrap_or_else(|| "proxy CPU not measured".to_owned())
    })
}

fn watts(r: &RunResult) -> Result<(f64, f64), String> {
    match (&r.power.value, &r.power.reason) {
        (Some(p), _) => Ok((p.mean_watts, p.joules)),
        (None, Some(reason)) => Err(reason.clone()),
        (None, None) => Err("power not measured".to_owned()),
    }
}

/// The estimate's mean watts, never a measurement's.
fn estimated_watts(r: &RunResult) -> Result<f64, String> {
    match (&r.power_estimate.value, &r.power_estimate.reason) {
        (Some(e), _) => Ok(e.mean_watts),
        (None, Some(reason)) => Err(reason.clone()),
        (None, None) => Err("not estimated".to_owned()),
    }
}

fn latency(r: &RunResult, pick: fn(&crate::result::Percentiles) -> f64) -> Result<f64, String> {
    r.latency_ms
        .as_ref()
        .map(pick)
        .ok_or_else(|| "no latency recorded".into())
}

/// The proxy host's CPU: the target host's when it was measured through its node_exporter
/// (remote mode), else this host's, where loadgen and the proxy ran together.
fn system_cpu(r: &RunResult) -> Result<f64, String> {
    let m = match &r.cpu.target_host_utilisation_percent {
        target @ Measured { value: Some(_), .. } => target,
        _ => &r.cpu.system_utilisation_percent,
    };
    m.value.ok_or_else(|| m.reason.clone().unwrap_or_default())
}

fn per_ok(r: &RunResult) -> Result<f64, String> {
    if r.requests_ok == 0 {
        Err("no request succeeded".to_owned())
    } else {
        Ok(r.requests_ok as f64)
    }
}

/// Every figure of the report, in table order.
pub const METRICS: &[Metric] = &[
    Metric {
        key: "requests_per_second",
        title: "Throughput",
        unit: "requests/s",
        better: Better::Higher,
        charted: true,
        optional: false,
        extract: |r| Ok(r.requests_per_second),
    },
    Metric {
        key: "latency_p50_ms",
        title: "P50 latency",
        unit: "ms",
        better: Better::Lower,
        charted: true,
        optional: false,
        extract: |r| latency(r, |l| l.p50),
    },
    Metric {
        key: "latency_p99_ms",
        title: "P99 latency",
        unit: "ms",
        better: Better::Lower,
        charted: false,
        optional: false,
        extract: |r| latency(r, |l| l.p99),
    },
    Metric {
        key: "payload_mb_per_second",
        title: "Payload",
        unit: "MB/s",
        better: Better::Higher,
        charted: true,
        optional: false,
        extract: |r| Ok(r.payload_mb_per_second),
    },
    Metric {
        key: "system_cpu_percent",
        title: "System CPU utilisation",
        unit: "% of all cores",
        better: Better::Lower,
        charted: true,
        optional: false,
        extract: system_cpu,
    },
    Metric {
        key: "proxy_cpu_percent",
        title: "Proxy CPU",
        unit: "% of one core",
        better: Better::Lower,
        charted: false,
        optional: false,
        extract: |r| {
            let secs = proxy_cpu(r)?;
            if r.measured_seconds > 0.0 {
                Ok(100.0 * secs / r.measured_seconds)
            } else {
                Err("no measured time".to_owned())
            }
        },
    },
    Metric {
        key: "cpu_headroom_percent",
        title: "CPU headroom",
        unit: "% of all cores idle",
        better: Better::Higher,
        charted: false,
        optional: false,
        extract: |r| system_cpu(r).map(|u| 100.0 - u),
    },
    Metric {
        key: "requests_per_watt",
        title: "Requests per watt",
        unit: "requests/s per W",
        better: Better::Higher,
        charted: true,
        optional: false,
        extract: |r| {
            let (w, _) = watts(r)?;
            if w > 0.0 {
                Ok(r.requests_per_second / w)
            } else {
                Err("zero watts measured".to_owned())
            }
        },
    },
    Metric {
        key: "requests_per_estimated_watt",
        title: "Requests per estimated watt",
        unit: "requests/s per estimated W (CPU-utilisation model, not measured)",
        better: Better::Higher,
        charted: true,
        optional: false,
        extract: |r| {
            let w = estimated_watts(r)?;
            if w > 0.0 {
                Ok(r.requests_per_second / w)
            } else {
                Err("zero watts estimated".to_owned())
            }
        },
    },
    Metric {
        key: "estimated_watts",
        title: "Estimated power",
        unit: "W, estimated from CPU utilisation (not measured)",
        better: Better::Lower,
        charted: false,
        optional: false,
        extract: estimated_watts,
    },
    Metric {
        key: "joules_per_1000_requests",
        title: "Energy",
        unit: "J per 1000 requests",
        better: Better::Lower,
        charted: false,
        optional: false,
        extract: |r| {
            let (_, j) = watts(r)?;
            Ok(1000.0 * j / per_ok(r)?)
        },
    },
    Metric {
        key: "requests_per_proxy_cpu_second",
        title: "Requests per proxy CPU-second",
        unit: "requests/CPU-s",
        better: Better::Higher,
        charted: false,
        optional: false,
        extract: |r| {
            let secs = proxy_cpu(r)?;
            if secs > 0.0 {
                Ok(per_ok(r)? / secs)
            } else {
                Err("proxy used no measurable CPU".to_owned())
            }
        },
    },
    Metric {
        key: "proxy_cpu_ms_per_handshake",
        title: "Proxy CPU per handshake",
        unit: "ms CPU (incl. the request)",
        better: Better::Lower,
        charted: true,
        optional: false,
        extract: |r| match (&r.proxy_metrics.value, &r.proxy_metrics.reason) {
            (Some(m), _) => m
                .cpu_seconds_per_handshake
                .map(|s| s * 1000.0)
                .ok_or_else(|| "no handshakes in the measured phase".to_owned()),
            // A peer terminator (nginx, HAProxy) has no such metrics: its watched CPU over
            // the handshakes the client made.
            (None, reason) => match (proxy_cpu(r), r.handshakes.count) {
                (Ok(secs), n) if n > 0 => Ok(1000.0 * secs / n as f64),
                (Ok(_), _) => Err("no handshakes in the measured phase".to_owned()),
                (Err(_), _) => Err(reason
                    .clone()
                    .unwrap_or_else(|| "proxy CPU not measured".into())),
            },
        },
    },
    Metric {
        key: "embeddings_per_second",
        title: "Co-located embeddings",
        unit: "embeddings/s",
        better: Better::Higher,
        charted: true,
        optional: true,
        extract: |r| {
            let live = embed_live(r)?;
            if live.ok == 0 {
                return Err(format!(
                    "no embedding call answered ({} failed{})",
                    live.failed,
                    live.first_error
                        .as_deref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                ));
            }
            Ok(live.embeddings_per_second)
        },
    },
    Metric {
        key: "embedding_latency_p50_ms",
        title: "Embedding call P50",
        unit: "ms",
        better: Better::Lower,
        charted: false,
        optional: true,
        extract: |r| {
            embed_live(r)?
                .latency_ms
                .as_ref()
                .map(|l| l.p50)
                .ok_or_else(|| "no embedding call answered".to_owned())
        },
    },
    Metric {
        key: "embedder_cpu_percent",
        title: "CPU the embedder got",
        unit: "% of one core",
        better: Better::Higher,
        charted: false,
        optional: true,
        extract: |r| {
            embed_live(r)?;
            r.cpu
                .watched
                .iter()
                .find(|p| p.name == "embedder")
                .map(|p| p.percent_of_core)
                .ok_or_else(|| "embedder CPU not watched (--watch-pid embedder=PID)".to_owned())
        },
    },
];

/// The co-located embedding load of a run, or why there is none.
fn embed_live(r: &RunResult) -> Result<&crate::result::EmbedLiveRecord, String> {
    r.embed_live
        .as_ref()
        .ok_or_else(|| "no co-located embedding load in this run".to_owned())
}
