//! The first response after the handshake from a client that keeps Nagle on: the median
//! delay to the first byte of a tiny GET's answer over new connections. A terminator that
//! waits for more before it writes (or is waited on by the client's unacknowledged bytes)
//! shows here as tens of milliseconds. Its client writes raw bytes on purpose: the row is
//! about when bytes move, so no HTTP library may coalesce or flush on its own terms.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::{Measure, Measuring, Round, RowSet, TerminatorRows, UNIT_LIMIT};
use crate::bench::table::Table;
use crate::bench::workloads::SERVER_NAME;

/// The tiny request: the answer is a few bytes.
const TINY_REQUEST: &[u8] = b"GET /tiny HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

/// The first-response row.
#[derive(Default)]
pub struct FirstResponse {
    key: String,
}

impl RowSet for FirstResponse {
    fn declare(&mut self, table: &mut Table) {
        self.key = table.declare(
            "first response after the handshake, client without TCP_NODELAY (median)".into(),
            "ms",
        );
    }

    fn how(&self) -> Measure<'_> {
        Measure::EveryRound(self)
    }
}

impl TerminatorRows for FirstResponse {
    fn measure<'a>(&'a self, round: &'a Round<'a>, table: &'a mut Table) -> Measuring<'a, ()> {
        Box::pin(async move {
            let Some(addr) = round.any_listener() else {
                return;
            };
            let connector = TlsConnector::from(round.bench.clients.http1.clone());
            let figure = median_first_response(
                addr,
                &connector,
                round.bench.plan.flags.first_response_connections,
                round,
            )
            .await;
            eprintln!("{}: first response {figure:?} ms (median)", round.label);
            table.put(&self.key, round.label, figure);
        })
    }
}

/// The median delay, in ms, to the first response byte over `connections` new connections.
async fn median_first_response(
    addr: SocketAddr,
    connector: &TlsConnector,
    connections: usize,
    round: &Round<'_>,
) -> Result<f64> {
    let mut delays = Vec::new();
    let mut error = None;
    for _ in 0..connections.max(1) {
        if round.bench.stop.is_cancelled() {
            break;
        }
        match tokio::time::timeout(UNIT_LIMIT, tiny_request(addr, connector)).await {
            Ok(Ok(d)) => delays.push(d),
            Ok(Err(e)) => error = Some(e),
            Err(_) => error = Some(anyhow!("no answer within {UNIT_LIMIT:?}")),
        }
    }
    delays.sort();
    match delays.get(delays.len() / 2) {
        Some(d) => Ok(d.as_secs_f64() * 1000.0),
        None => Err(error.unwrap_or_else(|| anyhow!("not measured"))),
    }
}

/// One new connection with Nagle on, one tiny GET, read to the end. Returns the time from
/// the end of the handshake to the first byte of the answer.
async fn tiny_request(addr: SocketAddr, connector: &TlsConnector) -> Result<Duration> {
    let tcp = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect {addr}"))?;
    tcp.set_nodelay(false)?;
    let name = rustls::pki_types::ServerName::try_from(SERVER_NAME)?;
    let mut tls = connector
        .connect(name, tcp)
        .await
        .context("TLS handshake")?;
    let sent = Instant::now();
    tls.write_all(TINY_REQUEST).await?;
    tls.flush().await?;
    let mut buf = [0u8; 1024];
    let n = tls.read(&mut buf).await.context("reading the answer")?;
    let first_byte = sent.elapsed();
    if !buf[..n].starts_with(b"HTTP/1.1 200") {
        bail!(
            "unexpected answer: {:?}",
            String::from_utf8_lossy(&buf[..n.min(80)])
        );
    }
    // Read to the end: the server closes after the answer (Connection: close). A close
    // without close_notify is the server's business, not a failed request.
    loop {
        match tls.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    Ok(first_byte)
}
