//! TLS to `https://` upstream nodes: the client configurations a listener's
//! `upstream_tls` asks for, the handshake on a fresh connection, and the stream that is
//! either plaintext or TLS so that one connector and one client serve both kinds of node.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::UpstreamTlsConfig;
use crate::crypto::{CryptoError, KxGroupName, ProviderName};
use crate::tls::client::{ClientTls, Trust};

/// The provider of every upstream connection, whatever the listener's: the client side
/// only verifies (no private-key operation to offload), and aws-lc-rs is the fastest at
/// that and offers the post-quantum group.
const CLIENT_PROVIDER: ProviderName = ProviderName::AwsLcRs;

/// The TLS side of one upstream client: a configuration (its ALPN fixed to the client's
/// protocol) and the server name, when one is configured for every node.
#[derive(Clone)]
pub struct UpstreamTls {
    connector: TlsConnector,
    server_name: Option<ServerName<'static>>,
}

/// A listener's upstream TLS, one per upstream protocol (ALPN differs).
#[derive(Clone)]
pub struct UpstreamTlsPair {
    /// Offers ALPN `http/1.1`.
    pub http1: UpstreamTls,
    /// Offers ALPN `h2`.
    pub h2: UpstreamTls,
}

impl UpstreamTlsPair {
    /// The configurations for `config`. Reads the CA, certificate and key files.
    pub fn new(config: &UpstreamTlsConfig) -> Result<Self, CryptoError> {
        let trust = match &config.ca {
            Some(ca) => Trust::CaFiles(vec![ca.clone()]),
            None => {
                let provider = crate::crypto::Provider::with_default_groups(CLIENT_PROVIDER)?;
                Trust::Verifier(Arc::new(rustls_platform_verifier::Verifier::new(
                    provider.crypto().clone(),
                )?))
            }
        };
        let server_name = config
            .server_name
            .as_deref()
            .map(|n| ServerName::try_from(n.to_owned()))
            .transpose()
            .map_err(|e| {
                CryptoError::Rustls(rustls::Error::General(format!(
                    "upstream_tls.server_name: {e}"
                )))
            })?;
        let client = |alpn: &[u8]| -> Result<UpstreamTls, CryptoError> {
            let tls = ClientTls {
                provider: CLIENT_PROVIDER,
                kx_groups: KxGroupName::PRODUCTION_DEFAULT.to_vec(),
                trust: trust.clone(),
                alpn: vec![alpn.to_vec()],
                resumption: true,
                client_auth: config.cert.clone().zip(config.key.clone()),
                ..ClientTls::default()
            };
            Ok(UpstreamTls {
                connector: TlsConnector::from(tls.build()?),
                server_name: server_name.clone(),
            })
        };
        Ok(Self {
            http1: client(b"http/1.1")?,
            h2: client(b"h2")?,
        })
    }
}

impl UpstreamTls {
    /// Handshakes over `tcp` with the node whose URI host is `host`.
    pub async fn connect(&self, host: &str, tcp: TcpStream) -> io::Result<UpstreamStream> {
        let name = match &self.server_name {
            Some(name) => name.clone(),
            None => ServerName::try_from(unbracket(host).to_owned()).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{host:?} cannot be verified as a TLS server name ({e}); set upstream_tls.server_name"),
                )
            })?,
        };
        let tls = self.connector.connect(name, tcp).await?;
        Ok(UpstreamStream::Tls(Box::new(tls)))
    }
}

/// An IPv6 host as URIs write it (`[::1]`), as an address.
fn unbracket(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// An upstream connection: plaintext, or TLS to an `https://` node (boxed: a TLS stream
/// is over a kilobyte, and the plaintext path should not carry that).
pub enum UpstreamStream {
    /// `http://` nodes.
    Plain(TcpStream),
    /// `https://` nodes.
    Tls(Box<TlsStream<TcpStream>>),
}

impl UpstreamStream {
    /// The socket under it.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(s) => s,
            Self::Tls(s) => s.get_ref().0,
        }
    }

    /// The protocol the node chose by ALPN (`None` in plaintext).
    pub fn alpn(&self) -> Option<&[u8]> {
        match self {
            Self::Plain(_) => None,
            Self::Tls(s) => s.get_ref().1.alpn_protocol(),
        }
    }
}

impl AsyncRead for UpstreamStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, data),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, data),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(s) => s.is_write_vectored(),
            Self::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
