//! The start-up proof: a batch of real signatures through the signer, each checked to have
//! been fetched from the QAT provider, taken asynchronously and verified.

use std::ffi::CStr;
use std::path::Path;
use std::sync::Arc;

use super::signer::{AsyncSigner, Padding};
use super::{cpu_lacks_avx512_ifma, QatError, QatState};

impl QatState {
    /// The signer handshakes sign through.
    pub fn signer(&self) -> &AsyncSigner {
        &self.signer
    }

    /// Signs a batch of probes (RSA: one PKCS#1 v1.5 batch, one PSS batch) with the private
    /// key in `key_path` through the signer, as handshakes do under load, and checks that
    /// the provider did the work asynchronously: each signature was fetched from this
    /// provider, the provider paused every job (a provider that is loaded but not
    /// offloading signs inline), and the signatures verify.
    pub fn prove_signing(&self, key_path: &Path) -> Result<SigningProof, QatError> {
        let pem = std::fs::read(key_path).map_err(|e| {
            QatError::Key(format!(
                "cannot read private key {}: {e}",
                key_path.display()
            ))
        })?;
        let key = openssl::pkey::PKey::private_key_from_pem(&pem).map_err(|e| {
            QatError::Key(format!(
                "private key {} cannot be read by OpenSSL: {e}",
                key_path.display()
            ))
        })?;
        let bits = key.bits();
        // RSA: PKCS#1 v1.5 (what TLS 1.2 clients may ask for) and PSS (TLS 1.3), each a
        // batch; ECDSA: its curve's hash.
        let probes: Vec<(&'static CStr, Padding, String)> = match key.id() {
            openssl::pkey::Id::RSA => vec![
                (
                    c"SHA256",
                    Padding::Pkcs1,
                    format!("RSA-{bits} PKCS#1 SHA-256"),
                ),
                (c"SHA256", Padding::Pss, format!("RSA-{bits} PSS SHA-256")),
            ],
            openssl::pkey::Id::EC if bits <= 256 => {
                vec![(c"SHA256", Padding::None, "ECDSA P-256 SHA-256".to_owned())]
            }
            openssl::pkey::Id::EC if bits <= 384 => {
                vec![(c"SHA384", Padding::None, "ECDSA P-384 SHA-384".to_owned())]
            }
            openssl::pkey::Id::EC => {
                vec![(c"SHA512", Padding::None, "ECDSA P-521 SHA-512".to_owned())]
            }
            other => {
                // Readable, but nothing QAT signs: the software fallback can serve it.
                return Err(QatError::NotOffloading(format!(
                    "private key {} is {other:?}: QAT offloads RSA and ECDSA signatures only",
                    key_path.display()
                )));
            }
        };
        let key = Arc::new(key);
        let mut proof = None;
        for (digest, padding, operation) in probes {
            proof = Some(self.prove_one(&key, key_path, digest, padding, operation)?);
        }
        proof.ok_or_else(|| QatError::NotOffloading("start-up proof: no probe to sign".to_owned()))
    }

    /// One probe batch of the proof (see [`prove_signing`](Self::prove_signing)).
    fn prove_one(
        &self,
        key: &Arc<openssl::pkey::PKey<openssl::pkey::Private>>,
        key_path: &Path,
        digest: &'static CStr,
        padding: Padding,
        operation: String,
    ) -> Result<SigningProof, QatError> {
        const PROBE: &[u8] = b"tls-proxy QAT start-up proof";
        // A full batch, as handshakes submit them: every one must be taken asynchronously.
        let mut signed = None;
        let mut all_paused = true;
        for result in self.signer.sign_batch(key, digest, padding, PROBE) {
            let one = result.map_err(|e| {
                QatError::NotOffloading(format!(
                    "start-up proof failed: a {operation} signature with {} failed inside the provider, \
                     not because of the key or certificate: {e}{}",
                    key_path.display(),
                    if cpu_lacks_avx512_ifma() {
                        "; note: this CPU has no AVX-512 IFMA, which QAT_Engine's software mode \
                         (qat_sw) needs for RSA and ECDSA, yet v1.8 enables qat_sw on any CPU with \
                         VAES and AVX2 (QAT hardware does not need it)"
                    } else {
                        ""
                    }
                ))
            })?;
            all_paused &= one.paused;
            signed = Some(one);
        }
        let Some(signed) = signed else {
            return Err(QatError::NotOffloading(
                "start-up proof: the signer returned no signature".to_owned(),
            ));
        };
        let signature_provider = signed.provider.name();
        if signature_provider != self.name {
            return Err(QatError::NotOffloading(format!(
                "start-up proof failed: a {operation} signature with {} was fetched from OpenSSL provider {:?}, \
                 not {:?} (property query {:?}); the provider does not implement it, so nothing would be offloaded",
                key_path.display(),
                signature_provider,
                self.name,
                self.property_query
            )));
        }
        if !all_paused {
            return Err(QatError::NotOffloading(format!(
                "start-up proof failed: provider {:?} produced the {operation} signature with {} without pausing \
                 its asynchronous job, so it is loaded but not offloading (qat_sw switched off for this CPU, \
                 or no QAT device or instance available); every signature would run in software",
                self.name,
                key_path.display()
            )));
        }
        let verifies = verify(key, digest, padding, PROBE, &signed.signature).map_err(|e| {
            QatError::NotOffloading(format!(
                "start-up proof: cannot verify the probe signature: {e}"
            ))
        })?;
        if !verifies {
            return Err(QatError::NotOffloading(format!(
                "start-up proof failed: provider {:?} returned a {operation} signature with {} that does not verify",
                self.name,
                key_path.display()
            )));
        }
        Ok(SigningProof {
            operation,
            signature_provider,
            signature_len: signed.signature.len(),
            batch: self.signer.batch(),
        })
    }
}

/// Verifies with OpenSSL's default provider (the library context's defaults).
fn verify(
    key: &openssl::pkey::PKey<openssl::pkey::Private>,
    digest: &CStr,
    padding: Padding,
    message: &[u8],
    signature: &[u8],
) -> Result<bool, openssl::error::ErrorStack> {
    use openssl::hash::MessageDigest;
    let md = match digest.to_bytes() {
        b"SHA384" => MessageDigest::sha384(),
        b"SHA512" => MessageDigest::sha512(),
        _ => MessageDigest::sha256(),
    };
    let mut verifier = openssl::sign::Verifier::new(md, key)?;
    match padding {
        Padding::Pss => {
            verifier.set_rsa_padding(openssl::rsa::Padding::PKCS1_PSS)?;
            verifier.set_rsa_pss_saltlen(openssl::sign::RsaPssSaltlen::DIGEST_LENGTH)?;
        }
        Padding::Pkcs1 => verifier.set_rsa_padding(openssl::rsa::Padding::PKCS1)?,
        Padding::None => {}
    }
    verifier.verify_oneshot(signature, message)
}

/// What the start-up proof saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SigningProof {
    /// e.g. "RSA-2048 PSS SHA-256".
    pub operation: String,
    /// The provider the signature operation was fetched from.
    pub signature_provider: String,
    /// Signature length in bytes (the signature was really produced, and verified).
    pub signature_len: usize,
    /// Signatures submitted together in the proof, all taken asynchronously.
    pub batch: usize,
}

impl std::fmt::Display for SigningProof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} signature fetched from provider {:?}, offloaded (a batch of {}: the provider paused every \
             asynchronous job), {} bytes, verified",
            self.operation, self.signature_provider, self.batch, self.signature_len
        )
    }
}
