//! What the benchmark asks of each terminator, one kind of work at a time: a new TLS
//! connection per tiny request, keep-alive bulk uploads (HTTP/1.1, h2, gRPC), idle
//! connections held open, the first response after the handshake from a client that keeps
//! Nagle on, and one large request at a time. Every loop is bounded in time and count.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::H2_WINDOW;

/// The tiny request of the new-connection row: the answer is a few bytes.
const TINY_REQUEST: &[u8] = b"GET /tiny HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
/// How long one idle connection's handshake may take (a terminator at its connection
/// limit leaves the rest waiting in its accept queue).
const IDLE_CONNECT_LIMIT: Duration = Duration::from_secs(10);
/// Most connections a loop may open, whatever the duration: a bound on a runaway loop.
const MAX_CONNECTIONS_PER_LOOP: u64 = 1_000_000;

/// Successes and failures of one loop, with the first failure's message.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Units of work completed.
    pub ok: u64,
    /// Units of work that failed.
    pub failed: u64,
    /// Request body bytes sent in the completed ones.
    pub bytes: u64,
    /// The first failure's message.
    pub first_error: Option<String>,
}

impl Outcome {
    fn merge(&mut self, other: Outcome) {
        self.ok += other.ok;
        self.failed += other.failed;
        self.bytes += other.bytes;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    fn fail(&mut self, e: anyhow::Error) {
        self.failed += 1;
        if self.first_error.is_none() {
            self.first_error = Some(format!("{e:#}"));
        }
    }
}

/// The outcomes of a loop's client tasks, added up.
async fn join(tasks: Vec<tokio::task::JoinHandle<Outcome>>) -> Outcome {
    let mut total = Outcome::default();
    for t in tasks {
        if let Ok(o) = t.await {
            total.merge(o);
        }
    }
    total
}

/// TLS client configurations: the two ALPN offers the rows need, and the baseline's.
#[derive(Clone)]
pub struct Clients {
    /// Offers ALPN http/1.1.
    pub http1: TlsConnector,
    /// Offers ALPN h2.
    pub h2: TlsConnector,
    /// The same client without ALPN, for the in-memory handshake baseline.
    pub in_memory: Arc<rustls::ClientConfig>,
}

fn server_name() -> ServerName<'static> {
    ServerName::try_from("localhost").expect("a valid DNS name")
}

async fn tls_connect(
    addr: SocketAddr,
    connector: &TlsConnector,
    nodelay: bool,
) -> Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect {addr}"))?;
    tcp.set_nodelay(nodelay)?;
    connector
        .connect(server_name(), tcp)
        .await
        .context("TLS handshake")
}

/// One new connection, one tiny GET, read to the end. Returns the time from the end of the
/// handshake to the first byte of the answer.
pub async fn tiny_request(
    addr: SocketAddr,
    connector: &TlsConnector,
    nodelay: bool,
) -> Result<Duration> {
    let mut tls = tls_connect(addr, connector, nodelay).await?;
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

/// `concurrency` clients each repeating `each` (one unit of work, returning the request
/// bytes it carried) until `duration`, bounded by [`MAX_CONNECTIONS_PER_LOOP`] in all; a
/// unit that takes longer than [`IDLE_CONNECT_LIMIT`] counts as failed.
async fn repeat_concurrently<F, Fut>(concurrency: usize, duration: Duration, each: F) -> Outcome
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<u64>> + Send,
{
    let deadline = Instant::now() + duration;
    let started = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency.max(1) {
        let each = each.clone();
        let started = started.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Outcome::default();
            while Instant::now() < deadline
                && started.fetch_add(1, Ordering::Relaxed) < MAX_CONNECTIONS_PER_LOOP
            {
                match tokio::time::timeout(IDLE_CONNECT_LIMIT, each()).await {
                    Ok(Ok(bytes)) => {
                        out.ok += 1;
                        out.bytes += bytes;
                    }
                    Ok(Err(e)) => out.fail(e),
                    Err(_) => out.fail(anyhow!("no answer within {IDLE_CONNECT_LIMIT:?}")),
                }
            }
            out
        }));
    }
    join(tasks).await
}

/// `concurrency` clients each opening a new connection per tiny request until `duration`.
pub async fn new_connections(
    addr: SocketAddr,
    connector: &TlsConnector,
    concurrency: usize,
    duration: Duration,
) -> Outcome {
    let connector = connector.clone();
    repeat_concurrently(concurrency, duration, move || {
        let connector = connector.clone();
        async move { tiny_request(addr, &connector, true).await.map(|_| 0) }
    })
    .await
}

/// The mission's unit of work: a new TLS connection that carries one upsert of `kind`
/// (`Connection: close` over HTTP/1.1; one call over h2), read to its end, then closed;
/// the close is awaited, so the terminator's teardown falls inside the loop that timed it.
pub async fn upsert_on_new_connection(
    addr: SocketAddr,
    clients: &Clients,
    kind: Bulk,
    body: &Bytes,
) -> Result<u64> {
    let tls = connect_for(addr, clients, kind).await?;
    let authority = format!("localhost:{}", addr.port());
    let mut req = bulk_request(kind, body, &authority);
    if kind == Bulk::H1Rest {
        req.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    let (mut sender, conn) = Sender::open(tls, kind != Bulk::H1Rest).await?;
    sender.exchange(req, kind == Bulk::Grpc).await?;
    // Dropping the sender ends the connection: HTTP/1.1 after `Connection: close`, h2 with
    // GOAWAY.
    drop(sender);
    let _ = conn.await;
    Ok(body.len() as u64)
}

/// `concurrency` clients each sending upserts of `kind`, a new connection each, until
/// `duration`.
pub async fn upserts_on_new_connections(
    addr: SocketAddr,
    clients: &Clients,
    kind: Bulk,
    body: Bytes,
    concurrency: usize,
    duration: Duration,
) -> Outcome {
    let clients = clients.clone();
    repeat_concurrently(concurrency, duration, move || {
        let clients = clients.clone();
        let body = body.clone();
        async move { upsert_on_new_connection(addr, &clients, kind, &body).await }
    })
    .await
}

/// Bulk request kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bulk {
    /// REST JSON over HTTP/2 (the terminator forwards over HTTP/1.1).
    H2Rest,
    /// REST JSON over HTTP/1.1.
    H1Rest,
    /// gRPC over HTTP/2 (the terminator forwards over h2c).
    Grpc,
}

/// A ready-to-use request sender on one connection.
pub enum Sender {
    /// HTTP/1.1.
    H1(http1::SendRequest<Full<Bytes>>),
    /// HTTP/2.
    H2(http2::SendRequest<Full<Bytes>>),
}

impl Sender {
    /// HTTP/1.1 or HTTP/2 (prior knowledge) over `io`; the connection is driven by a task.
    pub async fn over<IO>(io: IO, h2: bool) -> Result<Self>
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        Ok(Self::open(io, h2).await?.0)
    }

    /// As [`Sender::over`], with the task driving the connection, which ends when the
    /// connection does.
    pub async fn open<IO>(io: IO, h2: bool) -> Result<(Self, tokio::task::JoinHandle<()>)>
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let io = TokioIo::new(io);
        if h2 {
            let (send, conn) = http2::Builder::new(TokioExecutor::new())
                .initial_stream_window_size(H2_WINDOW)
                .initial_connection_window_size(H2_WINDOW * 4)
                .handshake(io)
                .await?;
            let conn = tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok((Self::H2(send), conn))
        } else {
            let (send, conn) = http1::handshake(io).await?;
            let conn = tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok((Self::H1(send), conn))
        }
    }

    /// Sends one request and reads the whole answer; gRPC answers must end in status 0.
    pub async fn exchange(&mut self, req: Request<Full<Bytes>>, grpc: bool) -> Result<()> {
        let resp = match self {
            Self::H1(s) => {
                s.ready().await?;
                s.send_request(req).await?
            }
            Self::H2(s) => {
                s.ready().await?;
                s.send_request(req).await?
            }
        };
        if resp.status() != StatusCode::OK {
            bail!("HTTP {}", resp.status());
        }
        let collected = resp.into_body().collect().await?;
        if grpc {
            let status = collected
                .trailers()
                .and_then(|t| t.get("grpc-status"))
                .map(|v| v.as_bytes().to_vec());
            if status.as_deref() != Some(b"0") {
                bail!(
                    "gRPC status {:?}",
                    status.as_deref().map(String::from_utf8_lossy)
                );
            }
        }
        Ok(())
    }
}

/// The request of a bulk row. `h2` chooses the URI form (HTTP/2 needs scheme and authority).
pub fn bulk_request(kind: Bulk, body: &Bytes, authority: &str) -> Request<Full<Bytes>> {
    let grpc = kind == Bulk::Grpc;
    let path = if grpc {
        "/qdrant.Points/Upsert"
    } else {
        "/collections/bench/points?wait=true"
    };
    let mut b = Request::post(format!("http://{authority}{path}"));
    if kind == Bulk::H1Rest {
        b = b.header(http::header::HOST, authority);
    }
    if grpc {
        b = b
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers");
    } else {
        b = b.header(http::header::CONTENT_TYPE, "application/json");
    }
    b.header(http::header::CONTENT_LENGTH, body.len())
        .body(Full::new(body.clone()))
        .expect("static request parts are valid")
}

/// A TLS connection to `addr` that negotiated the ALPN protocol `kind` needs.
async fn connect_for(
    addr: SocketAddr,
    clients: &Clients,
    kind: Bulk,
) -> Result<TlsStream<TcpStream>> {
    let h2 = kind != Bulk::H1Rest;
    let connector = if h2 { &clients.h2 } else { &clients.http1 };
    let tls = tls_connect(addr, connector, true).await?;
    let negotiated_h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    if negotiated_h2 != h2 {
        bail!(
            "ALPN: asked for {}, got the other",
            if h2 { "h2" } else { "http/1.1" }
        );
    }
    Ok(tls)
}

/// Opens a keep-alive TLS connection to `addr` for `kind`.
pub async fn bulk_sender(addr: SocketAddr, clients: &Clients, kind: Bulk) -> Result<Sender> {
    let tls = connect_for(addr, clients, kind).await?;
    Sender::over(tls, kind != Bulk::H1Rest).await
}

/// `connections` keep-alive connections, each sending `kind` requests one after another
/// until `duration`. `bytes` counts request bodies sent and answered.
pub async fn bulk(
    addr: SocketAddr,
    clients: &Clients,
    kind: Bulk,
    body: Bytes,
    connections: usize,
    duration: Duration,
) -> Outcome {
    let deadline = Instant::now() + duration;
    let mut tasks = Vec::new();
    for _ in 0..connections.max(1) {
        let clients = clients.clone();
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Outcome::default();
            let mut sender = match bulk_sender(addr, &clients, kind).await {
                Ok(s) => s,
                Err(e) => {
                    out.fail(e);
                    return out;
                }
            };
            let authority = format!("localhost:{}", addr.port());
            while Instant::now() < deadline {
                let req = bulk_request(kind, &body, &authority);
                match sender.exchange(req, kind == Bulk::Grpc).await {
                    Ok(()) => {
                        out.ok += 1;
                        out.bytes += body.len() as u64;
                    }
                    Err(e) => {
                        out.fail(e);
                        break;
                    }
                }
            }
            out
        }));
    }
    join(tasks).await
}

/// Mean time of one request at concurrency 1 over `sender`, after `warmup` unmeasured ones;
/// at most `count` requests and `limit` time.
pub async fn mean_latency(
    sender: &mut Sender,
    body: &Bytes,
    authority: &str,
    warmup: usize,
    count: usize,
    limit: Duration,
) -> Result<Duration> {
    for _ in 0..warmup {
        sender
            .exchange(bulk_request(Bulk::H2Rest, body, authority), false)
            .await?;
    }
    let deadline = Instant::now() + limit;
    let started = Instant::now();
    let mut done = 0u32;
    while (done as usize) < count && Instant::now() < deadline {
        sender
            .exchange(bulk_request(Bulk::H2Rest, body, authority), false)
            .await?;
        done += 1;
    }
    if done == 0 {
        return Err(anyhow!("no request finished within {limit:?}"));
    }
    Ok(started.elapsed() / done)
}

/// Opens `count` TLS connections (handshake done, no request) and keeps them; at most
/// `parallel` handshakes at a time.
pub async fn open_idle(
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
            let r = tokio::time::timeout(IDLE_CONNECT_LIMIT, tls_connect(addr, &connector, true))
                .await
                .unwrap_or_else(|_| Err(anyhow!("no handshake within {IDLE_CONNECT_LIMIT:?}")));
            drop(permit);
            r
        }));
    }
    for t in tasks {
        held.push(t.await??);
    }
    Ok(())
}

/// An idle connection held open by OpenSSL's client.
pub type OpensslIdle = openssl::ssl::SslStream<std::net::TcpStream>;

/// Opens `count` TLS connections with OpenSSL's client at its stock settings (its own
/// versions, groups and suites, as Python's `ssl.create_default_context()`, curl and most
/// clients outside Rust use it), ALPN http/1.1, verifying the server against `ca`; the
/// handshakes are blocking calls, `parallel` at a time on the blocking pool, each bounded by
/// `IDLE_CONNECT_LIMIT` (10 s).
pub async fn open_idle_openssl(
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
                let tcp = std::net::TcpStream::connect_timeout(&addr, IDLE_CONNECT_LIMIT)
                    .with_context(|| format!("connect {addr}"))?;
                tcp.set_nodelay(true)?;
                tcp.set_read_timeout(Some(IDLE_CONNECT_LIMIT))?;
                tcp.set_write_timeout(Some(IDLE_CONNECT_LIMIT))?;
                let tls = connector
                    .connect("localhost", tcp)
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
