//! Connection liveness: the per-connection state the deadlines read ([`Activity`]: requests
//! in flight, when anything last made progress, how many requests the client cancelled,
//! and the rapid-reset flag that `rapid_reset` raises), and the client socket wrapper
//! that feeds it ([`CountingIo`]: bytes counted for the metrics, and read ahead of rustls's
//! record-sized reads). Idle connections are found from these without a timer per read.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus::IntCounter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::rapid_reset::FloodFlag;

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
    in_flight: AtomicU32,
    /// Request bodies not yet read to their end (see [`Activity::body_opened`]).
    unfinished_bodies: AtomicU32,
    started: AtomicU64,
    cancelled: AtomicU64,
    /// Raised by the rapid-reset watch (`rapid_reset`) once the client has reset too
    /// many streams prematurely.
    flood: FloodFlag,
}

impl Activity {
    /// A fresh tracker, active now.
    pub fn new(bytes_are_progress: bool) -> Arc<Self> {
        Arc::new(Self {
            opened: Instant::now(),
            last_ms: AtomicU64::new(0),
            bytes_are_progress,
            in_flight: AtomicU32::new(0),
            unfinished_bodies: AtomicU32::new(0),
            started: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            flood: FloodFlag::default(),
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

    /// A request came with a body to read; [`Activity::body_finished`] once it was read to
    /// its end. A body dropped unfinished stays counted: its rest may still be on its way.
    pub fn body_opened(&self) {
        self.unfinished_bodies.fetch_add(1, Ordering::Relaxed);
    }

    /// A body counted by [`Activity::body_opened`] was read to its end.
    pub fn body_finished(&self) {
        self.unfinished_bodies.fetch_sub(1, Ordering::Relaxed);
    }

    /// No request in flight and every request body read to its end: the connection owes
    /// the client nothing and expects nothing of the requests it had.
    pub fn between_requests(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) == 0
            && self.unfinished_bodies.load(Ordering::Relaxed) == 0
    }

    /// Requests started on this connection.
    pub fn requests_started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Requests the client abandoned before their response was complete.
    pub fn requests_cancelled(&self) -> u64 {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// The connection's rapid-reset flag.
    pub fn flood(&self) -> &FloodFlag {
        &self.flood
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
            self.activity.cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// An I/O object that adds every byte read and written to two counters, and reads ahead.
///
/// rustls reads at most one TLS record (~16 KiB) per call into its own buffer, so a 416 KB
/// gRPC upsert took ~30 `recvfrom`s, each with its share of the kernel's per-call work (on
/// loopback, the window update it sends and the peer's transmission that update sets off).
/// When the caller asks for less than [`READ_AHEAD`], the socket is read into a buffer of
/// that size and the caller served from it: one system call per 64 KiB, for one copy. The
/// buffer is borrowed from the worker thread's spares only while it holds bytes, so an idle
/// connection holds none and a busy one allocates none.
#[derive(Debug)]
pub struct CountingIo<T> {
    inner: T,
    read: IntCounter,
    written: IntCounter,
    activity: Arc<Activity>,
    ahead: Option<ReadAhead>,
}

/// How much one read from the socket may take beyond what the caller asked.
pub const READ_AHEAD: usize = 64 * 1024;
/// Read-ahead buffers a worker thread keeps for its connections: as many as it has
/// connections with bytes waiting at once, which is rarely more than a few.
const SPARES_PER_THREAD: usize = 16;

thread_local! {
    static SPARE_BUFFERS: std::cell::RefCell<Vec<Box<[u8]>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Bytes read from the socket and not yet handed on: `buf[start..end]`, never empty.
#[derive(Debug)]
struct ReadAhead {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

fn borrow_buffer() -> Box<[u8]> {
    SPARE_BUFFERS
        .with(|s| s.borrow_mut().pop())
        .unwrap_or_else(|| vec![0; READ_AHEAD].into_boxed_slice())
}

fn return_buffer(buf: Box<[u8]>) {
    SPARE_BUFFERS.with(|s| {
        let mut spares = s.borrow_mut();
        if spares.len() < SPARES_PER_THREAD {
            spares.push(buf);
        }
    });
}

impl<T> CountingIo<T> {
    /// Wraps `inner`.
    pub fn new(inner: T, read: IntCounter, written: IntCounter, activity: Arc<Activity>) -> Self {
        Self {
            inner,
            read,
            written,
            activity,
            ahead: None,
        }
    }

    /// The wrapped object.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// Whether bytes already read from the socket wait here: a check of the socket alone
    /// (a peek, readiness) would not see them.
    pub fn has_buffered(&self) -> bool {
        self.ahead.is_some()
    }

    /// Hands on what waits in the read-ahead buffer, as much as `buf` takes, and returns
    /// the buffer once it is drained; false when nothing waits.
    fn serve_buffered(&mut self, buf: &mut ReadBuf<'_>) -> bool {
        let Some(a) = self.ahead.as_mut() else {
            return false;
        };
        let n = (a.end - a.start).min(buf.remaining());
        buf.put_slice(&a.buf[a.start..a.start + n]);
        a.start += n;
        if a.start == a.end {
            if let Some(drained) = self.ahead.take() {
                return_buffer(drained.buf);
            }
        }
        true
    }
}

impl<T: AsyncRead + Unpin> CountingIo<T> {
    /// One read from the socket: straight into `buf` when it is large, else into a
    /// read-ahead buffer and from there into `buf`. The bytes read from the socket.
    fn read_socket(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<usize>> {
        if buf.remaining() >= READ_AHEAD {
            let before = buf.filled().len();
            return Pin::new(&mut self.inner)
                .poll_read(cx, buf)
                .map_ok(|()| buf.filled().len() - before);
        }
        let mut spare = borrow_buffer();
        let mut into = ReadBuf::new(&mut spare);
        let read = Pin::new(&mut self.inner).poll_read(cx, &mut into);
        let n = into.filled().len();
        match read {
            Poll::Ready(Ok(())) if n > 0 => {
                self.ahead = Some(ReadAhead {
                    buf: spare,
                    start: 0,
                    end: n,
                });
                self.serve_buffered(buf);
                Poll::Ready(Ok(n))
            }
            other => {
                return_buffer(spare);
                other.map_ok(|()| 0)
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for CountingIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.serve_buffered(buf) {
            return Poll::Ready(Ok(()));
        }
        match self.read_socket(cx, buf) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.read.inc_by(n as u64);
                    self.activity.bytes_moved();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
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

impl AsRef<FloodFlag> for Activity {
    fn as_ref(&self) -> &FloodFlag {
        &self.flood
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn counting<T>(inner: T) -> (CountingIo<T>, IntCounter) {
        let read = IntCounter::new("read", "read").unwrap();
        let written = IntCounter::new("written", "written").unwrap();
        let io = CountingIo::new(inner, read.clone(), written, Activity::new(true));
        (io, read)
    }

    #[tokio::test]
    async fn read_ahead_hands_on_every_byte_in_order_and_holds_no_buffer_once_drained() {
        let sent: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let (mut client, server) = tokio::io::duplex(256 * 1024);
        let (mut io, read) = counting(server);
        let writer = {
            let sent = sent.clone();
            tokio::spawn(async move {
                client.write_all(&sent).await.unwrap();
                client.shutdown().await.unwrap();
            })
        };
        let mut got = Vec::with_capacity(sent.len());
        // Small reads as rustls makes them (a record at most), and now and then one larger
        // than the read-ahead, which goes to the socket directly once nothing waits here.
        let mut small = [0u8; 16 * 1024 + 5];
        let mut large = vec![0u8; READ_AHEAD + 1];
        for i in 0.. {
            let n = if i % 7 == 6 && !io.has_buffered() {
                let n = io.read(&mut large).await.unwrap();
                got.extend_from_slice(&large[..n]);
                n
            } else {
                let n = io.read(&mut small[..(i % 5 + 1) * 3000]).await.unwrap();
                got.extend_from_slice(&small[..n]);
                n
            };
            if n == 0 {
                break;
            }
        }
        writer.await.unwrap();
        assert_eq!(got.len(), sent.len());
        assert!(got == sent, "bytes out of order");
        assert_eq!(read.get(), sent.len() as u64, "counted once each");
        assert!(!io.has_buffered(), "a drained connection holds no buffer");
    }

    #[tokio::test]
    async fn a_small_read_takes_what_the_socket_has_up_to_the_read_ahead() {
        let (mut client, server) = tokio::io::duplex(256 * 1024);
        let (mut io, _) = counting(server);
        client.write_all(&[7u8; 100_000]).await.unwrap();
        let mut record = [0u8; 5];
        assert_eq!(io.read(&mut record).await.unwrap(), 5);
        // One read of the socket took 64 KiB; the rest of it waits here.
        assert!(io.has_buffered());
        let mut rest = vec![0u8; 16 * 1024];
        let mut from_buffer = 0;
        while io.has_buffered() {
            from_buffer += io.read(&mut rest).await.unwrap();
        }
        assert_eq!(5 + from_buffer, READ_AHEAD);
    }
}
