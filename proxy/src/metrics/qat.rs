//! QAT metrics: whether offload is on, the asynchronous signer's work (signatures by
//! outcome, in flight, provider retries), and the device telemetry, read at scrape time.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use prometheus::{GaugeVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use crate::crypto::qat::{telemetry, QatState};

/// Gauges and counters for the QAT provider and devices.
pub struct QatMetrics {
    state: Option<Arc<QatState>>,
    telemetry_root: PathBuf,
    enable_telemetry: bool,
    signatures: IntCounterVec,
    exchanges: IntCounterVec,
    retries: IntCounter,
    batches: IntCounter,
    released: IntCounter,
    part_batches: IntCounter,
    in_flight: IntGauge,
    telemetry_available: IntGauge,
    device_utilization: GaugeVec,
    pke_utilization: GaugeVec,
    pke_utilization_peak: GaugeVec,
    latency: GaugeVec,
    bandwidth: GaugeVec,
    // One refresh at a time: counters are advanced by deltas.
    refresh: Mutex<()>,
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(g.clone()))
        .expect("metric names are unique");
    g
}

impl QatMetrics {
    /// Registers the QAT metrics. `state` is `None` when offload is off (software fallback).
    pub fn register(
        registry: &Registry,
        state: Option<Arc<QatState>>,
        telemetry_root: PathBuf,
        enable_telemetry: bool,
    ) -> Self {
        let r = super::Registrar(registry);
        let offload_active = r.gauge(
            "proxy_qat_offload_active",
            "1 when openssl-qat listeners sign through the QAT provider, 0 when they fell back to software.",
        );
        offload_active.set(i64::from(state.is_some()));
        let provider_info = r.gauge_vec(
            "proxy_qat_provider_info",
            "1 for the active QAT provider: mode qat_sw (QAT_Engine's multi-buffer software on \
                 AVX-512 IFMA), qat_hw (a QuickAssist device) or unknown, and the batch it is fed.",
            &["provider", "mode", "batch"],
        );
        if let Some(state) = &state {
            provider_info
                .with_label_values(&[
                    state.name.as_str(),
                    state.mode.as_str(),
                    &state.signer().batch().to_string(),
                ])
                .set(1);
        }
        let signatures = r.counter_vec(
                "proxy_qat_signatures_total",
                "Handshake signatures of openssl-qat listeners, by outcome: offloaded (the QAT provider \
                 paused the asynchronous job: batched or sent to the device), inline (the QAT provider \
                 signed without pausing: not offloaded), software (OpenSSL's default provider: too few \
                 handshakes were under way to fill a batch, or a part batch could not fill in time), failed.",
            &["outcome"],
        );
        let exchanges = r.counter_vec(
                "proxy_qat_x25519_keys_total",
                "X25519 key pairs of openssl-qat handshakes, by outcome: offloaded (generated ahead \
                 in a QAT provider batch and taken from the stock), software (the stock was empty), \
                 failed (a provider batch that produced no key).",
            &["outcome"],
        );
        let retries = r.counter(
            "proxy_qat_signature_retries_total",
            "Times a signature was resumed because the QAT provider had no free request slot.",
        );
        let batches = r.counter(
            "proxy_qat_batches_total",
            "Batches of handshake signatures submitted to the QAT provider at once (qat.batch each, \
             one each with QAT hardware's batch of 1).",
        );
        let released = r.counter(
            "proxy_qat_part_batches_released_total",
            "Part batches that could not fill within qat.batch_wait, or with the handshakes under \
             way, and were signed in software instead.",
        );
        let part_batches = r.counter(
            "proxy_qat_part_batches_submitted_total",
            "Part batches submitted to the QAT provider as they were, where signing the held \
             signatures in software would have cost more CPU than a whole batch (qat_sw computes \
             them when its poll timer fires).",
        );
        let in_flight = r.gauge(
            "proxy_qat_signatures_in_flight",
            "Signatures submitted to the asynchronous signer and not yet returned.",
        );
        let telemetry_available = r.gauge(
            "proxy_qat_telemetry_available",
            "1 when QAT device telemetry could be read at the last scrape.",
        );
        Self {
            state,
            telemetry_root,
            enable_telemetry,
            signatures,
            exchanges,
            retries,
            batches,
            released,
            part_batches,
            in_flight,
            telemetry_available,
            device_utilization: gauge_vec(
                registry,
                "proxy_qat_device_utilization_ratio",
                "Mean utilisation over every slice of the QAT device, 0 to 1.",
                &["device"],
            ),
            pke_utilization: gauge_vec(
                registry,
                "proxy_qat_pke_utilization_ratio",
                "Mean utilisation of the device's public-key engines, 0 to 1.",
                &["device"],
            ),
            pke_utilization_peak: gauge_vec(
                registry,
                "proxy_qat_pke_utilization_peak_ratio",
                "Utilisation of the busiest public-key engine, 0 to 1.",
                &["device"],
            ),
            latency: gauge_vec(
                registry,
                "proxy_qat_latency_seconds",
                "Average device latency: get-to-put (gp) and PCIe read (rd), seconds.",
                &["device", "kind"],
            ),
            bandwidth: gauge_vec(
                registry,
                "proxy_qat_pcie_bandwidth_bytes_per_second",
                "PCIe bandwidth into (in) and out of (out) the device, bytes per second.",
                &["device", "direction"],
            ),
            refresh: Mutex::new(()),
        }
    }

    /// Reads the provider counters and the device telemetry.
    pub fn refresh(&self) {
        let _guard = self.refresh.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(state) = &self.state {
            let advance = |c: &IntCounter, now: u64| {
                let before = c.get();
                if now > before {
                    c.inc_by(now - before);
                }
            };
            let stats = state.signer().stats();
            for (outcome, counter) in [
                ("offloaded", &stats.offloaded),
                ("inline", &stats.inline),
                ("software", &stats.software),
                ("failed", &stats.failed),
            ] {
                advance(
                    &self.signatures.with_label_values(&[outcome]),
                    counter.load(Ordering::Relaxed),
                );
            }
            for (outcome, counter) in [
                ("offloaded", &stats.keys_from_stock),
                ("software", &stats.keys_in_software),
                ("failed", &stats.keys_failed),
            ] {
                advance(
                    &self.exchanges.with_label_values(&[outcome]),
                    counter.load(Ordering::Relaxed),
                );
            }
            advance(&self.retries, stats.retries.load(Ordering::Relaxed));
            advance(&self.batches, stats.batches.load(Ordering::Relaxed));
            advance(&self.released, stats.released.load(Ordering::Relaxed));
            advance(
                &self.part_batches,
                stats.part_batches.load(Ordering::Relaxed),
            );
            self.in_flight.set(stats.in_flight.load(Ordering::Relaxed));
        }
        match telemetry::read_all(&self.telemetry_root, self.enable_telemetry) {
            Ok(devices) => {
                self.telemetry_available.set(1);
                for d in devices {
                    let dev = d.device.as_str();
                    let set = |g: &GaugeVec, labels: &[&str], v: Option<f64>| {
                        if let Some(v) = v {
                            g.with_label_values(labels).set(v);
                        }
                    };
                    // The driver reports percent; Prometheus' convention is a 0-1 ratio.
                    let ratio = |percent: Option<f64>| percent.map(|p| p / 100.0);
                    set(
                        &self.device_utilization,
                        &[dev],
                        ratio(d.device_utilization()),
                    );
                    set(&self.pke_utilization, &[dev], ratio(d.pke_utilization()));
                    set(
                        &self.pke_utilization_peak,
                        &[dev],
                        ratio(d.pke_utilization_peak()),
                    );
                    set(&self.latency, &[dev, "gp"], d.gp_latency_seconds());
                    set(&self.latency, &[dev, "rd"], d.read_latency_seconds());
                    set(
                        &self.bandwidth,
                        &[dev, "in"],
                        d.bandwidth_in_bytes_per_second(),
                    );
                    set(
                        &self.bandwidth,
                        &[dev, "out"],
                        d.bandwidth_out_bytes_per_second(),
                    );
                }
            }
            Err(_) => self.telemetry_available.set(0),
        }
    }
}
