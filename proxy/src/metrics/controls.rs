//! The metrics of the operator controls: rate limits and the per-client connection cap
//! (`rate_limit/`), and span export (`trace/`).

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

use super::{Metrics, Registrar};

/// The key classes a rate limit counts refusals by (see `LimitKey::label`).
const KEY_CLASSES: [&str; 3] = ["api_key", "anonymous", "client"];
/// What a refused request went over.
const LIMIT_KINDS: [&str; 2] = ["requests", "bytes"];
/// The `limit` label of the per-client connection cap.
pub const CLIENT_CONNECTIONS_LIMIT: &str = "max_connections_per_client";

/// The families, registered once.
#[derive(Clone)]
pub(super) struct ControlVecs {
    rate_limited: IntCounterVec,
    rate_limit_keys: IntGaugeVec,
    rate_limit_overflow: IntCounterVec,
    otel_spans: IntCounterVec,
}

impl ControlVecs {
    pub(super) fn register(r: &Registrar<'_>) -> Self {
        Self {
            rate_limited: r.counter_vec(
                "proxy_rate_limited_total",
                "Requests (kind requests or bytes: which bucket was empty) and connections (kind connections: max_connections_per_client) refused by a listener's limit, by the limit's name and the key class (api_key, anonymous: an API-key limit's requests without a key, client).",
                &["listener", "limit", "key_class", "kind"],
            ),
            rate_limit_keys: r.gauge_vec(
                "proxy_rate_limit_keys",
                "Buckets a rate limit holds (one per API key or client address seen and not yet idle; for max_connections_per_client, the addresses with connections open).",
                &["listener", "limit"],
            ),
            rate_limit_overflow: r.counter_vec(
                "proxy_rate_limit_overflow_total",
                "Requests whose key found the limit's table full (max_keys) and shared its overflow bucket: a flood of new keys or addresses.",
                &["listener", "limit"],
            ),
            otel_spans: r.counter_vec(
                "proxy_otel_spans_total",
                "Request spans by what became of them: exported (the OTLP collector took them), dropped (the export queue was full), failed (the collector refused them or did not answer in time).",
                &["outcome"],
            ),
        }
    }
}

/// The counters of `proxy_otel_spans_total`: exported, dropped (queue full), failed (the
/// collector refused them or did not answer).
#[derive(Clone, Debug)]
pub struct SpanCounters {
    /// Accepted by the collector.
    pub exported: IntCounter,
    /// Not queued: the queue was full.
    pub dropped: IntCounter,
    /// Sent, and refused or unanswered.
    pub failed: IntCounter,
}

/// One rate limit's handles, resolved once.
#[derive(Clone, Debug)]
pub struct RateLimitMetrics {
    /// Buckets held.
    pub keys: IntGauge,
    /// Requests sent to the overflow bucket.
    pub overflow: IntCounter,
    /// Refusals by key class and kind, in the order of `KEY_CLASSES` x `LIMIT_KINDS`.
    refused: [IntCounter; 6],
}

impl RateLimitMetrics {
    /// The refusal counter of `class` and `kind` (labels of `KEY_CLASSES` and `LIMIT_KINDS`).
    pub fn refused(&self, class: &str, kind: &str) -> &IntCounter {
        let c = KEY_CLASSES.iter().position(|k| *k == class).unwrap_or(0);
        let k = LIMIT_KINDS.iter().position(|k| *k == kind).unwrap_or(0);
        &self.refused[c * LIMIT_KINDS.len() + k]
    }
}

impl Metrics {
    /// The counters of span export.
    pub fn otel_spans(&self) -> SpanCounters {
        let v = &self.controls.otel_spans;
        SpanCounters {
            exported: v.with_label_values(&["exported"]),
            dropped: v.with_label_values(&["dropped"]),
            failed: v.with_label_values(&["failed"]),
        }
    }

    /// Handles for listener `listener`'s rate limit `limit`, every series at zero.
    pub fn rate_limit(&self, listener: &str, limit: &str) -> RateLimitMetrics {
        let v = &self.controls;
        RateLimitMetrics {
            keys: v.rate_limit_keys.with_label_values(&[listener, limit]),
            overflow: v.rate_limit_overflow.with_label_values(&[listener, limit]),
            refused: std::array::from_fn(|i| {
                v.rate_limited.with_label_values(&[
                    listener,
                    limit,
                    KEY_CLASSES[i / LIMIT_KINDS.len()],
                    LIMIT_KINDS[i % LIMIT_KINDS.len()],
                ])
            }),
        }
    }

    /// The refusal counter and the tracked-address gauge of listener `listener`'s
    /// per-client connection cap.
    pub fn client_connections(&self, listener: &str) -> (IntCounter, IntGauge) {
        let v = &self.controls;
        (
            v.rate_limited.with_label_values(&[
                listener,
                CLIENT_CONNECTIONS_LIMIT,
                "client",
                "connections",
            ]),
            v.rate_limit_keys
                .with_label_values(&[listener, CLIENT_CONNECTIONS_LIMIT]),
        )
    }
}
