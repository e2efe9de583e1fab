//! The measurement example's parts: a minimal upstream, the real proxy binary started on
//! loopback, and a TLS client with a full handshake per connection.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use loadgen::launch::Launched;
use rustls::pki_types::ServerName;

/// A running proxy process; killed on drop (by the launcher).
pub struct RunningProxy {
    _process: Launched,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
}

/// Starts `binary run` on 127.0.0.1:0 with `args` through loadgen's launcher and waits
/// for its ready file.
pub async fn start_proxy(
    binary: &str,
    dir: &Path,
    tag: &str,
    args: &[String],
) -> anyhow::Result<RunningProxy> {
    let mut cmd = Command::new(binary);
    cmd.args(["run", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(args);
    let what = format!("proxy-{tag}");
    let dir = dir.to_owned();
    let process = tokio::task::spawn_blocking(move || {
        Launched::start(cmd, &what, &dir, Duration::from_secs(20))
    })
    .await??;
    let ready = process.proxy_ready()?;
    Ok(RunningProxy {
        addr: ready
            .first_listener()
            .ok_or_else(|| anyhow::anyhow!("the proxy bound no listener"))?,
        admin: ready
            .admin
            .ok_or_else(|| anyhow::anyhow!("the proxy has no admin port"))?,
        _process: process,
    })
}

/// TLS 1.3, X25519, no resumption: every connection is a full handshake.
pub fn client_config(ca: &Path) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    Ok(proxy::tls::client::ClientTls {
        versions: vec![proxy::config::TlsVersion::Tls13],
        alpn: vec![b"http/1.1".to_vec()],
        ..proxy::tls::client::ClientTls::trusting(ca)
    }
    .build()?)
}

/// An HTTP/1.1 sender on a new TLS connection.
pub async fn connect(
    addr: SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
) -> anyhow::Result<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

/// One GET on an established connection.
pub async fn get(
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
) -> anyhow::Result<()> {
    sender.ready().await?;
    let req = http::Request::get("/")
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    anyhow::ensure!(resp.status() == 200, "status {}", resp.status());
    resp.into_body().collect().await?;
    Ok(())
}

/// One GET on a new connection (a full handshake).
pub async fn one_request(addr: SocketAddr, cfg: Arc<rustls::ClientConfig>) -> anyhow::Result<()> {
    let mut sender = connect(addr, cfg).await?;
    get(&mut sender).await
}

/// The proxy's own CPU seconds, from its metrics.
pub async fn proxy_cpu(admin: SocketAddr) -> anyhow::Result<f64> {
    let tcp = tokio::net::TcpStream::connect(admin).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let req = http::Request::get("/metrics")
        .header("host", "admin")
        .body(Empty::<Bytes>::new())?;
    let body = sender
        .send_request(req)
        .await?
        .into_body()
        .collect()
        .await?
        .to_bytes();
    let text = String::from_utf8_lossy(&body);
    text.lines()
        .find_map(|l| l.strip_prefix("process_cpu_seconds_total "))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no process_cpu_seconds_total"))
}

/// A tiny HTTP upstream answering "ok".
pub async fn start_upstream() -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                        Bytes::from_static(b"ok"),
                    )))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// The q-quantile of sorted samples.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}
