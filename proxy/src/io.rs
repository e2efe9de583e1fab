//! The client socket wrapper and the per-connection state the deadlines read: bytes counted
//! for the metrics, requests in flight, when anything last made progress, and how many
//! streams the client cancelled. Idle connections are found from these without a timer per
//! read.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus::IntCounter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Why a connection's deadline fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quiet {
    /// No request arrived within the first-request timeout after the handshake (an h2
    /// client that never sends its preface, or only PINGs).
    NoFirstRequest,
    /// No request in flight for the idle timeout.
    Idle,
    /// Requests in flight, but nothing moved for the stall timeout: the client reads
    /// nothing (zero window, a reader that stopped) and sends nothing.
    Stalled,
}

impl Quiet {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::NoFirstRequest => "no_first_request",
            Self::Idle => "idle",
            Self::Stalled => "stalled",
        }
    }
}

/// How long each kind of quiet may last.
#[derive(Clone, Copy, Debug)]
pub struct QuietLimits {
    /// Before the first request.
    pub first_request: Duration,
    /// Between requests.
    pub idle: Duration,
    /// With requests in flight and nothing moving.
    pub stall: Duration,
}

impl QuietLimits {
    /// One limit for every case: tcp mode, where bytes are the only activity there is.
    pub fn uniform(d: Duration) -> Self {
        Self {
            first_request: d,
            idle: d,
            stall: d,
        }
    }
}

/// One client connection's progress, shared by its socket wrapper, its requests and the
/// task that enforces its deadlines.
#[derive(Debug)]
pub struct Activity {
    opened: Instant,
    /// Milliseconds since `opened` of the last progress.
    last_ms: AtomicU64,
    /// True in tcp mode: there are no requests, so any byte is progress. In HTTP mode only
    /// requests and body data are: a PING or a WINDOW_UPDATE keeps nothing alive.
    bytes_are_progress: bool,
    /// Requests the client may cancel before [`Activity::flooding`] resolves.
    reset_budget: u64,
    in_flight: AtomicU32,
    started: AtomicU64,
    cancelled: AtomicU64,
    /// Set once the client has cancelled too many streams; wakes the connection's driver.
    flooding: AtomicBool,
    flood: Notify,
}

impl Activity {
    /// A fresh tracker, active now. `reset_budget`: see [`Activity::flooding`].
    pub fn new(bytes_are_progress: bool, reset_budget: u64) -> Arc<Self> {
        Arc::new(Self {
            opened: Instant::now(),
            last_ms: AtomicU64::new(0),
            bytes_are_progress,
            reset_budget,
            in_flight: AtomicU32::new(0),
            started: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            flooding: AtomicBool::new(false),
            flood: Notify::new(),
        })
    }

    /// Records progress now.
    pub fn touch(&self) {
        let ms = self.opened.elapsed().as_millis() as u64;
        // Relaxed: this is a heuristic timestamp; no other memory depends on it.
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn bytes_moved(&self) {
        if self.bytes_are_progress {
            self.touch();
        }
    }

    /// A request arrived; dropping the guard ends it.
    pub fn request_started(self: &Arc<Self>) -> RequestGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.started.fetch_add(1, Ordering::Relaxed);
        self.touch();
        RequestGuard {
            activity: self.clone(),
            completed: false,
        }
    }

    /// Requests started on this connection.
    pub fn requests_started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Requests the client abandoned before their response was complete.
    pub fn requests_cancelled(&self) -> u64 {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// Counts a cancelled request: once more than the reset budget were cancelled by the
    /// client and they are at least half of all its requests, [`Activity::flooding`]
    /// resolves. Checked on each cancellation, so it costs nothing on connections that never
    /// cancel.
    fn note_cancelled(&self) {
        let cancelled = self.cancelled.fetch_add(1, Ordering::Relaxed) + 1;
        if cancelled > self.reset_budget
            && cancelled * 2 >= self.started.load(Ordering::Relaxed)
            && !self.flooding.swap(true, Ordering::Relaxed)
        {
            self.flood.notify_one();
        }
    }

    /// Whether the client has cancelled more streams than its budget allows.
    pub fn is_flooding(&self) -> bool {
        self.flooding.load(Ordering::Relaxed)
    }

    /// Resolves once the client has cancelled more streams than its budget allows (rapid
    /// reset at any pace).
    pub async fn flooding(&self) {
        if self.flooding.load(Ordering::Relaxed) {
            return;
        }
        self.flood.notified().await;
    }

    /// When the connection is next quiet past its limit, if nothing moves before then, and
    /// which limit that is.
    fn quiet_deadline(&self, limits: &QuietLimits) -> (Instant, Quiet) {
        let last = self.opened + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        let (limit, why) = if self.in_flight.load(Ordering::Relaxed) > 0 {
            (limits.stall, Quiet::Stalled)
        } else if self.started.load(Ordering::Relaxed) == 0 {
            (limits.first_request, Quiet::NoFirstRequest)
        } else {
            (limits.idle, Quiet::Idle)
        };
        (last + limit, why)
    }

    /// Resolves once the connection has been quiet past the limit that applies (see
    /// [`Quiet`]), and says which.
    pub async fn wait_quiet(&self, limits: &QuietLimits) -> Quiet {
        // A request starting or ending changes which limit applies (the 30 s before a first
        // request may become a 1 s idle limit) and nothing wakes this waiter when it does,
        // so it looks again after the shortest limit at the latest.
        let recheck = limits.first_request.min(limits.idle).min(limits.stall);
        loop {
            let (deadline, why) = self.quiet_deadline(limits);
            let now = Instant::now();
            if now >= deadline {
                return why;
            }
            tokio::time::sleep_until(deadline.min(now + recheck)).await;
        }
    }
}

/// One request in flight, from its head to the end of its response. Dropped before
/// [`RequestGuard::complete`], the request counts as cancelled by the client (an h2
/// RST_STREAM, a closed connection).
#[derive(Debug)]
pub struct RequestGuard {
    activity: Arc<Activity>,
    completed: bool,
}

impl RequestGuard {
    /// Progress on this request (a body frame either way, the response head).
    pub fn touch(&self) {
        self.activity.touch();
    }

    /// The response went out whole; dropping the guard now is not a cancellation.
    pub fn complete(&mut self) {
        self.completed = true;
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.activity.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.activity.touch();
        if !self.completed {
            self.activity.note_cancelled();
        }
    }
}

/// An I/O object that adds every byte read and written to two counters.
#[derive(Debug)]
pub struct CountingIo<T> {
    inner: T,
    read: IntCounter,
    written: IntCounter,
    activity: Arc<Activity>,
}

impl<T> CountingIo<T> {
    /// Wraps `inner`.
    pub fn new(inner: T, read: IntCounter, written: IntCounter, activity: Arc<Activity>) -> Self {
        Self {
            inner,
            read,
            written,
            activity,
        }
    }

    /// The wrapped object.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for CountingIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.read.inc_by(n as u64);
            self.activity.bytes_moved();
        }
        res
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CountingIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = res {
            if n > 0 {
                self.written.inc_by(n as u64);
                self.activity.bytes_moved();
            }
        }
        res
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = res {
            if n > 0 {
                self.written.inc_by(n as u64);
                self.activity.bytes_moved();
            }
        }
        res
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
