//! The drivers: closed loop (N workers, one request in flight each) and open loop (a fixed
//! schedule of R requests per second, latency measured from the scheduled send time so a
//! stalled target cannot hide its queueing delay). Both share one worker: the connection
//! policy, the timeout, and recording into per-worker HDR histograms merged at the end.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::{Conn, Connector, FailureKind};
use crate::workload::RequestSource;

/// When a connection is replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectionPolicy {
    /// A new connection (full or resumed handshake) for every request.
    New,
    /// Keep-alive: one connection per worker for the whole run.
    Reuse,
    /// A new connection every N requests.
    PerN(u64),
}

impl std::str::FromStr for ConnectionPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "new" => Ok(Self::New),
            "reuse" | "keep-alive" => Ok(Self::Reuse),
            _ => match s.strip_prefix("per-n=").map(str::parse::<u64>) {
                Some(Ok(n)) if n > 0 => Ok(Self::PerN(n)),
                _ => Err(format!("{s:?}: expected new, reuse or per-n=N with N >= 1")),
            },
        }
    }
}

impl std::fmt::Display for ConnectionPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::New => f.write_str("new"),
            Self::Reuse => f.write_str("reuse"),
            Self::PerN(n) => write!(f, "per-n={n}"),
        }
    }
}

/// How requests are paced.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// Closed loop: each worker sends its next request when the last one is answered.
    Closed,
    /// Requests per second.
    Open(f64),
}

/// How the driver sends.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    /// Closed or open loop.
    pub mode: Mode,
    /// Workers, each with one request in flight.
    pub concurrency: usize,
    /// When a worker opens a new connection.
    pub policy: ConnectionPolicy,
    /// Measured phase length; None means until `requests` are done.
    pub duration: Option<Duration>,
    /// Measured requests; None means until `duration` is over.
    pub requests: Option<u64>,
    /// Sent before the measured phase and not counted in it.
    pub warmup: Duration,
    /// How long one request may take before it counts as a timeout.
    pub request_timeout: Duration,
    /// HTTP/2 with keep-alive: the workers share this many connections, each request a new
    /// stream on one of them (a gRPC channel's behaviour). None: one connection per worker.
    pub shared_connections: Option<usize>,
    /// Print a progress line every second.
    pub progress: bool,
}

/// What the driver measured.
pub struct Outcome {
    /// Request latency in microseconds, measured requests.
    pub latency_us: Histogram<u64>,
    /// TCP connect + TLS handshake in microseconds, measured phase.
    pub handshake_us: Histogram<u64>,
    /// Measured requests acknowledged.
    pub ok: u64,
    /// Measured requests failed, by kind.
    pub failures: BTreeMap<FailureKind, u64>,
    /// First message seen per failure kind.
    pub failure_examples: BTreeMap<FailureKind, String>,
    /// Handshakes in the measured phase.
    pub handshakes: u64,
    /// Of which resumed.
    pub resumed_handshakes: u64,
    /// Body bytes of measured, acknowledged requests.
    pub ok_body_bytes: u64,
    /// Points acknowledged by the target, warm-up included (what the collection must hold).
    pub points_acknowledged: u64,
    /// Warm-up requests acknowledged.
    pub warmup_ok: u64,
    /// Warm-up requests failed.
    pub warmup_failed: u64,
    /// Measured phase: from the end of warm-up to the last measured completion.
    pub elapsed: Duration,
    /// Open loop: how late sends left against the schedule (microseconds).
    pub schedule_lag_us: Option<Histogram<u64>>,
    /// True when Ctrl-C (or the caller) stopped the run early.
    pub interrupted: bool,
    /// Measured requests (acknowledged, failed) by the second of the measured phase they
    /// ended in.
    pub per_second: Vec<(u64, u64)>,
}

struct Shared {
    workload: Arc<dyn RequestSource>,
    connector: Arc<Connector>,
    config: DriverConfig,
    start: Instant,
    measure_start: Instant,
    end: Option<Instant>,
    /// Next request sequence number (ids), warm-up included.
    next_seq: AtomicU64,
    /// Measured requests claimed so far (for `--requests`).
    measured_claimed: AtomicU64,
    live_ok: AtomicU64,
    live_failed: AtomicU64,
    live_latency: Mutex<Histogram<u64>>,
    /// Shared HTTP/2 connections, when `shared_connections` is set.
    h2_slots: Vec<tokio::sync::Mutex<Option<Conn>>>,
    stop: CancellationToken,
}

#[derive(Default)]
struct WorkerTally {
    ok: u64,
    failures: BTreeMap<FailureKind, u64>,
    examples: BTreeMap<FailureKind, String>,
    handshakes: u64,
    resumed: u64,
    ok_body_bytes: u64,
    points: u64,
    warmup_ok: u64,
    warmup_failed: u64,
    last_done: Option<Instant>,
    /// (acknowledged, failed) by second of the measured phase.
    per_second: Vec<(u64, u64)>,
}

impl WorkerTally {
    /// A request that failed: counted by kind with its first message, or as warm-up.
    fn failed(
        &mut self,
        shared: &Shared,
        failure: crate::client::Failure,
        done: Instant,
        measured: bool,
    ) {
        shared.live_failed.fetch_add(1, Ordering::Relaxed);
        if !measured {
            self.warmup_failed += 1;
            return;
        }
        *self.failures.entry(failure.kind.clone()).or_default() += 1;
        self.examples.entry(failure.kind).or_insert(failure.message);
        self.last_done = Some(done);
        self.count_second(shared.measure_start, done, false);
    }

    /// Counts a measured request that ended at `done` in its second.
    fn count_second(&mut self, measure_start: Instant, done: Instant, ok: bool) {
        let second = done.saturating_duration_since(measure_start).as_secs() as usize;
        if self.per_second.len() <= second {
            self.per_second.resize(second + 1, (0, 0));
        }
        let slot = &mut self.per_second[second];
        if ok {
            slot.0 += 1;
        } else {
            slot.1 += 1;
        }
    }
}

fn histogram() -> Histogram<u64> {
    // Microseconds, 3 significant digits, auto-resizing: any latency up to hours fits.
    let mut h = Histogram::new(3).expect("3 significant digits is valid");
    h.auto(true);
    h
}

/// Runs the workload until the duration, the request count or `stop` ends it.
pub async fn run(
    workload: Arc<dyn RequestSource>,
    connector: Arc<Connector>,
    config: DriverConfig,
    stop: CancellationToken,
) -> Outcome {
    // A child token: ending this run (which cancels it) must not cancel the caller's.
    let outer = stop;
    let stop = outer.child_token();
    let start = Instant::now();
    let measure_start = start + config.warmup;
    let end = config.duration.map(|d| measure_start + d);
    let shared = Arc::new(Shared {
        workload,
        connector,
        config: config.clone(),
        start,
        measure_start,
        end,
        next_seq: AtomicU64::new(0),
        measured_claimed: AtomicU64::new(0),
        live_ok: AtomicU64::new(0),
        live_failed: AtomicU64::new(0),
        live_latency: Mutex::new(histogram()),
        h2_slots: (0..config.shared_connections.unwrap_or(0))
            .map(|_| tokio::sync::Mutex::new(None))
            .collect(),
        stop: stop.clone(),
    });
    let progress = config
        .progress
        .then(|| tokio::spawn(progress_loop(shared.clone())));
    let workers: Vec<_> = (0..config.concurrency.max(1))
        .map(|id| tokio::spawn(worker(shared.clone(), id)))
        .collect();

    let mut latency = histogram();
    let mut handshake = histogram();
    let mut lag = matches!(config.mode, Mode::Open(_)).then(histogram);
    let mut tally = WorkerTally::default();
    for w in workers {
        let Ok((t, lat, hs, wl)) = w.await else {
            continue;
        };
        let _ = latency.add(&lat);
        let _ = handshake.add(&hs);
        if let (Some(all), Some(wl)) = (lag.as_mut(), wl) {
            let _ = all.add(&wl);
        }
        tally.ok += t.ok;
        for (k, n) in t.failures {
            *tally.failures.entry(k).or_default() += n;
        }
        for (k, m) in t.examples {
            tally.examples.entry(k).or_insert(m);
        }
        tally.handshakes += t.handshakes;
        tally.resumed += t.resumed;
        tally.ok_body_bytes += t.ok_body_bytes;
        tally.points += t.points;
        tally.warmup_ok += t.warmup_ok;
        tally.warmup_failed += t.warmup_failed;
        tally.last_done = tally.last_done.max(t.last_done);
        if tally.per_second.len() < t.per_second.len() {
            tally.per_second.resize(t.per_second.len(), (0, 0));
        }
        for (all, one) in tally.per_second.iter_mut().zip(&t.per_second) {
            all.0 += one.0;
            all.1 += one.1;
        }
    }
    let interrupted = outer.is_cancelled();
    stop.cancel();
    if let Some(p) = progress {
        let _ = p.await;
    }
    let finished = tally
        .last_done
        .unwrap_or_else(Instant::now)
        .max(measure_start);
    Outcome {
        latency_us: latency,
        handshake_us: handshake,
        ok: tally.ok,
        failures: tally.failures,
        failure_examples: tally.examples,
        handshakes: tally.handshakes,
        resumed_handshakes: tally.resumed,
        ok_body_bytes: tally.ok_body_bytes,
        points_acknowledged: tally.points,
        warmup_ok: tally.warmup_ok,
        warmup_failed: tally.warmup_failed,
        elapsed: finished - measure_start,
        schedule_lag_us: lag,
        interrupted,
        per_second: tally.per_second,
    }
}

/// The next request to send: its sequence number and the instant it was due.
fn next_request(shared: &Shared) -> Option<(u64, Instant)> {
    if shared.stop.is_cancelled() {
        return None;
    }
    let seq = shared.next_seq.fetch_add(1, Ordering::Relaxed);
    let due = match shared.config.mode {
        Mode::Closed => Instant::now(),
        Mode::Open(rate) => shared.start + Duration::from_secs_f64(seq as f64 / rate),
    };
    if let Some(end) = shared.end {
        if due >= end {
            return None;
        }
    }
    if due >= shared.measure_start {
        if let Some(limit) = shared.config.requests {
            if shared.measured_claimed.fetch_add(1, Ordering::Relaxed) >= limit {
                return None;
            }
        }
    }
    Some((seq, due))
}

/// A stream on the worker's shared HTTP/2 connection, opening it when needed; the handshake
/// is reported by the worker that opened it.
async fn shared_stream(
    shared: &Shared,
    id: usize,
    fresh: bool,
) -> Result<(Conn, Option<(Duration, bool)>), crate::client::Failure> {
    let slot = &shared.h2_slots[id % shared.h2_slots.len()];
    let mut guard = slot.lock().await;
    let mut handshake = None;
    if fresh || guard.as_ref().is_none_or(Conn::is_closed) {
        let opened = shared.connector.open().await?;
        handshake = Some((opened.handshake, opened.resumed));
        *guard = Some(opened.conn);
    }
    let conn = guard
        .as_ref()
        .and_then(Conn::share)
        .ok_or_else(|| crate::client::Failure {
            kind: FailureKind::Protocol,
            message: "shared connections need HTTP/2".to_owned(),
        })?;
    Ok((conn, handshake))
}

async fn worker(
    shared: Arc<Shared>,
    id: usize,
) -> (
    WorkerTally,
    Histogram<u64>,
    Histogram<u64>,
    Option<Histogram<u64>>,
) {
    let mut tally = WorkerTally::default();
    let mut latency = histogram();
    let mut handshake = histogram();
    let mut lag = matches!(shared.config.mode, Mode::Open(_)).then(histogram);
    let mut conn: Option<Conn> = None;
    let mut used_on_conn = 0u64;
    let points = shared.workload.points_per_request();
    let answer = shared.workload.answer();

    while let Some((seq, due)) = next_request(&shared) {
        if matches!(shared.config.mode, Mode::Open(_)) {
            tokio::select! {
                _ = tokio::time::sleep_until(due) => {}
                _ = shared.stop.cancelled() => break,
            }
            if let Some(lag) = lag.as_mut() {
                let _ =
                    lag.record(Instant::now().saturating_duration_since(due).as_micros() as u64);
            }
        }
        if needs_fresh(shared.config.policy, used_on_conn, conn.as_ref()) {
            conn = None;
        }
        let body_len = shared.workload.body_len(seq) as u64;
        let attempt = async {
            // A request the server never saw (its connection was closing) goes once more,
            // on a new connection.
            let mut resend = false;
            loop {
                let request = shared.workload.request(seq);
                let sent = if !shared.h2_slots.is_empty() {
                    let (mut stream, handshake) = shared_stream(&shared, id, resend).await?;
                    stream.send(request, answer).await.map(|()| handshake)
                } else {
                    let mut handshake_taken = None;
                    if conn.is_none() || resend {
                        let opened = shared.connector.open().await?;
                        handshake_taken = Some((opened.handshake, opened.resumed));
                        conn = Some(opened.conn);
                        used_on_conn = 0;
                    }
                    used_on_conn += 1;
                    let c = conn.as_mut().expect("a connection was just ensured");
                    c.send(request, answer).await.map(|()| handshake_taken)
                };
                match sent {
                    Err(f) if f.kind == FailureKind::Unsent && !resend => resend = true,
                    other => return other,
                }
            }
        };
        let result = tokio::time::timeout(shared.config.request_timeout, attempt).await;
        let done = Instant::now();
        let measured = due >= shared.measure_start;
        let outcome = match result {
            Ok(Ok(hs)) => Ok(hs),
            Ok(Err(f)) => Err(f),
            Err(_) => Err(crate::client::Failure {
                kind: FailureKind::Timeout,
                message: format!("no answer within {:?}", shared.config.request_timeout),
            }),
        };
        match outcome {
            Ok(hs) => {
                tally.points += points;
                if let Some((d, resumed)) = hs {
                    if measured {
                        tally.handshakes += 1;
                        tally.resumed += u64::from(resumed);
                        let _ = handshake.record(d.as_micros() as u64);
                    }
                }
                let us = done.saturating_duration_since(due).as_micros() as u64;
                // The shared histogram only feeds the progress line; no lock without it.
                if shared.config.progress {
                    if let Ok(mut live) = shared.live_latency.lock() {
                        let _ = live.record(us);
                    }
                }
                if measured {
                    let _ = latency.record(us);
                    tally.ok += 1;
                    tally.ok_body_bytes += body_len;
                    tally.last_done = Some(done);
                    tally.count_second(shared.measure_start, done, true);
                    shared.live_ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    tally.warmup_ok += 1;
                    shared.live_ok.fetch_add(1, Ordering::Relaxed);
                }
                // A connection per request is closed as a client closes it, and the close
                // is awaited: its cost (TLS close_notify, FIN, the server's teardown) falls
                // in this run, not whenever the next request replaces the handle. Latency
                // was taken before it.
                if shared.config.policy == ConnectionPolicy::New {
                    if let Some(c) = conn.take() {
                        c.close(shared.config.request_timeout).await;
                    }
                }
            }
            Err(failure) => {
                // A failed exchange leaves the connection in an unknown state.
                conn = None;
                tally.failed(&shared, failure, done, measured);
            }
        }
    }
    (tally, latency, handshake, lag)
}

/// Whether the next request needs a new connection: the policy's, or the one held closed.
fn needs_fresh(policy: ConnectionPolicy, used_on_conn: u64, conn: Option<&Conn>) -> bool {
    let by_policy = match policy {
        ConnectionPolicy::New => true,
        ConnectionPolicy::Reuse => false,
        ConnectionPolicy::PerN(n) => used_on_conn >= n,
    };
    by_policy || conn.is_none_or(Conn::is_closed)
}

async fn progress_loop(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    let mut last_ok = 0;
    let mut last = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shared.stop.cancelled() => return,
        }
        let now = Instant::now();
        let ok = shared.live_ok.load(Ordering::Relaxed);
        let failed = shared.live_failed.load(Ordering::Relaxed);
        let p50 = shared
            .live_latency
            .lock()
            .map(|mut h| {
                let v = h.value_at_quantile(0.5);
                h.reset();
                v
            })
            .unwrap_or(0);
        let rate = (ok - last_ok) as f64 / (now - last).as_secs_f64();
        let phase = if now < shared.measure_start {
            " (warm-up)"
        } else {
            ""
        };
        eprintln!(
            "[{:>5.1}s] {:>8.1} req/s  p50 {:>8.2} ms  ok {}  errors {}{}",
            (now - shared.start).as_secs_f64(),
            rate,
            p50 as f64 / 1000.0,
            ok,
            failed,
            phase
        );
        last_ok = ok;
        last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse() {
        assert_eq!(
            "new".parse::<ConnectionPolicy>().unwrap(),
            ConnectionPolicy::New
        );
        assert_eq!(
            "reuse".parse::<ConnectionPolicy>().unwrap(),
            ConnectionPolicy::Reuse
        );
        assert_eq!(
            "per-n=10".parse::<ConnectionPolicy>().unwrap(),
            ConnectionPolicy::PerN(10)
        );
        assert!("per-n=0".parse::<ConnectionPolicy>().is_err());
        assert!("sometimes".parse::<ConnectionPolicy>().is_err());
        assert_eq!(ConnectionPolicy::PerN(3).to_string(), "per-n=3");
    }
}
