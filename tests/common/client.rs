//! The tests' TLS client: rustls on the same provider registry as the proxy, trusting
//! the generated CA, and one-request helpers over HTTP/1.1 or HTTP/2.

#[allow(unused_imports)]
use super::*;

/// Options for a test client.
#[derive(Clone, Debug)]
pub struct ClientOpts {
    pub provider: ProviderName,
    pub tls13: bool,
    pub tls12: bool,
    pub alpn: Vec<Vec<u8>>,
    pub resumption: bool,
    pub client_cert: bool,
}

impl Default for ClientOpts {
    fn default() -> Self {
        Self {
            provider: ProviderName::AwsLcRs,
            tls13: true,
            tls12: true,
            alpn: vec![b"http/1.1".to_vec()],
            resumption: false,
            client_cert: false,
        }
    }
}

/// A rustls client config that trusts the generated CA, built by the project's one client
/// builder (`proxy::tls::client::ClientTls`).
pub fn client_config(opts: &ClientOpts) -> Arc<ClientConfig> {
    use proxy::config::TlsVersion;
    use proxy::tls::client::ClientTls;
    let versions = [
        (opts.tls13, TlsVersion::Tls13),
        (opts.tls12, TlsVersion::Tls12),
    ]
    .into_iter()
    .filter_map(|(on, v)| on.then_some(v))
    .collect();
    ClientTls {
        provider: opts.provider,
        versions,
        alpn: opts.alpn.clone(),
        resumption: opts.resumption,
        client_auth: opts.client_cert.then(|| certs().client.clone()),
        ..ClientTls::trusting(&certs().ca_cert)
    }
    .build()
    .expect("test client configuration")
}

/// Opens a TLS connection to `addr`, verifying the name "localhost".
pub async fn tls_connect(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").expect("server name"), tcp)
        .await
}

/// A response as the test sees it.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
    /// The trailers, if the answer had any (gRPC answers that are not trailers-only).
    pub trailers: Option<http::HeaderMap>,
    pub tls_version: Option<rustls::ProtocolVersion>,
    pub resumed: bool,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// One request on a new TLS connection: HTTP/2 when the connection negotiated h2,
/// HTTP/1.1 otherwise.
pub async fn request(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<Answer, Box<dyn std::error::Error + Send + Sync>> {
    request_with_body(addr, config, method, path, headers, Full::new(body)).await
}

/// `request` with any body: one of unknown length goes chunked over HTTP/1.1 and without
/// content-length over HTTP/2.
pub async fn request_with_body<B>(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: B,
) -> Result<Answer, Box<dyn std::error::Error + Send + Sync>>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tls = tls_connect(addr, config).await?;
    let (_, conn) = tls.get_ref();
    let tls_version = conn.protocol_version();
    let resumed = matches!(conn.handshake_kind(), Some(rustls::HandshakeKind::Resumed));
    let h2 = conn.alpn_protocol() == Some(b"h2");
    let mut builder = Request::builder()
        .method(method)
        .uri(format!("https://localhost:{}{path}", addr.port()));
    if !h2 {
        builder = builder.header("host", format!("localhost:{}", addr.port()));
    }
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let req = builder.body(body)?;
    let io = TokioIo::new(tls);
    let resp = if h2 {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
        tokio::spawn(conn);
        sender.send_request(req).await?
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(conn);
        sender.send_request(req).await?
    };
    let (parts, body) = resp.into_parts();
    let collected = body.collect().await?;
    let trailers = collected.trailers().cloned();
    Ok(Answer {
        status: parts.status,
        headers: parts.headers,
        body: collected.to_bytes(),
        trailers,
        tls_version,
        resumed,
    })
}

/// A GET on a new connection with the default client (TLS 1.3 or 1.2, h2 or HTTP/1.1 by
/// ALPN, no resumption), bounded in time.
pub async fn get(addr: SocketAddr, path: &str) -> Result<Answer, String> {
    request_bounded(
        addr,
        client_config(&ClientOpts::default()),
        "GET",
        path,
        &[],
        Bytes::new(),
    )
    .await
}

/// `request` with a time bound.
pub async fn request_bounded(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<Answer, String> {
    match tokio::time::timeout(WAIT, request(addr, config, method, path, headers, body)).await {
        Ok(Ok(a)) => Ok(a),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {WAIT:?}")),
    }
}

/// A tonic channel to a TLS listener at `addr` (server name "localhost", h2 by ALPN),
/// connecting on first use and again after a broken connection.
pub fn grpc_channel(addr: SocketAddr) -> tonic::transport::Channel {
    let cfg = client_config(&ClientOpts {
        alpn: vec![b"h2".to_vec()],
        ..ClientOpts::default()
    });
    tonic::transport::Endpoint::from_shared(format!("http://localhost:{}", addr.port()))
        .expect("endpoint")
        .connect_timeout(WAIT)
        .timeout(WAIT)
        .connect_with_connector_lazy(tower::service_fn(move |_uri| {
            let cfg = cfg.clone();
            async move { tls_connect(addr, cfg).await.map(TokioIo::new) }
        }))
}
