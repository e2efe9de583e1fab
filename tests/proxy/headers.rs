//! What clients may not set or learn: forwarded headers replaced unless the peer is a
//! trusted proxy, CONNECT refused, the client's framing errors answered as the client's, and
//! the upstream's host as its protocol names it.

use bytes::Bytes;
use e2e::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_headers_connect_and_client_framing_errors() {
    let upstream = EchoUpstream::start();
    let proxy = ProxyProcess::in_front_of(&upstream.url(), &[]);
    let cfg = client_config(&ClientOpts::default());
    let a = request_bounded(
        proxy.addr,
        cfg.clone(),
        "GET",
        "/",
        &[
            ("x-forwarded-for", "6.6.6.6"),
            ("forwarded", "for=6.6.6.6"),
            ("x-real-ip", "6.6.6.6"),
            ("authorization", "Bearer qdrant-jwt"),
        ],
        Bytes::new(),
    )
    .await
    .unwrap();
    let j = a.json();
    assert_eq!(j["headers"]["x-forwarded-for"], "127.0.0.1", "{j}");
    assert!(j["headers"]["forwarded"].is_null(), "{j}");
    assert!(j["headers"]["x-real-ip"].is_null(), "{j}");
    assert_eq!(j["headers"]["authorization"], "Bearer qdrant-jwt", "{j}");
    // Security headers added where the upstream set none.
    assert_eq!(a.headers["strict-transport-security"], "max-age=31536000");
    assert_eq!(a.headers["x-content-type-options"], "nosniff");

    // CONNECT is refused.
    let mut tls = tls_connect(proxy.addr, cfg.clone()).await.unwrap();
    tls.write_all(b"CONNECT 10.0.0.1:22 HTTP/1.1\r\nhost: 10.0.0.1:22\r\n\r\n")
        .await
        .unwrap();
    let mut out = vec![0u8; 1024];
    let n = tokio::time::timeout(WAIT, tls.read(&mut out))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out[..n]);
    assert!(text.starts_with("HTTP/1.1 405"), "{text}");

    // A broken chunked body is the client's error: 400, counted as such.
    let upstream_errors = proxy.metric("proxy_upstream_errors_total", &[]);
    let mut tls = tls_connect(proxy.addr, cfg).await.unwrap();
    tls.write_all(b"POST /collections/c/points HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: chunked\r\n\r\n4\r\nabcd\r\nzz\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(WAIT, tls.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(!text.contains("127.0.0.1"), "{text}");
    assert_eq!(
        proxy.metric("proxy_client_errors_total", &[("kind", "body")]),
        1.0
    );
    assert_eq!(
        proxy.metric("proxy_upstream_errors_total", &[]),
        upstream_errors,
        "a client's framing error is not an upstream error"
    );
    assert_eq!(
        proxy.metric("proxy_client_errors_total", &[("kind", "method")]),
        1.0
    );
}

/// Over h2c the upstream gets :authority and no host header (nginx answers a request with
/// both 400 "client sent duplicate host header").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_requests_carry_authority_only() {
    let upstream = EchoUpstream::start();
    let proxy = ProxyProcess::in_front_of(&upstream.url(), &["--upstream-protocol", "h2c"]);
    let cfg = client_config(&ClientOpts::default());
    let a = request_bounded(proxy.addr, cfg, "GET", "/", &[], Bytes::new())
        .await
        .unwrap();
    let j = a.json();
    assert_eq!(j["version"], "HTTP/2.0", "{j}");
    assert!(j["headers"]["host"].is_null(), "{j}");
}
