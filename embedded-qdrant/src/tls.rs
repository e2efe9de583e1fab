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

/// The REST port's TLS: the certificate chain and key (PEM) with ring, TLS 1.2 and 1.3,
/// ALPN h2 then http/1.1. It also makes ring the process's default provider, which
/// tonic's own TLS for the gRPC port builds on.
pub fn rest_acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    // Only the first caller installs it; a second call finds it in place.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let chain = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("--tls-cert {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("--tls-cert {}", cert.display()))?;
    if chain.is_empty() {
        anyhow::bail!("--tls-cert {}: no certificate in it", cert.display());
    }
    let key_der = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("--tls-key {}", key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .context("--tls-cert and --tls-key do not form a pair")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// The gRPC port's TLS, through tonic (as Qdrant's gRPC server configures it).
pub fn grpc_config(cert: &Path, key: &Path) -> Result<tonic::transport::ServerTlsConfig> {
    let cert_pem = std::fs::read(cert).with_context(|| format!("--tls-cert {}", cert.display()))?;
    let key_pem = std::fs::read(key).with_context(|| format!("--tls-key {}", key.display()))?;
    Ok(tonic::transport::ServerTlsConfig::new()
        .identity(tonic::transport::Identity::from_pem(cert_pem, key_pem)))
}
