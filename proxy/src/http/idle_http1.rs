//! HTTP/1.1 connections set aside between requests: once a response has gone out whole and
//! the client has nothing more to say, hyper's connection (its 8 KiB read buffer, its
//! 8 KiB head buffer, its timers) is ended and only the client stream is kept, waiting for
//! the next bytes; when they come a fresh hyper connection takes the stream on.
//!
//! An ingestion client between batches is such a connection, often for minutes. Set aside,
//! it costs what a connection that never sent a request costs (the stream and its TLS
//! state) instead of hyper's buffers as well, as nginx frees its buffers on a keep-alive
//! connection that goes quiet (docs/benchmarks.md, "Writes and bodies on the data path",
//! has the sizes). hyper has no way to shrink an idle connection, so the
//! stream is taken back from it: [`SetAside`] ends hyper's reading with an end of stream
//! at the moment nothing is in flight and nothing unsent, which hyper takes as a client
//! that closed between requests (no response, no error), and declines hyper's shutdown of
//! the stream that follows; `http1::Connection::into_parts` then hands back the stream and
//! whatever hyper had read and not parsed, which the next connection reads first.
//!
//! A client that sends its next request as soon as it has read an answer (a bulk loader,
//! h2load, ab) is not set aside between them: only one quiet for [`SET_ASIDE_AFTER`], so
//! that a busy connection does not build a hyper connection per request.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use crate::liveness::{Activity, Quiet, QuietLimits};

/// How long a connection with nothing in flight waits for the client's next bytes before it
/// is set aside: longer than a loader takes to send its next request once it has read an
/// answer (h2load `--h1` on loopback: tens of microseconds; 3,000 keep-alive GETs cost
/// 58,116 instructions each with this, 57,925 with 100 ms, and 60,047 when every request
/// was set aside and its connection built anew), short enough that connections answered
/// in a burst are set aside before the burst's buffers add up (1,000 clients sending one
/// request each, one after another: 11.9 KiB per connection after it with this, 18.0 KiB
/// with 100 ms; 9.9 KiB before any request).
pub const SET_ASIDE_AFTER: Duration = Duration::from_millis(1);

/// A client stream an HTTP/1.1 connection can be set aside on.
pub trait ClientStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Nothing written is still queued on its way to the socket (TLS records included).
    fn all_sent(&self) -> bool;

    /// Waits until the client has sent something more (or closed, or failed: the next read
    /// says which), the connection has been quiet past its limit, or `shutdown` fires.
    fn next_bytes<'a>(
        &'a mut self,
        activity: &'a Activity,
        limits: &'a QuietLimits,
        shutdown: &'a CancellationToken,
    ) -> impl Future<Output = NextBytes> + Send + 'a;
}

/// How a wait for a client's next bytes ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextBytes {
    /// Bytes, an end of stream or an error: the next read sees it.
    Arrived,
    /// Nothing came within the limit that applies.
    Quiet(Quiet),
    /// The proxy is draining: an idle connection just closes.
    Draining,
}

/// The client stream as one hyper connection sees it: `unread` (what the previous
/// connection had read and not parsed) first, then the stream; and an end of stream, in
/// place of waiting, once the connection can be set aside.
#[derive(Debug)]
pub struct SetAside<IO> {
    inner: IO,
    unread: Bytes,
    activity: Arc<Activity>,
    /// Bytes written and not yet flushed: hyper flushes after every response it writes.
    unflushed: bool,
    /// This connection's reading was ended here; its stream lives on.
    set_aside: bool,
    /// When the quiet that sets the connection aside started to count: armed by a read
    /// that found nothing while the connection could be set aside, disarmed by any bytes.
    /// Made once per hyper connection, reset per quiet.
    quiet_since: Option<Pin<Box<Sleep>>>,
    armed: bool,
    /// Requests started on the connection before this hyper connection: one that began
    /// with part of a head is not set aside again before that request has started, so a
    /// client trickling a head meets hyper's header read timeout instead of a new hyper
    /// connection every [`SET_ASIDE_AFTER`].
    started_before: Option<u64>,
}

impl<IO: ClientStream> SetAside<IO> {
    /// `inner` for one hyper connection, `unread` read first.
    pub fn new(inner: IO, unread: Bytes, activity: Arc<Activity>) -> Self {
        Self {
            started_before: (!unread.is_empty()).then(|| activity.requests_started()),
            inner,
            unread,
            activity,
            unflushed: false,
            set_aside: false,
            quiet_since: None,
            armed: false,
        }
    }

    /// The stream, and whether the connection was set aside (rather than closed).
    pub fn into_inner(self) -> (IO, bool) {
        (self.inner, self.set_aside)
    }

    /// Whether hyper may be told the client went quiet: every request answered whole and
    /// its body read to the end, every byte of the answers handed to the socket. hyper then
    /// waits for a request head with nothing of one read: an end of stream now is, to hyper,
    /// a client that closed between requests.
    fn may_set_aside(&self) -> bool {
        !self.unflushed
            && self.unread.is_empty()
            && self.activity.between_requests()
            && self
                .started_before
                .is_none_or(|before| self.activity.requests_started() > before)
            && self.inner.all_sent()
    }
}

impl<IO: ClientStream> AsyncRead for SetAside<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.unread.is_empty() {
            let n = this.unread.len().min(buf.remaining());
            buf.put_slice(&this.unread[..n]);
            this.unread.advance(n);
            return Poll::Ready(Ok(()));
        }
        if this.set_aside {
            return Poll::Ready(Ok(()));
        }
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Pending if this.may_set_aside() => {
                if this.quiet_for_long_enough(cx) {
                    this.set_aside = true;
                    return Poll::Ready(Ok(()));
                }
                Poll::Pending
            }
            other => {
                this.armed = false;
                other
            }
        }
    }
}

impl<IO> SetAside<IO> {
    /// Bytes written are unflushed, and activity: the quiet starts anew.
    fn wrote(&mut self, res: &Poll<io::Result<usize>>) {
        if matches!(res, Poll::Ready(Ok(n)) if *n > 0) {
            self.unflushed = true;
            self.armed = false;
        }
    }

    /// Whether the quiet has lasted [`SET_ASIDE_AFTER`]; if not, the task is woken when it
    /// has (hyper then reads again).
    fn quiet_for_long_enough(&mut self, cx: &mut Context<'_>) -> bool {
        let until = Instant::now() + SET_ASIDE_AFTER;
        let timer = self
            .quiet_since
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
        if !self.armed {
            timer.as_mut().reset(until);
            self.armed = true;
        }
        timer.as_mut().poll(cx).is_ready()
    }
}

impl<IO: ClientStream> AsyncWrite for SetAside<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write(cx, data);
        self.wrote(&res);
        res
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote(&res);
        res
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let res = Pin::new(&mut self.inner).poll_flush(cx);
        if matches!(res, Poll::Ready(Ok(()))) {
            self.unflushed = false;
        }
        res
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // hyper shuts the stream down when its connection ends; a connection set aside
        // ended only for hyper.
        if self.set_aside {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    /// A plain in-memory stream: everything written is sent at once.
    impl ClientStream for DuplexStream {
        fn all_sent(&self) -> bool {
            true
        }

        async fn next_bytes(
            &mut self,
            _: &Activity,
            _: &QuietLimits,
            _: &CancellationToken,
        ) -> NextBytes {
            NextBytes::Arrived
        }
    }

    #[tokio::test(start_paused = true)]
    async fn unread_bytes_come_first_then_the_stream() {
        let (mut client, server) = tokio::io::duplex(1024);
        let activity = Activity::new(false);
        let _busy = activity.request_started();
        let mut io = SetAside::new(server, Bytes::from_static(b"GET / HT"), activity.clone());
        client.write_all(b"TP/1.1\r\n").await.unwrap();
        let mut got = vec![0u8; 16];
        let n = io.read(&mut got).await.unwrap();
        assert_eq!(&got[..n], b"GET / HT");
        let n = io.read(&mut got).await.unwrap();
        assert_eq!(&got[..n], b"TP/1.1\r\n");
    }

    #[tokio::test(start_paused = true)]
    async fn set_aside_only_between_requests_with_everything_flushed() {
        let (mut client, server) = tokio::io::duplex(1024);
        let activity = Activity::new(false);
        let mut io = SetAside::new(server, Bytes::new(), activity.clone());
        let mut buf = [0u8; 8];

        // A request in flight: a read with nothing there waits.
        let request = activity.request_started();
        let waited = tokio::time::timeout(Duration::from_millis(50), io.read(&mut buf)).await;
        assert!(waited.is_err(), "a read during a request must wait");

        // Answered, but not flushed yet: still waits.
        drop(request);
        io.write_all(b"answer").await.unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(50), io.read(&mut buf)).await;
        assert!(
            waited.is_err(),
            "a read with the answer unflushed must wait"
        );

        // Flushed: once quiet for SET_ASIDE_AFTER, the read ends the connection for hyper,
        // and shutting down leaves the stream open.
        io.flush().await.unwrap();
        let quiet = Instant::now();
        assert_eq!(io.read(&mut buf).await.unwrap(), 0);
        assert!(quiet.elapsed() >= SET_ASIDE_AFTER);
        io.shutdown().await.unwrap();
        let (mut stream, set_aside) = io.into_inner();
        assert!(set_aside);
        stream.write_all(b"more").await.unwrap();
        let mut got = [0u8; 10];
        let n = client.read(&mut got).await.unwrap();
        assert_eq!(&got[..n], b"answermore");
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_within_the_quiet_are_read_not_set_aside() {
        let (mut client, server) = tokio::io::duplex(1024);
        let activity = Activity::new(false);
        let mut io = SetAside::new(server, Bytes::new(), activity.clone());
        // The read finds nothing and starts counting the quiet; the bytes come before it
        // has lasted (the clock is paused: it moves only when every task waits).
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            let n = io.read(&mut buf).await.unwrap();
            (io, n)
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        client.write_all(b"GET").await.unwrap();
        let (io, n) = reader.await.unwrap();
        assert_eq!(n, 3);
        let (_, set_aside) = io.into_inner();
        assert!(!set_aside);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_began_inside_a_head_is_set_aside_only_after_its_request() {
        let (_client, server) = tokio::io::duplex(1024);
        let activity = Activity::new(false);
        let mut io = SetAside::new(server, Bytes::from_static(b"GET / H"), activity.clone());
        let mut buf = [0u8; 16];
        assert_eq!(io.read(&mut buf).await.unwrap(), 7);
        let waited = tokio::time::timeout(SET_ASIDE_AFTER * 3, io.read(&mut buf)).await;
        assert!(waited.is_err(), "the rest of the head is waited for");
        drop(activity.request_started());
        assert_eq!(io.read(&mut buf).await.unwrap(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_body_left_unread_keeps_the_connection() {
        let (_client, server) = tokio::io::duplex(1024);
        let activity = Activity::new(false);
        // A request whose body nobody read to its end: hyper may still read it.
        drop(activity.request_started());
        activity.body_opened();
        let mut io = SetAside::new(server, Bytes::new(), activity.clone());
        let mut buf = [0u8; 8];
        let waited = tokio::time::timeout(Duration::from_millis(50), io.read(&mut buf)).await;
        assert!(waited.is_err(), "hyper may still be reading a body");
        activity.body_finished();
        assert_eq!(io.read(&mut buf).await.unwrap(), 0);
    }
}
