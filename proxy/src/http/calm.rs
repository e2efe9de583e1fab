//! GOAWAY with ENHANCE_YOUR_CALM for clients that reset too many streams.
//!
//! hyper can only close an HTTP/2 connection gracefully (GOAWAY with NO_ERROR); the h2
//! crate below it has `abrupt_shutdown(reason)` but hyper does not expose it. RFC 9113
//! asks for ENHANCE_YOUR_CALM when a peer is abusive, and clients (Go, grpc-java, h2)
//! treat it as "do not retry on this connection at once". So this wrapper sits under
//! hyper's HTTP/2 server, follows the frame boundaries of what it writes (a 9-byte header
//! per frame: cheap, no copy), and once the connection is flagged as flooding, rewrites
//! the error code of the GOAWAY frames that hyper's graceful close sends.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::io::Activity;

const FRAME_HEADER: usize = 9;
const GOAWAY: u8 = 0x7;
/// RFC 9113 7: ENHANCE_YOUR_CALM.
const ENHANCE_YOUR_CALM: [u8; 4] = 0xb_u32.to_be_bytes();

/// Where the writer is in the server's frame sequence.
#[derive(Clone, Debug, Default)]
struct FrameCursor {
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
    fn advance(&mut self, bytes: &[u8], mut patch: Option<&mut Vec<(usize, u8)>>) {
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

/// The HTTP/2 server's I/O: passes everything through, and once `activity` is flooding,
/// makes its GOAWAY frames say ENHANCE_YOUR_CALM.
#[derive(Debug)]
pub struct CalmIo<T> {
    inner: T,
    activity: Arc<Activity>,
    cursor: FrameCursor,
    scratch: Vec<u8>,
}

impl<T> CalmIo<T> {
    /// Wraps the decrypted stream of an HTTP/2 connection.
    pub fn new(inner: T, activity: Arc<Activity>) -> Self {
        Self {
            inner,
            activity,
            cursor: FrameCursor::default(),
            scratch: Vec::new(),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for CalmIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> CalmIo<T> {
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

impl<T: AsyncWrite + Unpin> AsyncWrite for CalmIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.activity.is_flooding() {
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
        if this.activity.is_flooding() {
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
