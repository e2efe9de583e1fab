//! The workload's TLS client: a rustls `ClientConfig` from the same provider registry the
//! proxy uses, so the client side of a comparison is held constant and named.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use proxy::crypto::Provider;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme, SupportedProtocolVersion};

pub struct TlsOptions {
    pub provider: Provider,
    /// PEM roots; None means the platform's trust store.
    pub ca: Option<PathBuf>,
    /// Skip certificate verification (the result records it).
    pub insecure: bool,
    /// Empty means TLS 1.3 and 1.2.
    pub versions: Vec<&'static SupportedProtocolVersion>,
    pub resumption: bool,
    pub alpn: Vec<Vec<u8>>,
}

pub fn client_config(opts: &TlsOptions) -> Result<Arc<ClientConfig>> {
    let versions: Vec<&'static SupportedProtocolVersion> = if opts.versions.is_empty() {
        vec![&rustls::version::TLS13, &rustls::version::TLS12]
    } else {
        opts.versions.clone()
    };
    let builder = ClientConfig::builder_with_provider(opts.provider.crypto().clone())
        .with_protocol_versions(&versions)
        .context("TLS versions not supported by the client provider")?;
    let mut config = if opts.insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(
                opts.provider.crypto().clone(),
            )))
            .with_no_client_auth()
    } else if let Some(path) = &opts.ca {
        let mut roots = rustls::RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(path)
            .with_context(|| format!("reading CA file {} (--ca)", path.display()))?;
        for cert in certs {
            let cert = cert.with_context(|| format!("bad PEM in CA file {}", path.display()))?;
            roots
                .add(cert)
                .with_context(|| format!("unusable CA certificate in {}", path.display()))?;
        }
        if roots.is_empty() {
            bail!(
                "CA file {} holds no usable certificate (--ca)",
                path.display()
            );
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        // The platform's trust store (on Linux: the system bundle wherever the distribution
        // keeps it), through rustls' platform verifier with our provider.
        use rustls_platform_verifier::BuilderVerifierExt;
        builder
            .with_platform_verifier()
            .context("the platform's certificate verifier")?
            .with_no_client_auth()
    };
    config.alpn_protocols = opts.alpn.clone();
    if !opts.resumption {
        config.resumption = rustls::client::Resumption::disabled();
    }
    Ok(Arc::new(config))
}

/// `--insecure`: accepts any certificate but still checks the handshake signatures, so the
/// server does the same asymmetric work as with verification on.
#[derive(Debug)]
struct NoVerification(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
