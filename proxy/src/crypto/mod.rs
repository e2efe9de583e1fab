//! Crypto: which provider performs the TLS cryptography, and the key material it signs with.
//!
//! This module owns the provider registry (ring, aws-lc-rs, OpenSSL, OpenSSL + QAT), the
//! loading and checking of certificates and private keys, and test-certificate generation.
//! It knows nothing of HTTP, listeners or sockets: everything provider-specific stays here,
//! so the rest of the proxy only ever sees a [`rustls::crypto::CryptoProvider`].

mod certgen;
mod keys;
mod openssl_hkdf;
mod openssl_ticketer;
mod provider;
pub mod qat;

pub use certgen::{
    generate_cert_set, generate_cert_set_valid_for, CertAlgorithmName, GeneratedSet,
    LEAF_VALIDITY_DAYS, MAX_LEAF_VALIDITY_DAYS,
};
pub(crate) use keys::{load_cert_chain, load_private_key};
pub use keys::{load_certified_key, load_client_ca, load_roots, CertAlgorithm, LoadedCert};
pub(crate) use provider::suite_rank;
pub use provider::{KxGroupName, Provider, ProviderName};

use std::path::PathBuf;

/// Everything that can go wrong while choosing a provider or loading key material.
///
/// Every message names the file, setting or provider the operator has to fix.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum CryptoError {
    /// The provider name is not one we know.
    #[error(
        "unknown crypto provider {name:?}; expected one of: ring, aws-lc-rs, openssl, openssl-qat"
    )]
    UnknownProvider {
        /// What was asked for.
        name: String,
    },
    /// The provider is known but cannot be used on this build or machine.
    #[error("crypto provider {name} is not available: {reason}")]
    ProviderUnavailable {
        /// Provider name.
        name: &'static str,
        /// Why it cannot be used.
        reason: String,
    },
    /// A key-exchange group name that we do not know.
    #[error("unknown key-exchange group {name:?}; expected one of: x25519, secp256r1, secp384r1, x25519mlkem768")]
    UnknownKxGroup {
        /// What was asked for.
        name: String,
    },
    /// The provider does not implement a requested key-exchange group.
    #[error("crypto provider {provider} does not support key-exchange group {group}")]
    KxGroupUnsupported {
        /// Provider name.
        provider: &'static str,
        /// Group name.
        group: &'static str,
    },
    /// A file could not be read.
    #[error("cannot read {what} file {}: {source}", path.display())]
    Read {
        /// Which kind of file ("certificate", "private key", "client CA").
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file was read but holds nothing usable of the expected kind.
    #[error("{what} file {} is not usable: {reason}", path.display())]
    BadPem {
        /// Which kind of file.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The provider refused the private key.
    #[error("private key {} cannot be used with provider {provider}: {reason}", path.display())]
    UnsupportedKey {
        /// The key path.
        path: PathBuf,
        /// Provider name.
        provider: &'static str,
        /// The provider's reason.
        reason: String,
    },
    /// The private key does not belong to the certificate.
    #[error("private key {} does not match certificate {}: {reason}", key.display(), cert.display())]
    KeyMismatch {
        /// Certificate path.
        cert: PathBuf,
        /// Key path.
        key: PathBuf,
        /// How the mismatch was detected.
        reason: String,
    },
    /// The provider could not sign with the key: the provider's failure, not the key's.
    #[error("signing with private key {} through provider {provider} failed: {reason}", key.display())]
    SigningFailed {
        /// Key path.
        key: PathBuf,
        /// The provider.
        provider: &'static str,
        /// What the provider reported.
        reason: String,
    },
    /// Certificate generation failed.
    #[error("certificate generation failed: {0}")]
    Generate(String),
    /// Writing generated files failed.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// rustls rejected a configuration built from valid parts.
    #[error("TLS configuration rejected: {0}")]
    Rustls(#[from] rustls::Error),
    /// The QAT provider is not active, or failed the listener's signing proof (named as the
    /// provider's failure, never as a key/certificate mismatch).
    #[error("openssl-qat: {0}")]
    Qat(#[from] crate::crypto::qat::QatError),
}
