//! Bad input while a parallel good client keeps succeeding: garbage instead of a
//! ClientHello, a truncated handshake, a client that stalls (the handshake timeout fires),
//! an oversized header, a slow upstream (504); and an upstream that is down (502).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::*;
use proxy::crypto::{CertAlgorithmName, ProviderName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads until EOF or error, bounded; returns how long the server took to close.
async fn wait_closed(mut s: TcpStream) -> Duration {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(WAIT, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return start.elapsed(),
            Ok(Ok(_)) => continue,
            Err(_) => panic!("server did not close the connection within {WAIT:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_clients_and_slow_upstream_do_not_disturb_a_good_client() {
    let upstream = EchoUpstream::start();
    let proxy = ProxyProcess::start(
        &upstream.url(),
        ProviderName::AwsLcRs,
        CertAlgorithmName::Rsa2048,
        &["--handshake-timeout", "1s", "--upstream-timeout", "1s"],
    );
    let addr = proxy.addr;

    // The good client: a new connection per request until told to stop (bounded).
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let good = {
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        tokio::spawn(async move {
            let cfg = client_config(&ClientOpts::default());
            for _ in 0..5_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                match request_bounded(addr, cfg.clone(), "GET", "/good", &[], Bytes::new()).await {
                    Ok(a) if a.status == 200 => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        })
    };

    // 1. Garbage instead of a ClientHello: plaintext HTTP to the TLS port.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    wait_closed(s).await;

    // 2. A truncated handshake: half a real ClientHello, then the client goes away.
    let cfg = client_config(&ClientOpts::default());
    let mut conn = rustls::ClientConnection::new(cfg, "localhost".try_into().unwrap()).unwrap();
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).unwrap();
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&hello[..hello.len() / 2]).await.unwrap();
    drop(s);

    // 3. A client that connects and stalls: closed by the handshake timeout (1 s).
    let s = TcpStream::connect(addr).await.unwrap();
    let took = wait_closed(s).await;
    assert!(
        took >= Duration::from_millis(900),
        "closed after {took:?}, before the timeout"
    );

    // 4. An oversized request head: 431. HTTP/1.1 connections may read up to 256 KiB at a
    // time when the budget allows (for bodies), yet heads stay limited to max_header_bytes
    // (64 KiB): 70 KiB is refused as 100 KiB is, and 60 KiB still passes.
    for (kib, status) in [(100, 431), (70, 431), (60, 200)] {
        let big = "v".repeat(kib * 1024);
        let a = request_bounded(
            addr,
            client_config(&ClientOpts::default()),
            "GET",
            "/",
            &[("x-big", &big)],
            Bytes::new(),
        )
        .await
        .unwrap();
        assert_eq!(a.status, status, "a {kib} KiB head");
    }

    // 5. A slow upstream: 504 with Qdrant's error shape.
    let a = get(addr, "/slow/3000").await.unwrap();
    assert_eq!(a.status, 504);
    let j = a.json();
    assert!(
        j["status"]["error"]
            .as_str()
            .unwrap()
            .contains("did not answer"),
        "{j}"
    );
    assert!(j["time"].is_number(), "{j}");

    stop.store(true, Ordering::Relaxed);
    good.await.unwrap();
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    assert!(ok > 0, "the good client made no request");
    assert_eq!(
        failed, 0,
        "good client failures while bad clients were served ({ok} ok)"
    );

    let m = proxy.metrics();
    let errors =
        metric_value(&m, "proxy_tls_handshakes_total", &[("outcome", "error")]).unwrap_or(0.0);
    assert!(
        errors >= 2.0,
        "garbage and truncated handshakes are counted:\n{m}"
    );
    assert_eq!(
        metric_value(&m, "proxy_tls_handshakes_total", &[("outcome", "timeout")]),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric_value(&m, "proxy_upstream_errors_total", &[("kind", "timeout")]),
        Some(1.0),
        "{m}"
    );
    proxy.wait_metric("proxy_active_connections", &[], 0.0);
    let log = proxy.log_text();
    assert!(log.contains("TLS handshake failed"), "{log}");
    assert!(log.contains("TLS handshake timed out"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_is_502_in_qdrant_error_shape() {
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let proxy = ProxyProcess::start(
        &format!("http://127.0.0.1:{closed_port}"),
        ProviderName::Openssl,
        CertAlgorithmName::EcdsaP256,
        &[],
    );
    for alpn in [b"http/1.1".to_vec(), b"h2".to_vec()] {
        let cfg = client_config(&ClientOpts {
            alpn: vec![alpn],
            ..ClientOpts::default()
        });
        let a = request_bounded(
            proxy.addr,
            cfg,
            "PUT",
            "/collections/c/points",
            &[],
            Bytes::from_static(b"{}"),
        )
        .await
        .unwrap();
        assert_eq!(a.status, 502);
        assert_eq!(a.headers["content-type"], "application/json");
        let j = a.json();
        let msg = j["status"]["error"].as_str().unwrap();
        // The client learns that the upstream is down, not where it is or the OS error.
        assert_eq!(msg, "the upstream is unavailable");
    }
    let log = proxy.log_text();
    assert!(
        log.contains(&format!("127.0.0.1:{closed_port}")) && log.contains("refused"),
        "the log names the upstream and the cause:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_max_connections_new_connections_wait_instead_of_failing() {
    let upstream = EchoUpstream::start();
    let proxy = ProxyProcess::in_front_of(
        &upstream.url(),
        &["--max-connections", "1", "--handshake-timeout", "20s"],
    );
    // This client holds the only slot without ever handshaking.
    let holder = TcpStream::connect(proxy.addr).await.unwrap();
    proxy.wait_metric("proxy_active_connections", &[], 1.0);
    let addr = proxy.addr;
    let waiting = tokio::spawn(async move { get(addr, "/queued").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "the second connection must wait for a slot"
    );
    drop(holder);
    let a = waiting
        .await
        .unwrap()
        .expect("served once the slot is free");
    assert_eq!(a.status, 200);
    assert_eq!(
        metric_value(&proxy.metrics(), "proxy_connections_total", &[]),
        Some(2.0)
    );
}

/// An HTTP/1.1 connection that completes its handshake holds no HTTP state until its first
/// request bytes arrive (see `server::first_request_bytes`); it must still be closed by the
/// idle timeout, and a request that comes late, or from a client that keeps Nagle on, must
/// still be answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_after_the_idle_timeout_and_a_late_request_is_served() {
    let upstream = EchoUpstream::start();
    let proxy = ProxyProcess::in_front_of(&upstream.url(), &["--idle-timeout", "1s"]);
    let cfg = client_config(&ClientOpts::default());

    // Silent after the handshake: closed by the idle timeout, not before it.
    let mut silent = tls_connect(proxy.addr, cfg.clone()).await.unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 256];
    let closed = tokio::time::timeout(WAIT, silent.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "expected a close, got {closed:?}"
    );
    let after = started.elapsed();
    assert!(
        after >= Duration::from_millis(900),
        "closed after {after:?}"
    );

    // A request 300 ms after the handshake, from a client with Nagle on.
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    tcp.set_nodelay(false).unwrap();
    let mut late = tokio_rustls::TlsConnector::from(cfg)
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    late.write_all(b"GET /late HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(WAIT, late.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
}
