//! Raw HTTP/2 for clients that misbehave where a client library would not (no preface,
//! PINGs only, a zero window, never acknowledging the GOAWAY's PING, paced resets): frames
//! written by hand and a reader that watches what the server sends back.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use e2e::*;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
pub const FRAME_SIZE_ERROR: u32 = 0x6;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

pub fn settings(pairs: &[(u16, u32)]) -> Vec<u8> {
    let mut p = Vec::new();
    for (id, v) in pairs {
        p.extend_from_slice(&id.to_be_bytes());
        p.extend_from_slice(&v.to_be_bytes());
    }
    frame(SETTINGS, 0, 0, &p)
}

/// A GET request's HEADERS: HPACK static entries for :method GET and :scheme https,
/// literals (not indexed) for :authority and :path.
pub fn get_headers(stream: u32, path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x87, 0x01, 9];
    block.extend_from_slice(b"localhost");
    block.extend_from_slice(&[0x04, path.len() as u8]);
    block.extend_from_slice(path.as_bytes());
    frame(HEADERS, END_HEADERS | END_STREAM, stream, &block)
}

/// What a raw client saw of the server until it closed or `limit` passed.
#[derive(Debug, Default)]
pub struct Seen {
    /// SETTINGS_MAX_FRAME_SIZE of the server's first SETTINGS (16384 if it sent none).
    pub max_frame_size: Option<u32>,
    /// The connection window the server opened: 65,535 plus its stream-0 WINDOW_UPDATEs.
    pub connection_window: u64,
    pub goaway_codes: Vec<u32>,
    /// The last stream id of each GOAWAY: the highest stream the server says it processed.
    pub goaway_last_streams: Vec<u32>,
    pub pings: usize,
    pub data_bytes: usize,
    pub closed_after: Option<Duration>,
}

/// Reads frames (answering nothing) until the server closes or `limit` passes.
pub async fn watch(reader: &mut (impl tokio::io::AsyncRead + Unpin), limit: Duration) -> Seen {
    let started = Instant::now();
    let mut seen = Seen {
        connection_window: 65_535,
        ..Seen::default()
    };
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let left = limit.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, reader.read(&mut chunk)).await {
            Err(_) => return seen,
            Ok(Ok(0)) | Ok(Err(_)) => {
                seen.closed_after = Some(started.elapsed());
                return seen;
            }
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
        while buf.len() >= 9 {
            let len =
                (usize::from(buf[0]) << 16) | (usize::from(buf[1]) << 8) | usize::from(buf[2]);
            if buf.len() < 9 + len {
                break;
            }
            let payload = &buf[9..9 + len];
            match buf[3] {
                GOAWAY => {
                    seen.goaway_last_streams.push(
                        u32::from_be_bytes(payload[..4].try_into().expect("a stream id"))
                            & 0x7fff_ffff,
                    );
                    seen.goaway_codes.push(u32::from_be_bytes(
                        payload[4..8].try_into().expect("GOAWAY has an error code"),
                    ));
                }
                PING if buf[4] & 0x1 == 0 => seen.pings += 1,
                SETTINGS if buf[4] & 0x1 == 0 && seen.max_frame_size.is_none() => {
                    let advertised = payload
                        .chunks_exact(6)
                        .find(|p| p[..2] == SETTINGS_MAX_FRAME_SIZE.to_be_bytes())
                        .map(|p| u32::from_be_bytes(p[2..6].try_into().expect("4 bytes")));
                    seen.max_frame_size = Some(advertised.unwrap_or(16_384));
                }
                WINDOW_UPDATE if buf[5..9] == [0, 0, 0, 0] => {
                    seen.connection_window += u64::from(
                        u32::from_be_bytes(payload[..4].try_into().expect("an increment"))
                            & 0x7fff_ffff,
                    );
                }
                DATA => seen.data_bytes += len,
                _ => {}
            }
            buf.drain(..9 + len);
        }
    }
}

pub async fn h2_connect(addr: SocketAddr) -> TlsStream<TcpStream> {
    let cfg = client_config(&ClientOpts {
        alpn: vec![b"h2".to_vec()],
        ..ClientOpts::default()
    });
    let tls = tls_connect(addr, cfg).await.expect("TLS to the proxy");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    tls
}

/// A HEADERS block for POST `path` with `extra` literal headers (name, value), not
/// ending the stream.
pub fn post_headers_block(path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut block = vec![0x83, 0x87, 0x01, 9];
    block.extend_from_slice(b"localhost");
    block.extend_from_slice(&[0x04, path.len() as u8]);
    block.extend_from_slice(path.as_bytes());
    for (name, value) in extra {
        block.push(0x00);
        hpack_length(&mut block, name.len());
        block.extend_from_slice(name.as_bytes());
        hpack_length(&mut block, value.len());
        block.extend_from_slice(value.as_bytes());
    }
    block
}

/// An HPACK string length (7-bit prefix integer, no Huffman).
pub fn hpack_length(out: &mut Vec<u8>, mut n: usize) {
    if n < 127 {
        out.push(n as u8);
        return;
    }
    out.push(127);
    n -= 127;
    while n >= 128 {
        out.push((n % 128 + 128) as u8);
        n /= 128;
    }
    out.push(n as u8);
}

pub const CONTINUATION: u8 = 0x9;
