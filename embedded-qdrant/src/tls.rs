//! In-process TLS, as Qdrant serves it with `service.enable_tls`: rustls with the ring
//! provider terminating both ports inside the server (REST with ALPN h2 and http/1.1, gRPC
//! with h2), so a benchmark can put "the database terminates TLS itself" beside "a proxy
//! terminates TLS in front of a plaintext database".

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// How long a client may take to finish its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Both ports' TLS, from one certificate chain and key.
pub struct InProcessTls {
    /// The REST port's acceptor: TLS 1.2 and 1.3, ALPN h2 then http/1.1.
    pub rest: tokio_rustls::TlsAcceptor,
    /// The gRPC port's configuration, through tonic (as Qdrant's gRPC server sets it up).
    pub grpc: tonic::transport::ServerTlsConfig,
}

/// Reads the chain and key (PEM) once, checks that they form a pair, and builds both ports'
/// TLS with ring. ring also becomes the process's default provider: tonic builds its
/// server configuration from the default.
pub fn load(cert: &Path, key: &Path) -> Result<InProcessTls> {
    let cert_pem = std::fs::read(cert).with_context(|| format!("--tls-cert {}", cert.display()))?;
    let key_pem = std::fs::read(key).with_context(|| format!("--tls-key {}", key.display()))?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("--tls-cert {}", cert.display()))?;
    if chain.is_empty() {
        anyhow::bail!("--tls-cert {}: no certificate in it", cert.display());
    }
    let key_der = PrivateKeyDer::from_pem_slice(&key_pem)
        .with_context(|| format!("--tls-key {}", key.display()))?;

    // Only the first call in a process installs it; embedded-qdrant makes one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(chain, key_der)
    .context("--tls-cert and --tls-key do not form a pair")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(InProcessTls {
        rest: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        grpc: tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(cert_pem, key_pem)),
    })
}
