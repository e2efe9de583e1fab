//! One-shot HTTP(S) requests for everything that is not the measured workload: the proxy's
//! /metrics and admin API, the embeddings endpoint, Redfish, the collection set-up.
//!
//! Built on the same hyper + rustls stack as the workload client, so loadgen carries one
//! HTTP implementation and one TLS configuration story.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::net::TcpStream;

/// A response, read whole.
pub struct Response {
    pub status: u16,
    pub body: Bytes,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Request options beyond method, URL and body.
#[derive(Clone, Default)]
pub struct Options {
    /// TLS configuration for https URLs; without one an https URL is an error.
    pub tls: Option<Arc<ClientConfig>>,
    /// Extra headers, e.g. authorization.
    pub headers: Vec<(String, String)>,
    pub timeout: Option<Duration>,
}

/// Sends one request on a fresh connection and reads the whole answer.
pub async fn send(
    method: Method,
    url: &str,
    body: Option<Bytes>,
    opts: &Options,
) -> Result<Response> {
    let timeout = opts.timeout.unwrap_or(Duration::from_secs(30));
    tokio::time::timeout(timeout, send_inner(method.clone(), url, body, opts))
        .await
        .map_err(|_| anyhow!("{method} {url}: no answer within {timeout:?}"))?
        .with_context(|| format!("{method} {url}"))
}

async fn send_inner(
    method: Method,
    url: &str,
    body: Option<Bytes>,
    opts: &Options,
) -> Result<Response> {
    let uri: Uri = url.parse().with_context(|| format!("bad URL {url:?}"))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => bail!("URL must start with http:// or https://"),
    };
    let host = uri
        .host()
        .ok_or_else(|| anyhow!("URL has no host"))?
        .to_owned();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let host_for_connect = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let tcp = TcpStream::connect((host_for_connect.as_str(), port))
        .await
        .with_context(|| format!("connecting to {host}:{port}"))?;
    tcp.set_nodelay(true)?;
    let path = uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_owned();
    let mut req = Request::builder().method(method).uri(path).header(
        http::header::HOST,
        uri.authority().map(|a| a.as_str()).unwrap_or(&host),
    );
    for (k, v) in &opts.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let has_body = body.is_some();
    if has_body {
        req = req.header(http::header::CONTENT_TYPE, "application/json");
    }
    let req = req.body(Full::new(body.unwrap_or_default()))?;
    if https {
        let tls = opts
            .tls
            .clone()
            .ok_or_else(|| anyhow!("https URL but no TLS trust configured"))?;
        let name = ServerName::try_from(host_for_connect.clone())
            .map_err(|e| anyhow!("bad TLS server name {host_for_connect:?}: {e}"))?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await
            .context("TLS handshake")?;
        exchange(TokioIo::new(stream), req).await
    } else {
        exchange(TokioIo::new(tcp), req).await
    }
}

async fn exchange<IO>(io: IO, req: Request<Full<Bytes>>) -> Result<Response>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
    let driver = tokio::spawn(conn);
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    driver.abort();
    Ok(Response { status, body })
}

/// A client configuration that trusts the roots in `ca` (PEM), or the system bundle when
/// `ca` is None, or anything at all when `insecure` (recorded by the caller).
pub fn trust_config(ca: Option<&std::path::Path>, insecure: bool) -> Result<Arc<ClientConfig>> {
    let provider = proxy::crypto::Provider::new(
        proxy::crypto::ProviderName::AwsLcRs,
        &[
            proxy::crypto::KxGroupName::X25519,
            proxy::crypto::KxGroupName::Secp256r1,
        ],
    )?;
    crate::client::tls::client_config(&crate::client::tls::TlsOptions {
        provider,
        ca: ca.map(|p| p.to_owned()),
        insecure,
        versions: vec![],
        resumption: true,
        alpn: vec![b"http/1.1".to_vec()],
    })
}
