//! Upstream connections (plaintext, or TLS to `https://` nodes), and the write coalescing
//! of HTTP/2 ones.
//!
//! h2 writes one DATA frame per write call and flushes after each (its encoder holds one
//! frame's payload at a time), and an upstream that advertises 16 KiB frames (Qdrant's, and
//! tonic's, default) fixes that size: a gRPC upsert would leave in 16 KB writes, each
//! waking the upstream's reader, where the HTTP/1.1 path writes ~100 KB at a time
//! (docs/benchmarks.md, "Writes and bodies on the data path", has the measurements).
//!
//! [`UpstreamIo`] gathers what h2 writes and answers a flush that follows fresh writes by
//! yielding once instead of writing: the connection task is polled again after the tasks
//! that were ready (the request bodies that feed it), and writes when a flush finds nothing
//! new since the last, or when [`COALESCE_MAX`] bytes are gathered. So every frame h2 has
//! in hand within one turn of the scheduler goes out in one write, and a lone frame waits
//! one turn, no timer.
//!
//! HTTP/1.1 connections pass through untouched: hyper's HTTP/1.1 client already queues a
//! request's body chunks into one vectored write, and holding its first write of a burst
//! back one turn as well cost more CPU than it saved.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;

use super::tls::{UpstreamStream, UpstreamTls};

/// The most an h2c connection gathers before writing: 8 of the 16 KiB frames an upstream
/// usually allows. One such buffer per h2c upstream connection (one per node: h2c
/// multiplexes every request over it), so it is outside the request buffer budget.
const COALESCE_MAX: usize = 128 * 1024;

/// Connects to upstream nodes, over TLS to `https://` ones; h2 connections coalesce their
/// writes (module docs).
#[derive(Clone)]
pub struct UpstreamConnector {
    tcp: HttpConnector,
    gather: bool,
    tls: Option<Arc<UpstreamTls>>,
    /// Bounds the TLS handshake as the TCP connect is bounded (a node that accepts and
    /// then says nothing must not hold a request until its response timeout).
    handshake_timeout: Duration,
}

impl UpstreamConnector {
    /// For HTTP/1.1 upstreams: the socket is used as it is.
    pub fn http1(tcp: HttpConnector, tls: Option<UpstreamTls>, timeout: Duration) -> Self {
        Self::new(tcp, false, tls, timeout)
    }

    /// For HTTP/2 upstreams (h2c, or h2 over TLS): writes are gathered.
    pub fn h2(tcp: HttpConnector, tls: Option<UpstreamTls>, timeout: Duration) -> Self {
        Self::new(tcp, true, tls, timeout)
    }

    fn new(
        mut tcp: HttpConnector,
        gather: bool,
        tls: Option<UpstreamTls>,
        handshake_timeout: Duration,
    ) -> Self {
        // `https://` URIs reach `call`; TLS is this connector's, not HttpConnector's.
        tcp.enforce_http(false);
        Self {
            tcp,
            gather,
            tls: tls.map(Arc::new),
            handshake_timeout,
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ConnectFuture = Pin<Box<dyn Future<Output = Result<UpstreamIo, BoxError>> + Send>>;

impl tower_service::Service<Uri> for UpstreamConnector {
    type Response = UpstreamIo;
    type Error = BoxError;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.tcp.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let gather = self.gather;
        let tls = match (dst.scheme() == Some(&http::uri::Scheme::HTTPS), &self.tls) {
            (false, _) => None,
            (true, Some(tls)) => Some((
                tls.clone(),
                dst.host().unwrap_or_default().to_owned(),
                self.handshake_timeout,
            )),
            (true, None) => {
                return Box::pin(async { Err("an https:// node without upstream TLS".into()) })
            }
        };
        let connecting = self.tcp.call(dst);
        // One allocation per upstream connection; connections are pooled.
        Box::pin(async move {
            let tcp = connecting.await?.into_inner();
            let stream = match tls {
                None => UpstreamStream::Plain(tcp),
                Some((tls, host, timeout)) => {
                    match tokio::time::timeout(timeout, tls.connect(&host, tcp)).await {
                        Ok(stream) => stream?,
                        Err(_) => {
                            return Err(format!(
                                "TLS handshake with {host} timed out after {timeout:?}"
                            )
                            .into())
                        }
                    }
                }
            };
            Ok(UpstreamIo::new(stream, gather))
        })
    }
}

/// An upstream socket that may gather writes (module docs).
pub struct UpstreamIo {
    inner: TokioIo<UpstreamStream>,
    /// Gathered bytes not yet written, from `written` on.
    buf: Vec<u8>,
    written: usize,
    /// Gather writes (h2c); otherwise every call goes straight to the socket.
    gather: bool,
    /// Bytes were gathered since the last flush.
    fresh: bool,
}

impl UpstreamIo {
    fn new(stream: UpstreamStream, gather: bool) -> Self {
        Self {
            inner: TokioIo::new(stream),
            buf: Vec::new(),
            written: 0,
            gather,
            fresh: false,
        }
    }

    fn pending(&self) -> usize {
        self.buf.len() - self.written
    }

    /// Writes every gathered byte.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buf.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.buf.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }

    /// Makes room for `len` more bytes, writing what is gathered if it must; `false` when
    /// `len` is too large to gather at all (write it directly).
    fn poll_room(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<io::Result<bool>> {
        if self.pending() + len > COALESCE_MAX {
            ready!(self.poll_drain(cx))?;
        }
        Poll::Ready(Ok(len <= COALESCE_MAX))
    }

    /// Gathers `bufs` (room made first); returns their length.
    fn take(&mut self, bufs: &[io::IoSlice<'_>]) -> usize {
        let before = self.buf.len();
        for b in bufs {
            self.buf.extend_from_slice(b);
        }
        self.fresh = true;
        self.buf.len() - before
    }
}

impl Read for UpstreamIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl Write for UpstreamIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.gather && ready!(this.poll_room(cx, data.len()))? {
            return Poll::Ready(Ok(this.take(&[io::IoSlice::new(data)])));
        }
        Pin::new(&mut this.inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        if this.gather && ready!(this.poll_room(cx, len))? {
            return Poll::Ready(Ok(this.take(bufs)));
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        // Gathering takes every slice h2 chains (frame head and payload) in one call.
        self.gather || self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.pending() > 0 {
            if this.fresh && this.pending() < COALESCE_MAX {
                // Yield once: the tasks feeding this connection run first, and what they
                // give it is written with this in one call when it is polled again.
                this.fresh = false;
                cx.waker().wake_by_ref();
                return Poll::Ready(Ok(()));
            }
            ready!(this.poll_drain(cx))?;
        }
        this.fresh = false;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Connection for UpstreamIo {
    fn connected(&self) -> Connected {
        let stream = self.inner.inner();
        let connected = stream.tcp().connected();
        if stream.alpn() == Some(b"h2") {
            connected.negotiated_h2()
        } else {
            connected
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Wake, Waker};
    use std::time::Duration;

    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A waker that counts its wakes, and the counter.
    fn counting_waker() -> (Waker, Arc<CountingWaker>) {
        let woken = Arc::new(CountingWaker(AtomicUsize::new(0)));
        (Waker::from(woken.clone()), woken)
    }

    /// A connected pair over loopback: the gathering side and the peer's socket.
    async fn pair(gather: bool) -> (UpstreamIo, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (ours, theirs) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (
            UpstreamIo::new(UpstreamStream::Plain(ours.unwrap()), gather),
            theirs.unwrap().0,
        )
    }

    fn write(io: &mut UpstreamIo, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(io).poll_write(cx, data)
    }

    fn flush(io: &mut UpstreamIo, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(io).poll_flush(cx)
    }

    async fn read_exactly(peer: &mut TcpStream, len: usize) -> Vec<u8> {
        let mut got = vec![0u8; len];
        tokio::time::timeout(Duration::from_secs(5), peer.read_exact(&mut got))
            .await
            .expect("the gathered bytes arrive")
            .unwrap();
        got
    }

    #[tokio::test]
    async fn frames_of_one_turn_go_out_in_one_write_at_the_next_flush() {
        let (mut io, mut peer) = pair(true).await;
        let (waker, woken) = counting_waker();
        let mut cx = Context::from_waker(&waker);

        // Two frames and the flush h2 makes after each: nothing reaches the socket yet,
        // and the task is woken so that it flushes again after one turn.
        let frame_a = vec![1u8; 16 * 1024 + 9];
        let frame_b = [2u8; 9];
        assert!(
            matches!(write(&mut io, &mut cx, &frame_a), Poll::Ready(Ok(n)) if n == frame_a.len())
        );
        assert!(matches!(flush(&mut io, &mut cx), Poll::Ready(Ok(()))));
        let vectored = [
            io::IoSlice::new(&frame_b[..4]),
            io::IoSlice::new(&frame_b[4..]),
        ];
        assert!(matches!(
            Pin::new(&mut io).poll_write_vectored(&mut cx, &vectored),
            Poll::Ready(Ok(9))
        ));
        assert!(matches!(flush(&mut io, &mut cx), Poll::Ready(Ok(()))));
        assert_eq!(woken.0.load(Ordering::Relaxed), 2);
        let mut probe = [0u8; 1];
        assert_eq!(
            peer.try_read(&mut probe).unwrap_err().kind(),
            io::ErrorKind::WouldBlock,
            "nothing is written before a flush finds no fresh bytes"
        );
        assert_eq!(io.pending(), frame_a.len() + frame_b.len());

        // The flush of the next turn, with nothing new, writes both.
        assert!(matches!(flush(&mut io, &mut cx), Poll::Ready(Ok(()))));
        assert_eq!(io.pending(), 0);
        assert_eq!(woken.0.load(Ordering::Relaxed), 2, "no further wake");
        let got = read_exactly(&mut peer, frame_a.len() + frame_b.len()).await;
        assert_eq!(&got[..frame_a.len()], &frame_a[..]);
        assert_eq!(&got[frame_a.len()..], &frame_b[..]);
    }

    #[tokio::test]
    async fn a_full_gather_is_written_before_more_is_taken_and_large_writes_pass_through() {
        let (mut io, mut peer) = pair(true).await;
        let (waker, _) = counting_waker();
        let mut cx = Context::from_waker(&waker);

        let chunk = vec![7u8; COALESCE_MAX / 2 + 1];
        assert!(write(&mut io, &mut cx, &chunk).is_ready());
        assert_eq!(io.pending(), chunk.len());
        // The second chunk does not fit: the first is written, the second gathered.
        assert!(write(&mut io, &mut cx, &chunk).is_ready());
        assert_eq!(io.pending(), chunk.len());
        assert_eq!(read_exactly(&mut peer, chunk.len()).await, chunk);

        // Larger than a gather: what is gathered goes first, then this one directly.
        let large = vec![9u8; COALESCE_MAX + 1];
        let Poll::Ready(Ok(n)) = write(&mut io, &mut cx, &large) else {
            panic!("the socket takes the first bytes of a large write");
        };
        assert_eq!(io.pending(), 0);
        assert_eq!(read_exactly(&mut peer, chunk.len()).await, chunk);
        assert_eq!(read_exactly(&mut peer, n).await, large[..n].to_vec());
    }

    #[tokio::test]
    async fn http1_connections_write_straight_through() {
        let (mut io, mut peer) = pair(false).await;
        let (waker, woken) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(matches!(
            write(&mut io, &mut cx, b"GET / HTTP/1.1\r\n\r\n"),
            Poll::Ready(Ok(18))
        ));
        assert_eq!(io.pending(), 0);
        assert!(flush(&mut io, &mut cx).is_ready());
        assert_eq!(woken.0.load(Ordering::Relaxed), 0);
        assert_eq!(read_exactly(&mut peer, 18).await, b"GET / HTTP/1.1\r\n\r\n");
    }

    #[tokio::test]
    async fn shutdown_writes_what_is_gathered() {
        let (mut io, mut peer) = pair(true).await;
        let (waker, _) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(write(&mut io, &mut cx, b"last frame").is_ready());
        poll_fn(|cx| Pin::new(&mut io).poll_shutdown(cx))
            .await
            .unwrap();
        let mut all = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), peer.read_to_end(&mut all))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(all, b"last frame");
    }
}
