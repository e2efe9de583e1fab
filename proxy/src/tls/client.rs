//! The client side of a handshake with a TLS terminator: one builder for every client the
//! project makes (loadgen's workload and bench clients, the end-to-end tests, the examples,
//! the benches), so each states the same things the same way: the provider and its
//! key-exchange groups, the versions, what it trusts, ALPN, resumption, a client
//! certificate, and the cipher order it offers. The proxy itself never connects over TLS.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::ServerCertVerifier;
use rustls::client::Resumption;
use rustls::version::{TLS12, TLS13};
use rustls::{ClientConfig, RootCertStore, SupportedProtocolVersion};

use super::TlsVersion;
use crate::crypto::{
    load_cert_chain, load_private_key, load_roots, CryptoError, KxGroupName, Provider, ProviderName,
};

/// What the client accepts as the server's certificate.
#[derive(Clone, Debug)]
pub enum Trust {
    /// Certificates chaining to a CA in one of these PEM files (at least one certificate
    /// in all).
    CaFiles(Vec<PathBuf>),
    /// A verifier of the caller's: the platform's trust store, or one that accepts any
    /// certificate but still checks the handshake signature.
    Verifier(Arc<dyn ServerCertVerifier>),
}

/// Which order the client offers cipher suites in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CipherOrder {
    /// The provider's order as the proxy uses it (AES-128-GCM first). A server that keeps
    /// its own order answers the same either way; this one costs the client least.
    #[default]
    Provider,
    /// AES-256-GCM first, as rustls, Go and OpenSSL clients ship: for measuring a
    /// terminator as real clients meet it (which suite wins is then the server's choice).
    Shipped,
}

/// A client configuration, stated in full. `Default`: aws-lc-rs, X25519, TLS 1.3 and 1.2,
/// no ALPN, no resumption, no client certificate, the provider's cipher order; the trust
/// must be given.
#[derive(Clone, Debug)]
pub struct ClientTls {
    /// The crypto provider.
    pub provider: ProviderName,
    /// Key-exchange groups, in order of preference.
    pub kx_groups: Vec<KxGroupName>,
    /// Versions offered (empty: TLS 1.3 and 1.2).
    pub versions: Vec<TlsVersion>,
    /// What it trusts.
    pub trust: Trust,
    /// ALPN protocols offered.
    pub alpn: Vec<Vec<u8>>,
    /// Whether sessions are resumed (off: every connection is a full handshake).
    pub resumption: bool,
    /// Certificate chain and key presented when the server asks (mTLS).
    pub client_auth: Option<(PathBuf, PathBuf)>,
    /// The order cipher suites are offered in.
    pub cipher_order: CipherOrder,
}

impl Default for ClientTls {
    fn default() -> Self {
        Self {
            provider: ProviderName::AwsLcRs,
            kx_groups: vec![KxGroupName::X25519],
            versions: Vec::new(),
            trust: Trust::CaFiles(Vec::new()),
            alpn: Vec::new(),
            resumption: false,
            client_auth: None,
            cipher_order: CipherOrder::Provider,
        }
    }
}

impl ClientTls {
    /// The defaults, trusting the CA in `ca`.
    pub fn trusting(ca: impl Into<PathBuf>) -> Self {
        Self {
            trust: Trust::CaFiles(vec![ca.into()]),
            ..Self::default()
        }
    }

    /// The rustls configuration.
    pub fn build(&self) -> Result<Arc<ClientConfig>, CryptoError> {
        let provider = Provider::new(self.provider, &self.kx_groups)?;
        let mut crypto = (**provider.crypto()).clone();
        if self.cipher_order == CipherOrder::Shipped {
            crypto
                .cipher_suites
                .sort_by_key(|s| shipped_rank(s.suite()));
        }
        let versions: Vec<&'static SupportedProtocolVersion> = if self.versions.is_empty() {
            vec![&TLS13, &TLS12]
        } else {
            self.versions
                .iter()
                .map(|v| match v {
                    TlsVersion::Tls13 => &TLS13,
                    TlsVersion::Tls12 => &TLS12,
                })
                .collect()
        };
        let builder = ClientConfig::builder_with_provider(Arc::new(crypto))
            .with_protocol_versions(&versions)?;
        let builder = match &self.trust {
            Trust::CaFiles(files) => {
                let mut roots = RootCertStore::empty();
                for file in files {
                    roots.roots.extend(load_roots(file, "CA")?.roots);
                }
                if roots.is_empty() {
                    return Err(CryptoError::BadPem {
                        what: "CA",
                        path: files.first().cloned().unwrap_or_default(),
                        reason: "no CA certificate to trust".to_owned(),
                    });
                }
                builder.with_root_certificates(roots)
            }
            Trust::Verifier(v) => builder
                .dangerous()
                .with_custom_certificate_verifier(v.clone()),
        };
        let mut config = match &self.client_auth {
            Some((cert, key)) => builder.with_client_auth_cert(
                load_cert_chain(cert, "client certificate")?,
                load_private_key(key)?,
            )?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = self.alpn.clone();
        if !self.resumption {
            config.resumption = Resumption::disabled();
        }
        Ok(Arc::new(config))
    }
}

/// The order clients ship with: the provider's server order (`suite_rank`) with AES-256-GCM
/// and AES-128-GCM swapped, in TLS 1.3 and in TLS 1.2.
fn shipped_rank(suite: rustls::CipherSuite) -> u8 {
    match crate::crypto::suite_rank(suite) {
        0 => 1,
        1 => 0,
        3 => 4,
        4 => 3,
        rank => rank,
    }
}
