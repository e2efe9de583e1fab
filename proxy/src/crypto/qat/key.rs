//! The rustls side of openssl-qat: a `KeyProvider` whose keys sign through the process's
//! [`AsyncSigner`], so that a handshake's signature goes to the QAT provider,
//! asynchronously and batched, and an X25519 group whose key pairs come from the signer's
//! stock, generated ahead in provider batches ([`QAT_X25519`]).

use std::ffi::CStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openssl::nid::Nid;
use openssl::pkey::{Id, PKey, Private};
use rustls::crypto::{ActiveKeyExchange, KeyProvider, SupportedKxGroup};
use rustls::pki_types::{PrivateKeyDer, SubjectPublicKeyInfoDer};
use rustls::sign::{Signer, SigningKey};
use rustls::{Error, NamedGroup, SignatureAlgorithm, SignatureScheme};

use super::kx::{SoftwareKeyExchange, SOFTWARE_X25519};
use super::signer::{AsyncSigner, OperationKind, Padding};

/// Loads private keys whose signatures run on the QAT signer. Used as the `key_provider`
/// of openssl-qat's `CryptoProvider`; everything else in that provider is rustls-openssl's.
#[derive(Debug)]
pub struct QatKeyProvider;

/// The one instance (`CryptoProvider::key_provider` takes a `&'static`).
pub static QAT_KEY_PROVIDER: QatKeyProvider = QatKeyProvider;

impl KeyProvider for QatKeyProvider {
    fn load_private_key(
        &self,
        key_der: PrivateKeyDer<'static>,
    ) -> Result<Arc<dyn SigningKey>, Error> {
        let state = super::active()
            .ok_or_else(|| Error::General("the QAT provider has not been activated".into()))?;
        let signer = state.signer().clone();
        let key = PKey::private_key_from_der(key_der.secret_der())
            .map_err(|e| Error::General(format!("OpenSSL cannot read the private key: {e}")))?;
        let schemes: &'static [(SignatureScheme, &'static CStr, Padding)] = match key.id() {
            Id::RSA => RSA_SCHEMES,
            Id::EC => {
                let curve = key
                    .ec_key()
                    .ok()
                    .and_then(|ec| ec.group().curve_name());
                match curve {
                    Some(Nid::X9_62_PRIME256V1) => {
                        &[(SignatureScheme::ECDSA_NISTP256_SHA256, c"SHA256", Padding::None)]
                    }
                    Some(Nid::SECP384R1) => {
                        &[(SignatureScheme::ECDSA_NISTP384_SHA384, c"SHA384", Padding::None)]
                    }
                    Some(Nid::SECP521R1) => {
                        &[(SignatureScheme::ECDSA_NISTP521_SHA512, c"SHA512", Padding::None)]
                    }
                    other => {
                        return Err(Error::General(format!(
                            "EC curve {other:?} is not supported for TLS signatures"
                        )))
                    }
                }
            }
            other => {
                return Err(Error::General(format!(
                    "{other:?} keys are not offloaded to QAT (RSA and ECDSA are); use the openssl provider"
                )))
            }
        };
        let algorithm = if key.id() == Id::RSA {
            SignatureAlgorithm::RSA
        } else {
            SignatureAlgorithm::ECDSA
        };
        let kind = OperationKind::of(&key);
        let key = Arc::new(key);
        let software_cost = software_cost(&signer, &key, schemes[0]);
        Ok(Arc::new(QatSigningKey {
            software_cost,
            offloaded: state.offload_p256 || !kind.is_p256(),
            kind,
            key,
            schemes,
            algorithm,
            signer,
        }))
    }
}

/// The fastest of three software signatures with `key` in its first scheme: the least
/// disturbed by whatever else runs. Costs three signatures once per key load.
fn software_cost(
    signer: &AsyncSigner,
    key: &PKey<Private>,
    (_, digest, padding): (SignatureScheme, &'static CStr, Padding),
) -> Duration {
    (0..3)
        .map(|_| {
            let started = Instant::now();
            let _ = signer.sign_uncounted(key, digest, padding, b"software cost probe");
            started.elapsed()
        })
        .min()
        .unwrap_or_default()
}

/// TLS 1.3's PSS first, then PKCS#1 for TLS 1.2 clients that offer nothing else; SHA-256
/// first in each (the digest's cost is negligible next to the private-key operation).
const RSA_SCHEMES: &[(SignatureScheme, &CStr, Padding)] = &[
    (SignatureScheme::RSA_PSS_SHA256, c"SHA256", Padding::Pss),
    (SignatureScheme::RSA_PSS_SHA384, c"SHA384", Padding::Pss),
    (SignatureScheme::RSA_PSS_SHA512, c"SHA512", Padding::Pss),
    (SignatureScheme::RSA_PKCS1_SHA256, c"SHA256", Padding::Pkcs1),
    (SignatureScheme::RSA_PKCS1_SHA384, c"SHA384", Padding::Pkcs1),
    (SignatureScheme::RSA_PKCS1_SHA512, c"SHA512", Padding::Pkcs1),
];

#[derive(Debug)]
struct QatSigningKey {
    key: Arc<PKey<Private>>,
    kind: OperationKind,
    /// One software signature with this key, measured at load: how long a part batch may
    /// wait, and whether completing one pays.
    software_cost: Duration,
    /// Signatures go to the provider (see `QatConfig::offload_p256`).
    offloaded: bool,
    schemes: &'static [(SignatureScheme, &'static CStr, Padding)],
    algorithm: SignatureAlgorithm,
    signer: AsyncSigner,
}

impl SigningKey for QatSigningKey {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
        let &(scheme, digest, padding) =
            self.schemes.iter().find(|(s, _, _)| offered.contains(s))?;
        Some(Box::new(QatSigner {
            key: self.key.clone(),
            kind: self.kind,
            software_cost: self.software_cost,
            offloaded: self.offloaded,
            scheme,
            digest,
            padding,
            signer: self.signer.clone(),
        }))
    }

    fn public_key(&self) -> Option<SubjectPublicKeyInfoDer<'_>> {
        self.key
            .public_key_to_der()
            .ok()
            .map(SubjectPublicKeyInfoDer::from)
    }

    fn algorithm(&self) -> SignatureAlgorithm {
        self.algorithm
    }
}

#[derive(Debug)]
struct QatSigner {
    key: Arc<PKey<Private>>,
    kind: OperationKind,
    software_cost: Duration,
    offloaded: bool,
    scheme: SignatureScheme,
    digest: &'static CStr,
    padding: Padding,
    signer: AsyncSigner,
}

impl Signer for QatSigner {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, Error> {
        let signed = if self.offloaded {
            self.signer.sign(
                &self.key,
                self.kind,
                self.software_cost,
                self.digest,
                self.padding,
                message,
            )
        } else {
            self.signer
                .sign_in_software(&self.key, self.digest, self.padding, message)
        };
        signed
            .map(|signed| signed.signature)
            .map_err(|e| Error::General(e.to_string()))
    }

    fn scheme(&self) -> SignatureScheme {
        self.scheme
    }
}

/// X25519 for openssl-qat listeners: with `qat.offload_x25519`, key pairs generated ahead in
/// QAT provider batches (the signer's stock), taken without waiting; the agreement on
/// OpenSSL's default provider. Without it, or with an empty stock, [`SOFTWARE_X25519`].
#[derive(Debug)]
pub struct QatX25519;

/// The one instance.
pub static QAT_X25519: QatX25519 = QatX25519;

impl SupportedKxGroup for QatX25519 {
    fn start(&self) -> Result<Box<dyn ActiveKeyExchange>, Error> {
        let stock = super::active().filter(|state| state.offload_x25519);
        let Some(pair) = stock.and_then(|state| state.signer().take_x25519()) else {
            return SOFTWARE_X25519.start();
        };
        Ok(Box::new(SoftwareKeyExchange::from_pair(&pair)?))
    }

    fn name(&self) -> NamedGroup {
        NamedGroup::X25519
    }
}
