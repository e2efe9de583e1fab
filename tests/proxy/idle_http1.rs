//! HTTP/1.1 keep-alive connections between requests, against a real proxy process: once a
//! response has gone out and the client is quiet, the proxy ends hyper's connection and
//! keeps only the TLS stream (the `idle_http1` module of `proxy::http`). Whatever the client
//! does next (a request at once, after a pause, split across pauses, pipelined, or nothing
//! until the idle timeout) must be served as before, and the connection must cost no more
//! memory after its requests than before them.

use std::time::Duration;

use e2e::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Reads one HTTP/1.1 response with a Content-Length body; returns its status line and body.
async fn read_response(tls: &mut TlsStream<TcpStream>, pending: &mut Vec<u8>) -> (String, String) {
    let head_end = loop {
        if let Some(i) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        read_more(tls, pending).await;
    };
    let head = String::from_utf8_lossy(&pending[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .expect("a Content-Length");
    while pending.len() < head_end + length {
        read_more(tls, pending).await;
    }
    let body = String::from_utf8_lossy(&pending[head_end..head_end + length]).into_owned();
    pending.drain(..head_end + length);
    (head.lines().next().unwrap_or_default().to_owned(), body)
}

/// Appends what the next read brings; the connection must not close before a whole answer.
async fn read_more(tls: &mut TlsStream<TcpStream>, pending: &mut Vec<u8>) {
    let mut chunk = [0u8; 4096];
    let n = tokio::time::timeout(WAIT, tls.read(&mut chunk))
        .await
        .expect("the answer within the wait")
        .expect("read");
    assert!(
        n > 0,
        "the connection closed before a whole answer: {pending:?}"
    );
    pending.extend_from_slice(&chunk[..n]);
}

fn body_len(echo: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(echo).expect("the echo's JSON");
    v["body_len"].as_u64().expect("body_len")
}

/// One keep-alive connection, quiet between each step long enough to be set aside: every
/// request is answered whole, including one whose head and body come in pieces with
/// pauses between them, a chunked one, and two pipelined in one write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_connection_serves_whatever_the_client_sends_next() {
    let upstream = EchoUpstream::start();
    let proxy = ProxyProcess::in_front_of(&upstream.url(), &[]);
    let cfg = client_config(&ClientOpts::default());
    let mut tls = tls_connect(proxy.addr, cfg).await.expect("TLS");
    let mut pending = Vec::new();
    let pause = || tokio::time::sleep(Duration::from_millis(150));

    tls.write_all(b"GET /first HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let (status, _) = read_response(&mut tls, &mut pending).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");

    // A head split inside a line, then the body in two parts, each after a pause.
    pause().await;
    tls.write_all(b"POST /second HTTP/1.1\r\nhost: a\r\ncontent-le")
        .await
        .unwrap();
    pause().await;
    tls.write_all(b"ngth: 10\r\n\r\nhello").await.unwrap();
    pause().await;
    tls.write_all(b"world").await.unwrap();
    let (status, echo) = read_response(&mut tls, &mut pending).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert_eq!(body_len(&echo), 10, "{echo}");

    // Chunked, its last chunk after a pause.
    pause().await;
    tls.write_all(
        b"POST /third HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n4\r\nabcd\r\n",
    )
    .await
    .unwrap();
    pause().await;
    tls.write_all(b"3\r\nefg\r\n0\r\n\r\n").await.unwrap();
    let (status, echo) = read_response(&mut tls, &mut pending).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert_eq!(body_len(&echo), 7, "{echo}");

    // Two pipelined in one write.
    pause().await;
    tls.write_all(
        b"POST /fourth HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\n\r\nabcGET /fifth HTTP/1.1\r\nhost: a\r\n\r\n",
    )
    .await
    .unwrap();
    let (status, echo) = read_response(&mut tls, &mut pending).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert_eq!(body_len(&echo), 3, "{echo}");
    let (status, echo) = read_response(&mut tls, &mut pending).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(echo.contains("/fifth"), "{echo}");
    assert!(pending.is_empty(), "nothing more was answered");
}

/// A connection set aside is still closed at the idle timeout, counted as idle, with a
/// TLS close_notify (a clean end of stream for the client, not a reset); and a client that
/// stops partway through a head is not kept forever either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_connection_still_meets_its_deadlines() {
    let upstream = EchoUpstream::start();
    let proxy = ProxyProcess::in_front_of(&upstream.url(), &["--idle-timeout", "1s"]);
    let cfg = client_config(&ClientOpts::default());
    let idle_before = metric_sum(
        &proxy.metrics(),
        "proxy_connection_closes_total",
        &[("reason", "idle")],
    );
    let mut tls = tls_connect(proxy.addr, cfg.clone()).await.expect("TLS");
    let mut pending = Vec::new();
    tls.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let (status, _) = read_response(&mut tls, &mut pending).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let quiet = std::time::Instant::now();
    let mut rest = Vec::new();
    let end = tokio::time::timeout(WAIT, tls.read_to_end(&mut rest))
        .await
        .expect("closed within the wait");
    assert!(end.is_ok(), "a clean close (close_notify), not {end:?}");
    assert!(rest.is_empty(), "nothing more was sent: {rest:?}");
    let waited = quiet.elapsed();
    assert!(
        waited >= Duration::from_millis(900),
        "closed after {waited:?}, before the idle timeout"
    );
    proxy.wait_metric(
        "proxy_connection_closes_total",
        &[("reason", "idle")],
        idle_before + 1.0,
    );

    // Half a head after a request, then nothing: at the idle timeout (no request is in
    // flight until its head is whole) the connection is asked to close, and as hyper holds
    // part of a request it gets the drain timeout (10 s) to finish it; closed then, before
    // the 30 s header read timeout, as before connections were set aside.
    let mut tls = tls_connect(proxy.addr, cfg).await.expect("TLS");
    tls.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let (status, _) = read_response(&mut tls, &mut pending).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    tokio::time::sleep(Duration::from_millis(150)).await;
    tls.write_all(b"GET / HTTP/1.1\r\nhost:").await.unwrap();
    let stopped = std::time::Instant::now();
    let mut rest = Vec::new();
    tokio::time::timeout(WAIT, tls.read_to_end(&mut rest))
        .await
        .expect("an unfinished head is not kept forever")
        .ok();
    let text = String::from_utf8_lossy(&rest);
    assert!(
        !text.contains("200 OK"),
        "an unfinished head was answered: {text}"
    );
    let waited = stopped.elapsed();
    assert!(
        waited < Duration::from_secs(20),
        "an unfinished head kept the connection {waited:?}"
    );
}

/// Connections that answered one request and went quiet hold no more memory than ones
/// that never sent a request, plus a margin: before, hyper's read and head buffers stayed
/// with each of them (about 16 KiB). Resident memory is not a speed: the same work leaves
/// the same pages touched, whatever else the machine does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_quiet_after_a_request_give_their_buffers_back() {
    raise_open_file_limit();
    const CONNECTIONS: usize = 400;
    let upstream = EchoUpstream::start();
    let proxy = ProxyProcess::in_front_of(&upstream.url(), &["--idle-timeout", "600s"]);
    let cfg = client_config(&ClientOpts::default());
    let rss = || {
        metric_value(&proxy.metrics(), "process_resident_memory_bytes", &[])
            .expect("process metrics")
    };
    // Warm: the allocator's first growth and the upstream pool are not per connection.
    for _ in 0..20 {
        let answer = get(proxy.addr, "/warm").await.expect("warm-up");
        assert_eq!(answer.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let base = rss();
    let mut held = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        held.push(tls_connect(proxy.addr, cfg.clone()).await.expect("TLS"));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = (rss() - base) / CONNECTIONS as f64 / 1024.0;
    let mut pending = Vec::new();
    for tls in &mut held {
        tls.write_all(b"GET /tiny HTTP/1.1\r\nhost: a\r\n\r\n")
            .await
            .unwrap();
        let (status, _) = read_response(tls, &mut pending).await;
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = (rss() - base) / CONNECTIONS as f64 / 1024.0;
    eprintln!(
        "RSS per idle connection: {before:.1} KiB before a request, {after:.1} KiB after one"
    );
    assert!(
        after <= before + 4.0,
        "{after:.1} KiB per connection after a request against {before:.1} KiB before one"
    );
}
