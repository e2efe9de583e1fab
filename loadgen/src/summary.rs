//! The human summary of one run, printed on stdout.

use std::fmt::Write;

use crate::result::{failure_windows, Measured, RunResult};

/// The summary of `r`: throughput, latency, CPU, power, verification and warnings.
pub fn render(r: &RunResult) -> String {
    let mut s = String::new();
    requests(&mut s, r);
    cpu(&mut s, r);
    outcome(&mut s, r);
    embeddings(&mut s, r);
    for warning in &r.warnings {
        let _ = writeln!(s, "WARNING: {warning}");
    }
    s
}

/// What was sent and how it went: target, counts, failures and when, throughput, latency.
fn requests(s: &mut String, r: &RunResult) {
    let w = &r.workload;
    let _ = writeln!(
        s,
        "target {} ({}, {} points x {}-d, {}-{} bytes/request, wait={}), TLS verification {}",
        r.target,
        w.protocol,
        w.points_per_request,
        w.dim,
        w.request_body_bytes_min,
        w.request_body_bytes_max,
        w.wait,
        if r.tls_verification { "on" } else { "OFF" }
    );
    let _ = writeln!(
        s,
        "measured {:.2} s: {} ok, {} failed ({} warm-up requests excluded)",
        r.measured_seconds, r.requests_ok, r.requests_failed, r.warmup_requests
    );
    for (kind, n) in &r.failures {
        let example = r
            .failure_examples
            .get(kind)
            .map(String::as_str)
            .unwrap_or("");
        let _ = writeln!(s, "  failed {kind}: {n}  (first: {example})");
    }
    // When the failures happened: each run of seconds with failures, from the measured
    // phase's start (a fault injected during the run shows as its window).
    if let (Some(first), windows) = (r.timeline.first(), failure_windows(&r.timeline)) {
        for (from, until, failed, ok) in windows {
            let _ = writeln!(
                s,
                "  failures at {}-{} s: {failed} failed, {ok} ok",
                from - first.at_unix_s,
                until + 1 - first.at_unix_s
            );
        }
    }
    let _ = writeln!(
        s,
        "throughput: {:.1} requests/s, {:.0} points/s, {:.2} MB/s of request bodies",
        r.requests_per_second, r.points_per_second, r.payload_mb_per_second
    );
    if let Some(l) = &r.latency_ms {
        let _ = writeln!(
            s,
            "latency ms: p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}",
            l.p50, l.p90, l.p99, l.p999, l.max
        );
    }
    if let Some(h) = &r.handshakes.latency_ms {
        let _ = writeln!(
            s,
            "handshakes: {} ({} resumed), connect+TLS ms p50 {:.2}  p99 {:.2}",
            r.handshakes.count, r.handshakes.resumed, h.p50, h.p99
        );
    }
    if let Some(l) = &r.schedule_lag_ms {
        let _ = writeln!(
            s,
            "open loop send lag ms: p50 {:.2}  p99 {:.2}  max {:.2}",
            l.p50, l.p99, l.max
        );
    }
}

/// Whose CPU the run cost: the host, loadgen, watched processes, the proxy's own metrics.
fn cpu(s: &mut String, r: &RunResult) {
    let _ = writeln!(
        s,
        "CPU: system {}; loadgen {:.3} s ({:.1}% of a core, {} per request)",
        measured(&r.cpu.system_utilisation_percent, |v| format!("{v:.1}%")),
        r.cpu.loadgen.cpu_seconds,
        r.cpu.loadgen.percent_of_core,
        per_request(r.cpu.loadgen.cpu_seconds_per_request)
    );
    if r.cpu.target_host_utilisation_percent.value.is_some()
        || r.config.target_node_exporter.is_some()
    {
        let _ = writeln!(
            s,
            "CPU of the target host (node_exporter via Prometheus): {}",
            measured(&r.cpu.target_host_utilisation_percent, |v| format!(
                "{v:.1}%"
            ))
        );
    }
    for p in &r.cpu.watched {
        let _ = writeln!(
            s,
            "  {} {:?}: {:.3} s ({:.1}% of a core, {} per request)",
            p.name,
            p.pids,
            p.cpu_seconds,
            p.percent_of_core,
            per_request(p.cpu_seconds_per_request)
        );
    }
    let _ = writeln!(
        s,
        "proxy /metrics: {}",
        measured(&r.proxy_metrics, |m| format!(
            "{} handshakes ({} resumed), {} requests, CPU {} s, {} per request",
            m.handshakes,
            m.resumed_handshakes,
            m.requests,
            m.cpu_seconds
                .map(|c| format!("{c:.3}"))
                .unwrap_or_else(|| "n/a".into()),
            per_request(m.cpu_seconds_per_request)
        ))
    );
}

/// Power, and whether every acknowledged point was stored.
fn outcome(s: &mut String, r: &RunResult) {
    let _ = writeln!(
        s,
        "power: {}",
        measured(&r.power, |p| format!(
            "{} {:.1} W mean, {:.1} J, {:.3} J per request",
            p.source,
            p.mean_watts,
            p.joules,
            if r.requests_ok > 0 {
                p.joules / r.requests_ok as f64
            } else {
                f64::NAN
            }
        ))
    );
    let _ = writeln!(
        s,
        "estimated power (a model, not a measurement): {}",
        measured(&r.power_estimate, |e| format!(
            "{:.1} W at {:.0} % of {} vCPUs ({} W idle to {} W full per vCPU: {})",
            e.mean_watts,
            e.utilisation_percent,
            e.vcpus,
            e.idle_watts_per_vcpu,
            e.full_watts_per_vcpu,
            e.model
        ))
    );
    let _ = writeln!(
        s,
        "stored: {}",
        measured(&r.verification, |v| format!(
            "collection count {} -> {}, acknowledged {} points: {}",
            v.count_before,
            v.count_after,
            v.points_acknowledged,
            if v.matches { "match" } else { "MISMATCH" }
        ))
    );
}

/// The co-located embedding load, when the run had one.
fn embeddings(s: &mut String, r: &RunResult) {
    if let Some(e) = &r.embed_live {
        let pace = e.pace();
        let latency = e
            .latency_ms
            .as_ref()
            .map(|l| format!(", call latency p50 {:.1} ms p99 {:.1} ms", l.p50, l.p99))
            .unwrap_or_default();
        let cpu = r
            .cpu
            .watched
            .iter()
            .find(|p| p.name == "embedder")
            .map(|p| format!(", embedder CPU {:.0} % of a core", p.percent_of_core))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "co-located embeddings ({pace}, {} texts a call): {:.1} embeddings/s, {} calls ok, {} failed{latency}{cpu}",
            e.batch, e.embeddings_per_second, e.ok, e.failed
        );
        if let Some(error) = &e.first_error {
            let _ = writeln!(s, "  first embedding failure: {error}");
        }
    }
}

fn per_request(v: Option<f64>) -> String {
    v.map(|v| format!("{:.3} ms CPU", v * 1000.0))
        .unwrap_or_else(|| "n/a".to_owned())
}

fn measured<T>(m: &Measured<T>, f: impl Fn(&T) -> String) -> String {
    match (&m.value, &m.reason) {
        (Some(v), _) => f(v),
        (None, Some(reason)) => format!("n/a ({reason})"),
        (None, None) => "n/a".to_owned(),
    }
}
