//! Attacks on the framing already stopped, kept stopped: HTTP/2 floods (settings, pings,
//! empty frames, CONTINUATION, HPACK bombs) and HTTP/1.1 request smuggling.

use std::time::Duration;

use e2e::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::bounded_resources::proxy_rss;
use super::counting_upstream::*;
use super::h2_raw::*;

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
    let proxy = ProxyProcess::in_front_of(
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
    let proxy = ProxyProcess::in_front_of(&upstream.url(), &[]);
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
