//! W3C trace context and OpenTelemetry spans: the proxy passes a client's `traceparent` on
//! with its own span as the upstream's parent, starts a trace for a request without one
//! under the sampling ratio, writes the trace id in the access log, and exports one span
//! per request over OTLP, HTTP and gRPC, to receivers built on the OpenTelemetry protocol's
//! own messages and service (opentelemetry-proto; no collector installs from the registries
//! these machines reach). A collector that is gone or slow costs requests nothing: the
//! spans are counted as failed or dropped.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::*;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

type Received = Arc<Mutex<Vec<ExportTraceServiceRequest>>>;

/// An OTLP/HTTP receiver (`POST /v1/traces`, protobuf) that answers after `delay`.
async fn http_receiver(delay: Duration) -> (SocketAddr, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Received::default();
    let store = received.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let store = store.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let store = store.clone();
                    async move {
                        assert_eq!(req.uri().path(), "/v1/traces");
                        assert_eq!(req.headers()["content-type"], "application/x-protobuf");
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        tokio::time::sleep(delay).await;
                        store
                            .lock()
                            .unwrap()
                            .push(ExportTraceServiceRequest::decode(body).unwrap());
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from(ExportTraceServiceResponse::default().encode_to_vec()),
                        )))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (addr, received)
}

/// An OTLP/gRPC receiver: the collector's TraceService, served by tonic.
struct GrpcReceiver(Received);

#[tonic::async_trait]
impl TraceService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

async fn grpc_receiver() -> (SocketAddr, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Received::default();
    let service = TraceServiceServer::new(GrpcReceiver(received.clone()));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (addr, received)
}

fn spans(received: &Received) -> Vec<(Span, String)> {
    received
        .lock()
        .unwrap()
        .iter()
        .flat_map(|r| r.resource_spans.iter())
        .flat_map(|rs| {
            let service = rs
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
                .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            rs.scope_spans
                .iter()
                .flat_map(|ss| ss.spans.iter())
                .map(move |s| (s.clone(), service.clone()))
        })
        .collect()
}

fn attribute(span: &Span, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref()?.value.clone())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn proxy_with_otel(upstream: &str, otel: &str, dir: &std::path::Path) -> ProxyProcess {
    let config = dir.join("proxy.toml");
    std::fs::write(&config, format!("[otel]\n{otel}\n")).unwrap();
    ProxyProcess::in_front_of(
        upstream,
        &[
            "--config",
            config.to_str().unwrap(),
            "--access-log",
            dir.join("access.log").to_str().unwrap(),
        ],
    )
}

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_PARENT: &str = "00f067aa0ba902b7";

/// Over OTLP/HTTP and OTLP/gRPC: a client's sampled trace goes upstream with the proxy's
/// span as the parent, and the span arrives with the client's span as its parent, the TLS
/// handshake, the upstream's wait and the sizes; a request without a trace starts one (ratio
/// 1); the access log carries both trace ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_the_collector_with_the_trace_passed_upstream() {
    let upstream = EchoUpstream::start();
    for grpc in [false, true] {
        let (addr, received) = if grpc {
            grpc_receiver().await
        } else {
            http_receiver(Duration::ZERO).await
        };
        let dir = temp_dir("otel");
        let endpoint = if grpc {
            format!("endpoint = \"http://{addr}\"\nprotocol = \"grpc\"")
        } else {
            format!("endpoint = \"http://{addr}/v1/traces\"")
        };
        let proxy = proxy_with_otel(
            &upstream.url(),
            &format!("{endpoint}\nsample_ratio = 1.0\nservice_name = \"ingest-proxy\""),
            &dir,
        );
        let cfg = client_config(&ClientOpts::default());
        let traced = request_bounded(
            proxy.addr,
            cfg.clone(),
            "PUT",
            "/collections/vectors/points",
            &[
                (
                    "traceparent",
                    &format!("00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"),
                ),
                ("tracestate", "vendor=abc"),
            ],
            Bytes::from(vec![b'x'; 5000]),
        )
        .await
        .unwrap();
        assert_eq!(traced.status, 200);
        let seen = traced.json();
        let sent: Vec<&str> = seen["headers"]["traceparent"]
            .as_str()
            .unwrap()
            .split('-')
            .collect();
        assert_eq!(sent[1], CLIENT_TRACE);
        assert_ne!(
            sent[2], CLIENT_PARENT,
            "the proxy's span is the upstream's parent"
        );
        assert_eq!(seen["headers"]["tracestate"], "vendor=abc");
        let fresh = request_bounded(proxy.addr, cfg, "GET", "/fresh", &[], Bytes::new())
            .await
            .unwrap();
        let started = fresh.json()["headers"]["traceparent"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            started.starts_with("00-") && started.ends_with("-01"),
            "{started}"
        );

        let all = eventually("two spans at the receiver", WAIT, || {
            let all = spans(&received);
            ready(all.len() >= 2, || format!("{} spans", all.len())).map(|_| all)
        });
        let (span, service) = all
            .iter()
            .find(|(s, _)| hex(&s.trace_id) == CLIENT_TRACE)
            .unwrap();
        eprintln!(
            "OTLP/{}: the span as the receiver got it: {span:?}",
            if grpc { "gRPC" } else { "HTTP" }
        );
        assert_eq!(service, "ingest-proxy");
        the_span_carries_the_request(span, sent[2]);
        let (fresh_span, _) = all
            .iter()
            .find(|(s, _)| hex(&s.trace_id) == started.split('-').nth(1).unwrap())
            .unwrap();
        assert!(
            fresh_span.parent_span_id.is_empty(),
            "the proxy started this trace"
        );
        // Counted once the collector's answer is in, which can be just after the receiver
        // stored the spans.
        proxy.wait_metric("proxy_otel_spans_total", &[("outcome", "exported")], 2.0);

        let log = eventually("the access log lines", WAIT, || {
            let log = std::fs::read_to_string(dir.join("access.log")).unwrap_or_default();
            ready(log.lines().count() >= 2, || log.clone()).map(|_| log)
        });
        let started_trace = started.split('-').nth(1).unwrap();
        for id in [CLIENT_TRACE, started_trace] {
            assert!(
                log.contains(&format!("\"trace_id\":\"{id}\"")),
                "{id}: {log}"
            );
        }
    }
}

/// The proxy's span of the client's traced upload: its place in the client's trace, its
/// name and kind, and the request's, the handshake's and the upstream's attributes.
fn the_span_carries_the_request(span: &Span, span_id: &str) {
    assert_eq!(hex(&span.parent_span_id), CLIENT_PARENT);
    assert_eq!(hex(&span.span_id), span_id);
    assert_eq!(span.trace_state, "vendor=abc");
    assert_eq!(span.name, "PUT /collections/{collection_name}/points");
    assert_eq!(span.kind, 2, "SERVER");
    assert!(span.end_time_unix_nano >= span.start_time_unix_nano);
    assert_eq!(
        attribute(span, "http.response.status_code"),
        Some(Value::IntValue(200))
    );
    assert_eq!(
        attribute(span, "http.request.body.size"),
        Some(Value::IntValue(5000))
    );
    assert_eq!(
        attribute(span, "vtp.tls.provider"),
        Some(Value::StringValue("aws-lc-rs".into()))
    );
    assert_eq!(
        attribute(span, "vtp.tls.algorithm"),
        Some(Value::StringValue("ecdsa-p256".into()))
    );
    assert_eq!(
        attribute(span, "tls.resumed"),
        Some(Value::BoolValue(false))
    );
    assert!(matches!(attribute(span, "upstream.duration"), Some(Value::DoubleValue(d)) if d > 0.0));
}

/// A collector that is gone, or too slow for the queue: every request is answered as fast
/// as without tracing, and the spans are counted as failed or dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_absent_collector_costs_requests_nothing() {
    let upstream = EchoUpstream::start();
    let gone = free_loopback_addr();
    let (slow, _) = http_receiver(Duration::from_secs(3)).await;
    for (endpoint, outcome) in [(gone, "failed"), (slow, "dropped")] {
        let dir = temp_dir("otel-slow");
        let proxy = proxy_with_otel(
            &upstream.url(),
            &format!("endpoint = \"http://{endpoint}/v1/traces\"\nsample_ratio = 1.0\nqueue = 2\nbatch = 1\nexport_timeout = \"10s\""),
            &dir,
        );
        let cfg = client_config(&ClientOpts::default());
        let started = Instant::now();
        for i in 0..20 {
            let a = request_bounded(
                proxy.addr,
                cfg.clone(),
                "GET",
                &format!("/r{i}"),
                &[],
                Bytes::new(),
            )
            .await
            .unwrap();
            assert_eq!(a.status, 200);
        }
        let took = started.elapsed();
        assert!(took < Duration::from_secs(15), "20 requests took {took:?}");
        eventually(&format!("spans counted as {outcome}"), WAIT, || {
            let n = proxy.metric("proxy_otel_spans_total", &[("outcome", outcome)]);
            ready(n >= 1.0, || proxy.metrics())
        });
    }
}
