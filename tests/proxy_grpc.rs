//! gRPC through the proxy to a real tonic server over h2c: unary and server-streaming
//! calls, a non-OK status with its message intact, and UNAVAILABLE when the upstream is down.

use e2e::*;
use proxy::crypto::{CertAlgorithmName, ProviderName};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{health_check_response::ServingStatus, HealthCheckRequest};

/// A channel through the proxy's first listener.
fn channel(proxy: &ProxyProcess) -> tonic::transport::Channel {
    grpc_channel(proxy.addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_streaming_and_error_status_pass_through() {
    let upstream = GrpcUpstream::start();
    let proxy = ProxyProcess::start(
        &format!("http://{}", upstream.addr),
        ProviderName::AwsLcRs,
        CertAlgorithmName::EcdsaP256,
        &[],
    );
    let mut client = HealthClient::new(channel(&proxy));

    // Unary, OK.
    let resp = client
        .check(HealthCheckRequest {
            service: GRPC_SERVICE.to_owned(),
        })
        .await
        .expect("check through proxy");
    assert_eq!(resp.into_inner().status, ServingStatus::Serving as i32);

    // Unary, non-OK: code and message arrive intact (they travel in HTTP/2 trailers).
    let err = client
        .check(HealthCheckRequest {
            service: "no.such.Service".to_owned(),
        })
        .await
        .expect_err("unknown service must fail");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    assert_eq!(err.message(), "service not registered");

    // Server streaming: the first message of the watch stream arrives.
    let mut stream = client
        .watch(HealthCheckRequest {
            service: GRPC_SERVICE.to_owned(),
        })
        .await
        .expect("watch")
        .into_inner();
    let first = tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("stream message in time")
        .expect("stream ok")
        .expect("a message");
    assert_eq!(first.status, ServingStatus::Serving as i32);
    drop(stream);

    let m = proxy.metrics();
    let grpc = metric_value(
        &m,
        "proxy_http_requests_total",
        &[("protocol", "grpc"), ("status", "200")],
    )
    .unwrap_or(0.0);
    assert!(grpc >= 3.0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_is_unavailable() {
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let proxy = ProxyProcess::start(
        &format!("http://127.0.0.1:{closed_port}"),
        ProviderName::Ring,
        CertAlgorithmName::EcdsaP256,
        &[],
    );
    let mut client = HealthClient::new(channel(&proxy));
    let err = client
        .check(HealthCheckRequest {
            service: GRPC_SERVICE.to_owned(),
        })
        .await
        .expect_err("upstream is down");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(err.message().contains("unavailable"), "{}", err.message());
    assert!(
        !err.message().contains(&closed_port.to_string()),
        "grpc-message names no upstream address: {}",
        err.message()
    );
    let m = proxy.metrics();
    assert_eq!(
        metric_value(&m, "proxy_upstream_errors_total", &[("kind", "connect")]),
        Some(1.0),
        "{m}"
    );
}
