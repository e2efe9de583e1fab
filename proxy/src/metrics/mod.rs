//! The proxy's metrics: one registry, Prometheus names and units, bounded labels. The data
//! path records into it; the admin listener only renders it.
//!
//! Label values come from small fixed sets (listener names from the config, provider and
//! algorithm names, TLS versions, HTTP status codes, error kinds), never from client input.

use std::sync::Arc;

mod controls;
mod listener;
mod methods;
mod process;
mod qat;
mod routes;

pub use controls::{RateLimitMetrics, SpanCounters};
pub use listener::{grpc_status_label, GrpcOutcomes, ListenerMetrics, GRPC_STATUS_NONE};
pub use methods::{MethodHandles, MethodMetrics, MethodMetricsConfig, OTHER as METHOD_OTHER};
pub use qat::QatMetrics;

use process::ProcessMetrics;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// Handshakes on loopback take 0.3-10 ms in software; QAT and overloaded hosts push the
/// tail into hundreds of milliseconds.
const HANDSHAKE_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0, 2.0, 5.0,
];
/// UPSERT_100 requests take milliseconds to seconds depending on `wait` and load.
const REQUEST_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Why a TLS handshake failed (see `proxy_tls_handshake_failures_total`), a bounded set:
/// `timeout` (no complete handshake within `handshake_timeout`), `eof` (the client closed
/// or reset the connection mid-handshake), `not_tls` (its first bytes were no
/// ClientHello: plain HTTP, a scanner), `incompatible` (no protocol version, cipher suite,
/// group or signature scheme in common), `alert_received` (the client refused: usually
/// it does not trust the certificate), `client_certificate` (mTLS: missing or not
/// verified), `protocol` (malformed or out-of-order TLS), `offload` (the signing pool
/// failed), `other`.
pub const HANDSHAKE_FAILURE_REASONS: [&str; 9] = [
    "timeout",
    "eof",
    "not_tls",
    "incompatible",
    "alert_received",
    "client_certificate",
    "protocol",
    "offload",
    "other",
];

/// How clients open connections to `protocol = "postgres"` listeners (see `postgres.rs`):
/// the `opening` label of `proxy_postgres_openings_total`.
pub const POSTGRES_OPENINGS: [&str; 8] = [
    "ssl_request",
    "direct_tls",
    "cancel_request",
    "gssenc_refused",
    "plaintext_refused",
    "invalid",
    "eof",
    "direct_tls_without_alpn",
];

/// Why the proxy closes a connection itself (see `proxy_connection_closes_total`).
pub const CLOSE_REASONS: [&str; 6] = [
    "no_first_request",
    "idle",
    "stalled",
    "max_age",
    "reset_flood",
    "drain_deadline",
];

/// Why an upstream exchange failed (see `proxy_upstream_errors_total`).
pub const UPSTREAM_ERROR_KINDS: [&str; 4] = ["connect", "connect_timeout", "timeout", "protocol"];

/// The per-node upstream series; a listener's nodes come from its config, so the label
/// set is as bounded as the listeners.
#[derive(Clone)]
struct NodeVecs {
    requests: IntCounterVec,
    errors: IntCounterVec,
    in_flight: IntGaugeVec,
    healthy: IntGaugeVec,
    ejected: IntGaugeVec,
    ejections: IntCounterVec,
}

impl NodeVecs {
    fn register(r: &Registrar<'_>) -> Self {
        let labels = &["listener", "upstream"];
        Self {
            requests: r.counter_vec(
                "proxy_upstream_node_requests_total",
                "Requests (tcp mode: connections) sent to one upstream node, retries included.",
                labels,
            ),
            errors: r.counter_vec(
                "proxy_upstream_node_errors_total",
                "Failed exchanges with one upstream node, by kind (connect, connect_timeout, timeout, protocol).",
                &["listener", "upstream", "kind"],
            ),
            in_flight: r.gauge_vec(
                "proxy_upstream_node_requests_in_flight",
                "Requests forwarded to one upstream node whose response has not finished.",
                labels,
            ),
            healthy: r.gauge_vec(
                "proxy_upstream_node_healthy",
                "1 while the node's active health checks pass (or none run), 0 after unhealthy_threshold failures.",
                labels,
            ),
            ejected: r.gauge_vec(
                "proxy_upstream_node_ejected",
                "1 from a failed connect to the node until it answers again or passes a health check.",
                labels,
            ),
            ejections: r.counter_vec(
                "proxy_upstream_node_ejections_total",
                "Times the node was ejected for a backoff after a failed connect.",
                labels,
            ),
        }
    }
}

/// Creates metrics and registers them in one step. The definitions are static, so a
/// failure (a bad name, a name registered twice) is a programming error caught by the
/// first test that starts a proxy.
struct Registrar<'a>(&'a Registry);

impl Registrar<'_> {
    fn register<C: prometheus::core::Collector + Clone + 'static>(&self, c: C) -> C {
        self.0
            .register(Box::new(c.clone()))
            .expect("metric names are unique");
        c
    }

    fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.register(IntCounter::new(name, help).expect("static metric definition"))
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.register(IntGauge::new(name, help).expect("static metric definition"))
    }

    fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.register(
            IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition"),
        )
    }

    fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.register(
            IntGaugeVec::new(Opts::new(name, help), labels).expect("static metric definition"),
        )
    }

    fn histogram_vec(
        &self,
        name: &str,
        help: &str,
        buckets: Vec<f64>,
        labels: &[&str],
    ) -> HistogramVec {
        self.register(
            HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
                .expect("static metric definition"),
        )
    }
}

/// One upstream node's series.
#[derive(Clone)]
pub struct NodeMetrics {
    /// Requests sent to it.
    pub requests: IntCounter,
    /// Requests in flight to it.
    pub in_flight: IntGauge,
    /// Its health checks' verdict.
    pub healthy: IntGauge,
    /// Ejected after a failed connect.
    pub ejected: IntGauge,
    /// Ejections.
    pub ejections: IntCounter,
    errors: IntCounterVec,
    listener: String,
    upstream: String,
}

impl NodeMetrics {
    /// A failed exchange with the node; `kind` is one of [`UPSTREAM_ERROR_KINDS`].
    pub fn error(&self, kind: &'static str) {
        self.errors
            .with_label_values(&[self.listener.as_str(), &self.upstream, kind])
            .inc();
    }
}

/// Every metric the proxy exports.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    handshakes: IntCounterVec,
    handshake_failures: IntCounterVec,
    negotiated: IntCounterVec,
    handshake_seconds: HistogramVec,
    requests: IntCounterVec,
    request_seconds: HistogramVec,
    upstream_response_seconds: HistogramVec,
    upstream_errors: IntCounterVec,
    connection_errors: IntCounterVec,
    active_connections: IntGaugeVec,
    connections: IntCounterVec,
    received_bytes: IntCounterVec,
    sent_bytes: IntCounterVec,
    listener_info: IntGaugeVec,
    certificate_expiry: IntGaugeVec,
    tls_reloads: IntCounterVec,
    config_reloads: IntCounterVec,
    upgrades: IntCounterVec,
    connection_closes: IntCounterVec,
    postgres_openings: IntCounterVec,
    upstream_rejected: IntCounterVec,
    upstream_in_flight: IntGaugeVec,
    client_errors: IntCounterVec,
    buffer_budget: IntGauge,
    buffer_reserved: IntGauge,
    admin_refusals: IntCounterVec,
    log_suppressed: IntCounter,
    upstream_retries: IntCounterVec,
    nodes: NodeVecs,
    access_log: [IntCounter; 3],
    sni_certificates: IntGaugeVec,
    process: ProcessMetrics,
    controls: controls::ControlVecs,
    methods: methods::MethodVecs,
    /// Each listener's per-method metrics, kept across reloads (see [`Metrics::methods`]).
    methods_by_listener: Arc<
        std::sync::Mutex<
            std::collections::HashMap<String, std::sync::Weak<methods::MethodMetrics>>,
        >,
    >,
    qat: std::sync::Arc<std::sync::OnceLock<QatMetrics>>,
}

impl Metrics {
    /// Creates and registers every metric, plus the process collector
    /// (`process_cpu_seconds_total`, `process_resident_memory_bytes`, ...).
    ///
    /// It stays one function: it is the list of the proxy's metrics, one registration each
    /// (through `Registrar`'s helpers) with its name, help and labels, in the order
    /// docs/proxy.md lists them; the length is the number of metrics, not logic.
    pub fn new() -> Self {
        let registry = Registry::new();
        let r = Registrar(&registry);
        let handshakes = r.counter_vec(
            "proxy_tls_handshakes_total",
            "TLS handshakes by provider, certificate algorithm, TLS version, resumption and outcome.",
            &["listener", "provider", "algorithm", "tls_version", "resumed", "outcome"],
        );
        let handshake_failures = r.counter_vec(
            "proxy_tls_handshake_failures_total",
            "Failed TLS handshakes by reason (timeout, eof, not_tls, incompatible, \
                 alert_received, client_certificate, protocol, offload, other).",
            &["listener", "reason"],
        );
        let negotiated = r.counter_vec(
            "proxy_tls_negotiated_total",
            "Completed TLS handshakes by what they negotiated: protocol version, cipher \
                 suite and key-exchange group (none on a TLS 1.2 resumption).",
            &["listener", "tls_version", "cipher_suite", "kx_group"],
        );
        let handshake_seconds = r.histogram_vec(
            "proxy_tls_handshake_duration_seconds",
            "Time from accepting the TCP connection to a completed TLS handshake.",
            HANDSHAKE_BUCKETS.to_vec(),
            &["listener", "provider", "algorithm", "resumed"],
        );
        let requests = r.counter_vec(
            "proxy_http_requests_total",
            "Requests served, by listener, protocol (http1, h2, grpc), HTTP status and, \
                 for gRPC, the call's grpc-status (0-16 as sent; none: the response ended \
                 without one; unknown: not a status code; empty for other protocols).",
            &["listener", "protocol", "status", "grpc_status"],
        );
        let request_seconds = r.histogram_vec(
            "proxy_http_request_duration_seconds",
            "Time from receiving a request head to sending the response head.",
            REQUEST_BUCKETS.to_vec(),
            &["listener", "protocol"],
        );
        let upstream_response_seconds = r.histogram_vec(
            "proxy_upstream_response_duration_seconds",
            "Time from handing a request to the upstream (a new connection's set-up \
                 included) to its response head: the upstream's own share of \
                 proxy_http_request_duration_seconds.",
            REQUEST_BUCKETS.to_vec(),
            &["listener", "upstream_protocol"],
        );
        let upstream_errors = r.counter_vec(
            "proxy_upstream_errors_total",
            "Failed upstream exchanges by kind (connect, connect_timeout, timeout, protocol).",
            &["listener", "kind"],
        );
        let connection_errors = r.counter_vec(
            "proxy_connection_errors_total",
            "Client connections that ended in error, by kind (handshake, handshake_timeout, http, upstream_connect, io, proxy_protocol_untrusted, proxy_protocol_malformed, proxy_protocol_eof).",
            &["listener", "kind"],
        );
        let active_connections = r.gauge_vec(
            "proxy_active_connections",
            "Client connections currently open.",
            &["listener"],
        );
        let connections = r.counter_vec(
            "proxy_connections_total",
            "Client connections accepted.",
            &["listener"],
        );
        let received_bytes = r.counter_vec(
            "proxy_received_bytes_total",
            "Bytes received from clients on the wire (TLS records included).",
            &["listener"],
        );
        let sent_bytes = r.counter_vec(
            "proxy_sent_bytes_total",
            "Bytes sent to clients on the wire (TLS records included).",
            &["listener"],
        );
        let build_info = r.gauge_vec(
            "proxy_build_info",
            "Always 1; labels give the versions of the proxy and of the TLS libraries it \
                 runs with (OpenSSL as loaded at run time, the others as built).",
            &[
                "version",
                "rustls",
                "ring",
                "aws_lc_rs",
                "aws_lc",
                "rustls_openssl",
                "openssl",
            ],
        );
        build_info
            .with_label_values(&[
                env!("CARGO_PKG_VERSION"),
                env!("PROXY_DEP_RUSTLS"),
                env!("PROXY_DEP_RING"),
                env!("PROXY_DEP_AWS_LC_RS"),
                aws_lc_version(),
                env!("PROXY_DEP_RUSTLS_OPENSSL"),
                openssl::version::version(),
            ])
            .set(1);
        let listener_info = r.gauge_vec(
            "proxy_listener_info",
            "Always 1; labels describe each listener's provider, certificate and handshake placement.",
            &["listener", "provider", "algorithm", "mode", "handshake_offload"],
        );
        let certificate_expiry = r.gauge_vec(
            "proxy_tls_certificate_expiry_timestamp_seconds",
            "notAfter of each listener's certificate in effect, in seconds since the Unix epoch.",
            &["listener"],
        );
        let tls_reloads = r.counter_vec(
            "proxy_tls_reloads_total",
            "Certificate and key reloads (on SIGHUP, or when the files are replaced), by listener and outcome (ok, error: the previous configuration stays).",
            &["listener", "outcome"],
        );
        let config_reloads = r.counter_vec(
            "proxy_config_reloads_total",
            "Configuration reloads (SIGHUP, or the configuration file replaced), by outcome (ok; error: the file did not check or a new listener could not start, and the configuration in effect stays).",
            &["outcome"],
        );
        let upgrades = r.counter_vec(
            "proxy_upgrades_total",
            "In-place upgrades this process started on SIGUSR2, by outcome (ok: the new process serves and this one drains; failed: the new process could not start or was not ready, and this one keeps serving).",
            &["outcome"],
        );
        let connection_closes = r.counter_vec(
            "proxy_connection_closes_total",
            "Client connections the proxy closed on a deadline or a limit, by reason (no_first_request, idle, stalled, max_age; reset_flood: rapid reset, more than half of its streams reset by the client within 1 s of opening them; drain_deadline: still open after the drain timeout, closed hard).",
            &["listener", "reason"],
        );
        let postgres_openings = r.counter_vec(
            "proxy_postgres_openings_total",
            "How clients opened connections to protocol = \"postgres\" listeners: ssl_request (answered S), direct_tls (ALPN postgresql), cancel_request (passed on in clear), gssenc_refused (answered N), and those refused: plaintext_refused (answered SQLSTATE 28000), invalid (not PostgreSQL), eof, direct_tls_without_alpn.",
            &["listener", "opening"],
        );
        let upstream_rejected = r.counter_vec(
            "proxy_upstream_rejected_total",
            "Requests answered 503 (gRPC RESOURCE_EXHAUSTED) because the upstream already had limits.max_upstream_requests in flight.",
            &["listener"],
        );
        let upstream_in_flight = r.gauge_vec(
            "proxy_upstream_requests_in_flight",
            "Requests forwarded to the upstream whose response has not finished.",
            &["listener"],
        );
        let client_errors = r.counter_vec(
            "proxy_client_errors_total",
            "Requests refused or cut for the client's fault, by kind (body: a malformed or cut body; body_too_large: over limits.max_request_body_bytes; method: CONNECT).",
            &["listener", "kind"],
        );
        let buffer_budget = r.gauge(
            "proxy_request_buffer_budget_bytes",
            "limits.request_buffer_budget: request bytes the proxy may hold across all connections.",
        );
        let buffer_reserved = r.gauge(
            "proxy_request_buffer_reserved_bytes",
            "Request buffer set aside for every connection's and upstream request's floor plus the HTTP/2 receive windows granted above it.",
        );
        let admin_refusals = r.counter_vec(
            "proxy_admin_refusals_total",
            "Admin connections or requests refused, by reason (connections: over admin.max_connections; token: missing or wrong bearer token).",
            &["reason"],
        );
        let log_suppressed = r.counter(
            "proxy_log_lines_suppressed_total",
            "Log lines caused by remote peers that were dropped by the log rate limit.",
        );
        let upstream_retries = r.counter_vec(
            "proxy_upstream_retries_total",
            "Requests (tcp mode: connections) sent to another upstream node because connecting to the one picked first failed; nothing had been sent to it.",
            &["listener"],
        );
        let nodes = NodeVecs::register(&r);
        let sni_certificates = r.gauge_vec(
            "proxy_tls_sni_certificate_expiry_timestamp_seconds",
            "notAfter of each SNI certificate of a listener (by its server names and algorithm), in seconds since the Unix epoch.",
            &["listener", "server_names", "algorithm"],
        );
        let access_log = [
            ("proxy_access_log_lines_total", "Access log lines written."),
            ("proxy_access_log_dropped_total", "Access log lines dropped because the writer's queue was full (the log's disk slower than the traffic)."),
            ("proxy_access_log_write_errors_total", "Failed writes or reopens of the access log."),
        ]
        .map(|(name, help)| r.counter(name, help));

        let process = ProcessMetrics::register(&registry);
        let controls = controls::ControlVecs::register(&r);
        let methods = methods::MethodVecs::register(&r);
        Self {
            registry,
            handshakes,
            handshake_failures,
            negotiated,
            handshake_seconds,
            requests,
            request_seconds,
            upstream_response_seconds,
            upstream_errors,
            connection_errors,
            active_connections,
            connections,
            received_bytes,
            sent_bytes,
            listener_info,
            certificate_expiry,
            tls_reloads,
            config_reloads,
            upgrades,
            connection_closes,
            postgres_openings,
            upstream_rejected,
            upstream_in_flight,
            client_errors,
            buffer_budget,
            buffer_reserved,
            admin_refusals,
            log_suppressed,
            upstream_retries,
            nodes,
            access_log,
            sni_certificates,
            process,
            controls,
            methods,
            methods_by_listener: Default::default(),
            qat: Default::default(),
        }
    }

    /// Metric handles for one listener, with its fixed labels resolved once.
    pub fn listener(
        &self,
        listener: &str,
        provider: &'static str,
        algorithm: &'static str,
        mode: &'static str,
        offload: &'static str,
    ) -> ListenerMetrics {
        self.listener_info
            .with_label_values(&[listener, provider, algorithm, mode, offload])
            .set(1);
        // Make the error series exist at zero, so rate() works from the first scrape.
        for kind in UPSTREAM_ERROR_KINDS {
            self.upstream_errors.with_label_values(&[listener, kind]);
        }
        for outcome in ["ok", "error"] {
            self.tls_reloads.with_label_values(&[listener, outcome]);
        }
        for reason in CLOSE_REASONS {
            self.connection_closes
                .with_label_values(&[listener, reason]);
        }
        for kind in ["body", "method"] {
            self.client_errors.with_label_values(&[listener, kind]);
        }
        for reason in HANDSHAKE_FAILURE_REASONS {
            self.handshake_failures
                .with_label_values(&[listener, reason]);
        }
        ListenerMetrics {
            listener: listener.to_owned(),
            provider,
            algorithm,
            active: self.active_connections.with_label_values(&[listener]),
            accepted: self.connections.with_label_values(&[listener]),
            received: self.received_bytes.with_label_values(&[listener]),
            sent: self.sent_bytes.with_label_values(&[listener]),
            upstream_rejected: self.upstream_rejected.with_label_values(&[listener]),
            upstream_in_flight: self.upstream_in_flight.with_label_values(&[listener]),
            upstream_retries: self.upstream_retries.with_label_values(&[listener]),
            grpc: GrpcOutcomes {
                requests: self.requests.clone(),
                listener: Arc::from(listener),
            },
            metrics: self.clone(),
        }
    }

    /// Removes a listener's info series after its provider or certificate was switched,
    /// so `proxy_listener_info` shows only what is in effect.
    pub fn retire_listener_info(
        &self,
        listener: &str,
        provider: &str,
        algorithm: &str,
        mode: &str,
        offload: &str,
    ) {
        let _ = self
            .listener_info
            .remove_label_values(&[listener, provider, algorithm, mode, offload]);
    }

    /// The request buffer budget's gauges: the total is set here, the reserved gauge is
    /// kept by the data path's request buffer budget.
    pub fn buffer_budget(&self, total: u64) -> IntGauge {
        self.buffer_budget.set(total as i64);
        self.buffer_reserved.clone()
    }

    /// An admin connection or request refused.
    pub fn admin_refused(&self, reason: &'static str) {
        self.admin_refusals.with_label_values(&[reason]).inc();
    }

    /// The access log's counters: lines written, dropped, write errors.
    pub fn access_log(&self) -> [IntCounter; 3] {
        self.access_log.clone()
    }

    /// The counter of log lines dropped by the rate limit.
    pub fn log_suppressed(&self) -> IntCounter {
        self.log_suppressed.clone()
    }

    /// Records the notAfter of the certificate a listener now serves.
    pub fn set_certificate_expiry(&self, listener: &str, not_after: i64) {
        self.certificate_expiry
            .with_label_values(&[listener])
            .set(not_after);
    }

    /// Lists a listener's SNI certificates (replacing what was listed before).
    pub fn set_sni_certificates(&self, listener: &str, certs: &[(String, &'static str, i64)]) {
        // Old entries go: a switch may have changed an algorithm.
        let old: Vec<[String; 3]> = {
            use prometheus::core::Collector;
            let label = |m: &prometheus::proto::Metric, name: &str| {
                m.get_label()
                    .iter()
                    .find(|l| l.name() == name)
                    .map_or_else(String::new, |l| l.value().to_owned())
            };
            self.sni_certificates
                .collect()
                .iter()
                .flat_map(|f| f.get_metric().iter())
                .map(|m| {
                    [
                        label(m, "listener"),
                        label(m, "server_names"),
                        label(m, "algorithm"),
                    ]
                })
                .filter(|l| l[0] == listener)
                .collect()
        };
        for [l, names, algorithm] in old {
            let _ = self
                .sni_certificates
                .remove_label_values(&[&l, &names, &algorithm]);
        }
        for (names, algorithm, not_after) in certs {
            self.sni_certificates
                .with_label_values(&[listener, names.as_str(), algorithm])
                .set(*not_after);
        }
    }

    /// Counts a SIGHUP reload of a listener's certificate and key.
    pub fn tls_reloaded(&self, listener: &str, ok: bool) {
        self.tls_reloads
            .with_label_values(&[listener, if ok { "ok" } else { "error" }])
            .inc();
    }

    /// A configuration reload: applied, or refused with the old configuration kept.
    pub fn config_reloaded(&self, ok: bool) {
        self.config_reloads
            .with_label_values(&[if ok { "ok" } else { "error" }])
            .inc();
    }

    /// An in-place upgrade's outcome.
    pub fn upgraded(&self, ok: bool) {
        self.upgrades
            .with_label_values(&[if ok { "ok" } else { "failed" }])
            .inc();
    }

    /// Adds the QAT metrics (once; `state` is `None` when offload fell back to software).
    pub fn enable_qat(
        &self,
        state: Option<std::sync::Arc<crate::crypto::qat::QatState>>,
        telemetry_root: std::path::PathBuf,
        enable_telemetry: bool,
    ) {
        let _ = self.qat.set(QatMetrics::register(
            &self.registry,
            state,
            telemetry_root,
            enable_telemetry,
        ));
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> Vec<u8> {
        self.process.refresh();
        if let Some(q) = self.qat.get() {
            q.refresh();
        }
        let mut out = Vec::with_capacity(16 * 1024);
        // Encoding into a Vec cannot fail for well-formed metrics.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// AWS-LC's own version (e.g. `5.12.0`), as the linked aws-lc-sys reports it.
fn aws_lc_version() -> &'static str {
    std::ffi::CStr::from_bytes_with_nul(aws_lc_sys::AWSLC_VERSION_NUMBER_STRING)
        .ok()
        .and_then(|c| c.to_str().ok())
        .unwrap_or("unknown")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn exposition_has_help_and_labels() {
        let m = Metrics::new();
        let l = m.listener("rest", "ring", "rsa2048", "http", "inline");
        l.handshake_ok("TLSv1_3", false, Duration::from_millis(2));
        l.request("http1", http::StatusCode::OK, Duration::from_millis(3));
        let text = String::from_utf8(m.render()).unwrap();
        assert!(text.contains("# HELP proxy_tls_handshakes_total"), "{text}");
        // The build's versions, as the libraries in use report them.
        let build = text
            .lines()
            .find(|l| l.starts_with("proxy_build_info{"))
            .unwrap_or_else(|| panic!("no proxy_build_info:\n{text}"));
        assert!(build.contains(r#"rustls="0.23."#), "{build}");
        assert!(
            build.contains(r#"aws_lc="#) && !build.contains(r#"aws_lc="unknown""#),
            "{build}"
        );
        assert!(
            build.contains(&format!("openssl=\"{}\"", openssl::version::version())),
            "{build}"
        );
        assert!(build.ends_with(" 1"), "{build}");
        assert!(text.contains(
            r#"proxy_tls_handshakes_total{algorithm="rsa2048",listener="rest",outcome="ok",provider="ring",resumed="false",tls_version="TLSv1_3"} 1"#
        ), "{text}");
        assert!(
            text.contains(
                r#"proxy_http_requests_total{grpc_status="",listener="rest",protocol="http1",status="200"} 1"#
            ),
            "{text}"
        );
        let cpu: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_cpu_seconds_total "))
            .expect("cpu metric present")
            .parse()
            .unwrap();
        // A test process has used some CPU; the value must not be truncated to whole seconds.
        assert!(cpu > 0.0 && cpu.fract() != 0.0, "{cpu}");
        assert!(text.contains("process_resident_memory_bytes"), "{text}");
    }
}
