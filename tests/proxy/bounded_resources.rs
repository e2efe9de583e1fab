//! Resources a client cannot exhaust: the upstream's concurrent requests are capped
//! (beyond the cap: 503 / RESOURCE_EXHAUSTED at once), HTTP/2 frames are offered within the
//! request buffer budget, and a thousand connections pushing at a stalled upstream stay
//! within it.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use e2e::*;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::counting_upstream::*;
use super::h2_raw::*;

/// 4 connections x 32 streams to a slow upstream: at most --max-upstream-requests reach it
/// and the rest get 503 in Qdrant's error shape (gRPC: RESOURCE_EXHAUSTED) at once, rather
/// than 128 upstream connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_upstream_requests_are_capped() {
    let upstream = CountingUpstream::start(Some(Duration::from_millis(1500)));
    let proxy = ProxyProcess::in_front_of(&upstream.url(), &["--max-upstream-requests", "16"]);
    let mut requests = Vec::new();
    for _ in 0..4 {
        let tls = h2_connect(proxy.addr).await;
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(conn);
        for _ in 0..32 {
            let mut sender = sender.clone();
            let uri = proxy.url("/collections");
            requests.push(tokio::spawn(async move {
                let req = http::Request::get(uri)
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                let resp = sender.send_request(req).await.unwrap();
                let status = resp.status();
                let headers = resp.headers().clone();
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                (status, headers, body)
            }));
        }
    }
    // While the upstream is saturated, a gRPC call is refused the gRPC way.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grpc = request_bounded(
        proxy.addr,
        client_config(&ClientOpts {
            alpn: vec![b"h2".to_vec()],
            ..ClientOpts::default()
        }),
        "POST",
        "/qdrant.Points/Upsert",
        &[("content-type", "application/grpc"), ("te", "trailers")],
        Bytes::from_static(&[0, 0, 0, 0, 0]),
    )
    .await
    .unwrap();
    assert_eq!(grpc.headers["grpc-status"], "8", "{grpc:?}");

    let mut ok = 0;
    let mut refused = 0;
    for r in requests {
        let (status, headers, body) = r.await.unwrap();
        match status.as_u16() {
            200 => ok += 1,
            503 => {
                refused += 1;
                assert_eq!(headers["retry-after"], "1");
                let j: serde_json::Value = serde_json::from_slice(&body).unwrap();
                assert!(j["status"]["error"].is_string(), "{j}");
            }
            other => panic!("unexpected status {other}"),
        }
    }
    eprintln!(
        "4 x 32 streams at --max-upstream-requests 16: {ok} forwarded, {refused} refused with 503, upstream peak {} connections",
        upstream.peak()
    );
    assert_eq!(ok + refused, 128);
    assert!((1..=16).contains(&ok), "{ok} requests reached the upstream");
    assert!(
        upstream.peak() <= 16,
        "the upstream saw {} connections at once",
        upstream.peak()
    );
    assert_eq!(
        proxy.metric("proxy_upstream_rejected_total", &[]),
        f64::from(refused + 1)
    );
}

/// Clients may send frames up to `limits.h2_max_frame_size` (1 MiB by default: an upsert
/// then crosses the proxy as one chunk), but h2 buffers a frame whole whatever its type, so
/// a larger one is refused, and a connection is offered large frames only out of its share
/// of the request buffer budget: when the floors take the whole budget it gets the
/// protocol's 16 KiB and 64 KiB window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_are_offered_within_the_buffer_budget_and_larger_ones_refused() {
    async fn opened(addr: SocketAddr) -> TlsStream<TcpStream> {
        let mut tls = h2_connect(addr).await;
        tls.write_all(PREFACE).await.unwrap();
        tls.write_all(&settings(&[])).await.unwrap();
        tls
    }
    let upstream = EchoUpstream::start();
    let proxy = ProxyProcess::in_front_of(&upstream.url(), &[]);
    let seen = watch(&mut opened(proxy.addr).await, Duration::from_millis(500)).await;
    assert_eq!(seen.max_frame_size, Some(1 << 20), "{seen:?}");
    assert!(seen.connection_window >= 1 << 20, "{seen:?}");

    // One byte over what was advertised, of a type h2 would otherwise skip unread.
    let mut tls = opened(proxy.addr).await;
    let len = (1u32 << 20) + 1;
    let head = [
        (len >> 16) as u8,
        (len >> 8) as u8,
        len as u8,
        0xfa,
        0,
        0,
        0,
        0,
        0,
    ];
    tls.write_all(&head).await.unwrap();
    let seen = watch(&mut tls, WAIT).await;
    assert!(seen.goaway_codes.contains(&FRAME_SIZE_ERROR), "{seen:?}");

    let tight = proxy::config::Limits {
        max_connections: 10,
        max_upstream_requests: 1,
        ..proxy::config::Limits::default()
    };
    let proxy = ProxyProcess::in_front_of(
        &upstream.url(),
        &[
            "--max-connections",
            "10",
            "--max-upstream-requests",
            "1",
            "--request-buffer-budget",
            &tight.request_buffer_floors().to_string(),
        ],
    );
    let seen = watch(&mut opened(proxy.addr).await, Duration::from_millis(500)).await;
    assert_eq!(seen.max_frame_size, Some(16_384), "{seen:?}");
    assert_eq!(seen.connection_window, 65_535, "{seen:?}");
}

/// 1,000 HTTP/2 connections each push a 4 MiB body at an upstream that reads nothing. The
/// proxy takes in no more than its request buffer budget (the windows it grants say so to
/// the clients), and its memory grows by no more than that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_connections_pushing_at_a_stalled_upstream_stay_within_the_budget() {
    raise_open_file_limit();
    const CONNECTIONS: usize = 1000;
    const BUDGET: u64 = 768 << 20;
    let upstream = CountingUpstream::start(None);
    let proxy = ProxyProcess::in_front_of(
        &upstream.url(),
        &[
            "--max-connections",
            "1100",
            "--max-upstream-requests",
            "1000",
            "--request-buffer-budget",
            &BUDGET.to_string(),
            // These clients send 64 KiB chunks, so frames that size are all they use; the
            // upstream requests' floors then count 64 KiB frames and fit the budget.
            "--h2-max-frame-size",
            "65536",
        ],
    );
    let mut senders = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        let tls = h2_connect(proxy.addr).await;
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(conn);
        senders.push(sender);
    }
    proxy.wait_metric("proxy_active_connections", &[], CONNECTIONS as f64);
    let rss_before = proxy_rss(&proxy);
    let received_before = proxy.metric("proxy_received_bytes_total", &[]);
    let mut pushes = Vec::with_capacity(CONNECTIONS);
    for mut sender in senders {
        let uri = proxy.url("/collections/c/points");
        pushes.push(tokio::spawn(async move {
            let chunks = (0..64)
                .map(|_| Ok::<_, std::io::Error>(Frame::data(Bytes::from(vec![b'v'; 64 * 1024]))));
            let body = StreamBody::new(tokio_stream::iter(chunks));
            let req = http::Request::put(uri)
                .header("content-type", "application/json")
                .header("content-length", (4u64 << 20).to_string())
                .body(body)
                .unwrap();
            let _ = sender.send_request(req).await;
        }));
    }
    // Long enough for every connection to fill what it was granted.
    let mut last = 0.0;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = proxy.metric("proxy_received_bytes_total", &[]);
        if now > received_before && (now - last) < 1e6 {
            break;
        }
        last = now;
    }
    let received = proxy.metric("proxy_received_bytes_total", &[]) - received_before;
    let rss_growth = proxy_rss(&proxy).saturating_sub(rss_before);
    let kernel_queued = kernel_send_queue_to(upstream.addr) as f64;
    let reserved = proxy.metric("proxy_request_buffer_reserved_bytes", &[]);
    for p in &pushes {
        p.abort();
    }
    eprintln!(
        "{CONNECTIONS} connections: received {:.1} MiB, of which {:.1} MiB queued in the kernel toward the upstream; RSS +{:.1} MiB, reserved {:.1} MiB of {} MiB; upstream connections {}",
        received / 1048576.0,
        kernel_queued / 1048576.0,
        rss_growth as f64 / 1048576.0,
        reserved / 1048576.0,
        BUDGET >> 20,
        upstream.accepted()
    );
    assert!(
        upstream.accepted() >= CONNECTIONS / 2,
        "the bodies were forwarded"
    );
    assert!(reserved <= BUDGET as f64, "reserved {reserved}");
    // What the proxy writes toward the stalled upstream leaves it for the kernel's send
    // buffers (sized by net.ipv4.tcp_wmem, printed above): outside the budget, and not in
    // the proxy's memory. Without the budget each connection kept up to its 4 MiB stream
    // window here, several GiB in all.
    assert!(
        rss_growth < BUDGET + (64 << 20),
        "RSS grew by {:.1} MiB",
        rss_growth as f64 / 1048576.0
    );
}

/// Bytes queued in the send buffers of every socket connected to `dst` (`ss`'s
/// wmem_queued), i.e. what the proxy has written toward a stalled upstream.
fn kernel_send_queue_to(dst: SocketAddr) -> u64 {
    let out = std::process::Command::new(system_tool("ss"))
        .args(["-tmnH", "dst", &dst.to_string()])
        .output()
        .expect("ss (iproute2) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split("skmem:(")
        .skip(1)
        .filter_map(|s| s.split(')').next())
        .flat_map(|fields| fields.split(','))
        .filter_map(|f| f.strip_prefix('w')?.parse::<u64>().ok())
        .sum()
}

pub(crate) fn proxy_rss(proxy: &ProxyProcess) -> u64 {
    let m = proxy.metrics();
    metric_value(&m, "process_resident_memory_bytes", &[]).expect("process metrics") as u64
}
