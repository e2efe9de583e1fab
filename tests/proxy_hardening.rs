//! Hostile clients against a real proxy process over loopback: each attack of the
//! hardening issue, bounded in time, with the limit that stops it. Raw HTTP/2 frames are
//! written by hand where a well-behaved client library would not misbehave (no preface,
//! PINGs only, a zero window, never acknowledging the GOAWAY's PING, paced resets).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::*;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use proxy::crypto::{CertAlgorithmName, ProviderName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

// ---------------------------------------------------------------------------------------
// Raw HTTP/2

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
const FRAME_SIZE_ERROR: u32 = 0x6;
const ENHANCE_YOUR_CALM: u32 = 0xb;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn settings(pairs: &[(u16, u32)]) -> Vec<u8> {
    let mut p = Vec::new();
    for (id, v) in pairs {
        p.extend_from_slice(&id.to_be_bytes());
        p.extend_from_slice(&v.to_be_bytes());
    }
    frame(SETTINGS, 0, 0, &p)
}

/// A GET request's HEADERS: HPACK static entries for :method GET and :scheme https,
/// literals (not indexed) for :authority and :path.
fn get_headers(stream: u32, path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x87, 0x01, 9];
    block.extend_from_slice(b"localhost");
    block.extend_from_slice(&[0x04, path.len() as u8]);
    block.extend_from_slice(path.as_bytes());
    frame(HEADERS, END_HEADERS | END_STREAM, stream, &block)
}

/// What a raw client saw of the server until it closed or `limit` passed.
#[derive(Debug, Default)]
struct Seen {
    /// SETTINGS_MAX_FRAME_SIZE of the server's first SETTINGS (16384 if it sent none).
    max_frame_size: Option<u32>,
    /// The connection window the server opened: 65,535 plus its stream-0 WINDOW_UPDATEs.
    connection_window: u64,
    goaway_codes: Vec<u32>,
    /// The last stream id of each GOAWAY: the highest stream the server says it processed.
    goaway_last_streams: Vec<u32>,
    pings: usize,
    data_bytes: usize,
    closed_after: Option<Duration>,
}

/// Reads frames (answering nothing) until the server closes or `limit` passes.
async fn watch(reader: &mut (impl tokio::io::AsyncRead + Unpin), limit: Duration) -> Seen {
    let started = Instant::now();
    let mut seen = Seen {
        connection_window: 65_535,
        ..Seen::default()
    };
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let left = limit.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, reader.read(&mut chunk)).await {
            Err(_) => return seen,
            Ok(Ok(0)) | Ok(Err(_)) => {
                seen.closed_after = Some(started.elapsed());
                return seen;
            }
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
        while buf.len() >= 9 {
            let len =
                (usize::from(buf[0]) << 16) | (usize::from(buf[1]) << 8) | usize::from(buf[2]);
            if buf.len() < 9 + len {
                break;
            }
            let payload = &buf[9..9 + len];
            match buf[3] {
                GOAWAY => {
                    seen.goaway_last_streams.push(
                        u32::from_be_bytes(payload[..4].try_into().expect("a stream id"))
                            & 0x7fff_ffff,
                    );
                    seen.goaway_codes.push(u32::from_be_bytes(
                        payload[4..8].try_into().expect("GOAWAY has an error code"),
                    ));
                }
                PING if buf[4] & 0x1 == 0 => seen.pings += 1,
                SETTINGS if buf[4] & 0x1 == 0 && seen.max_frame_size.is_none() => {
                    let advertised = payload
                        .chunks_exact(6)
                        .find(|p| p[..2] == SETTINGS_MAX_FRAME_SIZE.to_be_bytes())
                        .map(|p| u32::from_be_bytes(p[2..6].try_into().expect("4 bytes")));
                    seen.max_frame_size = Some(advertised.unwrap_or(16_384));
                }
                WINDOW_UPDATE if buf[5..9] == [0, 0, 0, 0] => {
                    seen.connection_window += u64::from(
                        u32::from_be_bytes(payload[..4].try_into().expect("an increment"))
                            & 0x7fff_ffff,
                    );
                }
                DATA => seen.data_bytes += len,
                _ => {}
            }
            buf.drain(..9 + len);
        }
    }
}

async fn h2_connect(addr: SocketAddr) -> TlsStream<TcpStream> {
    let cfg = client_config(&ClientOpts {
        alpn: vec![b"h2".to_vec()],
        ..ClientOpts::default()
    });
    let tls = tls_connect(addr, cfg).await.expect("TLS to the proxy");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    tls
}

// ---------------------------------------------------------------------------------------
// Upstreams that count their connections

#[derive(Default)]
struct UpstreamCounts {
    accepted: AtomicUsize,
    open: AtomicUsize,
    peak: AtomicUsize,
}

struct OpenGuard(Arc<UpstreamCounts>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A raw HTTP/1.1 upstream. `hold`: each request is answered that long after its head
/// arrived (a slow Qdrant); `None`: it never reads anything at all (a stalled one), with a
/// 4 KiB receive buffer so the kernel holds little for it.
struct CountingUpstream {
    addr: SocketAddr,
    counts: Arc<UpstreamCounts>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl CountingUpstream {
    fn start(hold: Option<Duration>) -> Self {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        if hold.is_none() {
            socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
        }
        socket
            .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .expect("bind");
        socket.listen(4096).expect("listen");
        socket.set_nonblocking(true).expect("nonblocking");
        let std_listener: std::net::TcpListener = socket.into();
        let addr = std_listener.local_addr().expect("addr");
        let counts = Arc::new(UpstreamCounts::default());
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let c = counts.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
                loop {
                    let (mut s, _) = tokio::select! {
                        r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
                        _ = &mut stop_rx => return,
                    };
                    c.accepted.fetch_add(1, Ordering::SeqCst);
                    let open = c.open.fetch_add(1, Ordering::SeqCst) + 1;
                    c.peak.fetch_max(open, Ordering::SeqCst);
                    let guard = OpenGuard(c.clone());
                    tokio::spawn(async move {
                        let _guard = guard;
                        let Some(hold) = hold else {
                            // Never read: wait for the proxy to give up on us.
                            let _ = s.readable().await;
                            let mut probe = [0u8; 1];
                            loop {
                                match s.peek(&mut probe).await {
                                    Ok(0) | Err(_) => return,
                                    Ok(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                                }
                            }
                        };
                        let mut head = Vec::new();
                        let mut buf = [0u8; 4096];
                        loop {
                            match s.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => head.extend_from_slice(&buf[..n]),
                            }
                            if head.windows(4).any(|w| w == b"\r\n\r\n") {
                                break;
                            }
                        }
                        // Answer after `hold`, unless the proxy closes first (a cancelled
                        // request): a read of 0 bytes says so.
                        tokio::select! {
                            _ = tokio::time::sleep(hold) => {
                                // One request per connection, said so: the proxy pools nothing.
                                let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}").await;
                                let _ = s.read(&mut buf).await;
                            }
                            _ = async { while let Ok(n) = s.read(&mut buf).await { if n == 0 { break } } } => {}
                        }
                    });
                }
            });
        });
        Self {
            addr,
            counts,
            _stop: stop_tx,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn accepted(&self) -> usize {
        self.counts.accepted.load(Ordering::SeqCst)
    }

    fn open(&self) -> usize {
        self.counts.open.load(Ordering::SeqCst)
    }

    fn peak(&self) -> usize {
        self.counts.peak.load(Ordering::SeqCst)
    }
}

/// The sum of every series of `name` whose labels contain `labels`, scraped now.
fn metric(proxy: &ProxyProcess, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_sum(&proxy.metrics(), name, labels)
}

/// A proxy (aws-lc-rs, ECDSA P-256) in front of `upstream` with `flags`.
fn proxy_in_front_of(upstream: &str, flags: &[&str]) -> ProxyProcess {
    ProxyProcess::start(
        upstream,
        ProviderName::AwsLcRs,
        CertAlgorithmName::EcdsaP256,
        flags,
    )
}

fn raise_open_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

// ---------------------------------------------------------------------------------------
// 1. Deadlines

/// 20 connections that negotiate h2 and then send no preface, or only PINGs, filled every
/// slot forever; now each is closed after the first-request timeout plus the drain
/// timeout, and a new client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_ping_only_h2_connections_give_their_slots_back() {
    let upstream = EchoUpstream::start();
    let proxy = proxy_in_front_of(
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
        metric(
            &proxy,
            "proxy_connection_closes_total",
            &[("reason", "no_first_request")]
        ),
        20.0
    );
}

/// A client that reads nothing (an h2 zero window, an HTTP/1.1 reader that stopped) and a
/// client that never acknowledges the PING of the GOAWAY outlived every timeout; now the
/// first two are closed after the stall timeout and the last after idle + drain.
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
    assert!(
        metric(
            &proxy,
            "proxy_connection_closes_total",
            &[("reason", "stalled")]
        ) >= 2.0
    );
    assert!(
        metric(
            &proxy,
            "proxy_connection_closes_total",
            &[("reason", "drain_deadline")]
        ) >= 1.0
    );
}

// ---------------------------------------------------------------------------------------
// 2. A bounded upstream

/// 4 connections x 32 streams to a slow upstream became 128 upstream connections; now at
/// most --max-upstream-requests reach it and the rest get 503 in Qdrant's error shape (gRPC:
/// RESOURCE_EXHAUSTED) at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_upstream_requests_are_capped() {
    let upstream = CountingUpstream::start(Some(Duration::from_millis(1500)));
    let proxy = proxy_in_front_of(&upstream.url(), &["--max-upstream-requests", "16"]);
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
        metric(&proxy, "proxy_upstream_rejected_total", &[]),
        f64::from(refused + 1)
    );
}

// ---------------------------------------------------------------------------------------
// 3. Rapid reset at any pace

/// What one paced rapid-reset connection cost before the proxy closed it.
#[derive(Debug)]
struct ResetRun {
    /// Streams whose frames the client wrote before the connection closed under it (at no
    /// pause, the kernel takes all 2,000 before the close arrives).
    streams_sent: u32,
    /// Streams h2 took, by a final GOAWAY's last stream id (those after the flag among them
    /// were refused without touching the upstream); `None` when only the graceful first
    /// GOAWAY (last id 2^31-1) came before the hard close (this client never answers the
    /// PING that would bring the final one).
    streams_taken: Option<u32>,
    upstream_requests: usize,
    seen: Seen,
}

/// The attack as an independent client ran it: streams opened in batches of 50 (HEADERS
/// for each), `pause`, then an RST_STREAM for each, up to 2,000 streams on one connection
/// or 15 s.
async fn paced_rapid_reset(proxy: &ProxyProcess, pause: Duration) -> (u32, Seen) {
    let tls = h2_connect(proxy.addr).await;
    let (mut r, mut w) = tokio::io::split(tls);
    let seen = tokio::spawn(async move { watch(&mut r, Duration::from_secs(20)).await });
    w.write_all(PREFACE).await.unwrap();
    w.write_all(&settings(&[])).await.unwrap();
    let started = Instant::now();
    let mut sent = 0u32;
    'batches: for batch in 0..40u32 {
        let ids: Vec<u32> = (0..50).map(|i| 2 * (batch * 50 + i) + 1).collect();
        let mut opens = Vec::new();
        for id in &ids {
            opens.extend(get_headers(*id, "/collections"));
        }
        if w.write_all(&opens).await.is_err() {
            break;
        }
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        for id in &ids {
            if w.write_all(&frame(RST_STREAM, 0, *id, &8u32.to_be_bytes()))
                .await
                .is_err()
            {
                break 'batches;
            }
            sent += 1;
        }
        if started.elapsed() > Duration::from_secs(15) {
            break;
        }
    }
    (sent, seen.await.unwrap())
}

/// Paced rapid reset went through (2,000 streams, no GOAWAY, 674-801 upstream requests)
/// when the upstream answered before the reset arrived: only streams still unanswered
/// counted. Now a stream reset within 1 s of opening counts whatever happened to its
/// answer, and at every pace, against a fast and a slow upstream, the connection gets
/// GOAWAY ENHANCE_YOUR_CALM and is closed within the budget, and every reset of a stream
/// still in flight cancels its upstream request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_rapid_reset_closes_the_connection_at_any_pace_and_upstream_speed() {
    let mut table = Vec::new();
    for (speed, hold) in [
        ("fast", Duration::ZERO),
        ("slow (20 s)", Duration::from_secs(20)),
    ] {
        let upstream = CountingUpstream::start(Some(hold));
        let proxy = proxy_in_front_of(&upstream.url(), &[]);
        for (n, pause_ms) in [0u64, 1, 5, 50].into_iter().enumerate() {
            let before = upstream.accepted();
            let (streams_sent, seen) =
                paced_rapid_reset(&proxy, Duration::from_millis(pause_ms)).await;
            let streams_taken = seen
                .goaway_last_streams
                .iter()
                .copied()
                .filter(|id| *id < 0x7fff_ffff)
                .min()
                .map(|id| id.div_ceil(2));
            let run = ResetRun {
                streams_sent,
                streams_taken,
                upstream_requests: upstream.accepted() - before,
                seen,
            };
            eprintln!(
                "rapid reset, {speed} upstream, pause {pause_ms} ms: {} streams written, {:?} taken, {} upstream requests, GOAWAY {:?}, closed after {:?}",
                run.streams_sent, run.streams_taken, run.upstream_requests, run.seen.goaway_codes, run.seen.closed_after
            );
            assert!(
                !run.seen.goaway_codes.is_empty() && run.seen.closed_after.is_some(),
                "{speed}, {pause_ms} ms: no GOAWAY or close: {run:?}"
            );
            assert!(
                run.seen
                    .goaway_codes
                    .iter()
                    .all(|c| *c == ENHANCE_YOUR_CALM),
                "{speed}, {pause_ms} ms: GOAWAY says ENHANCE_YOUR_CALM: {run:?}"
            );
            // Closed within the flood's drain second (and the h2 burst limit's GOAWAY).
            assert!(
                run.seen
                    .closed_after
                    .is_some_and(|t| t < Duration::from_secs(3)),
                "{speed}, {pause_ms} ms: not closed within 3 s: {run:?}"
            );
            // Flagged at the 51st premature reset of at most 100 streams (two batches);
            // streams opened after that are refused without touching the upstream.
            assert!(
                run.upstream_requests <= 100,
                "{speed}, {pause_ms} ms: {} upstream requests for {} reset streams",
                run.upstream_requests,
                run.streams_sent
            );
            // Every closing is counted with its reason, unless h2 itself refused the burst
            // first (its limit on streams reset before they were accepted).
            let closes = metric(
                &proxy,
                "proxy_connection_closes_total",
                &[("reason", "reset_flood")],
            );
            assert!(closes <= (n + 1) as f64, "{speed}: {closes} closes");
            if pause_ms > 0 {
                assert!(
                    closes >= 1.0,
                    "{speed}, {pause_ms} ms: not counted\n{}",
                    proxy.log_text()
                );
            }
            table.push((
                speed,
                pause_ms,
                run.streams_sent,
                run.upstream_requests,
                run.seen.closed_after.unwrap_or_default(),
            ));
        }
        // Each reset cancelled its upstream request: nothing stays open at the upstream,
        // which would otherwise hold every request for 20 s.
        let deadline = Instant::now() + Duration::from_secs(3);
        while upstream.open() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(upstream.open(), 0, "{speed}: upstream requests left open");
    }
    eprintln!(
        "upstream | pause ms | streams written before the close | upstream requests | closed after"
    );
    for (speed, pause, sent, requests, closed) in table {
        eprintln!("{speed} | {pause} | {sent} | {requests} | {closed:?}");
    }
}

/// A well-behaved HTTP/2 client that cancels some of its calls (a deadline shorter than
/// the answer) keeps its connection: 300 calls on one connection, every fourth reset 20 ms
/// after it opened, against a slow upstream; the others answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cancelling_some_calls_is_not_cut_off() {
    let upstream = CountingUpstream::start(Some(Duration::from_millis(50)));
    let proxy = proxy_in_front_of(&upstream.url(), &[]);
    let tls = h2_connect(proxy.addr).await;
    let (mut r, mut w) = tokio::io::split(tls);
    let seen = tokio::spawn(async move { watch(&mut r, Duration::from_secs(5)).await });
    w.write_all(PREFACE).await.unwrap();
    w.write_all(&settings(&[])).await.unwrap();
    for i in 0..300u32 {
        let id = 2 * i + 1;
        w.write_all(&get_headers(id, "/collections")).await.unwrap();
        if i % 4 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            w.write_all(&frame(RST_STREAM, 0, id, &8u32.to_be_bytes()))
                .await
                .unwrap();
        }
    }
    // The answers of the last calls arrive within the watch; then it stops reading.
    let seen = seen.await.unwrap();
    assert!(seen.goaway_codes.is_empty(), "cut off: {seen:?}");
    assert!(seen.closed_after.is_none(), "closed: {seen:?}");
    assert!(seen.data_bytes > 0, "no call answered: {seen:?}");
    assert_eq!(
        metric(
            &proxy,
            "proxy_connection_closes_total",
            &[("reason", "reset_flood")]
        ),
        0.0
    );
}

// ---------------------------------------------------------------------------------------
// 4. Bounded memory

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
    let proxy = proxy_in_front_of(&upstream.url(), &[]);
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
    let proxy = proxy_in_front_of(
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
    let proxy = proxy_in_front_of(
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
    let received_before = metric(&proxy, "proxy_received_bytes_total", &[]);
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
        let now = metric(&proxy, "proxy_received_bytes_total", &[]);
        if now > received_before && (now - last) < 1e6 {
            break;
        }
        last = now;
    }
    let received = metric(&proxy, "proxy_received_bytes_total", &[]) - received_before;
    let rss_growth = proxy_rss(&proxy).saturating_sub(rss_before);
    let kernel_queued = kernel_send_queue_to(upstream.addr) as f64;
    let reserved = metric(&proxy, "proxy_request_buffer_reserved_bytes", &[]);
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
    let out = std::process::Command::new("ss")
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

fn proxy_rss(proxy: &ProxyProcess) -> u64 {
    let m = proxy.metrics();
    metric_value(&m, "process_resident_memory_bytes", &[]).expect("process metrics") as u64
}

// ---------------------------------------------------------------------------------------
// 5. The admin listener

/// 200 admin connections with unfinished request heads stayed open forever; now at most
/// admin.max_connections are kept and those are closed after the header timeout; a wrong
/// token is refused and counted; /admin/tls reads only regular files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_port_bounds_connections_and_checks_what_it_reads() {
    let upstream = EchoUpstream::start();
    let dir = temp_dir("admin-hardening");
    let token = dir.join("token");
    std::fs::write(&token, "0123456789abcdef-secret").unwrap();
    let config = dir.join("proxy.toml");
    std::fs::write(
        &config,
        "[admin]\nmax_connections = 8\nheader_read_timeout = \"1s\"\n",
    )
    .unwrap();
    let proxy = proxy_in_front_of(
        &upstream.url(),
        &[
            "--config",
            config.to_str().unwrap(),
            "--admin-token-file",
            token.to_str().unwrap(),
        ],
    );
    let mut open = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(proxy.admin).await.unwrap();
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n").await;
        open.push(s);
    }
    // All 200 are closed: 192 at once (over the cap), 8 after the 1 s header timeout.
    let started = Instant::now();
    for (i, mut s) in open.into_iter().enumerate() {
        let mut buf = [0u8; 256];
        let left = Duration::from_secs(5).saturating_sub(started.elapsed());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {}
            Ok(Ok(_)) => {} // hyper's 408 before closing
            Err(_) => panic!("admin connection {i} still open after 5 s"),
        }
    }
    eprintln!(
        "200 admin connections with unfinished heads: all closed within {:?}",
        started.elapsed()
    );
    let m = proxy.metrics();
    assert!(
        metric_value(
            &m,
            "proxy_admin_refusals_total",
            &[("reason", "connections")]
        )
        .unwrap_or(0.0)
            >= 150.0,
        "{m}"
    );

    let switch = |auth: &str, body: String| {
        let auth = auth.to_owned();
        let admin = proxy.admin;
        async move {
            let mut s = TcpStream::connect(admin).await.unwrap();
            let req = format!(
                "POST /admin/tls HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            let _ = tokio::time::timeout(WAIT, s.read_to_string(&mut out)).await;
            out
        }
    };
    let (cert, _) = server_cert(CertAlgorithmName::EcdsaP256);
    let body = serde_json::json!({
        "provider": "aws-lc-rs",
        "cert": cert,
        "key": "/dev/zero",
    })
    .to_string();
    let wrong = switch("Bearer short", body.clone()).await;
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    let right = switch("Bearer 0123456789abcdef-secret", body).await;
    assert!(right.starts_with("HTTP/1.1 422"), "{right}");
    assert!(right.contains("not a regular file"), "{right}");
    assert_eq!(
        metric(&proxy, "proxy_admin_refusals_total", &[("reason", "token")]),
        1.0
    );
}

// ---------------------------------------------------------------------------------------
// 6. Clients learn nothing internal; headers they may not set

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_headers_connect_and_client_framing_errors() {
    let upstream = EchoUpstream::start();
    let proxy = proxy_in_front_of(&upstream.url(), &[]);
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
    let upstream_errors = metric(&proxy, "proxy_upstream_errors_total", &[]);
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
        metric(&proxy, "proxy_client_errors_total", &[("kind", "body")]),
        1.0
    );
    assert_eq!(
        metric(&proxy, "proxy_upstream_errors_total", &[]),
        upstream_errors,
        "a client's framing error is not an upstream error"
    );
    assert_eq!(
        metric(&proxy, "proxy_client_errors_total", &[("kind", "method")]),
        1.0
    );
}

/// Over h2c the upstream gets :authority and no host header (nginx answers a request with
/// both 400 "client sent duplicate host header").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_requests_carry_authority_only() {
    let upstream = EchoUpstream::start();
    let proxy = proxy_in_front_of(&upstream.url(), &["--upstream-protocol", "h2c"]);
    let cfg = client_config(&ClientOpts::default());
    let a = request_bounded(proxy.addr, cfg, "GET", "/", &[], Bytes::new())
        .await
        .unwrap();
    let j = a.json();
    assert_eq!(j["version"], "HTTP/2.0", "{j}");
    assert!(j["headers"]["host"].is_null(), "{j}");
}

// ---------------------------------------------------------------------------------------
// 8. Logs a scanner cannot flood; keys readable by others

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scanner_cannot_flood_the_log() {
    let upstream = EchoUpstream::start();
    let (cert, key) = server_cert(CertAlgorithmName::EcdsaP256);
    let dir = temp_dir("readable-key");
    let open_key = dir.join("key.pem");
    std::fs::copy(&key, &open_key).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&open_key, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let proxy = ProxyProcess::start_raw(&args(&[
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &upstream.url(),
        "--cert",
        cert.to_str().unwrap(),
        "--key",
        open_key.to_str().unwrap(),
    ]));
    assert!(
        proxy.log_text().contains("readable by every user"),
        "{}",
        proxy.log_text()
    );
    let started = Instant::now();
    for _ in 0..500 {
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        let _ = s.write_all(b"\x16\x03\x01\x00\x05hello-not-tls").await;
        let mut buf = [0u8; 64];
        let _ = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await;
    }
    let seconds = started.elapsed().as_secs() + 1;
    let m = proxy.metrics();
    let failed = metric_sum(&m, "proxy_tls_handshakes_total", &[("outcome", "error")]);
    assert_eq!(failed, 500.0, "{m}");
    let lines = proxy
        .log_text()
        .lines()
        .filter(|l| l.contains("TLS handshake failed"))
        .count() as u64;
    eprintln!(
        "500 bad handshakes in {seconds} s: {lines} log lines, {} suppressed",
        metric_value(&m, "proxy_log_lines_suppressed_total", &[]).unwrap_or(0.0)
    );
    assert!(
        lines <= 20 * (seconds + 1),
        "{lines} log lines for 500 bad handshakes in {seconds} s"
    );
    assert!(
        metric_value(&m, "proxy_log_lines_suppressed_total", &[]).unwrap_or(0.0) >= 1.0,
        "{m}"
    );
}

// ---------------------------------------------------------------------------------------
// Attacks that were already stopped: kept stopped

/// A HEADERS block for POST `path` with `extra` literal headers (name, value), not
/// ending the stream.
fn post_headers_block(path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut block = vec![0x83, 0x87, 0x01, 9];
    block.extend_from_slice(b"localhost");
    block.extend_from_slice(&[0x04, path.len() as u8]);
    block.extend_from_slice(path.as_bytes());
    for (name, value) in extra {
        block.push(0x00);
        hpack_length(&mut block, name.len());
        block.extend_from_slice(name.as_bytes());
        hpack_length(&mut block, value.len());
        block.extend_from_slice(value.as_bytes());
    }
    block
}

/// An HPACK string length (7-bit prefix integer, no Huffman).
fn hpack_length(out: &mut Vec<u8>, mut n: usize) {
    if n < 127 {
        out.push(n as u8);
        return;
    }
    out.push(127);
    n -= 127;
    while n >= 128 {
        out.push((n % 128 + 128) as u8);
        n /= 128;
    }
    out.push(n as u8);
}

const CONTINUATION: u8 = 0x9;

/// Each HTTP/2 flood from the list of attacks the proxy already stopped, on its own
/// connection, against an upstream that counts what reaches it: the attacking connection
/// is closed within seconds, nothing of it reaches the upstream, a good client is served
/// afterwards, and the proxy's memory does not grow with the floods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_floods_stay_stopped() {
    let upstream = CountingUpstream::start(Some(Duration::from_millis(10)));
    // PING and SETTINGS floods are stopped by backpressure (h2 reads no further while an
    // acknowledgement waits to be written to a client that does not read) and then closed
    // by the first-request deadline; the others are protocol errors closed at once.
    let proxy = proxy_in_front_of(
        &upstream.url(),
        &["--first-request-timeout", "2s", "--drain-timeout", "1s"],
    );
    let rss_before = proxy_rss(&proxy);
    let big = "x".repeat(16 * 1024);
    let floods: Vec<(&str, Vec<u8>)> = vec![
        ("CONTINUATION flood", {
            let mut f = frame(HEADERS, 0, 1, &post_headers_block("/", &[]));
            for _ in 0..2000 {
                f.extend(frame(
                    CONTINUATION,
                    0,
                    1,
                    &post_headers_block("/", &[("x-a", &big)])[9..],
                ));
            }
            f
        }),
        (
            "PING flood",
            (0..50_000u64)
                .flat_map(|n| frame(PING, 0, 0, &n.to_be_bytes()))
                .collect(),
        ),
        (
            "SETTINGS flood",
            (0..50_000).flat_map(|_| settings(&[(0x3, 100)])).collect(),
        ),
        ("empty DATA frames", {
            let mut f = frame(HEADERS, END_HEADERS, 1, &post_headers_block("/", &[]));
            for _ in 0..100_000 {
                f.extend(frame(DATA, 0, 1, &[]));
            }
            f
        }),
        ("window overflow", {
            let mut f = frame(WINDOW_UPDATE, 0, 0, &0x7fff_ffffu32.to_be_bytes());
            f.extend(frame(WINDOW_UPDATE, 0, 0, &0x7fff_ffffu32.to_be_bytes()));
            f
        }),
        ("oversized header list", {
            let headers: Vec<(&str, &str)> = (0..8).map(|_| ("x-big", big.as_str())).collect();
            frame(
                HEADERS,
                END_HEADERS | END_STREAM,
                1,
                &post_headers_block("/", &headers),
            )
        }),
    ];
    for (name, bytes) in floods {
        let before = upstream.accepted();
        let tls = h2_connect(proxy.addr).await;
        let (mut r, mut w) = tokio::io::split(tls);
        let seen = tokio::spawn(async move { watch(&mut r, Duration::from_secs(10)).await });
        w.write_all(PREFACE).await.unwrap();
        w.write_all(&settings(&[])).await.unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(10), w.write_all(&bytes)).await;
        let seen = seen.await.unwrap();
        eprintln!("{name}: {seen:?}");
        assert!(
            seen.closed_after.is_some() || !seen.goaway_codes.is_empty(),
            "{name}: the connection is neither closed nor told to go away: {seen:?}"
        );
        assert_eq!(upstream.accepted(), before, "{name} reached the upstream");
        let a = get(proxy.addr, "/")
            .await
            .unwrap_or_else(|e| panic!("after the {name}, a good client failed: {e}"));
        assert_eq!(a.status, 200, "after the {name}");
    }
    let growth = proxy_rss(&proxy).saturating_sub(rss_before);
    assert!(growth < 32 << 20, "RSS grew by {} MiB", growth >> 20);
}

/// HTTP/1.1 request smuggling and malformed framing: each is answered 400 (or 501 for an
/// unknown transfer coding) and never forwarded; Content-Length with Transfer-Encoding is
/// read by its chunked framing alone (hyper drops the Content-Length), forwarded as one
/// re-framed request, and the connection closed after the answer (RFC 9112 6.3), so a
/// second request hidden in the body never reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_smuggling_stays_stopped() {
    let upstream = CountingUpstream::start(Some(Duration::from_millis(10)));
    let proxy = proxy_in_front_of(&upstream.url(), &[]);
    // A bad chunk size inside a body is the framing test above: the head was valid and
    // already on its way, the upstream request is aborted and the client gets 400.
    let cases: [(&str, &str); 4] = [
        (
            "two different Content-Length",
            "POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 4\r\ncontent-length: 5\r\n\r\nabcde",
        ),
        (
            "invalid Content-Length",
            "POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 4x\r\n\r\nabcd",
        ),
        (
            "obs-fold",
            "GET / HTTP/1.1\r\nhost: a\r\nx-folded: a\r\n b\r\n\r\n",
        ),
        (
            "TE other than chunked",
            "POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: gzip\r\n\r\nabcd",
        ),
    ];
    let cfg = client_config(&ClientOpts::default());
    for (name, request) in cases {
        let before = upstream.accepted();
        let mut tls = tls_connect(proxy.addr, cfg.clone()).await.unwrap();
        tls.write_all(request.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(WAIT, tls.read_to_end(&mut out)).await;
        let text = String::from_utf8_lossy(&out);
        eprintln!(
            "{name}: {}",
            text.lines().next().unwrap_or("(closed, no answer)")
        );
        assert!(
            text.is_empty() || text.starts_with("HTTP/1.1 400") || text.starts_with("HTTP/1.1 501"),
            "{name}: {text}"
        );
        // Let a forwarded request, if any, reach the upstream before counting.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(upstream.accepted(), before, "{name} reached the upstream");
    }

    // The classic CL.TE smuggle: by Content-Length the body is "0\r\n\r\nGET /smuggled...",
    // by chunked framing it ends at "0\r\n\r\n" and a second request follows.
    let before = upstream.accepted();
    let mut tls = tls_connect(proxy.addr, cfg.clone()).await.unwrap();
    let smuggle = "POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 44\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nhost: a\r\n\r\n";
    tls.write_all(smuggle.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, tls.read_to_end(&mut out))
        .await
        .expect("the connection is closed after the answer")
        .ok();
    let text = String::from_utf8_lossy(&out);
    eprintln!("CL and TE together: {}", text.lines().next().unwrap_or(""));
    assert_eq!(
        text.matches("HTTP/1.1 ").count(),
        1,
        "one answer, for the chunked request only: {text}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        upstream.accepted(),
        before + 1,
        "only the chunked request was forwarded"
    );
}
