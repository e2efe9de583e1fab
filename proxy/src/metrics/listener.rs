//! One listener's view of the registry ([`ListenerMetrics`]), which its connections and
//! requests record into, and a gRPC call's outcome counter ([`GrpcOutcomes`]), which the
//! call's response body carries until its grpc-status arrives.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{IntCounter, IntCounterVec, IntGauge};

use super::{Metrics, NodeMetrics, UPSTREAM_ERROR_KINDS};

/// One listener's view of the metrics.
#[derive(Clone)]
pub struct ListenerMetrics {
    pub(super) listener: String,
    pub(super) provider: &'static str,
    pub(super) algorithm: &'static str,
    /// Open connections.
    pub active: IntGauge,
    /// Accepted connections.
    pub accepted: IntCounter,
    /// Bytes from clients.
    pub received: IntCounter,
    /// Bytes to clients.
    pub sent: IntCounter,
    /// Requests refused at the upstream cap.
    pub upstream_rejected: IntCounter,
    /// Requests in flight to the upstream.
    pub upstream_in_flight: IntGauge,
    /// Requests sent to another node after a failed connect.
    pub upstream_retries: IntCounter,
    pub(super) grpc: GrpcOutcomes,
    pub(super) metrics: Metrics,
}

/// gRPC calls counted in `proxy_http_requests_total` by their grpc-status, which arrives
/// in the response's trailers (or in its head, for a trailers-only answer): the HTTP
/// status of a gRPC call is 200 whether it succeeded or not. Cloning it allocates nothing,
/// so every call's response body can carry one.
#[derive(Clone, Debug)]
pub struct GrpcOutcomes {
    pub(super) requests: IntCounterVec,
    pub(super) listener: Arc<str>,
}

impl GrpcOutcomes {
    /// A gRPC call that ended with `grpc_status` (a label of [`grpc_status_label`]).
    pub fn count(&self, status: http::StatusCode, grpc_status: &'static str) {
        self.requests
            .with_label_values(&[&self.listener, "grpc", status.as_str(), grpc_status])
            .inc();
    }
}

/// The label of a `grpc-status` value: the code as sent for the 17 codes gRPC defines,
/// `unknown` for anything else (bounded, whatever an upstream sends).
pub fn grpc_status_label(value: &[u8]) -> &'static str {
    const CODES: [&str; 17] = [
        "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
    ];
    CODES
        .iter()
        .find(|c| c.as_bytes() == value)
        .copied()
        .unwrap_or("unknown")
}

/// The label of a gRPC call whose response ended without a grpc-status.
pub const GRPC_STATUS_NONE: &str = "none";

impl ListenerMetrics {
    /// The listener's name.
    pub fn name(&self) -> &str {
        &self.listener
    }

    /// The default certificate's algorithm.
    pub fn algorithm(&self) -> &'static str {
        self.algorithm
    }

    /// A completed handshake.
    pub fn handshake_ok(&self, tls_version: &'static str, resumed: bool, took: Duration) {
        let resumed = if resumed { "true" } else { "false" };
        let m = &self.metrics;
        m.handshakes
            .with_label_values(&[
                &self.listener,
                self.provider,
                self.algorithm,
                tls_version,
                resumed,
                "ok",
            ])
            .inc();
        m.handshake_seconds
            .with_label_values(&[&self.listener, self.provider, self.algorithm, resumed])
            .observe(took.as_secs_f64());
    }

    /// What a completed handshake negotiated.
    pub fn negotiated(
        &self,
        tls_version: &'static str,
        cipher_suite: &'static str,
        kx_group: &'static str,
    ) {
        self.metrics
            .negotiated
            .with_label_values(&[&self.listener, tls_version, cipher_suite, kx_group])
            .inc();
    }

    /// A handshake that failed, and why (one of [`HANDSHAKE_FAILURE_REASONS`](super::HANDSHAKE_FAILURE_REASONS)); its
    /// `outcome` in `proxy_tls_handshakes_total` is `timeout` for a timeout, `error`
    /// otherwise.
    pub fn handshake_failed_because(&self, reason: &'static str) {
        self.metrics
            .handshake_failures
            .with_label_values(&[&self.listener, reason])
            .inc();
        self.handshake_failed(if reason == "timeout" {
            "timeout"
        } else {
            "error"
        });
    }

    /// A handshake that failed (`outcome` is `error` or `timeout`).
    fn handshake_failed(&self, outcome: &'static str) {
        self.metrics
            .handshakes
            .with_label_values(&[
                &self.listener,
                self.provider,
                self.algorithm,
                "unknown",
                "false",
                outcome,
            ])
            .inc();
    }

    /// A client connection that ended in error.
    pub fn connection_error(&self, kind: &'static str) {
        self.metrics
            .connection_errors
            .with_label_values(&[&self.listener, kind])
            .inc();
    }

    /// A request whose response head was sent: its time to the head, and its count (for
    /// gRPC calls, once their grpc-status is known: [`ListenerMetrics::grpc_outcomes`]).
    pub fn request(&self, protocol: &'static str, status: http::StatusCode, took: Duration) {
        let m = &self.metrics;
        if protocol != "grpc" {
            m.requests
                .with_label_values(&[&self.listener, protocol, status.as_str(), ""])
                .inc();
        }
        m.request_seconds
            .with_label_values(&[&self.listener, protocol])
            .observe(took.as_secs_f64());
    }

    /// The upstream's answer to a forwarded request (`upstream_protocol`: http1 or h2c).
    pub fn upstream_response(&self, upstream_protocol: &'static str, took: Duration) {
        self.metrics
            .upstream_response_seconds
            .with_label_values(&[&self.listener, upstream_protocol])
            .observe(took.as_secs_f64());
    }

    /// Where this listener's gRPC calls are counted by their grpc-status.
    pub fn grpc_outcomes(&self) -> &GrpcOutcomes {
        &self.grpc
    }

    /// A connection the proxy closed on a deadline or limit; `reason` is one of
    /// [`CLOSE_REASONS`](super::CLOSE_REASONS).
    pub fn connection_closed(&self, reason: &'static str) {
        self.metrics
            .connection_closes
            .with_label_values(&[&self.listener, reason])
            .inc();
    }

    /// How a client opened a connection to a PostgreSQL listener (a label of
    /// [`POSTGRES_OPENINGS`](super::POSTGRES_OPENINGS)).
    pub(crate) fn postgres_opening(&self, opening: &'static str) {
        self.metrics
            .postgres_openings
            .with_label_values(&[&self.listener, opening])
            .inc();
    }

    /// Makes every `proxy_postgres_openings_total` series of this listener exist at zero.
    pub(crate) fn postgres_openings_at_zero(&self) {
        for opening in super::POSTGRES_OPENINGS {
            self.metrics
                .postgres_openings
                .with_label_values(&[&self.listener, opening]);
        }
    }

    /// A request refused or cut for the client's fault.
    pub fn client_error(&self, kind: &'static str) {
        self.metrics
            .client_errors
            .with_label_values(&[&self.listener, kind])
            .inc();
    }

    /// Metric handles for one of the listener's upstream nodes (`host:port`).
    pub fn node(&self, upstream: &str) -> NodeMetrics {
        let v = &self.metrics.nodes;
        let labels = [self.listener.as_str(), upstream];
        for kind in UPSTREAM_ERROR_KINDS {
            v.errors.with_label_values(&[labels[0], upstream, kind]);
        }
        NodeMetrics {
            requests: v.requests.with_label_values(&labels),
            in_flight: v.in_flight.with_label_values(&labels),
            healthy: v.healthy.with_label_values(&labels),
            ejected: v.ejected.with_label_values(&labels),
            ejections: v.ejections.with_label_values(&labels),
            errors: v.errors.clone(),
            listener: self.listener.clone(),
            upstream: upstream.to_owned(),
        }
    }

    /// An upstream exchange that failed.
    pub fn upstream_error(&self, kind: &'static str) {
        self.metrics
            .upstream_errors
            .with_label_values(&[&self.listener, kind])
            .inc();
    }
}
