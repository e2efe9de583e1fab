//! The TLS 1.3 key schedule of the OpenSSL providers (openssl, openssl-qat): HKDF over a
//! keyed OpenSSL HMAC that is copied per block, instead of rustls-openssl's HKDF.
//!
//! rustls-openssl computes every HKDF-Expand with a fresh `EVP_PKEY_CTX` of type HKDF
//! (`EVP_PKEY_CTX_new_id`, `EVP_PKEY_derive_init`): on OpenSSL 3.0 each one fetches the key
//! management and the KDF again, walking OpenSSL's method store (`OPENSSL_LH_doall_arg`,
//! `EVP_PKEY_derive_init_ex` in a profile). A TLS 1.3 handshake expands about twenty times,
//! and that came to a third of the proxy's CPU per ECDSA P-256 handshake with the openssl
//! provider (`perf record` under `ab -c 32`, new connection per request), as much as the
//! signature and key exchange together. Here the HMAC is fetched once per process
//! (`EVP_MAC_fetch`, OpenSSL's default provider), a digest-bound template context is kept
//! per hash, a key (each HKDF pseudo-random key) costs one copy of that template and an
//! `EVP_MAC_init`, and each HKDF block one copy of the keyed context: no fetch per
//! handshake. rustls' own [`HkdfUsingHmac`] builds HKDF from it, as its ring and
//! aws-lc-rs providers do.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::CStr;
use std::ptr;
use std::sync::{Mutex, OnceLock};

use openssl_sys as sys;
use rustls::crypto::hash::HashAlgorithm;
use rustls::crypto::hmac::{Hmac, Key, Tag};
use rustls::crypto::tls13::HkdfUsingHmac;
use rustls::crypto::CipherSuiteCommon;
use rustls::{SupportedCipherSuite, Tls13CipherSuite};
use std::os::raw::c_char;

extern "C" {
    fn OSSL_PARAM_construct_utf8_string(
        key: *const c_char,
        buf: *mut c_char,
        bsize: usize,
    ) -> sys::OSSL_PARAM;
}

/// An `EVP_MAC_CTX`, freed on drop.
struct MacCtx(*mut sys::EVP_MAC_CTX);

// SAFETY: a context is only ever used by one thread at a time: the templates are only
// read (copied), keyed contexts are copied before every use.
unsafe impl Send for MacCtx {}
unsafe impl Sync for MacCtx {}

impl Drop for MacCtx {
    fn drop(&mut self) {
        // SAFETY: owned, freed once.
        unsafe { sys::EVP_MAC_CTX_free(self.0) }
    }
}

impl MacCtx {
    /// A copy; panics only if OpenSSL cannot allocate.
    fn dup(&self) -> MacCtx {
        // SAFETY: a live context, only read.
        let copy = unsafe { sys::EVP_MAC_CTX_dup(self.0) };
        assert!(!copy.is_null(), "EVP_MAC_CTX_dup failed: out of memory");
        MacCtx(copy)
    }
}

/// HMAC with one hash, over OpenSSL's default provider.
pub struct OpensslHmac {
    hash: HashAlgorithm,
    digest_name: &'static CStr,
    output_len: usize,
    template: OnceLock<MacCtx>,
}

impl std::fmt::Debug for OpensslHmac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpensslHmac")
            .field("hash", &self.hash)
            .finish()
    }
}

/// HMAC-SHA256.
pub static HMAC_SHA256: OpensslHmac = OpensslHmac {
    hash: HashAlgorithm::SHA256,
    digest_name: c"SHA256",
    output_len: 32,
    template: OnceLock::new(),
};

/// HMAC-SHA384.
pub static HMAC_SHA384: OpensslHmac = OpensslHmac {
    hash: HashAlgorithm::SHA384,
    digest_name: c"SHA384",
    output_len: 48,
    template: OnceLock::new(),
};

impl OpensslHmac {
    /// The digest-bound context every key starts from, made once.
    fn template(&self) -> &MacCtx {
        self.template.get_or_init(|| {
            // SAFETY: fetch and context creation with checked results; the parameter array
            // points at a static name and lives across the call.
            unsafe {
                let mac = sys::EVP_MAC_fetch(
                    ptr::null_mut(),
                    c"HMAC".as_ptr(),
                    c"provider=default".as_ptr(),
                );
                assert!(
                    !mac.is_null(),
                    "OpenSSL has no HMAC in its default provider"
                );
                let ctx = sys::EVP_MAC_CTX_new(mac);
                // The context holds its own reference to the MAC.
                sys::EVP_MAC_free(mac);
                assert!(!ctx.is_null(), "EVP_MAC_CTX_new failed: out of memory");
                let params = [
                    OSSL_PARAM_construct_utf8_string(
                        c"digest".as_ptr(),
                        self.digest_name.as_ptr() as *mut _,
                        0,
                    ),
                    sys::OSSL_PARAM_construct_end(),
                ];
                let ctx = MacCtx(ctx);
                assert_eq!(
                    sys::EVP_MAC_CTX_set_params(ctx.0, params.as_ptr()),
                    1,
                    "OpenSSL's HMAC refuses digest {:?}",
                    self.digest_name
                );
                ctx
            }
        })
    }
}

impl Hmac for OpensslHmac {
    fn with_key(&self, key: &[u8]) -> Box<dyn Key> {
        let ctx = self.template().dup();
        // SAFETY: a fresh context of ours; the key is read during the call. A NULL
        // parameter list keeps the template's digest. A zero-length key (HKDF-Extract's
        // salt of zeros is not empty, but a PSK-less early secret may be) is passed as an
        // empty, non-null slice.
        let ok = unsafe { sys::EVP_MAC_init(ctx.0, key.as_ptr(), key.len(), ptr::null()) };
        assert_eq!(ok, 1, "EVP_MAC_init failed");
        Box::new(HmacKey {
            ctx,
            output_len: self.output_len,
        })
    }

    fn hash_output_len(&self) -> usize {
        self.output_len
    }
}

struct HmacKey {
    ctx: MacCtx,
    output_len: usize,
}

impl Key for HmacKey {
    fn sign_concat(&self, first: &[u8], middle: &[&[u8]], last: &[u8]) -> Tag {
        let ctx = self.ctx.dup();
        let mut out = [0u8; 64];
        let mut len = 0usize;
        // SAFETY: a fresh copy of a keyed context; every slice is read during its call and
        // `out` is large enough for any HMAC output OpenSSL produces here (48 bytes at most).
        unsafe {
            for part in std::iter::once(first)
                .chain(middle.iter().copied())
                .chain(std::iter::once(last))
            {
                if !part.is_empty() {
                    assert_eq!(
                        sys::EVP_MAC_update(ctx.0, part.as_ptr(), part.len()),
                        1,
                        "EVP_MAC_update failed"
                    );
                }
            }
            assert_eq!(
                sys::EVP_MAC_final(ctx.0, out.as_mut_ptr(), &mut len, out.len()),
                1,
                "EVP_MAC_final failed"
            );
        }
        Tag::new(&out[..len])
    }

    fn tag_len(&self) -> usize {
        self.output_len
    }
}

static HKDF_SHA256: HkdfUsingHmac<'static> = HkdfUsingHmac(&HMAC_SHA256);
static HKDF_SHA384: HkdfUsingHmac<'static> = HkdfUsingHmac(&HMAC_SHA384);

/// `suites` with every TLS 1.3 suite's HKDF replaced by the keyed-HMAC one; everything
/// else of each suite (hash, AEAD, QUIC keys) is rustls-openssl's. The suites are made
/// once per process (rustls takes `&'static` suites).
pub fn with_keyed_hmac_hkdf(suites: &mut [SupportedCipherSuite]) {
    static MADE: OnceLock<Mutex<HashMap<u16, &'static Tls13CipherSuite>>> = OnceLock::new();
    let made = MADE.get_or_init(Default::default);
    for suite in suites.iter_mut() {
        let SupportedCipherSuite::Tls13(original) = *suite else {
            continue;
        };
        let hkdf: &'static HkdfUsingHmac<'static> = match original.common.hash_provider.algorithm()
        {
            HashAlgorithm::SHA256 => &HKDF_SHA256,
            HashAlgorithm::SHA384 => &HKDF_SHA384,
            _ => continue,
        };
        let mut made = made.lock().unwrap_or_else(|p| p.into_inner());
        let ours = *made
            .entry(u16::from(original.common.suite))
            .or_insert_with(|| {
                Box::leak(Box::new(Tls13CipherSuite {
                    common: CipherSuiteCommon {
                        suite: original.common.suite,
                        hash_provider: original.common.hash_provider,
                        confidentiality_limit: original.common.confidentiality_limit,
                    },
                    hkdf_provider: hkdf,
                    aead_alg: original.aead_alg,
                    quic: original.quic,
                }))
            });
        *suite = SupportedCipherSuite::Tls13(ours);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::tls13::Hkdf;

    /// RFC 5869's test case 1 (SHA-256) and the same inputs through aws-lc-rs's HKDF for
    /// SHA-384: the keyed-HMAC HKDF gives the published and the reference output.
    #[test]
    fn hkdf_matches_rfc_5869_and_aws_lc() {
        openssl::init();
        let ikm = [0x0b; 22];
        let salt: Vec<u8> = (0x00..=0x0c).collect();
        let info: Vec<u8> = (0xf0..=0xf9).collect();
        let mut okm = [0u8; 42];
        HKDF_SHA256
            .extract_from_secret(Some(&salt), &ikm)
            .expand_slice(&[&info], &mut okm)
            .unwrap();
        let want =
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865";
        let got: String = okm.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(got, want);

        let reference = rustls::crypto::aws_lc_rs::default_provider()
            .cipher_suites
            .iter()
            .find_map(|s| match s {
                SupportedCipherSuite::Tls13(s)
                    if s.common.suite == rustls::CipherSuite::TLS13_AES_256_GCM_SHA384 =>
                {
                    Some(s.hkdf_provider)
                }
                _ => None,
            })
            .unwrap();
        let (mut ours, mut theirs) = ([0u8; 100], [0u8; 100]);
        HKDF_SHA384
            .extract_from_secret(Some(&salt), &ikm)
            .expand_slice(&[b"a", &info, b""], &mut ours)
            .unwrap();
        reference
            .extract_from_secret(Some(&salt), &ikm)
            .expand_slice(&[b"a", &info, b""], &mut theirs)
            .unwrap();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn only_tls13_suites_are_replaced_and_each_is_made_once() {
        let mut suites = rustls_openssl::default_provider().cipher_suites;
        let before: Vec<_> = suites.iter().map(|s| s.suite()).collect();
        with_keyed_hmac_hkdf(&mut suites);
        let mut again = rustls_openssl::default_provider().cipher_suites;
        with_keyed_hmac_hkdf(&mut again);
        assert_eq!(suites.iter().map(|s| s.suite()).collect::<Vec<_>>(), before);
        for (a, b) in suites.iter().zip(&again) {
            if let (SupportedCipherSuite::Tls13(a), SupportedCipherSuite::Tls13(b)) = (a, b) {
                assert!(std::ptr::eq(*a, *b), "{:?} made twice", a.common.suite);
            }
        }
    }
}
