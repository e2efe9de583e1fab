//! The client socket wrapper: counts bytes for the metrics and remembers when bytes last
//! moved, which is how idle connections are found without a timer per read.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus::IntCounter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// When a connection last moved bytes, in milliseconds since it opened.
#[derive(Debug)]
pub struct Activity {
    opened: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    /// A fresh tracker, active now.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            opened: Instant::now(),
            last_ms: AtomicU64::new(0),
        })
    }

    fn touch(&self) {
        let ms = self.opened.elapsed().as_millis() as u64;
        // Relaxed: this is a heuristic timestamp; no other memory depends on it.
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// When the connection becomes idle for `idle`, if nothing moves before then.
    pub fn idle_deadline(&self, idle: Duration) -> Instant {
        self.opened + Duration::from_millis(self.last_ms.load(Ordering::Relaxed)) + idle
    }

    /// Resolves once no bytes have moved for `idle`.
    pub async fn wait_idle(&self, idle: Duration) {
        loop {
            let deadline = self.idle_deadline(idle);
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
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
            self.activity.touch();
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
                self.activity.touch();
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
                self.activity.touch();
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
