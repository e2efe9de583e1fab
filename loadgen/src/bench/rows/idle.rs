//! Resident memory per idle TLS connection, for one client, protocol and state:
//! connections opened in steps up to each `--idle` count, either left quiet after the
//! handshake or after one request answered on each (a GET of a few bytes: over h2 an
//! upload leaves more resident, docs/benchmarks.md), the terminator's RSS read after each
//! step. Measured after the rounds on a
//! terminator started afresh for each such set alone ([`Measure::Afresh`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::{Measure, Measuring, Round, RowSet, TerminatorRows, UNIT_LIMIT};
use crate::bench::table::Table;
use crate::bench::workloads::{TinyGet, SERVER_NAME};
use crate::bench::IdleClient;

/// The protocol an idle connection negotiated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleProtocol {
    /// ALPN http/1.1.
    Http1,
    /// ALPN h2.
    H2,
}

/// What an idle connection did before it went quiet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleState {
    /// Nothing: the handshake only.
    Fresh,
    /// One request, answered (a GET of a few bytes), the connection kept.
    AfterRequest,
}

/// Idle connections held open by one kind of client.
enum Held {
    Rustls(Vec<TlsStream<TcpStream>>),
    Openssl(Vec<OpensslIdle>),
}

/// An idle connection held open by OpenSSL's client.
type OpensslIdle = openssl::ssl::SslStream<std::net::TcpStream>;

/// The idle rows of one client.
pub struct Idle {
    client: IdleClient,
    protocol: IdleProtocol,
    state: IdleState,
    counts: Vec<usize>,
    /// Per count of open connections: the per-connection row and the total's.
    keys: Vec<(usize, String, String)>,
}

impl Idle {
    /// For `client` over `protocol` in `state`, at each of `counts` open connections.
    pub fn new(
        client: IdleClient,
        protocol: IdleProtocol,
        state: IdleState,
        counts: &[usize],
    ) -> Self {
        Self {
            client,
            protocol,
            state,
            counts: counts.to_vec(),
            keys: Vec::new(),
        }
    }
}

impl RowSet for Idle {
    fn declare(&mut self, table: &mut Table) {
        // The rows of HTTP/1.1 connections that never sent a request keep their names of
        // before; the others say what differs.
        let client = self.client.as_str();
        let how = match (self.protocol, self.state) {
            (IdleProtocol::Http1, IdleState::Fresh) => "",
            (IdleProtocol::H2, IdleState::Fresh) => ", h2",
            (IdleProtocol::Http1, IdleState::AfterRequest) => ", after one HTTP/1.1 request",
            (IdleProtocol::H2, IdleState::AfterRequest) => ", after one h2 request",
        };
        for &n in &self.counts {
            self.keys.push((
                n,
                table.declare(
                    format!("RSS per idle TLS connection, {n} open, {client} client{how}"),
                    "KiB",
                ),
                table.declare(
                    format!("RSS of {n} idle TLS connections, {client} client{how}"),
                    "MiB",
                ),
            ));
        }
    }

    fn how(&self) -> Measure<'_> {
        Measure::Afresh(self)
    }
}

impl TerminatorRows for Idle {
    fn measure<'a>(&'a self, round: &'a Round<'a>, table: &'a mut Table) -> Measuring<'a, ()> {
        Box::pin(self.measure_afresh(round, table))
    }
}

impl Idle {
    async fn measure_afresh(&self, round: &Round<'_>, table: &mut Table) {
        let (t, label) = (round.t, round.label);
        let Some(addr) = round.any_listener() else {
            return;
        };
        // Settle: the start-up's own allocations must not count against idle connections.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let base = t.rss_kib();
        let mut held = match self.client {
            IdleClient::Rustls => Held::Rustls(Vec::new()),
            IdleClient::Openssl => Held::Openssl(Vec::new()),
        };
        let h2 = self.protocol == IdleProtocol::H2;
        let after_request = self.state == IdleState::AfterRequest;
        let connector = TlsConnector::from(if h2 {
            round.bench.clients.h2.clone()
        } else {
            round.bench.clients.http1.clone()
        });
        let mut opened = 0usize;
        for (n, per_key, total_key) in &self.keys {
            let figure = async {
                let base = *base.as_ref().map_err(|e| anyhow!("{e:#}"))?;
                if *n > t.max_connections {
                    bail!(
                        "configured for at most {} connections (the open-file limit)",
                        t.max_connections
                    );
                }
                let more = n - opened;
                match &mut held {
                    Held::Rustls(h) => {
                        open_idle(addr, &connector, more, 32, h).await?;
                        if after_request {
                            for tls in &mut h[opened..] {
                                one_request(tls, h2).await?;
                            }
                        }
                    }
                    Held::Openssl(h) => {
                        open_idle_openssl(addr, &round.bench.certs.ca, h2, more, 8, h).await?;
                        if after_request {
                            let mut asked = h.split_off(opened);
                            asked = tokio::task::spawn_blocking(move || {
                                for tls in &mut asked {
                                    one_request_blocking(tls, h2)?;
                                }
                                Ok::<_, anyhow::Error>(asked)
                            })
                            .await??;
                            h.append(&mut asked);
                        }
                    }
                }
                opened = *n;
                tokio::time::sleep(Duration::from_millis(1000)).await;
                let now = t.rss_kib()?;
                Ok::<_, anyhow::Error>((now.saturating_sub(base)) as f64)
            }
            .await;
            match figure {
                Ok(delta_kib) => {
                    eprintln!(
                        "{label}: {n} idle connections ({} client): +{:.1} MiB",
                        self.client.as_str(),
                        delta_kib / 1024.0
                    );
                    table.put(per_key, label, Ok(delta_kib / *n as f64));
                    table.put(total_key, label, Ok(delta_kib / 1024.0));
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    eprintln!("{label}: {n} idle connections: {msg}");
                    table.put_missing(&[per_key, total_key], label, &msg);
                    break;
                }
            }
        }
        drop(held);
    }
}

/// Opens `count` TLS connections (handshake done, no request) and keeps them; at most
/// `parallel` handshakes at a time, each bounded by [`UNIT_LIMIT`].
async fn open_idle(
    addr: SocketAddr,
    connector: &TlsConnector,
    count: usize,
    parallel: usize,
    held: &mut Vec<TlsStream<TcpStream>>,
) -> Result<()> {
    let sem = Arc::new(tokio::sync::Semaphore::new(parallel.max(1)));
    let mut tasks = Vec::with_capacity(count);
    for _ in 0..count {
        let permit = sem.clone().acquire_owned().await?;
        let connector = connector.clone();
        tasks.push(tokio::spawn(async move {
            let handshake = async {
                let tcp = TcpStream::connect(addr)
                    .await
                    .with_context(|| format!("connect {addr}"))?;
                tcp.set_nodelay(true)?;
                let name = rustls::pki_types::ServerName::try_from(SERVER_NAME)?;
                connector.connect(name, tcp).await.context("TLS handshake")
            };
            let r = tokio::time::timeout(UNIT_LIMIT, handshake)
                .await
                .unwrap_or_else(|_| Err(anyhow!("no handshake within {UNIT_LIMIT:?}")));
            drop(permit);
            r
        }));
    }
    for t in tasks {
        held.push(t.await??);
    }
    Ok(())
}

/// Opens `count` TLS connections with OpenSSL's client at its stock settings (its own
/// versions, groups and suites, as Python's `ssl.create_default_context()`, curl and most
/// clients outside Rust use it), ALPN h2 or http/1.1, verifying the server against `ca`; the
/// handshakes are blocking calls, `parallel` at a time on the blocking pool, each bounded by
/// [`UNIT_LIMIT`].
async fn open_idle_openssl(
    addr: SocketAddr,
    ca: &std::path::Path,
    h2: bool,
    count: usize,
    parallel: usize,
    held: &mut Vec<OpensslIdle>,
) -> Result<()> {
    use openssl::ssl::{SslConnector, SslMethod};
    let mut builder = SslConnector::builder(SslMethod::tls_client())?;
    builder
        .set_ca_file(ca)
        .with_context(|| format!("loading {}", ca.display()))?;
    builder.set_alpn_protos(if h2 { b"\x02h2" } else { b"\x08http/1.1" })?;
    let connector = Arc::new(builder.build());
    let parallel = parallel.clamp(1, count.max(1));
    let mut tasks = Vec::with_capacity(parallel);
    for i in 0..parallel {
        let share = count / parallel + usize::from(i < count % parallel);
        let connector = connector.clone();
        tasks.push(tokio::task::spawn_blocking(move || {
            let mut opened = Vec::with_capacity(share);
            for _ in 0..share {
                let tcp = std::net::TcpStream::connect_timeout(&addr, UNIT_LIMIT)
                    .with_context(|| format!("connect {addr}"))?;
                tcp.set_nodelay(true)?;
                tcp.set_read_timeout(Some(UNIT_LIMIT))?;
                tcp.set_write_timeout(Some(UNIT_LIMIT))?;
                let tls = connector
                    .connect(SERVER_NAME, tcp)
                    .map_err(|e| anyhow!("OpenSSL handshake: {e}"))?;
                opened.push(tls);
            }
            Ok::<_, anyhow::Error>(opened)
        }));
    }
    for t in tasks {
        held.extend(t.await??);
    }
    Ok(())
}

/// One GET of [`TinyGet::PATH`] on an idle connection (HTTP/1.1 keep-alive, or stream 1 of
/// an h2 connection), written by hand as bytes and its answer read to its end, so that the
/// same exchange runs over the rustls and the OpenSSL client.
struct OneRequest {
    h2: bool,
    seen: Vec<u8>,
}

/// The h2 frame types and flags [`OneRequest`] reads.
const H2_DATA: u8 = 0x0;
const H2_HEADERS: u8 = 0x1;
const H2_SETTINGS: u8 = 0x4;
const H2_GOAWAY: u8 = 0x7;
const H2_END_STREAM: u8 = 0x1;
const H2_ACK: u8 = 0x1;
/// An empty SETTINGS frame with ACK: the answer to the server's SETTINGS.
const H2_SETTINGS_ACK: [u8; 9] = [0, 0, 0, H2_SETTINGS, H2_ACK, 0, 0, 0, 0];

impl OneRequest {
    /// The exchange, and the bytes that open it.
    fn start(h2: bool) -> (Self, Vec<u8>) {
        let request = if h2 {
            // HPACK: :method GET and :scheme https from the static table, :path and
            // :authority as literals without indexing.
            let mut block = vec![0x82, 0x87, 0x04, TinyGet::PATH.len() as u8];
            block.extend_from_slice(TinyGet::PATH.as_bytes());
            block.extend_from_slice(&[0x01, SERVER_NAME.len() as u8]);
            block.extend_from_slice(SERVER_NAME.as_bytes());
            let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
            out.extend_from_slice(&[0, 0, 0, H2_SETTINGS, 0, 0, 0, 0, 0]);
            let len = (block.len() as u32).to_be_bytes();
            // HEADERS on stream 1 with END_HEADERS | END_STREAM.
            out.extend_from_slice(&[len[1], len[2], len[3], H2_HEADERS, 0x5, 0, 0, 0, 1]);
            out.extend_from_slice(&block);
            out
        } else {
            format!(
                "GET {} HTTP/1.1\r\nhost: {SERVER_NAME}\r\n\r\n",
                TinyGet::PATH
            )
            .into_bytes()
        };
        let exchange = Self {
            h2,
            seen: Vec::new(),
        };
        (exchange, request)
    }

    /// Takes bytes read from the server: whether the answer is complete, and what to write
    /// back first (the SETTINGS acknowledgement).
    fn feed(&mut self, data: &[u8]) -> Result<(bool, Option<&'static [u8]>)> {
        self.seen.extend_from_slice(data);
        if self.h2 {
            self.h2_frames()
        } else {
            Ok((self.http1_complete()?, None))
        }
    }

    fn h2_frames(&mut self) -> Result<(bool, Option<&'static [u8]>)> {
        let mut reply = None;
        while self.seen.len() >= 9 {
            let len = u32::from_be_bytes([0, self.seen[0], self.seen[1], self.seen[2]]) as usize;
            if self.seen.len() < 9 + len {
                break;
            }
            let (kind, flags) = (self.seen[3], self.seen[4]);
            let stream =
                u32::from_be_bytes([self.seen[5], self.seen[6], self.seen[7], self.seen[8]])
                    & 0x7fff_ffff;
            self.seen.drain(..9 + len);
            match kind {
                H2_SETTINGS if flags & H2_ACK == 0 => reply = Some(&H2_SETTINGS_ACK[..]),
                H2_GOAWAY => bail!("the server sent GOAWAY before answering"),
                H2_HEADERS | H2_DATA if stream == 1 && flags & H2_END_STREAM != 0 => {
                    return Ok((true, reply))
                }
                _ => {}
            }
        }
        Ok((false, reply))
    }

    fn http1_complete(&self) -> Result<bool> {
        let Some(end) = self.seen.windows(4).position(|w| w == b"\r\n\r\n") else {
            return Ok(false);
        };
        let head = String::from_utf8_lossy(&self.seen[..end]);
        if !head.starts_with("HTTP/1.1 200") {
            bail!("answered {}", head.lines().next().unwrap_or_default());
        }
        let header = |name: &str| {
            head.lines().find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_ascii_lowercase())
            })
        };
        let body = &self.seen[end + 4..];
        if let Some(length) = header("content-length") {
            return Ok(body.len() >= length.parse::<usize>()?);
        }
        if header("transfer-encoding").is_some_and(|te| te.contains("chunked")) {
            return Ok(body.ends_with(b"0\r\n\r\n"));
        }
        bail!("an answer without Content-Length or chunked framing")
    }
}

/// [`OneRequest`] over a rustls connection, bounded by [`UNIT_LIMIT`].
async fn one_request(tls: &mut TlsStream<TcpStream>, h2: bool) -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let (mut exchange, request) = OneRequest::start(h2);
        tls.write_all(&request).await?;
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = tls.read(&mut buf).await?;
            if n == 0 {
                bail!("the server closed the connection before answering");
            }
            let (done, reply) = exchange.feed(&buf[..n])?;
            if let Some(reply) = reply {
                tls.write_all(reply).await?;
            }
            if done {
                return Ok(());
            }
        }
    };
    tokio::time::timeout(UNIT_LIMIT, exchange)
        .await
        .unwrap_or_else(|_| Err(anyhow!("no answer within {UNIT_LIMIT:?}")))
        .context("one request on an idle connection")
}

/// [`OneRequest`] over an OpenSSL connection (its socket's timeouts are [`UNIT_LIMIT`]).
fn one_request_blocking(tls: &mut OpensslIdle, h2: bool) -> Result<()> {
    use std::io::{Read, Write};
    let (mut exchange, request) = OneRequest::start(h2);
    tls.write_all(&request)?;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tls
            .read(&mut buf)
            .context("one request on an idle connection")?;
        if n == 0 {
            bail!("the server closed the connection before answering");
        }
        let (done, reply) = exchange.feed(&buf[..n])?;
        if let Some(reply) = reply {
            tls.write_all(reply)?;
        }
        if done {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_http1_answer_is_complete_at_its_length_or_last_chunk() {
        let (mut e, request) = OneRequest::start(false);
        assert!(request.starts_with(b"GET /tiny HTTP/1.1\r\n"));
        assert!(
            !e.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nab")
                .unwrap()
                .0
        );
        assert!(e.feed(b"c").unwrap().0);
        let (mut e, _) = OneRequest::start(false);
        assert!(
            !e.feed(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
                .unwrap()
                .0
        );
        assert!(e.feed(b"0\r\n\r\n").unwrap().0);
        let (mut e, _) = OneRequest::start(false);
        assert!(e.feed(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").is_err());
    }

    #[test]
    fn an_h2_answer_is_complete_at_end_stream_and_settings_are_acknowledged() {
        let (mut e, request) = OneRequest::start(true);
        assert!(request.starts_with(b"PRI * HTTP/2.0"));
        // The server's SETTINGS (one setting), then HEADERS, then DATA with END_STREAM,
        // fed in pieces.
        let mut server = vec![0, 0, 6, H2_SETTINGS, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100];
        server.extend_from_slice(&[0, 0, 1, H2_HEADERS, 0x4, 0, 0, 0, 1, 0x88]);
        server.extend_from_slice(&[0, 0, 2, H2_DATA, H2_END_STREAM, 0, 0, 0, 1, b'o', b'k']);
        let (done, reply) = e.feed(&server[..12]).unwrap();
        assert!(!done && reply.is_none());
        let (done, reply) = e.feed(&server[12..20]).unwrap();
        assert!(!done);
        assert_eq!(reply, Some(&H2_SETTINGS_ACK[..]));
        let (done, _) = e.feed(&server[20..]).unwrap();
        assert!(done);
        let (mut e, _) = OneRequest::start(true);
        assert!(e
            .feed(&[0, 0, 8, H2_GOAWAY, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
            .is_err());
    }
}
