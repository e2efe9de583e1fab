//! `loadgen merge`: one result from the results of loadgen processes that ran the same cell
//! side by side (one host or many, started together with `--start-at`).
//!
//! What adds up is added: requests, failures, bytes, handshakes, and the latency histograms
//! (so merged percentiles are those of the union of every sample, never an average of
//! percentiles). Rates are over the union of the measured windows, which must overlap.
//! CPU is summed per host: the load generators' own processes add up; a process several
//! of them watched on one host (the proxy) is counted once, then hosts add up. What every
//! process measured of one shared thing (the target's power, the proxy's counters) is
//! taken once, from the process whose window was longest, and not summed.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::result::*;

/// Reads run results written by `loadgen run --out`.
pub fn read(paths: &[impl AsRef<Path>]) -> Result<Vec<RunResult>> {
    paths
        .iter()
        .map(|p| {
            let p = p.as_ref();
            let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
            serde_json::from_slice(&bytes)
                .with_context(|| format!("{} is not a loadgen run result", p.display()))
        })
        .collect()
}

/// Merges results of one cell measured side by side; `names` label them in the result.
pub fn merge(results: &[RunResult], names: &[String]) -> Result<RunResult> {
    let Some(first) = results.first() else {
        bail!("nothing to merge");
    };
    same_cell(first, results, names)?;
    let (from, until, overlap) = side_by_side_window(results, names)?;
    let (latency, handshake) = added_histograms(results, names)?;

    let secs = until - from;
    let ok: u64 = results.iter().map(|r| r.requests_ok).sum();
    let failed: u64 = results.iter().map(|r| r.requests_failed).sum();
    let bytes: u64 = results
        .iter()
        .map(|r| {
            r.payload_bytes
                .unwrap_or((r.payload_mb_per_second * r.measured_seconds * 1e6) as u64)
        })
        .sum();
    let mut failures = BTreeMap::new();
    let mut failure_examples = BTreeMap::new();
    for r in results {
        for (k, v) in &r.failures {
            *failures.entry(k.clone()).or_insert(0) += v;
        }
        for (k, v) in &r.failure_examples {
            failure_examples
                .entry(k.clone())
                .or_insert_with(|| v.clone());
        }
    }
    // The process that watched the longest: its view of shared things is the one kept.
    let widest = results
        .iter()
        .max_by(|a, b| a.measured_seconds.total_cmp(&b.measured_seconds))
        .expect("one result");
    let mut warnings: Vec<String> = results
        .iter()
        .zip(names)
        .flat_map(|(r, name)| r.warnings.iter().map(move |w| format!("{name}: {w}")))
        .collect();
    if overlap < 0.9 {
        warnings.push(format!(
            "the measured windows overlap for only {:.0}% of their union: the processes were not started together, and the rates understate what they did side by side",
            overlap * 100.0
        ));
    }
    let rate = |n: f64| if secs > 0.0 { n / secs } else { 0.0 };
    let mut merged = first.clone();
    merged.started_at = results
        .iter()
        .map(|r| r.started_at.clone())
        .min()
        .unwrap_or_default();
    // Side-by-side processes of one cell run one configuration (checked above); the
    // files merged are in `merged_from`.
    merged.config = first.config.clone();
    merged.measured_seconds = secs;
    merged.requests_ok = ok;
    merged.requests_failed = failed;
    merged.failures = failures;
    merged.failure_examples = failure_examples;
    merged.warmup_requests = results.iter().map(|r| r.warmup_requests).sum();
    merged.requests_per_second = rate(ok as f64);
    merged.points_per_second = rate((ok * first.workload.points_per_request as u64) as f64);
    merged.payload_mb_per_second = rate(bytes as f64) / 1e6;
    merged.payload_bytes = Some(bytes);
    merged.latency_ms = Percentiles::from_us(&latency);
    merged.handshakes = HandshakeRecord {
        count: results.iter().map(|r| r.handshakes.count).sum(),
        resumed: results.iter().map(|r| r.handshakes.resumed).sum(),
        latency_ms: Percentiles::from_us(&handshake),
    };
    // Send lag is kept per process only.
    merged.schedule_lag_ms = None;
    merged.cpu = merge_cpu(results, ok);
    merged.power = widest.power.clone();
    merged.proxy_metrics = widest.proxy_metrics.clone();
    merged.verification = Measured::missing(
        "merged: each process counted the collection for its own requests; sum the stored points from the database",
    );
    merged.embed_live = None;
    merged.warnings = warnings;
    merged.interrupted = results.iter().any(|r| r.interrupted);
    merged.window = Some(MeasuredWindow {
        from_unix_s: from,
        until_unix_s: until,
    });
    merged.histograms = Some(Histograms::encode(&latency, &handshake));
    merged.merged_from = names.to_vec();
    let mut seconds: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for s in results.iter().flat_map(|r| &r.timeline) {
        let e = seconds.entry(s.at_unix_s).or_default();
        e.0 += s.ok;
        e.1 += s.failed;
    }
    merged.timeline = seconds
        .into_iter()
        .map(|(at_unix_s, (ok, failed))| SecondTally {
            at_unix_s,
            ok,
            failed,
        })
        .collect();
    merged.environment.host = {
        let mut hosts: Vec<&str> = results
            .iter()
            .map(|r| r.environment.host.as_str())
            .collect();
        hosts.sort_unstable();
        hosts.dedup();
        hosts.join(",")
    };
    Ok(merged)
}

/// Every result is of the same cell and workload as the first.
fn same_cell(first: &RunResult, results: &[RunResult], names: &[String]) -> Result<()> {
    for (r, name) in results.iter().zip(names) {
        let (a, b) = (&first.workload, &r.workload);
        if (a.protocol.as_str(), a.points_per_request, a.dim, a.wait)
            != (b.protocol.as_str(), b.points_per_request, b.dim, b.wait)
        {
            bail!(
                "{name}: another workload ({} {}x{}, wait {}) than the first ({} {}x{}, wait {}): not the same cell",
                b.protocol, b.points_per_request, b.dim, b.wait,
                a.protocol, a.points_per_request, a.dim, a.wait
            );
        }
        let cell = |r: &RunResult| {
            r.cell
                .as_ref()
                .map(|c| (c.provider.clone(), c.algorithm.clone()))
        };
        if cell(r) != cell(first) {
            bail!("{name}: another cell than the first");
        }
    }
    Ok(())
}

/// The union of the measured windows (from, until) and the share of it they all overlap;
/// windows that do not overlap at all were not measured side by side.
fn side_by_side_window(results: &[RunResult], names: &[String]) -> Result<(f64, f64, f64)> {
    let windows: Vec<MeasuredWindow> = results
        .iter()
        .zip(names)
        .map(|(r, name)| {
            r.window.with_context(|| {
                format!("{name}: no measured window (written by a loadgen before merge existed)")
            })
        })
        .collect::<Result<_>>()?;
    let from = windows
        .iter()
        .map(|w| w.from_unix_s)
        .fold(f64::INFINITY, f64::min);
    let until = windows.iter().map(|w| w.until_unix_s).fold(0.0, f64::max);
    let latest_start = windows.iter().map(|w| w.from_unix_s).fold(0.0, f64::max);
    let earliest_end = windows
        .iter()
        .map(|w| w.until_unix_s)
        .fold(f64::INFINITY, f64::min);
    if latest_start >= earliest_end {
        bail!(
            "the measured windows do not overlap (one ended {:.1} s before another started): these processes did not run side by side; start them with the same --start-at",
            latest_start - earliest_end
        );
    }
    let overlap = (earliest_end - latest_start) / (until - from);

    Ok((from, until, overlap))
}

/// The latency and handshake histograms of every result, added.
fn added_histograms(
    results: &[RunResult],
    names: &[String],
) -> Result<(hdrhistogram::Histogram<u64>, hdrhistogram::Histogram<u64>)> {
    let mut latency = None;
    let mut handshake = None;
    for (r, name) in results.iter().zip(names) {
        let h = r
            .histograms
            .as_ref()
            .with_context(|| format!("{name}: no histograms to merge"))?;
        for (text, into) in [
            (&h.latency_us, &mut latency),
            (&h.handshake_us, &mut handshake),
        ] {
            let decoded = decode_histogram(text).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            // A decoded histogram covers only its own range; the total grows to hold each.
            let total = match into {
                Some(total) => total,
                None => {
                    let mut h = hdrhistogram::Histogram::<u64>::new(decoded.sigfig())
                        .map_err(|e| anyhow::anyhow!("{name}: histogram: {e:?}"))?;
                    h.auto(true);
                    into.insert(h)
                }
            };
            total
                .add(&decoded)
                .map_err(|e| anyhow::anyhow!("{name}: histogram: {e:?}"))?;
        }
    }
    Ok((latency.expect("one result"), handshake.expect("one result")))
}

/// Loadgen processes add up; a process watched by several loadgens of one host is counted
/// once (the longest view); hosts add up.
fn merge_cpu(results: &[RunResult], ok: u64) -> CpuRecord {
    let per_request = |s: f64| (ok > 0).then(|| s / ok as f64);
    let mut loadgen = results[0].cpu.loadgen.clone();
    loadgen.pids = results
        .iter()
        .flat_map(|r| r.cpu.loadgen.pids.clone())
        .collect();
    loadgen.cpu_seconds = results.iter().map(|r| r.cpu.loadgen.cpu_seconds).sum();
    loadgen.percent_of_core = results.iter().map(|r| r.cpu.loadgen.percent_of_core).sum();
    loadgen.cpu_seconds_per_request = per_request(loadgen.cpu_seconds);
    // (host, name, pids) -> the longest view of that process.
    let mut seen: BTreeMap<(String, String, Vec<u32>), ProcessCpu> = BTreeMap::new();
    for r in results {
        for w in &r.cpu.watched {
            let key = (r.environment.host.clone(), w.name.clone(), w.pids.clone());
            let keep = seen
                .get(&key)
                .is_none_or(|prev| w.cpu_seconds > prev.cpu_seconds);
            if keep {
                seen.insert(key, w.clone());
            }
        }
    }
    let mut watched: BTreeMap<String, ProcessCpu> = BTreeMap::new();
    for ((_, name, _), w) in seen {
        match watched.get_mut(&name) {
            None => {
                watched.insert(name, w);
            }
            Some(total) => {
                total.pids.extend(w.pids);
                total.cpu_seconds += w.cpu_seconds;
                total.percent_of_core += w.percent_of_core;
            }
        }
    }
    let watched = watched
        .into_values()
        .map(|mut w| {
            w.cpu_seconds_per_request = per_request(w.cpu_seconds);
            w
        })
        .collect();
    let one_host = results
        .iter()
        .all(|r| r.environment.host == results[0].environment.host);
    let shared = |pick: fn(&RunResult) -> &Measured<f64>| {
        if one_host {
            // One host's utilisation, seen by every process: their mean.
            let values: Vec<f64> = results.iter().filter_map(|r| pick(r).value).collect();
            if values.len() == results.len() {
                return Measured::ok(values.iter().sum::<f64>() / values.len() as f64);
            }
        }
        Measured::missing("merged across hosts: utilisation is per host; see each result")
    };
    CpuRecord {
        system_utilisation_percent: shared(|r| &r.cpu.system_utilisation_percent),
        target_host_utilisation_percent: shared(|r| &r.cpu.target_host_utilisation_percent),
        loadgen,
        watched,
    }
}
