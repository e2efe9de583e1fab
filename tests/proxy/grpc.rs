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

    // gRPC calls are counted when they end (their grpc-status is in the trailers), so
    // the cancelled watch counts once the proxy has seen the cancellation.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let m = proxy.metrics();
        let grpc = metric_sum(
            &m,
            "proxy_http_requests_total",
            &[("protocol", "grpc"), ("status", "200")],
        );
        if grpc >= 3.0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{m}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A gRPC call answers HTTP 200 whether it succeeded or not: the proxy counts and logs it
/// by the grpc-status of its trailers, or of its head for a trailers-only answer (how
/// Qdrant's and tonic's errors arrive), so a rejected upsert is visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_are_counted_and_logged_by_their_grpc_status() {
    use qdrant_client::qdrant::collections_client::CollectionsClient;
    use qdrant_client::qdrant::{GetCollectionInfoRequest, ListCollectionsRequest};
    let eq = EmbeddedQdrant::start(&temp_dir("grpc-outcomes"));
    let log = temp_dir("grpc-outcomes-log").join("access.log");
    let proxy = ProxyProcess::start(
        &format!("http://{}", eq.grpc),
        ProviderName::AwsLcRs,
        CertAlgorithmName::EcdsaP256,
        &[
            "--upstream-protocol",
            "h2c",
            "--access-log",
            log.to_str().unwrap(),
        ],
    );
    let mut client = CollectionsClient::new(channel(&proxy));
    client
        .list(ListCollectionsRequest {})
        .await
        .expect("list collections");
    let err = client
        .get(GetCollectionInfoRequest {
            collection_name: "missing".into(),
        })
        .await
        .expect_err("no such collection");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err}");
    let ok = [
        ("protocol", "grpc"),
        ("status", "200"),
        ("grpc_status", "0"),
    ];
    let not_found = [
        ("protocol", "grpc"),
        ("status", "200"),
        ("grpc_status", "5"),
    ];
    proxy.wait_metric("proxy_http_requests_total", &ok, 1.0);
    proxy.wait_metric("proxy_http_requests_total", &not_found, 1.0);
    // The access log says the same, line by line.
    let deadline = std::time::Instant::now() + WAIT;
    let lines = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        if lines.len() >= 2 || std::time::Instant::now() > deadline {
            break lines;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let status_of = |path: &str| {
        lines
            .iter()
            .find(|l| l["path"] == path)
            .map(|l| (l["status"].clone(), l["grpc_status"].clone()))
    };
    assert_eq!(
        status_of("/qdrant.Collections/List"),
        Some((200.into(), "0".into())),
        "{lines:?}"
    );
    assert_eq!(
        status_of("/qdrant.Collections/Get"),
        Some((200.into(), "5".into())),
        "{lines:?}"
    );
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

/// A gRPC upsert over the proxy's body limit, sent to a real gRPC upstream over h2c, is
/// answered RESOURCE_EXHAUSTED naming the setting to raise (not UNAVAILABLE, which gRPC
/// clients retry: hyper's HTTP/2 client resets the stream on the body's error and reports
/// only its own reset), counted as the client's error and not the upstream's; a
/// gRPC body has no length, so the limit trips while it streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_grpc_upsert_is_resource_exhausted_not_unavailable() {
    use qdrant_client::qdrant::points_client::PointsClient;
    use qdrant_client::qdrant::{PointStruct, UpsertPointsBuilder};
    use qdrant_client::Payload;
    let eq = EmbeddedQdrant::start(&temp_dir("grpc-oversized"));
    create_collection(eq.rest, "big", 1024);
    let proxy = ProxyProcess::start(
        &format!("http://{}", eq.grpc),
        ProviderName::AwsLcRs,
        CertAlgorithmName::EcdsaP256,
        &[
            "--upstream-protocol",
            "h2c",
            "--max-request-body",
            "1000000",
        ],
    );
    let mut points = PointsClient::new(channel(&proxy));
    let upsert = |n: u64| {
        let batch: Vec<PointStruct> = (0..n)
            .map(|id| PointStruct::new(id, vec![0.25f32; 1024], Payload::new()))
            .collect();
        UpsertPointsBuilder::new("big", batch).wait(true).build()
    };
    // 100 points of 1024 floats: about 420 KB, under the limit.
    points
        .upsert(upsert(100))
        .await
        .expect("an upsert under the limit");
    // 1,000 points: about 4.2 MB.
    let err = points
        .upsert(upsert(1_000))
        .await
        .expect_err("over the limit");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("max_request_body"),
        "names the setting: {}",
        err.message()
    );
    let m = proxy.metrics();
    assert_eq!(
        metric_sum(
            &m,
            "proxy_client_errors_total",
            &[("kind", "body_too_large")]
        ),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric_sum(&m, "proxy_upstream_errors_total", &[]),
        0.0,
        "{m}"
    );
    // The upstream kept only the upsert under the limit.
    assert_eq!(count_points(eq.rest, "big"), 100);
}
