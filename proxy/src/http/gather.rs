//! Request-body chunks gathered on their way upstream while the upstream could not use them
//! yet: the rest of a body whose length is known, the rest of a gRPC message.
//!
//! Clients send a body in the pieces their framing gives it: h2load, gRPC's C core and Go
//! send 16 KiB DATA frames whatever the proxy allows, and an HTTP/1.1 body arrives in
//! whatever one read of the socket held. Forwarded as they came, each piece is a write to
//! the upstream and a wake-up of the proxy, most of the cost in the kernel; nginx reads a
//! whole body before it forwards any, so the pace of the pieces costs it little.
//!
//! [`Gather`] holds such pieces (no copy: the `Bytes` themselves) and hands them on in one
//! run, which hyper's HTTP/1.1 client writes with one vectored write and its h2 client
//! queues at once, when holding more could not help: [`Gather::new`]'s byte cap (at most
//! the chunk in hand that the request buffer budget counts per upstream request, so it
//! holds nothing the budget does not), 16 pieces (hyper's vectored write takes 16 buffers),
//! or the end of what the upstream can use: the body's end, or a gRPC message's. A gRPC
//! server acts on whole messages and Qdrant's REST API on whole bodies, so holding delays
//! nothing they could act on and needs no timer: a gRPC stream whose messages are each
//! complete passes them on as they come, and a body of unknown length (chunked HTTP/1.1)
//! gets no [`Gather`] at all. An upstream that reads a known-length body as it streams in
//! sees it in runs of up to the cap instead of piece by piece (nginx, which buffers a whole
//! body before it connects upstream, delays it more); a client that trickles its body still
//! counts as making progress with every piece (the stall timeout), held or not. What it
//! saves, measured, is in docs/benchmarks.md ("Writes and bodies on the data path").

use std::collections::VecDeque;

use bytes::{Buf, Bytes};
use http_body::Frame;

/// The most pieces held: hyper's HTTP/1.1 client writes at most 16 buffers in one vectored
/// write (its `MAX_BUF_LIST_BUFFERS`).
pub const GATHER_MAX_PIECES: usize = 16;
/// The most bytes held, before the request buffer budget's own cap: 16 of the 16 KiB frames
/// most clients send.
pub const GATHER_MAX_BYTES: usize = 256 * 1024;
/// A gRPC message's prefix: a compressed flag and a 4-byte big-endian length.
const GRPC_PREFIX: usize = 5;

/// Where the upstream can next make use of a body: how the end of a usable unit is found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Units {
    /// The body's end, known from its length (Content-Length).
    KnownLength,
    /// The end of each gRPC message (gRPC's PROTOCOL-HTTP2: a flag byte and a 4-byte
    /// big-endian length before each message).
    GrpcMessages,
}

/// A gRPC message boundary tracker over the pieces of a body.
#[derive(Clone, Copy, Debug, Default)]
struct GrpcFraming {
    /// Bytes of the current prefix seen so far (0 at a message boundary).
    prefix_seen: usize,
    /// The prefix's length bytes, as they arrive.
    length: [u8; 4],
    /// Bytes of the current message still to come after its prefix.
    rest: u64,
}

impl GrpcFraming {
    /// Steps over `piece`; true if it ended exactly at a message boundary.
    fn at_boundary_after(&mut self, mut piece: &[u8]) -> bool {
        while !piece.is_empty() {
            if self.rest > 0 {
                let n = (self.rest.min(piece.len() as u64)) as usize;
                self.rest -= n as u64;
                piece.advance(n);
                continue;
            }
            // In a prefix: byte 0 is the flag, bytes 1-4 the length.
            if self.prefix_seen > 0 {
                self.length[self.prefix_seen - 1] = piece[0];
            }
            self.prefix_seen += 1;
            piece.advance(1);
            if self.prefix_seen == GRPC_PREFIX {
                self.prefix_seen = 0;
                self.rest = u64::from(u32::from_be_bytes(self.length));
            }
        }
        self.prefix_seen == 0 && self.rest == 0
    }
}

/// Pieces of one request body held back (see the module's docs).
#[derive(Debug)]
pub struct Gather {
    units: Units,
    grpc: GrpcFraming,
    max_bytes: usize,
    held: VecDeque<Frame<Bytes>>,
    held_bytes: usize,
    /// Set once a run is to go: pieces are handed on until none is left.
    releasing: bool,
}

impl Gather {
    /// Holds pieces of a body whose usable units are `units`, at most `max_bytes` at a time
    /// (capped at [`GATHER_MAX_BYTES`]).
    pub fn new(units: Units, max_bytes: usize) -> Self {
        Self {
            units,
            grpc: GrpcFraming::default(),
            max_bytes: max_bytes.min(GATHER_MAX_BYTES),
            held: VecDeque::new(),
            held_bytes: 0,
            releasing: false,
        }
    }

    /// Bytes held now.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The next held piece of a run being handed on.
    pub fn next_released(&mut self) -> Option<Frame<Bytes>> {
        if !self.releasing {
            return None;
        }
        // A run is only started with something held.
        let frame = self.held.pop_front()?;
        self.held_bytes -= frame.data_ref().map_or(0, Bytes::len);
        self.releasing = !self.held.is_empty();
        Some(frame)
    }

    /// Hands on everything held (the body ended, failed, or its source has nothing more).
    pub fn release(&mut self) {
        self.releasing = !self.held.is_empty();
    }

    /// Takes `frame`, just read; `body_ended`: the body has nothing after it. Returns the
    /// frame to pass on at once (nothing is held and holding it could not help), or `None`
    /// if it was held (then [`Gather::next_released`] says whether a run is ready).
    pub fn offer(&mut self, frame: Frame<Bytes>, body_ended: bool) -> Option<Frame<Bytes>> {
        let len = frame.data_ref().map_or(0, Bytes::len);
        let unit_ended = body_ended
            || match (self.units, frame.data_ref()) {
                (Units::GrpcMessages, Some(data)) => self.grpc.at_boundary_after(data),
                (Units::KnownLength, Some(_)) => false,
                // Trailers end a body.
                (_, None) => true,
            };
        if self.held.is_empty() && (unit_ended || len >= self.max_bytes) {
            return Some(frame);
        }
        self.held.push_back(frame);
        self.held_bytes += len;
        if unit_ended || self.held_bytes >= self.max_bytes || self.held.len() >= GATHER_MAX_PIECES {
            self.releasing = true;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Frame<Bytes> {
        Frame::data(Bytes::from(vec![0u8; n]))
    }

    fn grpc_message(len: u32) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend_from_slice(&len.to_be_bytes());
        m.extend(std::iter::repeat_n(7u8, len as usize));
        m
    }

    fn drain(g: &mut Gather) -> Vec<usize> {
        std::iter::from_fn(|| g.next_released())
            .map(|f| f.data_ref().map_or(0, Bytes::len))
            .collect()
    }

    #[test]
    fn a_known_length_body_is_held_in_runs_up_to_the_cap_and_handed_on_whole_at_its_end() {
        let mut g = Gather::new(Units::KnownLength, 64 * 1024);
        for _ in 0..3 {
            assert!(g.offer(data(16 * 1024), false).is_none());
            assert!(drain(&mut g).is_empty(), "below the cap: held");
        }
        assert!(g.offer(data(16 * 1024), false).is_none());
        assert_eq!(
            drain(&mut g),
            vec![16 * 1024; 4],
            "at the cap: handed on in order"
        );
        assert_eq!(g.held_bytes(), 0);
        assert!(g.offer(data(100), false).is_none());
        assert!(g.offer(data(50), true).is_none());
        assert_eq!(
            drain(&mut g),
            vec![100, 50],
            "the body's end releases the run"
        );
        assert!(g.is_empty());
    }

    #[test]
    fn a_piece_that_could_not_be_helped_passes_at_once_when_nothing_is_held() {
        let mut g = Gather::new(Units::KnownLength, 64 * 1024);
        assert!(
            g.offer(data(64 * 1024), false).is_some(),
            "as large as the cap"
        );
        assert!(
            g.offer(data(10), true).is_some(),
            "the whole body in one piece"
        );
    }

    #[test]
    fn no_more_pieces_than_one_vectored_write_takes_are_held() {
        let mut g = Gather::new(Units::KnownLength, GATHER_MAX_BYTES);
        for _ in 0..GATHER_MAX_PIECES - 1 {
            assert!(g.offer(data(10), false).is_none());
        }
        assert!(drain(&mut g).is_empty());
        assert!(g.offer(data(10), false).is_none());
        assert_eq!(drain(&mut g).len(), GATHER_MAX_PIECES);
    }

    #[test]
    fn grpc_pieces_are_held_to_the_end_of_each_message_wherever_the_prefixes_fall() {
        let mut body = grpc_message(40_000);
        body.extend(grpc_message(0));
        body.extend(grpc_message(3));
        // Pieces cut through the first prefix, the message, and the second prefix.
        let cuts = [2, 16_384, 16_384, 7_237];
        let mut at = 0;
        let mut g = Gather::new(Units::GrpcMessages, GATHER_MAX_BYTES);
        let mut runs = Vec::new();
        for n in cuts {
            let piece = Bytes::copy_from_slice(&body[at..at + n]);
            at += n;
            if let Some(f) = g.offer(Frame::data(piece), false) {
                runs.push(vec![f.data_ref().unwrap().len()]);
            }
            let run = drain(&mut g);
            if !run.is_empty() {
                runs.push(run);
            }
        }
        // The first message is 40,005 bytes: the four pieces (40,007) end 2 bytes into the
        // second message's prefix, so all four are still held.
        assert!(runs.is_empty(), "{runs:?}");
        let last = Bytes::copy_from_slice(&body[at..]);
        assert!(g.offer(Frame::data(last), false).is_none());
        assert_eq!(
            drain(&mut g),
            vec![2, 16_384, 16_384, 7_237, body.len() - at],
            "the third message's end is a boundary"
        );
    }

    #[test]
    fn a_grpc_stream_of_whole_messages_is_never_held() {
        let mut g = Gather::new(Units::GrpcMessages, GATHER_MAX_BYTES);
        for len in [10, 0, 300] {
            let m = Bytes::from(grpc_message(len));
            assert!(g.offer(Frame::data(m), false).is_some());
        }
    }

    #[test]
    fn trailers_end_a_run() {
        let mut g = Gather::new(Units::GrpcMessages, GATHER_MAX_BYTES);
        let mut half = grpc_message(100);
        half.truncate(50);
        assert!(g.offer(Frame::data(Bytes::from(half)), false).is_none());
        assert!(g
            .offer(Frame::trailers(http::HeaderMap::new()), false)
            .is_none());
        let run: Vec<bool> = std::iter::from_fn(|| g.next_released())
            .map(|f| f.is_trailers())
            .collect();
        assert_eq!(run, vec![false, true]);
    }
}
