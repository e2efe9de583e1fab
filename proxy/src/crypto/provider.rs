//! The provider registry: one enum of names, one function from name to `CryptoProvider`.
//!
//! Every `ServerConfig` and `ClientConfig` in this workspace is built from a [`Provider`]
//! explicitly; with both the ring and aws-lc-rs rustls features compiled in there is no
//! process-wide default provider, and relying on one would make a comparison between
//! providers silently wrong.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use rustls::crypto::{CryptoProvider, SupportedKxGroup};
use rustls::server::ProducesTickets;
use rustls::NamedGroup;
use serde::{Deserialize, Serialize};

use super::{openssl_ticketer, CryptoError};

/// The crypto providers the proxy and the load generator can use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum ProviderName {
    /// ring, via rustls' built-in provider.
    Ring,
    /// AWS-LC, via rustls' built-in aws-lc-rs provider.
    AwsLcRs,
    /// The system OpenSSL 3.x (or the vendored 3.5), via rustls-openssl.
    Openssl,
    /// OpenSSL with the Intel QuickAssist provider performing the asymmetric operations.
    OpensslQat,
}

impl ProviderName {
    /// Every provider, in the order reports list them.
    pub const ALL: [ProviderName; 4] = [Self::Ring, Self::AwsLcRs, Self::Openssl, Self::OpensslQat];

    /// The providers that need no hardware: the baselines a QAT figure is compared with.
    pub const SOFTWARE: [ProviderName; 3] = [Self::Ring, Self::AwsLcRs, Self::Openssl];

    /// The name used on the command line, in config files and as a metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ring => "ring",
            Self::AwsLcRs => "aws-lc-rs",
            Self::Openssl => "openssl",
            Self::OpensslQat => "openssl-qat",
        }
    }
}

impl fmt::Display for ProviderName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ProviderName {
    type Err = CryptoError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "ring" => Ok(Self::Ring),
            "aws-lc-rs" | "aws-lc" | "awslc" | "aws_lc_rs" => Ok(Self::AwsLcRs),
            "openssl" => Ok(Self::Openssl),
            "openssl-qat" | "qat" => Ok(Self::OpensslQat),
            _ => Err(CryptoError::UnknownProvider { name: s.to_owned() }),
        }
    }
}

impl TryFrom<String> for ProviderName {
    type Error = CryptoError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<ProviderName> for String {
    fn from(p: ProviderName) -> String {
        p.as_str().to_owned()
    }
}

/// Key-exchange groups we let operators pin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum KxGroupName {
    /// X25519 (RFC 7748).
    X25519,
    /// NIST P-256.
    Secp256r1,
    /// NIST P-384.
    Secp384r1,
    /// The hybrid post-quantum group X25519 + ML-KEM-768.
    X25519Mlkem768,
}

impl KxGroupName {
    /// What a listener offers when its configuration names no groups, most preferred
    /// first: the post-quantum hybrid where the provider has it (current Chrome, Firefox,
    /// OpenSSL 3.5 and rustls clients offer it), then every group a current nginx accepts,
    /// so that a client offering only P-256 or only P-384 is served too. Each provider
    /// offers the ones it implements (ring and OpenSSL 3.0 have no ML-KEM).
    pub const PRODUCTION_DEFAULT: [KxGroupName; 4] = [
        Self::X25519Mlkem768,
        Self::X25519,
        Self::Secp256r1,
        Self::Secp384r1,
    ];

    /// Name as used in config, flags and reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::X25519 => "x25519",
            Self::Secp256r1 => "secp256r1",
            Self::Secp384r1 => "secp384r1",
            Self::X25519Mlkem768 => "x25519mlkem768",
        }
    }

    /// The group rustls negotiated, by our name; None for a group we do not offer.
    pub fn from_named_group(group: NamedGroup) -> Option<Self> {
        Self::PRODUCTION_DEFAULT
            .into_iter()
            .find(|g| g.named_group() == group)
    }

    fn named_group(self) -> NamedGroup {
        match self {
            Self::X25519 => NamedGroup::X25519,
            Self::Secp256r1 => NamedGroup::secp256r1,
            Self::Secp384r1 => NamedGroup::secp384r1,
            Self::X25519Mlkem768 => NamedGroup::X25519MLKEM768,
        }
    }
}

impl fmt::Display for KxGroupName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for KxGroupName {
    type Err = CryptoError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().replace(['-', '_'], "").as_str() {
            "x25519" => Ok(Self::X25519),
            "secp256r1" | "p256" | "prime256v1" => Ok(Self::Secp256r1),
            "secp384r1" | "p384" => Ok(Self::Secp384r1),
            "x25519mlkem768" => Ok(Self::X25519Mlkem768),
            _ => Err(CryptoError::UnknownKxGroup { name: s.to_owned() }),
        }
    }
}

impl TryFrom<String> for KxGroupName {
    type Error = CryptoError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<KxGroupName> for String {
    fn from(g: KxGroupName) -> String {
        g.as_str().to_owned()
    }
}

/// Cipher suite preference, most preferred first: AES-128-GCM, then AES-256-GCM, then
/// ChaCha20-Poly1305, TLS 1.3 before TLS 1.2. AES-128-GCM is as strong as any client needs
/// (Mozilla's recommended order starts with it) and cheaper per record than AES-256 (10
/// AES rounds instead of 14), and its SHA-256 transcript hash runs on the SHA extensions
/// where SHA-384 has no hardware path. The providers' own lists start with AES-256.
pub(crate) fn suite_rank(suite: rustls::CipherSuite) -> u8 {
    use rustls::CipherSuite as C;
    match suite {
        C::TLS13_AES_128_GCM_SHA256 => 0,
        C::TLS13_AES_256_GCM_SHA384 => 1,
        C::TLS13_CHACHA20_POLY1305_SHA256 => 2,
        C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 | C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => 3,
        C::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 | C::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => 4,
        C::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        | C::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => 5,
        _ => 6,
    }
}

/// A ready-to-use provider: the rustls `CryptoProvider` with its key-exchange groups pinned,
/// plus what the proxy needs to know about it.
#[derive(Clone, Debug)]
pub struct Provider {
    name: ProviderName,
    crypto: Arc<CryptoProvider>,
}

/// Signature verification (client certificates, the start-up key check) for OpenSSL
/// listeners while the QAT provider is loaded: aws-lc-rs's. rustls-openssl verifies with
/// fetches that carry no property query, and with QAT_Engine loaded its RSA verification
/// was measured to run inside the QAT provider despite the process's `?provider=default`
/// preference (signing was not: handshakes verified by `openssl s_client` came out right).
/// Where qat_sw cannot do RSA (no AVX-512 IFMA) every verification failed, so a plain
/// openssl RSA listener beside an openssl-qat one refused to start ("key does not match
/// certificate"). Verification is public-key work off the signing path, so it leaves
/// OpenSSL rather than depend on how OpenSSL 3.0 picks the provider of a public key.
fn verification_beside_qat() -> rustls::crypto::WebPkiSupportedAlgorithms {
    rustls::crypto::aws_lc_rs::default_provider().signature_verification_algorithms
}

impl Provider {
    /// Builds the named provider with exactly `kx_groups`, in that order of preference
    /// (an empty list keeps the provider's own); a group the provider lacks is an error.
    ///
    /// Pinning the groups matters for comparisons: aws-lc-rs and OpenSSL >= 3.5 otherwise
    /// negotiate X25519MLKEM768 while ring and OpenSSL 3.0 negotiate X25519, and the
    /// difference would be measured as a provider difference.
    pub fn new(name: ProviderName, kx_groups: &[KxGroupName]) -> Result<Self, CryptoError> {
        Self::build(name, kx_groups, false)
    }

    /// Builds the named provider with the production groups
    /// ([`KxGroupName::PRODUCTION_DEFAULT`]) that it implements, in that order.
    pub fn with_default_groups(name: ProviderName) -> Result<Self, CryptoError> {
        Self::build(name, &KxGroupName::PRODUCTION_DEFAULT, true)
    }

    /// Builds the named provider with `kx_groups` when given, the production default
    /// otherwise (a listener's `tls.kx_groups`).
    pub fn with_groups(
        name: ProviderName,
        kx_groups: Option<&[KxGroupName]>,
    ) -> Result<Self, CryptoError> {
        match kx_groups {
            Some(groups) => Self::new(name, groups),
            None => Self::with_default_groups(name),
        }
    }

    /// `skip_missing`: leave out wanted groups the provider does not implement (the
    /// production default) instead of refusing them (an operator's explicit list).
    fn build(
        name: ProviderName,
        kx_groups: &[KxGroupName],
        skip_missing: bool,
    ) -> Result<Self, CryptoError> {
        let (mut crypto, all_groups): (CryptoProvider, Vec<&'static dyn SupportedKxGroup>) =
            match name {
                ProviderName::Ring => (
                    rustls::crypto::ring::default_provider(),
                    rustls::crypto::ring::ALL_KX_GROUPS.to_vec(),
                ),
                ProviderName::AwsLcRs => (
                    rustls::crypto::aws_lc_rs::default_provider(),
                    rustls::crypto::aws_lc_rs::ALL_KX_GROUPS.to_vec(),
                ),
                ProviderName::Openssl => (
                    rustls_openssl::default_provider(),
                    rustls_openssl::kx_group::available_groups(),
                ),
                // rustls-openssl for everything (record layer, key exchange on OpenSSL's
                // default provider) except the server's signature, which the QAT key
                // provider sends to the QAT provider through the asynchronous signer, and
                // verification (below).
                ProviderName::OpensslQat => {
                    if super::qat::active().is_none() {
                        return Err(CryptoError::ProviderUnavailable {
                            name: name.as_str(),
                            reason: "the QAT OpenSSL provider has not been activated".to_owned(),
                        });
                    }
                    let mut crypto = rustls_openssl::default_provider();
                    crypto.key_provider = &super::qat::key::QAT_KEY_PROVIDER;
                    (crypto, rustls_openssl::kx_group::available_groups())
                }
            };
        let uses_openssl = matches!(name, ProviderName::Openssl | ProviderName::OpensslQat);
        if uses_openssl {
            super::openssl_hkdf::with_keyed_hmac_hkdf(&mut crypto.cipher_suites);
        }
        let mut all_groups = all_groups;
        if uses_openssl && super::qat::active().is_some() {
            crypto.signature_verification_algorithms = verification_beside_qat();
            // X25519 pinned to the default provider (openssl), or batched in the QAT
            // provider inside the offload step (openssl-qat): rustls-openssl's lands in the
            // QAT provider outside any job (see `qat::kx`).
            let x25519: &'static dyn SupportedKxGroup = match name {
                ProviderName::OpensslQat => &super::qat::key::QAT_X25519,
                _ => &super::qat::kx::SOFTWARE_X25519,
            };
            for group in all_groups.iter_mut().chain(crypto.kx_groups.iter_mut()) {
                if group.name() == NamedGroup::X25519 {
                    *group = x25519;
                }
            }
        }
        if !kx_groups.is_empty() {
            let mut pinned = Vec::with_capacity(kx_groups.len());
            for wanted in kx_groups {
                match all_groups.iter().find(|g| g.name() == wanted.named_group()) {
                    Some(group) => pinned.push(*group),
                    None if skip_missing => {}
                    None => {
                        return Err(CryptoError::KxGroupUnsupported {
                            provider: name.as_str(),
                            group: wanted.as_str(),
                        })
                    }
                }
            }
            crypto.kx_groups = pinned;
        }
        // One preference order for every provider; servers enforce it (see `tls`).
        crypto.cipher_suites.sort_by_key(|s| suite_rank(s.suite()));
        Ok(Self {
            name,
            crypto: Arc::new(crypto),
        })
    }

    /// The provider's name.
    pub fn name(&self) -> ProviderName {
        self.name
    }

    /// The key-exchange groups this provider offers, most preferred first, by our names
    /// (`rustls` names for any other group), for the start-up line and `check-config`.
    pub fn kx_group_names(&self) -> Vec<String> {
        self.crypto
            .kx_groups
            .iter()
            .map(|g| match KxGroupName::from_named_group(g.name()) {
                Some(ours) => ours.as_str().to_owned(),
                None => format!("{:?}", g.name()),
            })
            .collect()
    }

    /// The rustls provider, to build configs with.
    pub fn crypto(&self) -> &Arc<CryptoProvider> {
        &self.crypto
    }

    /// A session-ticket producer that uses this provider's own symmetric crypto, rotated
    /// every few hours so that ticket keys are erased in time.
    pub fn ticketer(&self) -> Result<Arc<dyn ProducesTickets>, CryptoError> {
        Ok(match self.name {
            ProviderName::Ring => rustls::crypto::ring::Ticketer::new()?,
            ProviderName::AwsLcRs => rustls::crypto::aws_lc_rs::Ticketer::new()?,
            ProviderName::Openssl | ProviderName::OpensslQat => openssl_ticketer::new()?,
        })
    }

    /// The underlying library and its version, for logs and reports.
    pub fn library_version(&self) -> String {
        match self.name {
            ProviderName::Ring => "ring 0.17".to_owned(),
            ProviderName::AwsLcRs => "aws-lc-rs 1 (AWS-LC)".to_owned(),
            ProviderName::Openssl | ProviderName::OpensslQat => {
                openssl::version::version().to_owned()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in ProviderName::ALL {
            assert_eq!(p.as_str().parse::<ProviderName>().unwrap(), p);
        }
        let err = "boringssl".parse::<ProviderName>().unwrap_err();
        assert!(err.to_string().contains("boringssl"), "{err}");
    }

    #[test]
    fn kx_groups_are_pinned_for_every_software_provider() {
        for p in ProviderName::SOFTWARE {
            let prov = Provider::new(p, &[KxGroupName::X25519]).unwrap();
            let names: Vec<_> = prov.crypto().kx_groups.iter().map(|g| g.name()).collect();
            assert_eq!(names, vec![NamedGroup::X25519], "{p}");
        }
    }

    #[test]
    fn production_default_offers_what_each_provider_has_in_order() {
        let expect_pq = |p: ProviderName| match p {
            ProviderName::Ring => false,
            ProviderName::AwsLcRs => true,
            // rustls-openssl offers ML-KEM from OpenSSL 3.5 on.
            _ => openssl::version::number() >= 0x3050_0000,
        };
        for p in ProviderName::SOFTWARE {
            let prov = Provider::with_default_groups(p).unwrap();
            let mut want = vec!["x25519", "secp256r1", "secp384r1"];
            if expect_pq(p) {
                want.insert(0, "x25519mlkem768");
            }
            assert_eq!(prov.kx_group_names(), want, "{p}");
        }
    }

    #[test]
    fn unsupported_group_is_a_clear_error() {
        // ring has no ML-KEM.
        let err = Provider::new(ProviderName::Ring, &[KxGroupName::X25519Mlkem768]).unwrap_err();
        assert!(err.to_string().contains("x25519mlkem768"), "{err}");
    }
}
