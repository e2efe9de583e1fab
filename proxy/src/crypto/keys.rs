//! Certificates and private keys: loading from PEM, telling what algorithm they use, and
//! proving that the key belongs to the certificate and that the provider can sign with it.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, SignatureScheme};
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::public_key::PublicKey;

use super::{CryptoError, Provider};

/// The public-key algorithm of a server certificate, as reports and metrics name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CertAlgorithm {
    /// RSA with the given modulus size in bits.
    Rsa(u32),
    /// ECDSA on NIST P-256.
    EcdsaP256,
    /// ECDSA on NIST P-384.
    EcdsaP384,
    /// ECDSA on NIST P-521.
    EcdsaP521,
    /// Ed25519.
    Ed25519,
    /// Anything else (still usable if the provider accepts the key).
    Other,
}

impl CertAlgorithm {
    /// The label used in metrics and reports: rsa2048, rsa4096, ecdsa-p256, ecdsa-p384, ...
    pub fn label(self) -> &'static str {
        match self {
            Self::Rsa(2048) => "rsa2048",
            Self::Rsa(3072) => "rsa3072",
            Self::Rsa(4096) => "rsa4096",
            Self::Rsa(8192) => "rsa8192",
            Self::Rsa(_) => "rsa-other",
            Self::EcdsaP256 => "ecdsa-p256",
            Self::EcdsaP384 => "ecdsa-p384",
            Self::EcdsaP521 => "ecdsa-p521",
            Self::Ed25519 => "ed25519",
            Self::Other => "other",
        }
    }

    /// Key size in bits.
    pub fn key_bits(self) -> u32 {
        match self {
            Self::Rsa(bits) => bits,
            Self::EcdsaP256 | Self::Ed25519 => 256,
            Self::EcdsaP384 => 384,
            Self::EcdsaP521 => 521,
            Self::Other => 0,
        }
    }
}

impl fmt::Display for CertAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rsa(bits) => write!(f, "RSA {bits}-bit"),
            Self::EcdsaP256 => f.write_str("ECDSA P-256"),
            Self::EcdsaP384 => f.write_str("ECDSA P-384"),
            Self::EcdsaP521 => f.write_str("ECDSA P-521"),
            Self::Ed25519 => f.write_str("Ed25519"),
            Self::Other => f.write_str("unknown algorithm"),
        }
    }
}

/// A certificate chain and its key, loaded through one provider and checked.
#[derive(Clone, Debug)]
pub struct LoadedCert {
    /// What rustls serves.
    pub certified: Arc<CertifiedKey>,
    /// The end-entity certificate's key algorithm.
    pub algorithm: CertAlgorithm,
    /// The subject of the end-entity certificate, for logs.
    pub subject: String,
    /// The end-entity certificate's notAfter, in seconds since the Unix epoch.
    pub not_after: i64,
}

impl LoadedCert {
    /// A warning when the certificate has expired or expires within 14 days, for the log at
    /// start-up and on every reload or switch (the proxy still serves it, as clients decide).
    pub fn expiry_warning(&self) -> Option<String> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let left = self.not_after - now;
        if left <= 0 {
            Some(format!(
                "certificate {} expired {} days ago",
                self.subject,
                -left / 86_400
            ))
        } else if left < 14 * 86_400 {
            Some(format!(
                "certificate {} expires in {} days",
                self.subject,
                left / 86_400
            ))
        } else {
            None
        }
    }
}

/// Loads `cert_path` (PEM chain, end-entity first) and `key_path` (PKCS#8, PKCS#1 or SEC1
/// PEM) with `provider`, and proves they belong together by signing a probe message with the
/// provider and verifying it against the certificate's public key.
///
/// The probe signature is deliberate: it is the first thing a misconfigured provider (or a
/// hardware provider that is not really active) gets wrong, and it fails here, at start-up,
/// with the file names in the message, instead of in the first client's handshake.
pub fn load_certified_key(
    provider: &Provider,
    cert_path: &Path,
    key_path: &Path,
) -> Result<LoadedCert, CryptoError> {
    let chain = load_cert_chain(cert_path, "certificate")?;
    let key = load_private_key(key_path)?;
    let (algorithm, subject, not_after) =
        describe(&chain[0]).map_err(|reason| CryptoError::BadPem {
            what: "certificate",
            path: cert_path.to_owned(),
            reason,
        })?;
    let signing_key = provider
        .crypto()
        .key_provider
        .load_private_key(key)
        .map_err(|e| CryptoError::UnsupportedKey {
            path: key_path.to_owned(),
            provider: provider.name().as_str(),
            reason: e.to_string(),
        })?;
    let certified = CertifiedKey::new(chain, signing_key);
    let mismatch = |reason: String| CryptoError::KeyMismatch {
        cert: cert_path.to_owned(),
        key: key_path.to_owned(),
        reason,
    };
    match certified.keys_match() {
        Ok(()) => {}
        // The provider cannot export the public key: the probe signature below decides.
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(e) => return Err(mismatch(e.to_string())),
    }
    probe_signature(provider, &certified).map_err(|e| match e {
        Probe::Sign(reason) => CryptoError::SigningFailed {
            key: key_path.to_owned(),
            provider: provider.name().as_str(),
            reason,
        },
        Probe::Verify(reason) => mismatch(reason),
    })?;
    Ok(LoadedCert {
        certified: Arc::new(certified),
        algorithm,
        subject,
        not_after,
    })
}

/// How the probe signature failed: the provider could not sign (its failure), or the
/// signature does not verify with the certificate (the key is not the certificate's).
enum Probe {
    Sign(String),
    Verify(String),
}

/// Signs a fixed message with the key through the provider, then verifies the signature
/// with the certificate's public key, using only TLS 1.3 schemes (what a handshake uses).
fn probe_signature(provider: &Provider, certified: &CertifiedKey) -> Result<(), Probe> {
    const PROBE: &[u8] = b"tls-proxy start-up probe: the key must sign for its certificate";
    const TLS13_SCHEMES: &[SignatureScheme] = &[
        SignatureScheme::ECDSA_NISTP256_SHA256,
        SignatureScheme::ECDSA_NISTP384_SHA384,
        SignatureScheme::ECDSA_NISTP521_SHA512,
        SignatureScheme::ED25519,
        SignatureScheme::RSA_PSS_SHA256,
        SignatureScheme::RSA_PSS_SHA384,
        SignatureScheme::RSA_PSS_SHA512,
    ];
    let signer = certified
        .key
        .choose_scheme(TLS13_SCHEMES)
        .ok_or_else(|| Probe::Verify("the key offers no TLS 1.3 signature scheme".to_owned()))?;
    let scheme = signer.scheme();
    let signature = signer.sign(PROBE).map_err(|e| Probe::Sign(e.to_string()))?;
    let end_entity = webpki::EndEntityCert::try_from(
        certified
            .end_entity_cert()
            .map_err(|e| Probe::Verify(e.to_string()))?,
    )
    .map_err(|e| Probe::Verify(format!("the certificate cannot be parsed: {e}")))?;
    let algorithms = provider
        .crypto()
        .signature_verification_algorithms
        .mapping
        .iter()
        .filter(|(s, _)| *s == scheme)
        .flat_map(|(_, algs)| algs.iter());
    let mut last_error = String::from("the provider cannot verify this scheme");
    for alg in algorithms {
        match end_entity.verify_signature(*alg, PROBE, &signature) {
            Ok(()) => return Ok(()),
            Err(e) => last_error = e.to_string(),
        }
    }
    Err(Probe::Verify(format!(
        "a {scheme:?} signature by the key does not verify with the certificate ({last_error})"
    )))
}

/// Reads a PEM file of certificates (at least one).
pub(crate) fn load_cert_chain(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, CryptoError> {
    let bytes = std::fs::read(path).map_err(|source| CryptoError::Read {
        what,
        path: path.to_owned(),
        source,
    })?;
    let chain = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CryptoError::BadPem {
            what,
            path: path.to_owned(),
            reason: format!("invalid PEM: {e}"),
        })?;
    if chain.is_empty() {
        return Err(CryptoError::BadPem {
            what,
            path: path.to_owned(),
            reason: "no CERTIFICATE block found".to_owned(),
        });
    }
    Ok(chain)
}

/// Reads a PEM private key (PKCS#8, PKCS#1 or SEC1).
pub(crate) fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, CryptoError> {
    let bytes = std::fs::read(path).map_err(|source| CryptoError::Read {
        what: "private key",
        path: path.to_owned(),
        source,
    })?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| CryptoError::BadPem {
        what: "private key",
        path: path.to_owned(),
        reason: format!("no PKCS#8, PKCS#1 (RSA) or SEC1 (EC) private key found ({e})"),
    })
}

/// Loads the CA certificates that client certificates must chain to (mTLS).
pub fn load_client_ca(path: &Path) -> Result<RootCertStore, CryptoError> {
    load_roots(path, "client CA")
}

/// Every certificate of a PEM file as a trust anchor (`what` names the file in errors).
pub fn load_roots(path: &Path, what: &'static str) -> Result<RootCertStore, CryptoError> {
    let certs = load_cert_chain(path, what)?;
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| CryptoError::BadPem {
            what,
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    }
    Ok(roots)
}

fn describe(cert: &CertificateDer<'_>) -> Result<(CertAlgorithm, String, i64), String> {
    use x509_parser::oid_registry::{OID_EC_P256, OID_NIST_EC_P384, OID_NIST_EC_P521};
    let (_, parsed) =
        X509Certificate::from_der(cert.as_ref()).map_err(|e| format!("not X.509 DER: {e}"))?;
    let spki = parsed.public_key();
    let algorithm = match spki.parsed() {
        Ok(PublicKey::RSA(rsa)) => CertAlgorithm::Rsa(rsa.key_size() as u32),
        Ok(PublicKey::EC(_)) => {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok());
            match curve {
                Some(oid) if oid == OID_EC_P256 => CertAlgorithm::EcdsaP256,
                Some(oid) if oid == OID_NIST_EC_P384 => CertAlgorithm::EcdsaP384,
                Some(oid) if oid == OID_NIST_EC_P521 => CertAlgorithm::EcdsaP521,
                _ => CertAlgorithm::Other,
            }
        }
        Ok(PublicKey::Unknown(_)) if spki.algorithm.algorithm.to_id_string() == "1.3.101.112" => {
            CertAlgorithm::Ed25519
        }
        _ => CertAlgorithm::Other,
    };
    Ok((
        algorithm,
        parsed.subject().to_string(),
        parsed.validity().not_after.timestamp(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::{generate_cert_set, CertAlgorithmName, KxGroupName, ProviderName};

    #[test]
    fn expiry_is_read_from_the_certificate_and_warned_about_near_the_end() {
        let dir = std::env::temp_dir().join(format!("keys-expiry-{}", std::process::id()));
        let set = generate_cert_set(&dir, &[CertAlgorithmName::EcdsaP256], &[]).unwrap();
        let (_, cert, key) = &set.servers[0];
        let provider = Provider::new(ProviderName::AwsLcRs, &[KxGroupName::X25519]).unwrap();
        let loaded = load_certified_key(&provider, cert, key).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        // Generated leaves live 90 days: far from the 14-day warning window.
        assert!(loaded.not_after > now + 80 * 86_400, "{}", loaded.not_after);
        assert_eq!(loaded.expiry_warning(), None);
        let soon = LoadedCert {
            not_after: now + 3 * 86_400 + 3600,
            ..loaded.clone()
        };
        let w = soon.expiry_warning().unwrap();
        assert!(w.ends_with("expires in 3 days"), "{w}");
        let gone = LoadedCert {
            not_after: now - 2 * 86_400 - 3600,
            ..loaded
        };
        let w = gone.expiry_warning().unwrap();
        assert!(w.ends_with("expired 2 days ago"), "{w}");
        std::fs::remove_dir_all(dir).ok();
    }
}
