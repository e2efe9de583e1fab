//! X25519 key exchange beside the QAT provider: batched in the provider for openssl-qat,
//! and pinned to OpenSSL's default provider everywhere else.
//!
//! Why a group of our own: with QAT_Engine loaded, rustls-openssl's X25519 (`EVP_PKEY_CTX_new_id`,
//! no property query) was measured to generate and derive inside the QAT provider despite
//! the process's `?provider=default` preference (`multibuff_x25519_keygen` and `_derive` in
//! a profile of the proxy), outside any ASYNC job: qat_sw then runs its eight-lane
//! multi-buffer code for one key, at about 12 % of an ECDSA P-256 handshake's CPU. So every
//! OpenSSL listener of a process with the QAT provider loaded uses [`SOFTWARE_X25519`],
//! whose fetches name `provider=default` outright.
//!
//! openssl-qat listeners use [`QAT_X25519`](super::key::QAT_X25519). A server's ephemeral key does not depend on
//! the client, so the QAT signer generates key pairs ahead, eight at a time in one provider
//! batch, and a handshake takes one without waiting, on whatever thread it runs; only the
//! agreement, which needs the client's share, runs in software. Handing the agreement to
//! the signer as well was tried: a second round trip between threads per handshake cost
//! more CPU than the batch saved on this 2-core host (see deploy/QAT.md). A pair waits in
//! the stock (two batches at most) until a handshake takes it, is used once, and its
//! private half is wiped when dropped.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::os::raw::c_char;
use std::ptr;

use openssl_sys as sys;
use rustls::crypto::{ActiveKeyExchange, SharedSecret, SupportedKxGroup};
use rustls::{Error, NamedGroup};

extern "C" {
    fn OPENSSL_cleanse(ptr: *mut std::ffi::c_void, len: usize);
    fn EVP_PKEY_CTX_new_from_pkey(
        libctx: *mut sys::OSSL_LIB_CTX,
        pkey: *mut sys::EVP_PKEY,
        propquery: *const c_char,
    ) -> *mut sys::EVP_PKEY_CTX;
}

/// Where the software path fetches from: OpenSSL's default provider, required.
pub const DEFAULT_PROVIDER: &CStr = c"provider=default";
/// X25519's public keys and shared secrets are 32 bytes.
pub const X25519_LEN: usize = 32;

/// An X25519 private key, freed on drop.
struct Key(*mut sys::EVP_PKEY);

// SAFETY: an EVP_PKEY is reference-counted and safe to use from one thread at a time;
// this handle is only moved between threads, never shared.
unsafe impl Send for Key {}
unsafe impl Sync for Key {}

impl Drop for Key {
    fn drop(&mut self) {
        // SAFETY: owned, freed once.
        unsafe { sys::EVP_PKEY_free(self.0) }
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("X25519 private key")
    }
}

struct Ctx(*mut sys::EVP_PKEY_CTX);

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: owned, freed once; null is allowed.
        unsafe { sys::EVP_PKEY_CTX_free(self.0) }
    }
}

/// An X25519 key pair as raw bytes: what the key stock keeps between the provider batch
/// that generated it and the handshake that uses it. The private half is wiped on drop.
pub struct RawKeyPair {
    private_key: [u8; X25519_LEN],
    public_key: [u8; X25519_LEN],
}

impl Drop for RawKeyPair {
    fn drop(&mut self) {
        // SAFETY: a valid buffer of its own length.
        unsafe { OPENSSL_cleanse(self.private_key.as_mut_ptr().cast(), X25519_LEN) }
    }
}

impl std::fmt::Debug for RawKeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("X25519 key pair")
    }
}

fn failed(what: &str) -> String {
    format!("X25519 {what}: {}", super::ffi::openssl_errors())
}

/// Generates a key with the X25519 implementation `property_query` selects.
fn generate(property_query: &CStr) -> Result<(Key, [u8; X25519_LEN]), String> {
    // SAFETY: every pointer is created here and owned by a guard; return codes are checked
    // before results are used.
    unsafe {
        let ctx = Ctx(sys::EVP_PKEY_CTX_new_from_name(
            ptr::null_mut(),
            c"X25519".as_ptr(),
            property_query.as_ptr(),
        ));
        if ctx.0.is_null() || sys::EVP_PKEY_keygen_init(ctx.0) != 1 {
            return Err(failed("key generation cannot start"));
        }
        let mut pkey = ptr::null_mut();
        if sys::EVP_PKEY_generate(ctx.0, &mut pkey) != 1 || pkey.is_null() {
            return Err(failed("key generation failed"));
        }
        let key = Key(pkey);
        let mut public_key = [0u8; X25519_LEN];
        let mut len = X25519_LEN;
        if sys::EVP_PKEY_get_raw_public_key(key.0, public_key.as_mut_ptr(), &mut len) != 1
            || len != X25519_LEN
        {
            return Err(failed("public key unavailable"));
        }
        Ok((key, public_key))
    }
}

/// Agrees a secret between `key` and the peer's public key, fetched per `property_query`.
fn agree(
    key: &Key,
    peer: &[u8],
    property_query: &CStr,
) -> Result<([u8; X25519_LEN], *const sys::OSSL_PROVIDER), String> {
    if peer.len() != X25519_LEN {
        return Err(format!(
            "X25519 peer public key of {} bytes, not {X25519_LEN}",
            peer.len()
        ));
    }
    // SAFETY: as in `generate`.
    unsafe {
        let peer_key = sys::EVP_PKEY_new_raw_public_key_ex(
            ptr::null_mut(),
            c"X25519".as_ptr(),
            property_query.as_ptr(),
            peer.as_ptr(),
            peer.len(),
        );
        if peer_key.is_null() {
            return Err(failed("peer public key rejected"));
        }
        let peer_key = Key(peer_key);
        let ctx = Ctx(EVP_PKEY_CTX_new_from_pkey(
            ptr::null_mut(),
            key.0,
            property_query.as_ptr(),
        ));
        if ctx.0.is_null()
            || sys::EVP_PKEY_derive_init(ctx.0) != 1
            || sys::EVP_PKEY_derive_set_peer(ctx.0, peer_key.0) != 1
        {
            return Err(failed("agreement cannot start"));
        }
        let provider = super::ffi::pkey_ctx_provider(ctx.0);
        let mut secret = [0u8; X25519_LEN];
        let mut len = X25519_LEN;
        if sys::EVP_PKEY_derive(ctx.0, secret.as_mut_ptr(), &mut len) != 1 || len != X25519_LEN {
            return Err(failed("agreement failed"));
        }
        Ok((secret, provider))
    }
}

/// Generates a key pair with the implementation `property_query` selects and returns its
/// raw halves: the body of the QAT signer's key-stock jobs (`?provider=qatprovider`, where
/// generation pauses the job until its batch of eight is computed).
pub(super) fn generate_raw(property_query: &CStr) -> Result<RawKeyPair, String> {
    let (key, public_key) = generate(property_query)?;
    let mut private_key = [0u8; X25519_LEN];
    let mut len = X25519_LEN;
    // SAFETY: a live key; the buffer is of the length passed.
    if unsafe { sys::EVP_PKEY_get_raw_private_key(key.0, private_key.as_mut_ptr(), &mut len) } != 1
        || len != X25519_LEN
    {
        return Err(failed("private key unavailable"));
    }
    Ok(RawKeyPair {
        private_key,
        public_key,
    })
}

/// A default-provider key from a pair's raw halves; both are given, so OpenSSL does not
/// compute the public key again.
fn from_raw(pair: &RawKeyPair) -> Result<Key, String> {
    // SAFETY: the parameter array points at the pair's buffers, which outlive the call; the
    // context and key are owned by guards.
    unsafe {
        let ctx = Ctx(sys::EVP_PKEY_CTX_new_from_name(
            ptr::null_mut(),
            c"X25519".as_ptr(),
            DEFAULT_PROVIDER.as_ptr(),
        ));
        if ctx.0.is_null() || sys::EVP_PKEY_fromdata_init(ctx.0) != 1 {
            return Err(failed("key import cannot start"));
        }
        let params = [
            sys::OSSL_PARAM_construct_octet_string(
                c"priv".as_ptr(),
                pair.private_key.as_ptr() as *mut _,
                X25519_LEN,
            ),
            sys::OSSL_PARAM_construct_octet_string(
                c"pub".as_ptr(),
                pair.public_key.as_ptr() as *mut _,
                X25519_LEN,
            ),
            sys::OSSL_PARAM_construct_end(),
        ];
        let mut pkey = ptr::null_mut();
        if sys::EVP_PKEY_fromdata(
            ctx.0,
            &mut pkey,
            sys::EVP_PKEY_KEYPAIR,
            params.as_ptr() as *mut _,
        ) != 1
            || pkey.is_null()
        {
            return Err(failed("key import failed"));
        }
        Ok(Key(pkey))
    }
}

/// X25519 on OpenSSL's default provider, named outright (see the module doc).
#[derive(Debug)]
pub struct SoftwareX25519;

/// The one instance (`CryptoProvider::kx_groups` holds `&'static` groups).
pub static SOFTWARE_X25519: SoftwareX25519 = SoftwareX25519;

#[derive(Debug)]
pub(super) struct SoftwareKeyExchange {
    key: Key,
    public_key: [u8; X25519_LEN],
}

impl SoftwareKeyExchange {
    /// An exchange with a key pair from the stock (see `QatX25519` in `key`).
    pub(super) fn from_pair(pair: &RawKeyPair) -> Result<Self, Error> {
        Ok(Self {
            key: from_raw(pair).map_err(Error::General)?,
            public_key: pair.public_key,
        })
    }
}

impl SupportedKxGroup for SoftwareX25519 {
    fn start(&self) -> Result<Box<dyn ActiveKeyExchange>, Error> {
        let (key, public_key) = generate(DEFAULT_PROVIDER).map_err(Error::General)?;
        Ok(Box::new(SoftwareKeyExchange { key, public_key }))
    }

    fn name(&self) -> NamedGroup {
        NamedGroup::X25519
    }
}

impl ActiveKeyExchange for SoftwareKeyExchange {
    fn complete(self: Box<Self>, peer_pub_key: &[u8]) -> Result<SharedSecret, Error> {
        let (secret, _) = agree(&self.key, peer_pub_key, DEFAULT_PROVIDER)
            .map_err(|e| Error::PeerMisbehaved(peer_misbehaved(e)))?;
        Ok(SharedSecret::from(&secret[..]))
    }

    fn pub_key(&self) -> &[u8] {
        &self.public_key
    }

    fn group(&self) -> NamedGroup {
        NamedGroup::X25519
    }
}

/// A key share that does not agree (a low-order point gives an all-zero secret, which
/// OpenSSL refuses) is the peer's fault; rustls has one name for it.
fn peer_misbehaved(detail: String) -> rustls::PeerMisbehaved {
    tracing::debug!(%detail, "X25519 agreement refused");
    rustls::PeerMisbehaved::InvalidKeyShare
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two software exchanges agree, and a peer share of the wrong size or of low order
    /// is refused as the peer's fault.
    #[test]
    fn software_x25519_agrees_and_refuses_bad_shares() {
        openssl::init();
        let a = SOFTWARE_X25519.start().unwrap();
        let b = SOFTWARE_X25519.start_and_complete(a.pub_key()).unwrap();
        let a_secret = a.complete(&b.pub_key).unwrap();
        assert_eq!(a_secret.secret_bytes(), b.secret.secret_bytes());
        assert_eq!(b.pub_key.len(), X25519_LEN);

        let short = SOFTWARE_X25519.start().unwrap().complete(&[9; 31]);
        assert!(
            matches!(short, Err(Error::PeerMisbehaved(_))),
            "{:?}",
            short.err()
        );
        let low_order = SOFTWARE_X25519.start().unwrap().complete(&[0; 32]);
        assert!(
            matches!(low_order, Err(Error::PeerMisbehaved(_))),
            "{:?}",
            low_order.err()
        );
    }

    /// The software path is fetched from OpenSSL's default provider.
    #[test]
    fn software_x25519_is_fetched_from_the_default_provider() {
        openssl::init();
        let (key, _) = generate(DEFAULT_PROVIDER).unwrap();
        let (_, peer) = generate(DEFAULT_PROVIDER).unwrap();
        let (_, provider) = agree(&key, &peer, DEFAULT_PROVIDER).unwrap();
        assert_eq!(
            super::super::signer::ProviderRef(provider).name(),
            "default"
        );
    }
}
