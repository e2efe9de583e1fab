//! Spans sent to an OpenTelemetry collector over OTLP (HTTP/1.1 protobuf, or gRPC over
//! h2c), from a bounded queue by one task: requests only `try_send` into the queue, so a
//! slow or absent collector costs them nothing; what does not fit is dropped and counted
//! (`proxy_otel_spans_total`). Written here rather than with opentelemetry-otlp's
//! exporter, whose batch processor drops spans without a count an operator can alert on.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use http::{header, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span, status, ResourceSpans, ScopeSpans, Span, Status,
};
use prometheus::IntCounter;
use prost::Message;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::{Attribute, OtelConfig, SpanRecord};
use crate::metrics::SpanCounters;

/// How spans travel to the collector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OtlpProtocol {
    /// `POST` of the protobuf to the endpoint's path (OTLP/HTTP, port 4318, `/v1/traces`).
    #[default]
    Http,
    /// The `TraceService/Export` call over HTTP/2 cleartext (OTLP/gRPC, port 4317).
    Grpc,
}

/// How long the exporter gathers spans before sending what it has.
const BATCH_WAIT: Duration = Duration::from_secs(1);
const GRPC_EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// The queue's sending end.
pub struct Exporter {
    queue: mpsc::Sender<Box<SpanRecord>>,
    dropped: IntCounter,
}

impl Exporter {
    /// Starts the exporting task on the current runtime.
    pub(super) fn start(config: &OtelConfig, counters: SpanCounters) -> Self {
        let (queue, spans) = mpsc::channel(config.queue);
        let endpoint: Uri = config
            .endpoint
            .as_deref()
            .unwrap_or_default()
            .parse()
            .expect("checked by the plan");
        let dropped = counters.dropped.clone();
        tokio::spawn(export(
            spans,
            Collector::new(endpoint, config.protocol),
            Batching {
                service_name: config.service_name.clone(),
                batch: config.batch,
                timeout: config.export_timeout,
            },
            counters,
        ));
        Self { queue, dropped }
    }

    /// Queues `span`, or drops it (counted) when the queue is full.
    pub(super) fn queue(&self, span: Box<SpanRecord>) {
        if self.queue.try_send(span).is_err() {
            self.dropped.inc();
        }
    }
}

struct Batching {
    service_name: String,
    batch: usize,
    timeout: Duration,
}

/// The collector's address and the client that reaches it.
struct Collector {
    endpoint: Uri,
    protocol: OtlpProtocol,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Collector {
    fn new(endpoint: Uri, protocol: OtlpProtocol) -> Self {
        let mut builder = Client::builder(TokioExecutor::new());
        if protocol == OtlpProtocol::Grpc {
            builder.http2_only(true);
        }
        Self {
            endpoint,
            protocol,
            client: builder.build(HttpConnector::new()),
        }
    }

    /// Sends one export request; `Err` says why it did not take it.
    async fn send(&self, message: &ExportTraceServiceRequest) -> Result<(), String> {
        let encoded = message.encode_to_vec();
        let (uri, content_type, body) = match self.protocol {
            OtlpProtocol::Http => (
                self.endpoint.clone(),
                "application/x-protobuf",
                Bytes::from(encoded),
            ),
            OtlpProtocol::Grpc => {
                let mut framed = BytesMut::with_capacity(5 + encoded.len());
                framed.put_u8(0);
                framed.put_u32(encoded.len() as u32);
                framed.extend_from_slice(&encoded);
                let uri = Uri::builder()
                    .scheme("http")
                    .authority(self.endpoint.authority().expect("checked").clone())
                    .path_and_query(GRPC_EXPORT_PATH)
                    .build()
                    .map_err(|e| e.to_string())?;
                (uri, "application/grpc", framed.freeze())
            }
        };
        let mut request = Request::post(uri).header(header::CONTENT_TYPE, content_type);
        if self.protocol == OtlpProtocol::Grpc {
            request = request.header("te", "trailers");
        }
        let request = request.body(Full::new(body)).map_err(|e| e.to_string())?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let head_grpc = response.headers().get("grpc-status").cloned();
        let collected = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("the collector answered {status}"));
        }
        if self.protocol == OtlpProtocol::Grpc {
            let grpc_status = head_grpc.or_else(|| {
                collected
                    .trailers()
                    .and_then(|t| t.get("grpc-status").cloned())
            });
            if grpc_status.as_ref().map(|v| v.as_bytes()) != Some(b"0") {
                return Err(format!(
                    "the collector answered grpc-status {grpc_status:?}"
                ));
            }
        }
        Ok(())
    }
}

/// The exporting task: gathers spans for up to a second or a batch, sends them, counts
/// what became of them; ends when every sender is gone.
async fn export(
    mut spans: mpsc::Receiver<Box<SpanRecord>>,
    collector: Collector,
    batching: Batching,
    counters: SpanCounters,
) {
    let mut batch = Vec::with_capacity(batching.batch);
    while let Some(first) = spans.recv().await {
        batch.push(first);
        let deadline = tokio::time::Instant::now() + BATCH_WAIT;
        while batch.len() < batching.batch {
            match tokio::time::timeout_at(deadline, spans.recv()).await {
                Ok(Some(span)) => batch.push(span),
                _ => break,
            }
        }
        let message = encode(&batch, &batching.service_name);
        let n = batch.len() as u64;
        batch.clear();
        match tokio::time::timeout(batching.timeout, collector.send(&message)).await {
            Ok(Ok(())) => counters.exported.inc_by(n),
            Ok(Err(e)) => {
                counters.failed.inc_by(n);
                crate::peer_warn!(endpoint = %collector.endpoint, error = %e, spans = n, "span export failed");
            }
            Err(_) => {
                counters.failed.inc_by(n);
                crate::peer_warn!(endpoint = %collector.endpoint, timeout = ?batching.timeout, spans = n, "span export timed out");
            }
        }
    }
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn key_value(key: &str, value: &Attribute) -> KeyValue {
    let value = match value {
        Attribute::Text(s) => any_value::Value::StringValue(s.clone()),
        Attribute::Int(i) => any_value::Value::IntValue(*i),
        Attribute::Bool(b) => any_value::Value::BoolValue(*b),
        Attribute::Float(f) => any_value::Value::DoubleValue(*f),
    };
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

/// The OTLP message of `spans`, under one resource (`service.name`) and scope.
pub(super) fn encode(spans: &[Box<SpanRecord>], service_name: &str) -> ExportTraceServiceRequest {
    let spans = spans
        .iter()
        .map(|s| Span {
            trace_id: s.trace_id.to_bytes().to_vec(),
            span_id: s.span_id.to_bytes().to_vec(),
            trace_state: s.tracestate.clone().unwrap_or_default(),
            parent_span_id: s
                .parent_id
                .map(|p| p.to_bytes().to_vec())
                .unwrap_or_default(),
            flags: 1,
            name: s.name.clone(),
            kind: span::SpanKind::Server as i32,
            start_time_unix_nano: unix_nanos(s.start),
            end_time_unix_nano: unix_nanos(s.end.unwrap_or(s.start)),
            attributes: s.attributes.iter().map(|(k, v)| key_value(k, v)).collect(),
            status: Some(match &s.error {
                Some(message) => Status {
                    message: message.clone(),
                    code: status::StatusCode::Error as i32,
                },
                None => Status::default(),
            }),
            ..Default::default()
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    key_value("service.name", &Attribute::Text(service_name.to_owned())),
                    key_value(
                        "service.version",
                        &Attribute::Text(env!("CARGO_PKG_VERSION").to_owned()),
                    ),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "vector-tls-proxy".to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..Default::default()
                }),
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}
