//! HTTP(S) for everything that is not the measured workload: the proxy's /metrics and admin
//! API, the embeddings endpoint, Redfish, Prometheus, the collection set-up.
//!
//! reqwest, with its TLS configuration built by us: the provider from the proxy's registry
//! (aws-lc-rs) and either the roots given (`--ca` and friends) or the platform's (rustls'
//! platform verifier: the system's trust store wherever it lives). One client per
//! [`Options`], built on first use and reused, so a probe polling every second keeps its
//! connection.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http::Method;
use proxy::error_chain;
use rustls::ClientConfig;

/// A response, read whole.
pub struct Response {
    /// The HTTP status.
    pub status: u16,
    /// The body.
    pub body: Bytes,
}

impl Response {
    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Request options beyond method, URL and body.
#[derive(Clone, Default)]
pub struct Options {
    /// TLS configuration for https URLs; without one, the platform's roots are trusted.
    pub tls: Option<Arc<ClientConfig>>,
    /// Extra headers, e.g. authorization.
    pub headers: Vec<(String, String)>,
    /// Limit on the whole exchange; none: the client's default.
    pub timeout: Option<Duration>,
    /// The client these options build, shared by their clones.
    pub(crate) client: Arc<OnceLock<reqwest::Client>>,
}

impl Options {
    fn client(&self) -> Result<&reqwest::Client> {
        if let Some(c) = self.client.get() {
            return Ok(c);
        }
        let tls = match &self.tls {
            Some(tls) => (**tls).clone(),
            None => (*trust_config(None, false)?).clone(),
        };
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            // These are control-plane calls to named services: no proxy from the environment
            // should reroute a Redfish or admin request.
            .no_proxy()
            .build()
            .context("building the HTTP client")?;
        Ok(self.client.get_or_init(|| client))
    }
}

/// Sends one request and reads the whole answer.
pub async fn send(
    method: Method,
    url: &str,
    body: Option<Bytes>,
    opts: &Options,
) -> Result<Response> {
    let timeout = opts.timeout.unwrap_or(Duration::from_secs(30));
    match url.split_once("://").map(|(scheme, _)| scheme) {
        Some("http" | "https") => {}
        _ => bail!("{method} {url}: URL must start with http:// or https://"),
    }
    let mut req = opts.client()?.request(method.clone(), url).timeout(timeout);
    for (k, v) in &opts.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    if let Some(body) = body {
        req = req
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body);
    }
    let answer = async {
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let body = resp.bytes().await?;
        Ok::<_, reqwest::Error>(Response { status, body })
    }
    .await;
    answer.map_err(|e| {
        if e.is_timeout() {
            anyhow!("{method} {url}: no answer within {timeout:?}")
        } else {
            anyhow!("{method} {url}: {}", error_chain(&e))
        }
    })
}

/// A client configuration that trusts the roots in `ca` (PEM), or the platform's when
/// `ca` is None, or anything at all when `insecure` (recorded by the caller).
pub fn trust_config(ca: Option<&std::path::Path>, insecure: bool) -> Result<Arc<ClientConfig>> {
    let provider = proxy::crypto::ProviderName::AwsLcRs;
    Ok(proxy::tls::client::ClientTls {
        provider,
        kx_groups: vec![
            proxy::crypto::KxGroupName::X25519,
            proxy::crypto::KxGroupName::Secp256r1,
        ],
        trust: crate::client::tls::trust(provider, ca, insecure)?,
        resumption: true,
        alpn: vec![b"http/1.1".to_vec()],
        ..Default::default()
    }
    .build()?)
}
