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

/// A byte-echoing TCP server: the database behind a tcp listener, as far as the splice can
/// tell. Stops with the test's runtime.
async fn tcp_echo() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// Whether the proxy closed `tls` within `limit` (a read that ends, or fails).
async fn closed_within(
    tls: &mut tokio_rustls::client::TlsStream<TcpStream>,
    limit: Duration,
) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(limit, tls.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

/// tcp listeners' own bounds: a listener's `max_connections` (the third client waits in
/// the kernel's queue until a slot frees), `limits.max_connection_age` (a busy connection is
/// closed at that age, counted as max_age), the process-wide idle limit on one listener and
/// none (`idle_timeout = "0s"`) on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_listeners_bound_connections_age_and_idleness() {
    let upstream = tcp_echo().await;
    let (cert, key) = server_cert(CertAlgorithmName::EcdsaP256);
    let dir = temp_dir("tcp-bounds");
    let config = dir.join("proxy.toml");
    let listener = |name: &str, extra: &str| {
        format!(
            "[[listener]]\nname = \"{name}\"\nlisten = \"127.0.0.1:0\"\nmode = \"tcp\"\nupstream = \"tcp://{upstream}\"\ncert = \"{}\"\nkey = \"{}\"\n{extra}\n",
            cert.display(),
            key.display()
        )
    };
    std::fs::write(
        &config,
        format!(
            "[limits]\nidle_timeout = \"1s\"\nmax_connection_age = \"3s\"\n\n{}{}",
            listener("capped", "max_connections = 2"),
            listener("patient", "idle_timeout = \"0s\"")
        ),
    )
    .unwrap();
    let proxy = ProxyProcess::start_raw(&["--config".to_owned(), config.display().to_string()]);
    let cfg = client_config(&ClientOpts {
        alpn: vec![],
        ..ClientOpts::default()
    });
    let capped = proxy.listener("capped");

    let mut first = tls_connect(capped, cfg.clone()).await.unwrap();
    let _second = tls_connect(capped, cfg.clone()).await.unwrap();
    let third = tokio::spawn(tls_connect(capped, cfg.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !third.is_finished(),
        "a third connection was served past max_connections = 2"
    );
    first.shutdown().await.unwrap();
    drop(first);
    let mut third = tokio::time::timeout(Duration::from_secs(5), third)
        .await
        .expect("the third connection is served once a slot frees")
        .unwrap()
        .unwrap();
    // Idle on the capped listener (the process-wide 1 s): closed.
    assert!(closed_within(&mut third, Duration::from_secs(3)).await);

    // No idle limit on the other, and the age limit on a connection that keeps talking.
    let mut patient = tls_connect(proxy.listener("patient"), cfg.clone())
        .await
        .unwrap();
    let opened = Instant::now();
    assert!(!closed_within(&mut patient, Duration::from_millis(1500)).await);
    let mut talker = tls_connect(proxy.listener("patient"), cfg).await.unwrap();
    let talking = Instant::now();
    let mut echoed = [0u8; 4];
    loop {
        use tokio::io::AsyncReadExt;
        if talker.write_all(b"ping").await.is_err() {
            break;
        }
        match tokio::time::timeout(Duration::from_secs(2), talker.read_exact(&mut echoed)).await {
            Ok(Ok(_)) => tokio::time::sleep(Duration::from_millis(200)).await,
            _ => break,
        }
        assert!(
            talking.elapsed() < Duration::from_secs(10),
            "never closed at its age"
        );
    }
    let lived = talking.elapsed();
    assert!(
        lived >= Duration::from_millis(2900),
        "closed after {lived:?}"
    );
    assert!(closed_within(&mut patient, Duration::from_secs(3)).await);
    assert!(opened.elapsed() >= Duration::from_millis(2900));
    let m = proxy.metrics();
    assert!(
        metric_sum(
            &m,
            "proxy_connection_closes_total",
            &[("listener", "capped"), ("reason", "idle")]
        ) >= 1.0,
        "{m}"
    );
    assert!(
        metric_sum(
            &m,
            "proxy_connection_closes_total",
            &[("listener", "patient"), ("reason", "max_age")]
        ) >= 2.0,
        "{m}"
    );
    assert_eq!(
        metric_sum(
            &m,
            "proxy_connection_closes_total",
            &[("listener", "patient"), ("reason", "idle")]
        ),
        0.0,
        "{m}"
    );
}
