//! Deadlines that hold against clients that hold connections without using them: "idle"
//! means no request in flight, not "no byte" (PINGs and WINDOW_UPDATEs keep nothing open),
//! and a client that reads nothing or ignores the GOAWAY is closed.

use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::*;
use proxy::crypto::{CertAlgorithmName, ProviderName};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::h2_raw::*;

/// 20 connections that negotiate h2 and then send no preface, or only PINGs, fill every
/// slot: each is closed after the first-request timeout plus the drain timeout, and a new
/// client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_ping_only_h2_connections_give_their_slots_back() {
    let upstream = EchoUpstream::start();
    let proxy = ProxyProcess::in_front_of(
        &upstream.url(),
        &[
            "--max-connections",
            "20",
            "--first-request-timeout",
            "1s",
            "--idle-timeout",
            "2s",
            "--drain-timeout",
            "1s",
        ],
    );
    let mut tasks = Vec::new();
    for i in 0..20 {
        let mut tls = h2_connect(proxy.addr).await;
        tasks.push(tokio::spawn(async move {
            if i % 2 == 1 {
                tls.write_all(PREFACE).await.unwrap();
                tls.write_all(&settings(&[])).await.unwrap();
                let (mut r, mut w) = tokio::io::split(tls);
                // PINGs every 200 ms, never a request, never an ACK of the server's PING.
                let pinger = tokio::spawn(async move {
                    for n in 0u64.. {
                        if w.write_all(&frame(PING, 0, 0, &n.to_be_bytes()))
                            .await
                            .is_err()
                        {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                });
                let seen = watch(&mut r, Duration::from_secs(8)).await;
                pinger.abort();
                seen
            } else {
                watch(&mut tls, Duration::from_secs(8)).await
            }
        }));
    }
    // Every slot is taken: the proxy is at --max-connections.
    proxy.wait_metric("proxy_active_connections", &[], 20.0);
    let cfg = client_config(&ClientOpts::default());
    let started = Instant::now();
    let a = request_bounded(proxy.addr, cfg, "GET", "/", &[], Bytes::new())
        .await
        .expect("a new client is served once the idle ones are gone");
    assert_eq!(a.status, 200);
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "served after {:?}",
        started.elapsed()
    );
    let served_after = started.elapsed();
    let mut latest = Duration::ZERO;
    for (i, t) in tasks.into_iter().enumerate() {
        let seen = t.await.unwrap();
        let closed = seen
            .closed_after
            .unwrap_or_else(|| panic!("connection {i} still open after 8 s: {seen:?}"));
        // first request 1 s + drain 1 s, with room for a loaded machine.
        assert!(
            closed < Duration::from_secs(5),
            "connection {i} closed after {closed:?}"
        );
        latest = latest.max(closed);
    }
    eprintln!(
        "20 silent / PING-only h2 connections: the last closed {latest:?} after it opened; a new client was served after waiting {served_after:?}"
    );
    assert_eq!(
        proxy.metric(
            "proxy_connection_closes_total",
            &[("reason", "no_first_request")]
        ),
        20.0
    );
}

/// A client that reads nothing (an h2 zero window, an HTTP/1.1 reader that stopped) and a
/// client that never acknowledges the PING of the GOAWAY: the first two are closed after
/// the stall timeout and the last after idle + drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_read_nothing_or_ignore_the_goaway_are_closed() {
    let upstream = StaticAnswer::start(vec![b'x'; 32 * 1024 * 1024]);
    let proxy = ProxyProcess::start(
        &format!("http://{}", upstream.addr),
        ProviderName::AwsLcRs,
        CertAlgorithmName::EcdsaP256,
        &[
            "--idle-timeout",
            "1s",
            "--drain-timeout",
            "1s",
            "--upstream-timeout",
            "2s",
            "--stall-timeout",
            "2s",
        ],
    );

    // h2 with a zero stream window: the response head comes, its body never can.
    let mut zero = h2_connect(proxy.addr).await;
    zero.write_all(PREFACE).await.unwrap();
    zero.write_all(&settings(&[(SETTINGS_INITIAL_WINDOW_SIZE, 0)]))
        .await
        .unwrap();
    zero.write_all(&get_headers(1, "/")).await.unwrap();
    let zero_seen = tokio::spawn(async move { watch(&mut zero, Duration::from_secs(10)).await });

    // HTTP/1.1 with a tiny receive buffer, reading nothing of a 32 MiB answer.
    let tcp = {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.set_recv_buffer_size(4096).unwrap();
        s.connect(&proxy.addr.into()).unwrap();
        s.set_nonblocking(true).unwrap();
        TcpStream::from_std(s.into()).unwrap()
    };
    let mut slow = tokio_rustls::TlsConnector::from(client_config(&ClientOpts::default()))
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();

    // h2 that completes one request, then ignores the GOAWAY's PING.
    let mut ignorer = h2_connect(proxy.addr).await;
    ignorer.write_all(PREFACE).await.unwrap();
    ignorer.write_all(&settings(&[])).await.unwrap();
    ignorer.write_all(&get_headers(1, "/")).await.unwrap();
    // Room for the whole body, so the request completes.
    let mut window = Vec::new();
    window.extend_from_slice(&frame(0x8, 0, 0, &(64u32 << 20).to_be_bytes()));
    window.extend_from_slice(&frame(0x8, 0, 1, &(64u32 << 20).to_be_bytes()));
    ignorer.write_all(&window).await.unwrap();
    let ignorer_seen = watch(&mut ignorer, Duration::from_secs(12)).await;

    let zero_seen = zero_seen.await.unwrap();
    let closed = zero_seen.closed_after.unwrap_or_else(|| {
        panic!(
            "the zero-window connection is still open: {zero_seen:?}\n{}\n{}",
            proxy.log_text(),
            proxy.metrics()
        )
    });
    assert!(
        closed < Duration::from_secs(6),
        "zero window closed after {closed:?}"
    );
    assert_eq!(zero_seen.data_bytes, 0, "{zero_seen:?}");

    assert!(
        ignorer_seen.data_bytes >= 32 * 1024 * 1024,
        "the first request completed: {ignorer_seen:?}"
    );
    assert!(
        !ignorer_seen.goaway_codes.is_empty() && ignorer_seen.pings >= 1,
        "GOAWAY and PING sent: {ignorer_seen:?}"
    );
    assert!(
        ignorer_seen.closed_after.is_some(),
        "the connection that ignores the GOAWAY's PING is still open: {ignorer_seen:?}"
    );

    // The slow reader: the proxy closes it (the active gauge returns to 0).
    proxy.wait_metric("proxy_active_connections", &[], 0.0);
    eprintln!(
        "zero window closed after {closed:?}; GOAWAY-PING ignorer closed {:?} after its request began (idle 1 s + drain 1 s); slow HTTP/1.1 reader closed as stalled",
        ignorer_seen.closed_after
    );
    drop(slow);
    assert!(proxy.metric("proxy_connection_closes_total", &[("reason", "stalled")]) >= 2.0);
    assert!(
        proxy.metric(
            "proxy_connection_closes_total",
            &[("reason", "drain_deadline")]
        ) >= 1.0
    );
}
