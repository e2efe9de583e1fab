//! Large bodies, session resumption, mTLS and tcp (splice) mode through the real proxy.

use bytes::Bytes;
use e2e::*;
use proxy::crypto::{CertAlgorithmName, ProviderName};

/// An UPSERT_100 of 1024-d vectors as JSON is about 800 KB.
fn big_body() -> Bytes {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let data: Vec<u8> = (0..800 * 1024)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            b'0' + (state % 10) as u8
        })
        .collect();
    Bytes::from(data)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_arrive_intact_over_http1_and_h2_and_oversize_is_413() {
    let upstream = EchoUpstream::start();
    let proxy = ProxyProcess::in_front_of(&upstream.url(), &["--max-request-body", "1000000"]);
    let body = big_body();
    let want = sha256_hex(&body);
    for alpn in [b"http/1.1".to_vec(), b"h2".to_vec()] {
        let cfg = client_config(&ClientOpts {
            alpn: vec![alpn.clone()],
            ..ClientOpts::default()
        });
        let a = request_bounded(
            proxy.addr,
            cfg.clone(),
            "PUT",
            "/collections/c/points",
            &[],
            body.clone(),
        )
        .await
        .unwrap();
        assert_eq!(a.status, 200);
        let echo = a.json();
        assert_eq!(echo["body_len"], body.len(), "{echo}");
        assert_eq!(echo["body_sha256"], want.as_str());
        // The upstream is spoken to in HTTP/1.1 for REST whatever the client used.
        assert_eq!(echo["version"], "HTTP/1.1");

        let too_big = Bytes::from(vec![b'x'; 1_500_000]);
        let a = request_bounded(
            proxy.addr,
            cfg,
            "PUT",
            "/collections/c/points",
            &[],
            too_big,
        )
        .await
        .unwrap();
        assert_eq!(a.status, 413, "{}", String::from_utf8_lossy(&a.body));
        assert!(a.json()["status"]["error"]
            .as_str()
            .unwrap()
            .contains("limit"));
    }
}

async fn two_connections(proxy: &ProxyProcess, tls13: bool) -> (Answer, Answer) {
    let cfg = client_config(&ClientOpts {
        tls13,
        tls12: !tls13,
        resumption: true,
        ..ClientOpts::default()
    });
    let first = request_bounded(proxy.addr, cfg.clone(), "GET", "/a", &[], Bytes::new())
        .await
        .unwrap();
    let second = request_bounded(proxy.addr, cfg, "GET", "/b", &[], Bytes::new())
        .await
        .unwrap();
    (first, second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumption_on_resumes_and_off_does_full_handshakes() {
    let upstream = EchoUpstream::start();
    for provider in ProviderName::SOFTWARE {
        let on = ProxyProcess::start(&upstream.url(), provider, CertAlgorithmName::Rsa2048, &[]);
        for (tls13, version) in [(true, "1.3"), (false, "1.2")] {
            let (first, second) = two_connections(&on, tls13).await;
            assert!(
                !first.resumed,
                "{provider} TLS {version}: first connection is full"
            );
            assert!(
                second.resumed,
                "{provider} TLS {version}: second connection must resume"
            );
            let m = on.metrics();
            assert_eq!(
                metric_value(
                    &m,
                    "proxy_tls_handshakes_total",
                    &[
                        ("resumed", "true"),
                        ("tls_version", version),
                        ("provider", provider.as_str())
                    ]
                ),
                Some(1.0),
                "{provider} TLS {version}\n{m}"
            );
        }
        let off = ProxyProcess::start(
            &upstream.url(),
            provider,
            CertAlgorithmName::Rsa2048,
            &["--resumption", "off"],
        );
        for tls13 in [true, false] {
            let (first, second) = two_connections(&off, tls13).await;
            assert!(
                !first.resumed && !second.resumed,
                "{provider}: resumption is off"
            );
        }
        let m = off.metrics();
        assert_eq!(
            metric_value(&m, "proxy_tls_handshakes_total", &[("resumed", "true")]),
            None,
            "{m}"
        );
        assert_eq!(
            metric_value(
                &m,
                "proxy_tls_handshakes_total",
                &[("resumed", "false"), ("tls_version", "1.3")]
            ),
            Some(2.0),
            "{m}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_refuses_without_client_certificate_and_accepts_with_one() {
    let upstream = EchoUpstream::start();
    let ca = certs().ca_cert.display().to_string();
    let proxy = ProxyProcess::start(
        &upstream.url(),
        ProviderName::AwsLcRs,
        CertAlgorithmName::EcdsaP384,
        &["--client-ca", &ca],
    );
    for tls13 in [true, false] {
        let without = client_config(&ClientOpts {
            tls13,
            tls12: !tls13,
            ..ClientOpts::default()
        });
        let err = request_bounded(proxy.addr, without, "GET", "/", &[], Bytes::new())
            .await
            .expect_err("no client certificate must be refused");
        assert!(!err.is_empty());
        let with = client_config(&ClientOpts {
            tls13,
            tls12: !tls13,
            client_cert: true,
            ..ClientOpts::default()
        });
        let a = request_bounded(proxy.addr, with, "GET", "/", &[], Bytes::new())
            .await
            .unwrap();
        assert_eq!(a.status, 200);
    }
    // The proxy counts a refused handshake after its alert is on the wire, so the client
    // can see the refusal first: read the counter once it settles (CI once read 1 of 2).
    proxy.wait_metric("proxy_tls_handshakes_total", &[("outcome", "error")], 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_mode_splices_bytes() {
    let upstream = EchoUpstream::start();
    let proxy = ProxyProcess::start(
        &format!("tcp://{}", upstream.addr),
        ProviderName::Openssl,
        CertAlgorithmName::Rsa2048,
        &["--mode", "tcp"],
    );
    let body = big_body();
    let cfg = client_config(&ClientOpts::default());
    let a = request_bounded(proxy.addr, cfg, "POST", "/spliced", &[], body.clone())
        .await
        .unwrap();
    assert_eq!(a.status, 200);
    let echo = a.json();
    assert_eq!(echo["body_sha256"], sha256_hex(&body));
    // Spliced bytes are not rewritten: no forwarding headers appear.
    assert!(echo["headers"]["x-forwarded-proto"].is_null(), "{echo}");
    let m = proxy.metrics();
    let received = metric_value(&m, "proxy_received_bytes_total", &[]).unwrap();
    assert!(received > body.len() as f64, "{m}");
}

/// A request that ends its connection (HTTP/1.1 `Connection: close`, HTTP/1.0 without
/// keep-alive) gets its whole response, small or larger than a TLS record, and then a TLS
/// close_notify: rustls reports a close without close_notify as an error, so `read_to_end`
/// succeeding is the clean close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_requests_get_the_whole_response_then_close_notify() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    for (size, request) in [
        (
            2,
            "GET /a HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        ),
        (
            300 * 1024,
            "GET /b HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        ),
        (300 * 1024, "GET /c HTTP/1.0\r\nHost: localhost\r\n\r\n"),
    ] {
        let body = big_body().slice(..size);
        let upstream = StaticAnswer::start(body.to_vec());
        let proxy = ProxyProcess::in_front_of(&upstream.url(), &[]);
        let cfg = client_config(&ClientOpts::default());
        let mut tls = tls_connect(proxy.addr, cfg).await.unwrap();
        tls.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(WAIT, tls.read_to_end(&mut answer))
            .await
            .expect("the proxy closes the connection")
            .unwrap_or_else(|e| panic!("{request:?}: not a clean TLS close: {e}"));
        let head_end = answer
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a response head")
            + 4;
        let head = String::from_utf8_lossy(&answer[..head_end]);
        // hyper answers an HTTP/1.0 request in HTTP/1.0.
        assert!(
            head.get(8..).is_some_and(|s| s.starts_with(" 200")),
            "{head}"
        );
        assert_eq!(
            &answer[head_end..],
            &body[..],
            "{request:?}: the whole body"
        );
    }
}
