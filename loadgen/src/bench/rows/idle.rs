//! Resident memory per idle TLS connection, for one client: connections opened (handshake
//! done, no request) in steps up to each `--idle` count, the terminator's RSS read after
//! each step. Measured after the rounds on a terminator started afresh for this client
//! alone ([`When::Afresh`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::{Measuring, Round, RowSet, When, UNIT_LIMIT};
use crate::bench::table::Table;
use crate::bench::workloads::SERVER_NAME;
use crate::bench::IdleClient;

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
    counts: Vec<usize>,
    /// Per count of open connections: the per-connection row and the total's.
    keys: Vec<(usize, String, String)>,
}

impl Idle {
    /// For `client`, at each of `counts` open connections.
    pub fn new(client: IdleClient, counts: &[usize]) -> Self {
        Self {
            client,
            counts: counts.to_vec(),
            keys: Vec::new(),
        }
    }
}

impl RowSet for Idle {
    fn declare(&mut self, table: &mut Table) {
        let client = self.client.as_str();
        for &n in &self.counts {
            self.keys.push((
                n,
                table.declare(
                    format!("RSS per idle TLS connection, {n} open, {client} client"),
                    "KiB",
                ),
                table.declare(
                    format!("RSS of {n} idle TLS connections, {client} client"),
                    "MiB",
                ),
            ));
        }
    }

    fn when(&self) -> When {
        When::Afresh
    }

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
        let connector = TlsConnector::from(round.bench.clients.http1.clone());
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
                    Held::Rustls(h) => open_idle(addr, &connector, more, 32, h).await?,
                    Held::Openssl(h) => {
                        open_idle_openssl(addr, &round.bench.certs.ca, more, 8, h).await?
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
/// clients outside Rust use it), ALPN http/1.1, verifying the server against `ca`; the
/// handshakes are blocking calls, `parallel` at a time on the blocking pool, each bounded by
/// [`UNIT_LIMIT`].
async fn open_idle_openssl(
    addr: SocketAddr,
    ca: &std::path::Path,
    count: usize,
    parallel: usize,
    held: &mut Vec<OpensslIdle>,
) -> Result<()> {
    use openssl::ssl::{SslConnector, SslMethod};
    let mut builder = SslConnector::builder(SslMethod::tls_client())?;
    builder
        .set_ca_file(ca)
        .with_context(|| format!("loading {}", ca.display()))?;
    builder.set_alpn_protos(b"\x08http/1.1")?;
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
