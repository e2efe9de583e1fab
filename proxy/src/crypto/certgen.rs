//! Test and benchmark certificates: one CA, and a server certificate per algorithm the
//! reference study compares, plus a client certificate for mTLS.
//!
//! Keys are generated with aws-lc-rs through rcgen (ring cannot generate RSA keys). The
//! files are ordinary PEM, so every provider, nginx and HAProxy can load the same ones.
//!
//! The certificates follow RFC 5280 as strict verifiers read it (pyca/cryptography's
//! verifier, Python 3.13's `ssl` with VERIFY_X509_STRICT, sslyze's Mozilla profile): the
//! CA has a critical basicConstraints CA:TRUE, keyUsage keyCertSign and cRLSign, and a
//! Subject Key Identifier; every leaf has Authority and Subject Key Identifiers (4.2.1.1
//! makes the former a MUST in any certificate that is not self-signed), a critical
//! basicConstraints CA:FALSE, keyUsage and extendedKeyUsage for its role, and lives 90
//! days by default.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, RsaKeySize,
};
use serde::{Deserialize, Serialize};

use super::CryptoError;

/// The server-certificate algorithms of the reference study.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum CertAlgorithmName {
    /// RSA 2048-bit, signed with SHA-256.
    Rsa2048,
    /// RSA 4096-bit, signed with SHA-256.
    Rsa4096,
    /// ECDSA P-256 with SHA-256.
    EcdsaP256,
    /// ECDSA P-384 with SHA-384.
    EcdsaP384,
}

impl CertAlgorithmName {
    /// All four, in report order.
    pub const ALL: [Self; 4] = [
        Self::Rsa2048,
        Self::Rsa4096,
        Self::EcdsaP256,
        Self::EcdsaP384,
    ];

    /// File stem and label: rsa2048, rsa4096, ecdsa-p256, ecdsa-p384.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Rsa2048 => "rsa2048",
            Self::Rsa4096 => "rsa4096",
            Self::EcdsaP256 => "ecdsa-p256",
            Self::EcdsaP384 => "ecdsa-p384",
        }
    }

    fn generate_key(self) -> Result<KeyPair, rcgen::Error> {
        match self {
            Self::Rsa2048 => KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, RsaKeySize::_2048),
            Self::Rsa4096 => KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, RsaKeySize::_4096),
            Self::EcdsaP256 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
            Self::EcdsaP384 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384),
        }
    }
}

impl fmt::Display for CertAlgorithmName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CertAlgorithmName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "rsa2048" | "rsa-2048" => Ok(Self::Rsa2048),
            "rsa4096" | "rsa-4096" => Ok(Self::Rsa4096),
            "ecdsa-p256" | "p256" | "ecdsap256" => Ok(Self::EcdsaP256),
            "ecdsa-p384" | "p384" | "ecdsap384" => Ok(Self::EcdsaP384),
            _ => Err(format!(
                "unknown certificate algorithm {s:?}; expected one of: rsa2048, rsa4096, ecdsa-p256, ecdsa-p384"
            )),
        }
    }
}

impl TryFrom<String> for CertAlgorithmName {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<CertAlgorithmName> for String {
    fn from(a: CertAlgorithmName) -> String {
        a.as_str().to_owned()
    }
}

/// What [`generate_cert_set`] wrote.
#[derive(Debug)]
pub struct GeneratedSet {
    /// The CA certificate clients trust.
    pub ca_cert: PathBuf,
    /// `(algorithm, cert, key)` for each server certificate.
    pub servers: Vec<(CertAlgorithmName, PathBuf, PathBuf)>,
    /// Client certificate and key for mTLS, signed by the same CA.
    pub client: (PathBuf, PathBuf),
}

/// The client certificate's subject alternative name.
const CLIENT_SAN: &str = "client.tls-proxy.invalid";

/// SANs every generated server certificate carries, so loopback tests and a local
/// benchmark verify the server name without extra flags.
const DEFAULT_SANS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Writes `ca.crt`/`ca.key`, `<alg>.crt`/`<alg>.key` for each algorithm and
/// `client.crt`/`client.key` into `out`, all signed by one fresh CA; the leaves are valid
/// for [`LEAF_VALIDITY_DAYS`].
pub fn generate_cert_set(
    out: &Path,
    algorithms: &[CertAlgorithmName],
    extra_sans: &[String],
) -> Result<GeneratedSet, CryptoError> {
    generate_cert_set_valid_for(out, algorithms, extra_sans, LEAF_VALIDITY_DAYS)
}

/// [`generate_cert_set`] with leaves valid for `leaf_days` days (from yesterday, for
/// clock skew).
pub fn generate_cert_set_valid_for(
    out: &Path,
    algorithms: &[CertAlgorithmName],
    extra_sans: &[String],
    leaf_days: u32,
) -> Result<GeneratedSet, CryptoError> {
    if !(1..=MAX_LEAF_VALIDITY_DAYS).contains(&leaf_days) {
        return Err(CryptoError::Generate(format!(
            "leaf validity of {leaf_days} days: expected 1 to {MAX_LEAF_VALIDITY_DAYS} (the most browsers accept)"
        )));
    }
    let gen_err = |e: rcgen::Error| CryptoError::Generate(e.to_string());
    std::fs::create_dir_all(out).map_err(|source| CryptoError::Write {
        path: out.to_owned(),
        source,
    })?;

    let ca_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).map_err(gen_err)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(gen_err)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "tls-proxy benchmark CA");
    // keyCertSign and cRLSign only: a CA key that also signs TLS handshakes is what
    // strict profiles flag.
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let now = time::OffsetDateTime::now_utc();
    ca_params.not_before = now - time::Duration::days(1);
    ca_params.not_after = now + time::Duration::days(CA_VALIDITY_DAYS);
    let ca_cert = ca_params.self_signed(&ca_key).map_err(gen_err)?;
    let ca_cert_path = out.join("ca.crt");
    write_file(&ca_cert_path, ca_cert.pem().as_bytes(), false)?;
    write_file(&out.join("ca.key"), ca_key.serialize_pem().as_bytes(), true)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let mut sans: Vec<String> = DEFAULT_SANS.iter().map(|s| (*s).to_owned()).collect();
    sans.extend(extra_sans.iter().cloned());

    let mut servers = Vec::with_capacity(algorithms.len());
    for &alg in algorithms {
        let key = alg.generate_key().map_err(gen_err)?;
        let mut params = CertificateParams::new(sans.clone()).map_err(gen_err)?;
        params
            .distinguished_name
            .push(DnType::CommonName, format!("tls-proxy {alg}"));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        if matches!(alg, CertAlgorithmName::Rsa2048 | CertAlgorithmName::Rsa4096) {
            // RFC 5280 4.2.1.3 and the CA/Browser Forum baseline: an RSA server key may
            // also encipher (TLS 1.2's RSA key transport, which this proxy never offers,
            // but verifiers check the usage, not the suite).
            params.key_usages.push(KeyUsagePurpose::KeyEncipherment);
        }
        set_leaf_profile(&mut params, leaf_days);
        let cert = params.signed_by(&key, &issuer).map_err(gen_err)?;
        let cert_path = out.join(format!("{alg}.crt"));
        let key_path = out.join(format!("{alg}.key"));
        write_file(&cert_path, cert.pem().as_bytes(), false)?;
        write_file(&key_path, key.serialize_pem().as_bytes(), true)?;
        servers.push((alg, cert_path, key_path));
    }

    let client_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(gen_err)?;
    // A client certificate names its holder in a SAN too: RFC 5280 verifiers such as
    // pyca/cryptography's client verifier require the extension. `.invalid` (RFC 2606)
    // says the name is an identity, not a host to reach.
    let mut client_params = CertificateParams::new(vec![CLIENT_SAN.to_owned()]).map_err(gen_err)?;
    client_params
        .distinguished_name
        .push(DnType::CommonName, "tls-proxy benchmark client");
    client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    client_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    set_leaf_profile(&mut client_params, leaf_days);
    let client_cert = client_params
        .signed_by(&client_key, &issuer)
        .map_err(gen_err)?;
    let client = (out.join("client.crt"), out.join("client.key"));
    write_file(&client.0, client_cert.pem().as_bytes(), false)?;
    write_file(&client.1, client_key.serialize_pem().as_bytes(), true)?;

    Ok(GeneratedSet {
        ca_cert: ca_cert_path,
        servers,
        client,
    })
}

/// What every leaf carries beyond its names and usages: an Authority Key Identifier
/// (RFC 5280 4.2.1.1), a Subject Key Identifier and basicConstraints CA:FALSE (rcgen
/// writes both for `ExplicitNoCa`), and a validity from yesterday (clock skew) for
/// `days`. rcgen's default validity (the year 4096) is a HIGH finding in testssl.
fn set_leaf_profile(params: &mut CertificateParams, days: u32) {
    params.use_authority_key_identifier_extension = true;
    params.is_ca = IsCa::ExplicitNoCa;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(i64::from(days));
}

/// Default leaf lifetime: 90 days, what ACME CAs issue and what Mozilla's TLS guidelines
/// recommend (their intermediate profile allows at most 366; public CAs issue at most 200
/// since March 2026). `proxy gen-certs --days` changes it.
pub const LEAF_VALIDITY_DAYS: u32 = 90;

/// The longest leaf lifetime `--days` accepts: 397 days, the most browsers accept.
pub const MAX_LEAF_VALIDITY_DAYS: u32 = 397;

/// The CA lives ten years: it only signs the certificates generated beside it, and a
/// leaf re-issued from it must not outlive it.
const CA_VALIDITY_DAYS: i64 = 3650;

fn write_file(path: &Path, contents: &[u8], private: bool) -> Result<(), CryptoError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    if private {
        // Private keys are readable by their owner only, as ssh and nginx expect.
        opts.mode(0o600);
    }
    let mut f = opts.open(path).map_err(|source| CryptoError::Write {
        path: path.to_owned(),
        source,
    })?;
    f.write_all(contents).map_err(|source| CryptoError::Write {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::{load_certified_key, Provider, ProviderName};

    #[test]
    fn generated_set_loads_with_every_software_provider() {
        let dir = tempdir();
        let set = generate_cert_set(
            &dir,
            &[CertAlgorithmName::EcdsaP256, CertAlgorithmName::Rsa2048],
            &["qdrant.internal".to_owned()],
        )
        .unwrap();
        for p in ProviderName::SOFTWARE {
            let provider = Provider::new(p, &[]).unwrap();
            for (alg, cert, key) in &set.servers {
                let loaded = load_certified_key(&provider, cert, key).unwrap();
                assert_eq!(loaded.algorithm.label(), alg.as_str(), "{p}");
            }
        }
        // A key from another pair is rejected, naming both files.
        let provider = Provider::new(ProviderName::AwsLcRs, &[]).unwrap();
        let err = load_certified_key(&provider, &set.servers[0].1, &set.client.1).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("does not match"), "{msg}");
        assert!(msg.contains("client.key"), "{msg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The RFC 5280 profile, read back with x509-parser (the CI's interop tests check the
    /// same files with Python's strict verifier and sslyze).
    #[test]
    fn certificates_carry_the_rfc5280_profile() {
        use x509_parser::extensions::ParsedExtension;
        use x509_parser::prelude::{FromDer, X509Certificate};
        let dir = tempdir();
        let set = generate_cert_set_valid_for(
            &dir,
            &[CertAlgorithmName::Rsa2048, CertAlgorithmName::EcdsaP256],
            &[],
            30,
        )
        .unwrap();
        let der = |path: &Path| {
            let pem = std::fs::read(path).unwrap();
            rustls_pki_types::pem::PemObject::from_pem_slice(&pem)
                .map(|c: rustls_pki_types::CertificateDer<'static>| c.to_vec())
                .unwrap()
        };
        let ca_der = der(&set.ca_cert);
        let (_, ca) = X509Certificate::from_der(&ca_der).unwrap();
        let bc = ca.basic_constraints().unwrap().unwrap();
        assert!(bc.critical && bc.value.ca, "CA basicConstraints");
        let ku = ca.key_usage().unwrap().unwrap().value;
        assert!(ku.key_cert_sign() && ku.crl_sign() && !ku.digital_signature());
        let ski_of = |c: &X509Certificate| {
            c.extensions()
                .iter()
                .find_map(|e| match e.parsed_extension() {
                    ParsedExtension::SubjectKeyIdentifier(k) => Some(k.0.to_vec()),
                    _ => None,
                })
                .expect("subject key identifier")
        };
        let ca_ski = ski_of(&ca);
        let leaves = set
            .servers
            .iter()
            .map(|(alg, cert, _)| (Some(*alg), cert))
            .chain([(None, &set.client.0)]);
        for (alg, path) in leaves {
            let leaf_der = der(path);
            let (_, leaf) = X509Certificate::from_der(&leaf_der).unwrap();
            let what = path.display();
            let aki = leaf
                .extensions()
                .iter()
                .find_map(|e| match e.parsed_extension() {
                    ParsedExtension::AuthorityKeyIdentifier(a) => a.key_identifier.clone(),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("{what}: no authority key identifier"));
            assert_eq!(aki.0, ca_ski.as_slice(), "{what}: AKI is the CA's SKI");
            ski_of(&leaf);
            let bc = leaf.basic_constraints().unwrap().unwrap();
            assert!(bc.critical && !bc.value.ca, "{what}: CA:FALSE");
            let ku = leaf.key_usage().unwrap().unwrap().value;
            assert!(ku.digital_signature() && !ku.key_cert_sign(), "{what}");
            let rsa = matches!(alg, Some(CertAlgorithmName::Rsa2048));
            assert_eq!(
                ku.key_encipherment(),
                rsa,
                "{what}: keyEncipherment for RSA only"
            );
            let eku = leaf.extended_key_usage().unwrap().unwrap().value;
            match alg {
                Some(_) => {
                    assert!(eku.server_auth && !eku.client_auth, "{what}");
                    let san = leaf.subject_alternative_name().unwrap().unwrap();
                    assert_eq!(san.value.general_names.len(), DEFAULT_SANS.len(), "{what}");
                }
                None => assert!(eku.client_auth && !eku.server_auth, "{what}"),
            }
            let days = (leaf.validity().not_after.timestamp()
                - leaf.validity().not_before.timestamp())
                / 86_400;
            assert_eq!(days, 31, "{what}: 30 days from yesterday");
        }
        let err = generate_cert_set_valid_for(&dir, &[], &[], 398).unwrap_err();
        assert!(err.to_string().contains("398 days"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "certgen-test-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
