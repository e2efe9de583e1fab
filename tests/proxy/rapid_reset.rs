//! Rapid reset at any pace: a client that opens and resets streams, paced or in bursts,
//! gets GOAWAY ENHANCE_YOUR_CALM within the budget, while one that cancels some of its calls
//! is not cut off.

use std::time::{Duration, Instant};

use e2e::*;
use tokio::io::AsyncWriteExt;

use super::counting_upstream::*;
use super::h2_raw::*;

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
pub(super) async fn paced_rapid_reset(proxy: &ProxyProcess, pause: Duration) -> (u32, Seen) {
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
        let proxy = ProxyProcess::in_front_of(&upstream.url(), &[]);
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
            let closes = proxy.metric(
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
    let proxy = ProxyProcess::in_front_of(&upstream.url(), &[]);
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
        proxy.metric(
            "proxy_connection_closes_total",
            &[("reason", "reset_flood")]
        ),
        0.0
    );
}
