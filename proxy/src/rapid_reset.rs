//! Rapid reset at any pace: which client streams were reset prematurely, and GOAWAY with
//! ENHANCE_YOUR_CALM for the connections that reset too many.
//!
//! **Counting.** [`ResetWatch`] follows the frame headers the client sends (under hyper,
//! nothing copied: a 9-byte header per frame, payloads skipped by their length). A stream
//! opens with its first HEADERS; an RST_STREAM from the client within
//! [`PREMATURE_RESET_WINDOW`] of that is premature, whether or not the proxy's answer
//! already went out (Envoy's rule). Counting only streams whose answer was still pending
//! missed the paced attack against a fast upstream: every answer left before its reset
//! arrived, yet every stream cost a task and an upstream request. A connection whose
//! premature resets pass half of its streams, counted over at least the reset budget
//! (`h2_max_reset_streams`), is flagged as flooding; a client that cancels a few calls on
//! deadline never comes near that.
//!
//! **Closing.** hyper can only close an HTTP/2 connection gracefully (GOAWAY with NO_ERROR); the h2
//! crate below it has `abrupt_shutdown(reason)` but hyper does not expose it. RFC 9113
//! asks for ENHANCE_YOUR_CALM when a peer is abusive, and clients (Go, grpc-java, h2)
//! treat it as "do not retry on this connection at once". So this wrapper sits under
//! hyper's HTTP/2 server, follows the frame boundaries of what it writes (a 9-byte header
//! per frame: cheap, no copy), and once the connection is flagged as flooding, rewrites
//! the error code of the GOAWAY frames that hyper's graceful close sends.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const GOAWAY: u8 = 0x7;
/// RFC 9113 3.4: what an HTTP/2 client sends before its first frame.
const CLIENT_PREFACE_LEN: usize = 24;
/// RFC 9113 7: ENHANCE_YOUR_CALM.
const ENHANCE_YOUR_CALM: [u8; 4] = 0xb_u32.to_be_bytes();

/// A client stream reset within this long after it opened counts as premature (Envoy's
/// `premature_reset_min_stream_lifetime_seconds`).
pub const PREMATURE_RESET_WINDOW: Duration = Duration::from_secs(1);
/// The resolution of the open times [`ResetWatch`] keeps.
pub(crate) const OPEN_BUCKET: Duration = Duration::from_millis(50);
/// Open-time checkpoints kept: more buckets than the window spans, so an evicted one is
/// always older than the window.
const CHECKPOINTS: usize = 32;
const _: () = assert!(
    (CHECKPOINTS as u128) * OPEN_BUCKET.as_millis() > PREMATURE_RESET_WINDOW.as_millis() + 100
);

/// Follows the frames a client sends and counts its premature resets (see the module doc).
///
/// Client stream ids only grow, so "opened within the window" is "an id above the highest
/// one opened before the window began". That is kept as checkpoints: per 50 ms bucket in
/// which streams opened, the highest id opened by then; a fixed array, so the watch
/// allocates nothing and a busy connection costs one clock read per new stream.
#[derive(Clone, Debug)]
pub struct ResetWatch {
    started: Instant,
    /// Streams counted at least, before half of them may be premature resets.
    budget: u64,
    preface_left: usize,
    header: [u8; FRAME_HEADER],
    header_len: usize,
    payload_left: usize,
    highest_opened: u32,
    opened: u64,
    premature: u64,
    /// Set for good at the reset that passed the bound: the connection is being closed,
    /// and nothing it sends afterwards is counted.
    flooded: bool,
    /// (bucket, highest id opened by its end), oldest first; `len` of them in use.
    checkpoints: [(u32, u32); CHECKPOINTS],
    len: usize,
    /// The highest id of the checkpoints pushed out: all older than the window.
    evicted_max: u32,
}

impl ResetWatch {
    /// A watch for a connection that starts now. `budget`: see the module doc.
    pub fn new(budget: u64) -> Self {
        Self {
            started: Instant::now(),
            budget,
            preface_left: CLIENT_PREFACE_LEN,
            header: [0; FRAME_HEADER],
            header_len: 0,
            payload_left: 0,
            highest_opened: 0,
            opened: 0,
            premature: 0,
            flooded: false,
            checkpoints: [(0, 0); CHECKPOINTS],
            len: 0,
            evicted_max: 0,
        }
    }

    /// Streams the client opened so far.
    pub fn opened(&self) -> u64 {
        self.opened
    }

    /// Streams the client reset within [`PREMATURE_RESET_WINDOW`] of opening them.
    pub fn premature(&self) -> u64 {
        self.premature
    }

    /// Whether the premature resets passed the bound at some reset: more than half of the
    /// streams opened by then, counted over at least the budget.
    pub fn is_flood(&self) -> bool {
        self.flooded
    }

    /// Follows `bytes` the client sent; true once the connection counts as flooding (and
    /// from then on, without reading further).
    pub fn observe(&mut self, bytes: &[u8]) -> bool {
        if self.flooded {
            return true;
        }
        let mut i = 0;
        if self.preface_left > 0 {
            let skip = self.preface_left.min(bytes.len());
            self.preface_left -= skip;
            i = skip;
        }
        while i < bytes.len() {
            if self.payload_left > 0 {
                let skip = self.payload_left.min(bytes.len() - i);
                self.payload_left -= skip;
                i += skip;
                continue;
            }
            let take = (FRAME_HEADER - self.header_len).min(bytes.len() - i);
            self.header[self.header_len..self.header_len + take]
                .copy_from_slice(&bytes[i..i + take]);
            self.header_len += take;
            i += take;
            if self.header_len < FRAME_HEADER {
                break;
            }
            self.header_len = 0;
            let h = self.header;
            self.payload_left =
                (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
            let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
            match h[3] {
                // Ids only grow (RFC 9113 5.1.1): a HEADERS on a lower one is trailers.
                HEADERS if stream > self.highest_opened => self.opened_stream(stream),
                RST_STREAM
                    if stream != 0
                        && stream <= self.highest_opened
                        && self.reset_stream(stream) =>
                {
                    self.flooded = true;
                    return true;
                }
                _ => {}
            }
        }
        false
    }

    fn bucket_now(&self) -> u32 {
        let ms = self.started.elapsed().as_millis() / OPEN_BUCKET.as_millis();
        u32::try_from(ms).unwrap_or(u32::MAX)
    }

    fn opened_stream(&mut self, stream: u32) {
        self.highest_opened = stream;
        self.opened += 1;
        let bucket = self.bucket_now();
        if self.len > 0 && self.checkpoints[self.len - 1].0 == bucket {
            self.checkpoints[self.len - 1].1 = stream;
            return;
        }
        if self.len == CHECKPOINTS {
            self.evicted_max = self.evicted_max.max(self.checkpoints[0].1);
            self.checkpoints.copy_within(1.., 0);
            self.len -= 1;
        }
        self.checkpoints[self.len] = (bucket, stream);
        self.len += 1;
    }

    /// Counts a reset of `stream`; true once the connection counts as flooding.
    fn reset_stream(&mut self, stream: u32) -> bool {
        let window = (PREMATURE_RESET_WINDOW.as_millis() / OPEN_BUCKET.as_millis()) as u32;
        // Buckets wholly before the window began: their streams are old enough.
        let old_before = self.bucket_now().saturating_sub(window);
        let opened_long_ago = self.checkpoints[..self.len]
            .iter()
            .rev()
            .find(|(bucket, _)| *bucket < old_before)
            .map_or(self.evicted_max, |(_, id)| (*id).max(self.evicted_max));
        if stream <= opened_long_ago {
            return false;
        }
        self.premature += 1;
        self.premature * 2 > self.opened.max(self.budget)
    }
}

/// Where the writer is in the server's frame sequence.
#[derive(Clone, Debug, Default)]
pub(crate) struct FrameCursor {
    header: [u8; FRAME_HEADER],
    header_len: usize,
    /// Payload bytes left in the current frame, and how many of it were already written;
    /// meaningful once the header is complete (`header_len` is reset to 0 at each frame's
    /// end, so a complete header always has payload left).
    payload_left: usize,
    payload_at: usize,
}

impl FrameCursor {
    /// Advances over `bytes` written; when `patch` is set, returns each (index, byte) of
    /// `bytes` that must be replaced (a GOAWAY's error code).
    pub(crate) fn advance(&mut self, bytes: &[u8], mut patch: Option<&mut Vec<(usize, u8)>>) {
        let mut i = 0;
        while i < bytes.len() {
            if self.header_len < FRAME_HEADER {
                let take = (FRAME_HEADER - self.header_len).min(bytes.len() - i);
                self.header[self.header_len..self.header_len + take]
                    .copy_from_slice(&bytes[i..i + take]);
                self.header_len += take;
                i += take;
                if self.header_len == FRAME_HEADER {
                    let h = &self.header;
                    self.payload_left =
                        (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
                    self.payload_at = 0;
                    if self.payload_left == 0 {
                        self.header_len = 0;
                    }
                }
                continue;
            }
            let take = self.payload_left.min(bytes.len() - i);
            if let Some(out) = patch.as_deref_mut() {
                if self.header[3] == GOAWAY {
                    // The error code is payload bytes 4..8, after the last stream id.
                    for k in 0..take {
                        let at = self.payload_at + k;
                        if (4..8).contains(&at) {
                            out.push((i + k, ENHANCE_YOUR_CALM[at - 4]));
                        }
                    }
                }
            }
            self.payload_left -= take;
            self.payload_at += take;
            i += take;
            if self.payload_left == 0 {
                self.header_len = 0;
            }
        }
    }
}

/// Raised once a connection's client has reset too many streams prematurely: refuses its
/// new streams at once and wakes the connection's driver, which sends the GOAWAY. It lives
/// in the connection's shared state (`liveness::Activity`), which the driver and every
/// request of the connection hold.
#[derive(Debug, Default)]
pub struct FloodFlag {
    raised: AtomicBool,
    wake: Notify,
    /// What the flood was, for the log: premature resets and streams opened.
    counts: (AtomicU64, AtomicU64),
}

impl FloodFlag {
    /// Raises the flag: `premature` of the `opened` streams were reset by the client just
    /// after it opened them. [`FloodFlag::raised`] resolves.
    pub fn raise(&self, premature: u64, opened: u64) {
        self.counts.0.store(premature, Ordering::Relaxed);
        self.counts.1.store(opened, Ordering::Relaxed);
        if !self.raised.swap(true, Ordering::Relaxed) {
            self.wake.notify_one();
        }
    }

    /// The premature resets and streams opened when the flag was raised.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.counts.0.load(Ordering::Relaxed),
            self.counts.1.load(Ordering::Relaxed),
        )
    }

    /// Whether the client was flagged for resetting too many streams.
    pub fn is_raised(&self) -> bool {
        self.raised.load(Ordering::Relaxed)
    }

    /// Resolves once the flag is raised (rapid reset at any pace).
    pub async fn raised(&self) {
        if self.is_raised() {
            return;
        }
        self.wake.notified().await;
    }
}

/// The HTTP/2 server's I/O: passes everything through, counts the client's premature
/// resets as it reads, raises the connection's [`FloodFlag`] when they pass the bound, and
/// from then on makes the server's GOAWAY frames say ENHANCE_YOUR_CALM. `C` is the
/// connection's shared state that holds the flag.
#[derive(Debug)]
pub struct CalmIo<T, C> {
    inner: T,
    connection: Arc<C>,
    resets: ResetWatch,
    cursor: FrameCursor,
    scratch: Vec<u8>,
}

impl<T, C: AsRef<FloodFlag>> CalmIo<T, C> {
    /// Wraps the decrypted stream of an HTTP/2 connection; `reset_budget`: see the module
    /// doc.
    pub fn new(inner: T, connection: Arc<C>, reset_budget: u64) -> Self {
        Self {
            inner,
            connection,
            resets: ResetWatch::new(reset_budget),
            cursor: FrameCursor::default(),
            scratch: Vec::new(),
        }
    }

    fn flag(&self) -> &FloodFlag {
        (*self.connection).as_ref()
    }
}

impl<T: AsyncRead + Unpin, C: AsRef<FloodFlag>> AsyncRead for CalmIo<T, C> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let res = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(res, Poll::Ready(Ok(()))) && !this.flag().is_raised() {
            let read = &buf.filled()[before..];
            if this.resets.observe(read) {
                let (premature, opened) = (this.resets.premature(), this.resets.opened());
                this.flag().raise(premature, opened);
            }
        }
        res
    }
}

impl<T: AsyncWrite + Unpin, C: AsRef<FloodFlag>> CalmIo<T, C> {
    /// Writes `data` with any GOAWAY error code in it rewritten (copies; only after the
    /// connection was flagged).
    fn poll_write_patched(&mut self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        // Which bytes to patch depends on where the cursor is now; the cursor itself only
        // moves by what the inner writer accepted.
        let mut probe = self.cursor.clone();
        let mut patches = Vec::new();
        probe.advance(data, Some(&mut patches));
        let res = if patches.is_empty() {
            Pin::new(&mut self.inner).poll_write(cx, data)
        } else {
            self.scratch.clear();
            self.scratch.extend_from_slice(data);
            for (at, byte) in patches {
                self.scratch[at] = byte;
            }
            Pin::new(&mut self.inner).poll_write(cx, &self.scratch)
        };
        if let Poll::Ready(Ok(n)) = res {
            self.cursor.advance(&data[..n], None);
        }
        res
    }
}

impl<T: AsyncWrite + Unpin, C: AsRef<FloodFlag>> AsyncWrite for CalmIo<T, C> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.flag().is_raised() {
            return this.poll_write_patched(cx, data);
        }
        let res = Pin::new(&mut this.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = res {
            this.cursor.advance(&data[..n], None);
        }
        res
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.flag().is_raised() {
            // Rare and short: one slice at a time, patched.
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &b[..]);
            return this.poll_write_patched(cx, first);
        }
        let res = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(mut n)) = res {
            for b in bufs {
                let take = n.min(b.len());
                this.cursor.advance(&b[..take], None);
                n -= take;
                if n == 0 {
                    break;
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            0,
            0,
            0,
            0,
            0,
        ];
        f.extend_from_slice(payload);
        f
    }

    /// Feeds `stream` in chunks of `step` bytes through a cursor with patching on.
    fn patched(stream: &[u8], step: usize) -> Vec<u8> {
        let mut cursor = FrameCursor::default();
        let mut out = stream.to_vec();
        let mut at = 0;
        for chunk in stream.chunks(step) {
            let mut patches = Vec::new();
            cursor.advance(chunk, Some(&mut patches));
            for (i, b) in patches {
                out[at + i] = b;
            }
            at += chunk.len();
        }
        out
    }

    fn client_frame(kind: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = frame(kind, payload);
        f[5..9].copy_from_slice(&stream.to_be_bytes());
        f
    }

    fn headers(stream: u32) -> Vec<u8> {
        client_frame(HEADERS, stream, &[0x82, 0x87])
    }

    fn reset(stream: u32) -> Vec<u8> {
        client_frame(RST_STREAM, stream, &8u32.to_be_bytes())
    }

    /// A watch that has seen the client preface and an empty SETTINGS.
    fn watch_after_preface(budget: u64) -> ResetWatch {
        let mut w = ResetWatch::new(budget);
        let mut start = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        start.extend(frame(0x4, &[]));
        assert!(!w.observe(&start));
        w
    }

    #[tokio::test(start_paused = true)]
    async fn streams_reset_after_their_answer_still_count_and_trip_past_half_the_budget() {
        // Batches of 50 HEADERS, then 50 RST_STREAMs (the paced attack); the watch sees
        // frames only, so whether an answer went out in between changes nothing.
        let mut w = watch_after_preface(100);
        let mut tripped_at = None;
        'batches: for batch in 0..40u32 {
            for i in 0..50 {
                assert!(!w.observe(&headers(2 * (batch * 50 + i) + 1)));
            }
            tokio::time::advance(Duration::from_millis(5)).await;
            for i in 0..50 {
                if w.observe(&reset(2 * (batch * 50 + i) + 1)) {
                    tripped_at = Some(w.premature());
                    break 'batches;
                }
            }
        }
        assert_eq!(
            tripped_at,
            Some(51),
            "more than half of at least 100 streams"
        );
        assert_eq!(w.opened(), 100);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_cancels_some_calls_on_deadline_is_never_flagged() {
        // 2,000 calls, every 5th cancelled 300 ms after it opened (a short deadline: still
        // premature), the others answered and never reset.
        let mut w = watch_after_preface(100);
        for i in 0..2000u32 {
            let id = 2 * i + 1;
            assert!(!w.observe(&headers(id)));
            if i % 5 == 0 {
                tokio::time::advance(Duration::from_millis(300)).await;
                assert!(!w.observe(&reset(id)), "flagged after {i} calls");
            }
        }
        assert_eq!(w.premature(), 400);
        assert!(!w.is_flood());
    }

    #[tokio::test(start_paused = true)]
    async fn a_reset_after_the_window_is_not_premature_even_past_the_checkpoints() {
        let mut w = watch_after_preface(0);
        // Streams opened in 60 different buckets over 3 s: more than the checkpoints hold.
        for i in 0..60u32 {
            assert!(!w.observe(&headers(2 * i + 1)));
            tokio::time::advance(Duration::from_millis(50)).await;
        }
        // The first ones are long past the window (their checkpoints were evicted), the
        // ones opened 1.1 s ago too; the last one opened 50 ms ago.
        assert!(!w.observe(&reset(1)));
        assert!(!w.observe(&reset(2 * 36 + 1)));
        assert_eq!(w.premature(), 0);
        assert!(
            !w.observe(&reset(2 * 59 + 1)),
            "one premature reset of 60 is not half"
        );
        assert_eq!(w.premature(), 1);
    }

    #[test]
    fn frames_split_anywhere_are_followed_the_same() {
        let mut stream = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        for i in 0..30u32 {
            stream.extend(headers(2 * i + 1));
            stream.extend(client_frame(0x0, 2 * i + 1, &[0u8; 300])); // DATA
            stream.extend(reset(2 * i + 1));
            stream.extend(reset(999)); // never opened: not counted
        }
        for step in [1, 2, 7, 9, 10, 301, stream.len()] {
            let mut w = ResetWatch::new(100);
            for chunk in stream.chunks(step) {
                w.observe(chunk);
            }
            assert_eq!((w.opened(), w.premature()), (30, 30), "step {step}");
        }
    }

    #[test]
    fn goaway_codes_are_rewritten_at_any_split_and_nothing_else_is() {
        let mut stream = frame(0x4, &[]); // SETTINGS, empty payload
        stream.extend(frame(0x0, &[7u8; 20_000])); // DATA
        let mut goaway = 0x7fff_ffff_u32.to_be_bytes().to_vec();
        goaway.extend_from_slice(&0u32.to_be_bytes()); // NO_ERROR
        goaway.extend_from_slice(b"debug");
        stream.extend(frame(GOAWAY, &goaway));
        stream.extend(frame(0x6, &[1u8; 8])); // PING
        for step in [1, 3, 9, 13, 4096, stream.len()] {
            let out = patched(&stream, step);
            let goaway_at = 9 + 9 + 20_000;
            assert_eq!(out[..goaway_at], stream[..goaway_at], "step {step}");
            assert_eq!(
                out[goaway_at + 9 + 4..goaway_at + 9 + 8],
                ENHANCE_YOUR_CALM,
                "step {step}"
            );
            assert_eq!(
                out[goaway_at + 9 + 8..],
                stream[goaway_at + 9 + 8..],
                "step {step}"
            );
        }
    }
}
