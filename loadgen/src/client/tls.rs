//! What loadgen's TLS clients trust (`--ca`, the platform's store, `--insecure`); the
//! configuration itself comes from the project's one client builder,
//! `proxy::tls::client::ClientTls`, on the same provider registry the proxy uses, so the
//! client side of a comparison is held constant and named.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use proxy::crypto::{KxGroupName, Provider, ProviderName};
use proxy::tls::client::Trust;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// What loadgen's clients trust: the roots in `ca` (PEM), else the platform's trust store
/// (on Linux the system bundle wherever the distribution keeps it, through rustls' platform
/// verifier), or any certificate at all when `insecure` (recorded by the caller); the
/// handshake signature is checked in every case, with `provider`'s algorithms.
pub fn trust(provider: ProviderName, ca: Option<&Path>, insecure: bool) -> Result<Trust> {
    let crypto = || -> Result<Arc<rustls::crypto::CryptoProvider>> {
        Ok(Provider::new(provider, &[KxGroupName::X25519])?
            .crypto()
            .clone())
    };
    Ok(if insecure {
        Trust::Verifier(Arc::new(NoVerification(crypto()?)))
    } else if let Some(path) = ca {
        Trust::CaFiles(vec![path.to_owned()])
    } else {
        Trust::Verifier(Arc::new(
            rustls_platform_verifier::Verifier::new(crypto()?)
                .context("the platform's certificate verifier")?,
        ))
    })
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
