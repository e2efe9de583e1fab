//! No request lost to an upstream that closes idle keep-alive connections: Qdrant's REST
//! server (actix-web) closes a connection idle for 5 s, and a proxy that still pooled it
//! could write the next request into the closing socket (1 in 60 requests at 5.00 s
//! intervals got a 502 when the pool kept connections for 30 s). The upstreams here close
//! idle connections after 5 s on their own clock, abruptly, as actix does over HTTP/1.1
//! and (harsher than any GOAWAY) over h2c; requests arrive through the proxy 4.8 to 5.2 s
//! apart, each on a new client connection, over HTTP/1.1 and h2c at once.
//!
//! `KEEPALIVE_REQUESTS=N` sends N requests per protocol instead of 10 (a longer run by hand,
//! e.g. against an older build with `E2E_PROXY_BIN`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::*;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The upstreams' keep-alive: actix-web's default, which Qdrant keeps.
const UPSTREAM_KEEP_ALIVE: Duration = Duration::from_secs(5);
/// Gaps between requests, cycled: around the upstream's keep-alive, both sides of it.
const GAPS_MS: [u64; 6] = [5000, 4800, 5100, 4900, 5200, 5000];
/// Requests per protocol by default (bounded: about 50 s).
const REQUESTS: usize = 10;

fn requests() -> usize {
    std::env::var("KEEPALIVE_REQUESTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(REQUESTS)
}

/// Connections an upstream accepted and requests it answered.
#[derive(Default)]
struct Counts {
    connections: AtomicUsize,
    answered: AtomicUsize,
    closed_idle: AtomicUsize,
}

/// A raw HTTP/1.1 keep-alive upstream: answers each request with a small JSON body, and
/// closes a connection on which no request began within 5 s of the last answer.
/// Serves each connection accepted on a loopback port with `serve` (counted first) on
/// `rt`; the address and the counts.
fn counting_upstream<F, Fut>(rt: &tokio::runtime::Handle, serve: F) -> (SocketAddr, Arc<Counts>)
where
    F: Fn(tokio::net::TcpStream, Arc<Counts>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    std_listener.set_nonblocking(true).expect("nonblocking");
    let addr = std_listener.local_addr().expect("addr");
    let counts = Arc::new(Counts::default());
    let c = counts.clone();
    rt.spawn(async move {
        let listener = TcpListener::from_std(std_listener).expect("listener");
        loop {
            let Ok((s, _)) = listener.accept().await else {
                continue;
            };
            c.connections.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(s, c.clone()));
        }
    });
    (addr, counts)
}

fn closing_http1_upstream(rt: &tokio::runtime::Handle) -> (SocketAddr, Arc<Counts>) {
    counting_upstream(rt, |mut s, c| async move {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 16 * 1024];
        loop {
            // Waiting for the next request's first bytes: the keep-alive clock.
            let head_end = loop {
                if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break at + 4;
                }
                let read = if buf.is_empty() {
                    match tokio::time::timeout(UPSTREAM_KEEP_ALIVE, s.read(&mut chunk)).await {
                        Ok(r) => r,
                        Err(_) => {
                            c.closed_idle.fetch_add(1, Ordering::SeqCst);
                            return; // dropped: closed, as actix does
                        }
                    }
                } else {
                    s.read(&mut chunk).await
                };
                match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
            let body_len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < head_end + body_len {
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            buf.drain(..head_end + body_len);
            let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 15\r\n\r\n{\"result\":true}";
            if s.write_all(answer).await.is_err() {
                return;
            }
            c.answered.fetch_add(1, Ordering::SeqCst);
        }
    })
}

/// An h2c upstream (hyper's server): answers each request, and drops a connection that
/// has had no request in flight for 5 s, with no GOAWAY.
fn closing_h2c_upstream(rt: &tokio::runtime::Handle) -> (SocketAddr, Arc<Counts>) {
    counting_upstream(rt, |s, c| async move {
        // (requests in flight, when the last one ended)
        let state = Arc::new(Mutex::new((0usize, Instant::now())));
        let svc_state = state.clone();
        let svc_counts = c.clone();
        let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let state = svc_state.clone();
            let counts = svc_counts.clone();
            async move {
                state.lock().unwrap().0 += 1;
                let _ = req.into_body().collect().await;
                {
                    let mut st = state.lock().unwrap();
                    st.0 -= 1;
                    st.1 = Instant::now();
                }
                counts.answered.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::convert::Infallible>(
                    hyper::Response::builder()
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from_static(b"{\"result\":true}")))
                        .expect("response"),
                )
            }
        });
        let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .serve_connection(TokioIo::new(s), svc);
        let mut conn = std::pin::pin!(conn);
        loop {
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = tokio::time::sleep(Duration::from_millis(10)) => {
                    let (in_flight, last) = *state.lock().unwrap();
                    if in_flight == 0 && last.elapsed() >= UPSTREAM_KEEP_ALIVE {
                        c.closed_idle.fetch_add(1, Ordering::SeqCst);
                        return; // dropped: the socket closes under the client
                    }
                }
            }
        }
    })
}

/// Sends `requests()` requests through `proxy`, each on a new TLS connection, `GAPS_MS`
/// apart; the failures, each with what it got.
async fn paced_requests(proxy: SocketAddr, alpn: &[u8]) -> Vec<String> {
    let config = client_config(&ClientOpts {
        alpn: vec![alpn.to_vec()],
        ..ClientOpts::default()
    });
    let mut failures = Vec::new();
    let mut next = tokio::time::Instant::now();
    for i in 0..requests() {
        tokio::time::sleep_until(next).await;
        next += Duration::from_millis(GAPS_MS[i % GAPS_MS.len()]);
        let answer = request_bounded(
            proxy,
            config.clone(),
            "POST",
            "/collections/docs/points/search",
            &[("content-type", "application/json")],
            Bytes::from_static(b"{\"vector\":[0.1,0.2,0.3],\"limit\":3}"),
        )
        .await;
        match answer {
            Ok(a) if a.status == 200 => {}
            Ok(a) => failures.push(format!(
                "request {i}: {} {}",
                a.status,
                String::from_utf8_lossy(&a.body)
            )),
            Err(e) => failures.push(format!("request {i}: {e}")),
        }
    }
    failures
}

#[test]
fn no_request_is_lost_to_an_upstream_closing_idle_connections_after_5s() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (h1_addr, h1_counts) = closing_http1_upstream(rt.handle());
    let (h2c_addr, h2c_counts) = closing_h2c_upstream(rt.handle());
    // The proxy's defaults: its pool keeps idle upstream connections under 5 s.
    let h1_proxy = ProxyProcess::in_front_of(
        &format!("http://{h1_addr}"),
        &["--upstream-protocol", "http1"],
    );
    let h2c_proxy = ProxyProcess::in_front_of(
        &format!("http://{h2c_addr}"),
        &["--upstream-protocol", "h2c"],
    );
    let (h1_failures, h2c_failures) = rt.block_on(async {
        tokio::join!(
            paced_requests(h1_proxy.addr, b"http/1.1"),
            paced_requests(h2c_proxy.addr, b"h2")
        )
    });
    for (name, counts, failures) in [
        ("HTTP/1.1", &h1_counts, &h1_failures),
        ("h2c", &h2c_counts, &h2c_failures),
    ] {
        eprintln!(
            "{name}: {} requests 4.8-5.2 s apart, {} failed; the upstream answered {} on {} connections and closed {} idle ones",
            requests(),
            failures.len(),
            counts.answered.load(Ordering::SeqCst),
            counts.connections.load(Ordering::SeqCst),
            counts.closed_idle.load(Ordering::SeqCst),
        );
    }
    assert!(h1_failures.is_empty(), "HTTP/1.1: {h1_failures:?}");
    assert!(h2c_failures.is_empty(), "h2c: {h2c_failures:?}");
    // How it holds: the pool let every connection go before the upstream's 5 s (its 4 s
    // default), so each request, coming 4.8 s or more after the last, had a new one.
    for counts in [&h1_counts, &h2c_counts] {
        assert_eq!(counts.answered.load(Ordering::SeqCst), requests());
        assert_eq!(counts.connections.load(Ordering::SeqCst), requests());
    }
    for proxy in [&h1_proxy, &h2c_proxy] {
        assert_eq!(
            metric_sum(&proxy.metrics(), "proxy_upstream_errors_total", &[]),
            0.0,
            "upstream errors counted"
        );
    }
}

/// A pool that keeps connections longer than the upstream does is the operator's choice
/// (`upstream_idle_timeout`); zero keeps none, and every request then opens its own.
#[test]
fn an_idle_timeout_of_zero_reuses_no_upstream_connection() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (addr, counts) = closing_http1_upstream(rt.handle());
    let proxy = ProxyProcess::in_front_of(
        &format!("http://{addr}"),
        &[
            "--upstream-protocol",
            "http1",
            "--upstream-idle-timeout",
            "0s",
        ],
    );
    rt.block_on(async {
        for _ in 0..3 {
            let a = get(proxy.addr, "/collections").await.expect("answer");
            assert_eq!(a.status, 200);
        }
    });
    assert_eq!(counts.connections.load(Ordering::SeqCst), 3);
}
