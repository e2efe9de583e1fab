//! A run's result assembled from what it measured (`read_out`), the collection's count
//! check (`verify`), and result files written whole (`write_json`).

use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;

use super::{Measurements, Prepared, RunArgs, RunPlan};
use crate::client::qdrant::Admin;
use crate::client::{Connector, Protocol};
use crate::driver::Mode;
use crate::probe;
use crate::result::*;

/// The result: figures derived from the measurements, warnings about what may have bounded
/// the run, and the configuration and environment it ran in.
pub(super) fn read_out(
    args: &RunArgs,
    plan: &RunPlan,
    prepared: &Prepared,
    m: Measurements,
) -> Result<RunResult> {
    let (target, protocol, mode) = (&plan.target, plan.protocol, plan.driver.mode);
    let proc_root = &plan.proc_root;
    let secs = m.outcome.elapsed.as_secs_f64();
    let rate = |n: f64| if secs > 0.0 { n / secs } else { 0.0 };
    let failed: u64 = m.outcome.failures.values().sum();
    let run_warnings = run_warnings(args, mode, &m, failed);
    let mut warnings = m.finished.warnings;
    warnings.extend(run_warnings);
    let (cpu_model, cores, kernel) = probe::cpu::machine_facts(proc_root);
    let power_estimate = estimate_power(&m.finished.cpu, cores, secs);
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
        workload: workload_record(args, protocol, prepared),
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
        power_estimate,
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
        timeline: m
            .outcome
            .per_second
            .iter()
            .enumerate()
            .map(|(i, (ok, failed))| SecondTally {
                at_unix_s: (m.measured_from + i as f64) as u64,
                ok: *ok,
                failed: *failed,
            })
            .collect(),
    };
    Ok(result)
}

/// What the run itself warns of: loadgen at its own CPU limit, a target that fell behind an
/// open loop's schedule, failures, a collection that did not grow as acknowledged, a stop.
fn run_warnings(args: &RunArgs, mode: Mode, m: &Measurements, failed: u64) -> Vec<String> {
    let mut warnings = Vec::new();
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
    warnings
}

/// The workload as the result records it.
fn workload_record(args: &RunArgs, protocol: Protocol, prepared: &Prepared) -> WorkloadRecord {
    let (vectors, workload) = (&prepared.vectors, &prepared.workload);
    WorkloadRecord {
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
    }
}

/// This host's power estimated from its measured utilisation ([`crate::power_estimate`]), where
/// the proxy ran on it: with the utilisation of another host (remote mode) but not its
/// vCPUs, no estimate is made.
fn estimate_power(
    cpu: &CpuRecord,
    cores: usize,
    secs: f64,
) -> Measured<crate::power_estimate::PowerEstimate> {
    if cpu.target_host_utilisation_percent.value.is_some() {
        return Measured::missing(
            "the proxy ran on another host: its vCPUs are not known here, so no estimate",
        );
    }
    match cpu.system_utilisation_percent.value {
        Some(u) => Measured::ok(crate::power_estimate::CCF_AWS_AVERAGE.estimate(cores, u, secs)),
        None => Measured::missing(
            cpu.system_utilisation_percent
                .reason
                .clone()
                .unwrap_or_else(|| "no CPU utilisation measured".to_owned()),
        ),
    }
}

pub(super) async fn verify(
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

/// Writes `value` as pretty JSON to `path`, its folder created, through a temporary file
/// renamed into place (a reader never sees half a result).
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
