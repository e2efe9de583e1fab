//! Every request limit answered right on every path: a body over
//! `limits.max_request_body_bytes` with or without a length, and a head over
//! `limits.max_header_bytes`, sent over HTTP/1.1, HTTP/2 and gRPC to HTTP/1.1, h2c and TLS
//! upstreams. Each gets 413 / 431 (REST) or RESOURCE_EXHAUSTED (gRPC) with a message that
//! names the setting to raise, never an answer a client retries (502, UNAVAILABLE); it is
//! counted as the client's error, not the upstream's, and reaches the upstream at most once
//! (a body without a length may have started up before it went over; the others never).
//!
//! One test per cell, so that a failing cell hides no other. The TLS upstream is a second
//! proxy process terminating TLS in front of the echo server (as Qdrant's own TLS would).

use std::time::Duration;

use bytes::Bytes;
use e2e::*;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use proxy::crypto::{CertAlgorithmName, ProviderName};

/// The body limit the proxy under test runs with: small, so that the cells run fast.
const BODY_LIMIT: usize = 256 * 1024;
/// The head limit it runs with: hyper's smallest.
const HEADER_LIMIT: usize = 8192;

#[derive(Clone, Copy, Debug, PartialEq)]
enum ClientKind {
    Http1,
    H2,
    Grpc,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum UpstreamKind {
    /// REST over HTTP/1.1 (gRPC goes over h2c whatever the setting).
    Http1,
    /// Every request over h2c.
    H2c,
    /// `https://`: REST over HTTP/1.1 and gRPC over h2, both in TLS.
    Tls,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Limit {
    /// A body over the limit with its length announced.
    BodyWithLength,
    /// A body over the limit streamed without a length (chunked, or HTTP/2 without
    /// content-length).
    BodyWithoutLength,
    /// A head over the limit (a 12 KiB header), under h2's and hyper's own ceilings.
    Headers,
}

/// The upstream, the TLS node in front of it (for `Tls`), and the proxy under test.
struct Path {
    echo: EchoUpstream,
    _node: Option<ProxyProcess>,
    proxy: ProxyProcess,
}

fn path_to(upstream: UpstreamKind) -> Path {
    let echo = EchoUpstream::start();
    let dir = temp_dir("limits");
    let limits = dir.join("limits.toml");
    std::fs::write(
        &limits,
        format!(
            "[limits]\nmax_header_bytes = {HEADER_LIMIT}\nmax_request_body_bytes = {BODY_LIMIT}\n"
        ),
    )
    .unwrap();
    let (node, target, protocol) = match upstream {
        UpstreamKind::Http1 => (None, echo.url(), "auto"),
        UpstreamKind::H2c => (None, echo.url(), "h2c"),
        UpstreamKind::Tls => {
            let node = ProxyProcess::in_front_of(&echo.url(), &[]);
            let target = format!("https://localhost:{}", node.addr.port());
            (Some(node), target, "auto")
        }
    };
    let (cert, key) = server_cert(CertAlgorithmName::EcdsaP256);
    let ca = certs().ca_cert.display().to_string();
    let mut flags = listener_args(&target, ProviderName::AwsLcRs, &cert, &key);
    flags.extend(args(&[
        "--config",
        limits.to_str().unwrap(),
        "--upstream-protocol",
        protocol,
    ]));
    if node.is_some() {
        flags.extend(args(&["--upstream-ca", &ca]));
    }
    let proxy = ProxyProcess::start_raw(&flags);
    Path {
        echo,
        _node: node,
        proxy,
    }
}

/// What the client got: the HTTP status and, for gRPC, the status and message.
struct Outcome {
    status: u16,
    grpc: Option<(String, String)>,
    body: String,
}

async fn send(addr: std::net::SocketAddr, client: ClientKind, limit: Limit) -> Outcome {
    let alpn = if client == ClientKind::Http1 {
        b"http/1.1".to_vec()
    } else {
        b"h2".to_vec()
    };
    let config = client_config(&ClientOpts {
        alpn: vec![alpn],
        ..ClientOpts::default()
    });
    let padding = "p".repeat(12 * 1024);
    let mut headers: Vec<(&str, &str)> = Vec::new();
    let path = if client == ClientKind::Grpc {
        headers.extend([("content-type", "application/grpc"), ("te", "trailers")]);
        "/qdrant.Points/Upsert"
    } else {
        headers.push(("content-type", "application/json"));
        "/collections/limits/points"
    };
    if limit == Limit::Headers {
        headers.push(("x-padding", &padding));
    }
    let over = 2 * BODY_LIMIT;
    let body = match limit {
        Limit::BodyWithLength => Full::new(Bytes::from(vec![b'x'; over])).boxed(),
        Limit::BodyWithoutLength => {
            let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
            let chunks = (0..over / chunk.len()).map(move |_| Ok(Frame::data(chunk.clone())));
            StreamBody::new(tokio_stream::iter(chunks)).boxed()
        }
        Limit::Headers => Full::new(Bytes::from_static(b"{}")).boxed(),
    };
    let answer = request_with_body(addr, config, "PUT", path, &headers, body);
    let answer = tokio::time::timeout(Duration::from_secs(20), answer)
        .await
        .unwrap_or_else(|_| panic!("{client:?} {limit:?}: no answer within 20 s"))
        .unwrap_or_else(|e| panic!("{client:?} {limit:?}: {e}"));
    let grpc = (client == ClientKind::Grpc).then(|| {
        let fields = answer
            .trailers
            .as_ref()
            .filter(|t| t.contains_key("grpc-status"))
            .unwrap_or(&answer.headers);
        let field = |name: &str| {
            fields
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        (field("grpc-status"), field("grpc-message"))
    });
    Outcome {
        status: answer.status.as_u16(),
        grpc,
        body: String::from_utf8_lossy(&answer.body).into_owned(),
    }
}

fn check(client: ClientKind, upstream: UpstreamKind, limit: Limit) {
    let path = path_to(upstream);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let outcome = runtime.block_on(send(path.proxy.addr, client, limit));
    let cell = format!("{client:?} client, {upstream:?} upstream, {limit:?}");
    let metrics = path.proxy.metrics();
    let sent_up = path.echo.requests();
    // The whole observation first, so that a failing cell shows everything it saw.
    eprintln!(
        "{cell}: HTTP {}, gRPC {:?}, client errors {:?}, upstream errors {}, upstream sends {sent_up}, body {:?}",
        outcome.status,
        outcome.grpc,
        ["body_too_large", "headers_too_large"]
            .map(|k| metric_sum(&metrics, "proxy_client_errors_total", &[("kind", k)])),
        metric_sum(&metrics, "proxy_upstream_errors_total", &[]),
        outcome.body.chars().take(120).collect::<String>(),
    );
    let (setting, http_status, kind) = match limit {
        Limit::Headers => ("limits.max_header_bytes", 431, "headers_too_large"),
        _ => ("limits.max_request_body_bytes", 413, "body_too_large"),
    };
    match &outcome.grpc {
        Some((code, message)) => {
            assert_eq!(outcome.status, 200, "{cell}: trailers-only gRPC answer");
            assert_eq!(
                code, "8",
                "{cell}: RESOURCE_EXHAUSTED, got {code} {message}"
            );
            assert!(message.contains(setting), "{cell}: {message}");
        }
        None => {
            assert_eq!(outcome.status, http_status, "{cell}: {}", outcome.body);
            assert!(outcome.body.contains(setting), "{cell}: {}", outcome.body);
        }
    }
    assert_eq!(
        metric_sum(&metrics, "proxy_client_errors_total", &[("kind", kind)]),
        1.0,
        "{cell}: counted once as the client's error\n{metrics}"
    );
    assert_eq!(
        metric_sum(&metrics, "proxy_upstream_errors_total", &[]),
        0.0,
        "{cell}: nothing blamed on the upstream\n{metrics}"
    );
    let most = u64::from(limit == Limit::BodyWithoutLength);
    assert!(
        sent_up <= most,
        "{cell}: reached the upstream {sent_up} times (at most {most})"
    );
}

/// One test per cell: `cell!(name, client, upstream, limit)`.
macro_rules! cell {
    ($name:ident, $client:ident, $upstream:ident, $limit:ident) => {
        #[test]
        fn $name() {
            check(ClientKind::$client, UpstreamKind::$upstream, Limit::$limit);
        }
    };
}

cell!(
    http1_to_http1_body_with_length,
    Http1,
    Http1,
    BodyWithLength
);
cell!(
    http1_to_http1_body_without_length,
    Http1,
    Http1,
    BodyWithoutLength
);
cell!(http1_to_http1_headers, Http1, Http1, Headers);
cell!(http1_to_h2c_body_with_length, Http1, H2c, BodyWithLength);
cell!(
    http1_to_h2c_body_without_length,
    Http1,
    H2c,
    BodyWithoutLength
);
cell!(http1_to_h2c_headers, Http1, H2c, Headers);
cell!(http1_to_tls_body_with_length, Http1, Tls, BodyWithLength);
cell!(
    http1_to_tls_body_without_length,
    Http1,
    Tls,
    BodyWithoutLength
);
cell!(http1_to_tls_headers, Http1, Tls, Headers);
cell!(h2_to_http1_body_with_length, H2, Http1, BodyWithLength);
cell!(
    h2_to_http1_body_without_length,
    H2,
    Http1,
    BodyWithoutLength
);
cell!(h2_to_http1_headers, H2, Http1, Headers);
cell!(h2_to_h2c_body_with_length, H2, H2c, BodyWithLength);
cell!(h2_to_h2c_body_without_length, H2, H2c, BodyWithoutLength);
cell!(h2_to_h2c_headers, H2, H2c, Headers);
cell!(h2_to_tls_body_with_length, H2, Tls, BodyWithLength);
cell!(h2_to_tls_body_without_length, H2, Tls, BodyWithoutLength);
cell!(h2_to_tls_headers, H2, Tls, Headers);
cell!(grpc_to_h2c_body_with_length, Grpc, H2c, BodyWithLength);
cell!(
    grpc_to_h2c_body_without_length,
    Grpc,
    H2c,
    BodyWithoutLength
);
cell!(grpc_to_h2c_headers, Grpc, H2c, Headers);
cell!(grpc_to_tls_body_with_length, Grpc, Tls, BodyWithLength);
cell!(
    grpc_to_tls_body_without_length,
    Grpc,
    Tls,
    BodyWithoutLength
);
cell!(grpc_to_tls_headers, Grpc, Tls, Headers);
