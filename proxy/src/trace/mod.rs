//! W3C trace context and OpenTelemetry spans, one per forwarded request (`[otel]`).
//!
//! - **Propagation**: a request's `traceparent` (and `tracestate`) go upstream. When spans
//!   are exported and the trace is sampled, the proxy's span becomes the upstream's parent
//!   (the header's parent-id is the proxy's span id); otherwise the header passes unchanged.
//!   A request without one starts a trace with probability `sample_ratio` (the proxy is where
//!   an ingestion request's trace can begin: Qdrant declined tracing in the server).
//! - **Spans**: with an `endpoint`, each sampled request's span (SERVER kind, the TLS
//!   handshake's provider, algorithm and resumption, the upstream's wait, the body sizes,
//!   the status) is queued for `export.rs`, which sends batches over OTLP; the queue is
//!   bounded and never waited on: a full queue drops the span and counts it.
//! - **Off** (no `[otel]`): nothing here runs; the access log still reads the trace id of a
//!   `traceparent` it logs.

mod export;

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue};
use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
use serde::{Deserialize, Serialize};

pub use export::{Exporter, OtlpProtocol};

/// The W3C header.
pub const TRACEPARENT: &str = "traceparent";

/// `[otel]`: trace context and span export.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtelConfig {
    /// Requests without a `traceparent` that start a sampled trace, 0 to 1.
    pub sample_ratio: f64,
    /// Where spans go (`http://host:4318/v1/traces` for OTLP/HTTP, `http://host:4317` for
    /// OTLP/gRPC); unset: none are exported (propagation and sampling still work).
    pub endpoint: Option<String>,
    /// `http` (protobuf over HTTP/1.1) or `grpc` (over HTTP/2 cleartext).
    pub protocol: OtlpProtocol,
    /// The resource's `service.name`.
    pub service_name: String,
    /// Spans waiting for export at most; more are dropped (counted).
    pub queue: usize,
    /// Spans per export request at most.
    pub batch: usize,
    /// How long an export may take before its spans count as failed.
    #[serde(with = "humantime_serde")]
    pub export_timeout: Duration,
}

impl Default for OtelConfig {
    fn default() -> Self {
        Self {
            sample_ratio: 0.0,
            endpoint: None,
            protocol: OtlpProtocol::Http,
            service_name: "vector-tls-proxy".to_owned(),
            queue: 2048,
            batch: 512,
            export_timeout: Duration::from_secs(5),
        }
    }
}

impl OtelConfig {
    /// Every problem, each naming its field.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            problems.push("otel.sample_ratio: must be between 0 and 1".to_owned());
        }
        if let Some(endpoint) = &self.endpoint {
            match endpoint.parse::<http::Uri>() {
                Ok(uri) if uri.scheme_str() == Some("http") && uri.authority().is_some() => {}
                _ => problems.push(format!(
                    "otel.endpoint: {endpoint:?} is not an http:// URL (the collector on the host or a sidecar; OTLP over TLS is not supported)"
                )),
            }
        }
        if self.queue == 0 || self.batch == 0 {
            problems.push("otel.queue and otel.batch must be at least 1".to_owned());
        }
        problems
    }

    /// Whether anything here is on.
    pub fn is_on(&self) -> bool {
        self.sample_ratio > 0.0 || self.endpoint.is_some()
    }
}

/// A `traceparent` as W3C Trace Context (level 1) writes it:
/// `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace.
    pub trace_id: TraceId,
    /// The caller's span.
    pub parent_id: SpanId,
    /// Bit 0: sampled.
    pub flags: u8,
}

impl TraceParent {
    /// Parses a header value; `None` for anything the specification says to ignore
    /// (another length, version ff, all-zero ids, non-hex).
    pub fn parse(value: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(value).ok()?;
        let mut parts = text.split('-');
        let (version, trace, parent, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        // Version 00 has exactly four fields; a later version may add more after them.
        if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
            return None;
        }
        if trace.len() != 32 || parent.len() != 16 || flags.len() != 2 {
            return None;
        }
        let trace_id = u128::from_str_radix(trace, 16).ok().filter(|t| *t != 0)?;
        let parent_id = u64::from_str_radix(parent, 16).ok().filter(|p| *p != 0)?;
        Some(Self {
            trace_id: TraceId::from(trace_id),
            parent_id: SpanId::from(parent_id),
            flags: u8::from_str_radix(flags, 16).ok()?,
        })
    }

    /// Whether the caller sampled the trace.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The header value with `span` as the parent.
    pub fn header_with_parent(&self, span: SpanId) -> HeaderValue {
        HeaderValue::from_str(&format!("00-{}-{}-{:02x}", self.trace_id, span, self.flags))
            .expect("hex digits are a valid header value")
    }
}

/// What the proxy does with a request's trace: the trace id (for the access log) and, when
/// the span is exported, the span being recorded.
#[derive(Debug)]
pub struct RequestTrace {
    /// The request's trace, as it went upstream.
    pub trace_id: TraceId,
    /// The proxy's span, when it is recorded.
    pub span: Option<Box<SpanRecord>>,
}

/// A span being recorded: set as the request goes, queued when its response ends.
#[derive(Debug)]
pub struct SpanRecord {
    pub(crate) trace_id: TraceId,
    pub(crate) span_id: SpanId,
    pub(crate) parent_id: Option<SpanId>,
    pub(crate) tracestate: Option<String>,
    pub(crate) name: String,
    pub(crate) start: SystemTime,
    pub(crate) end: Option<SystemTime>,
    /// `(key, value)` attributes (OpenTelemetry's semantic conventions where they exist).
    pub(crate) attributes: Vec<(&'static str, Attribute)>,
    /// An error status (a 5xx, a failed gRPC call), with its message.
    pub(crate) error: Option<String>,
}

/// An attribute's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Attribute {
    /// Text.
    Text(String),
    /// A number.
    Int(i64),
    /// A flag.
    Bool(bool),
    /// A measurement.
    Float(f64),
}

impl SpanRecord {
    /// Adds an attribute.
    pub fn set(&mut self, key: &'static str, value: Attribute) {
        self.attributes.push((key, value));
    }

    /// The node that answered and how long it took to its response head, in seconds.
    pub fn upstream_answered(&mut self, node: &http::uri::Authority, took: Duration) {
        self.set("upstream.address", Attribute::Text(node.to_string()));
        self.set("upstream.duration", Attribute::Float(took.as_secs_f64()));
    }

    /// The answer: its status (a 5xx, or a gRPC status other than OK, marks the span as an
    /// error, as OpenTelemetry's HTTP and gRPC conventions say for servers), and the body
    /// sizes each way.
    pub fn answered(
        &mut self,
        status: http::StatusCode,
        grpc_status: Option<&str>,
        bytes: (u64, u64),
    ) {
        self.set(
            "http.response.status_code",
            Attribute::Int(i64::from(status.as_u16())),
        );
        if let Some(code) = grpc_status {
            if let Ok(n) = code.parse::<i64>() {
                self.set("rpc.grpc.status_code", Attribute::Int(n));
            }
            // The codes OpenTelemetry's gRPC conventions count as a server's error; the
            // rest (NOT_FOUND, INVALID_ARGUMENT, ...) are the client's.
            if matches!(
                code,
                "2" | "4" | "12" | "13" | "14" | "15" | "none" | "unknown"
            ) {
                self.error = Some(format!("grpc-status {code}"));
            }
        } else if status.is_server_error() {
            self.error = Some(status.to_string());
        }
        self.set("http.request.body.size", Attribute::Int(bytes.0 as i64));
        self.set("http.response.body.size", Attribute::Int(bytes.1 as i64));
        self.end = Some(SystemTime::now());
    }
}

/// The process's trace settings in effect: sampling, and the exporter when spans go out.
pub struct Tracer {
    sample_ratio: f64,
    exporter: Option<Exporter>,
    ids: RandomIdGenerator,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("sample_ratio", &self.sample_ratio)
            .field("exports", &self.exporter.is_some())
            .finish()
    }
}

impl Tracer {
    /// `None` when `config` turns nothing on (the data path then skips all of this).
    pub fn new(config: &OtelConfig, metrics: &crate::metrics::Metrics) -> Option<Self> {
        config.is_on().then(|| Self {
            sample_ratio: config.sample_ratio,
            exporter: config
                .endpoint
                .as_ref()
                .map(|_| Exporter::start(config, metrics.otel_spans())),
            ids: RandomIdGenerator::default(),
        })
    }

    /// The request's trace: the client's `traceparent` (its span as the upstream's parent
    /// when the proxy's span is exported), or one started under the sampling ratio; the
    /// header is set for the upstream accordingly. `None` when the request has no trace.
    pub fn begin(
        &self,
        headers: &mut HeaderMap,
        name: impl FnOnce() -> String,
    ) -> Option<RequestTrace> {
        let incoming = headers
            .get(TRACEPARENT)
            .and_then(|v| TraceParent::parse(v.as_bytes()));
        let parent = match incoming {
            Some(p) => p,
            None if self.sample_ratio > 0.0 && self.roll() => TraceParent {
                trace_id: self.ids.new_trace_id(),
                parent_id: SpanId::INVALID,
                flags: 1,
            },
            None => return None,
        };
        let recorded = self.exporter.is_some() && parent.sampled();
        if !recorded {
            if incoming.is_none() {
                // Started here, not recorded: the upstream still gets the trace.
                let id = self.ids.new_span_id();
                headers.insert(TRACEPARENT, parent.header_with_parent(id));
            }
            return Some(RequestTrace {
                trace_id: parent.trace_id,
                span: None,
            });
        }
        let span_id = self.ids.new_span_id();
        headers.insert(TRACEPARENT, parent.header_with_parent(span_id));
        Some(RequestTrace {
            trace_id: parent.trace_id,
            span: Some(Box::new(SpanRecord {
                trace_id: parent.trace_id,
                span_id,
                parent_id: incoming.map(|p| p.parent_id),
                tracestate: headers
                    .get("tracestate")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned),
                name: name(),
                start: SystemTime::now(),
                end: None,
                attributes: Vec::with_capacity(16),
                error: None,
            })),
        })
    }

    /// Queues a finished span; never waits (a full queue drops it, counted).
    pub fn finish(&self, mut span: Box<SpanRecord>) {
        if let Some(exporter) = &self.exporter {
            span.end.get_or_insert_with(SystemTime::now);
            exporter.queue(span);
        }
    }

    fn roll(&self) -> bool {
        // The top 53 bits of a random span id, as a fraction of 1.
        let r = u64::from_be_bytes(self.ids.new_span_id().to_bytes()) >> 11;
        (r as f64) / ((1u64 << 53) as f64) < self.sample_ratio
    }
}

/// The trace id of a request's `traceparent`, for the access log of a proxy without `[otel]`.
pub fn trace_id_of(headers: &HeaderMap) -> Option<TraceId> {
    headers
        .get(TRACEPARENT)
        .and_then(|v| TraceParent::parse(v.as_bytes()))
        .map(|p| p.trace_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_is_read_as_w3c_says() {
        let p = TraceParent::parse(EXAMPLE.as_bytes()).unwrap();
        assert_eq!(p.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(p.parent_id.to_string(), "00f067aa0ba902b7");
        assert!(p.sampled());
        assert_eq!(
            p.header_with_parent(SpanId::from(0xabu64)),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00000000000000ab-01"
        );
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad.as_bytes()), None, "{bad}");
        }
        // A later version with more fields: read as version 00.
        assert!(TraceParent::parse(format!("01{}-more", &EXAMPLE[2..]).as_bytes()).is_some());
    }

    #[test]
    fn a_trace_is_started_under_the_ratio_and_the_clients_passes_on() {
        let metrics = crate::metrics::Metrics::new();
        let always = Tracer::new(
            &OtelConfig {
                sample_ratio: 1.0,
                ..OtelConfig::default()
            },
            &metrics,
        )
        .unwrap();
        let mut h = HeaderMap::new();
        let t = always.begin(&mut h, String::new).unwrap();
        assert!(t.span.is_none(), "nothing is exported");
        let sent = TraceParent::parse(h[TRACEPARENT].as_bytes()).unwrap();
        assert_eq!(sent.trace_id, t.trace_id);
        assert!(sent.sampled());
        // The client's header passes unchanged when no span is recorded.
        let mut h = HeaderMap::new();
        h.insert(TRACEPARENT, HeaderValue::from_static(EXAMPLE));
        always.begin(&mut h, String::new).unwrap();
        assert_eq!(h[TRACEPARENT], EXAMPLE);
        assert!(Tracer::new(&OtelConfig::default(), &metrics).is_none());
    }
}
