//! TLS session-ticket encryption with OpenSSL's AES-256-GCM, from its default provider.
//!
//! rustls-openssl ships no ticketer, and borrowing ring's or aws-lc-rs' would mean an
//! "openssl" measurement runs another library's code on every resumed handshake.
//!
//! The cipher is fetched by name with `provider=default`, never through the legacy
//! `EVP_aes_256_gcm()`, whose implicit fetch was measured to land in QAT_Engine's provider
//! when openssl-qat has it loaded, despite the process's `?provider=default` preference:
//! qat_sw's AES-GCM corrupted the heap there (`malloc(): corrupted top size`, the proxy
//! aborted at the first resumed handshakes of 32 clients).

use std::sync::{Arc, OnceLock};

use openssl::cipher::Cipher;
use openssl::cipher_ctx::CipherCtx;
use openssl::rand::rand_bytes;
use rustls::crypto::GetRandomFailed;
use rustls::server::ProducesTickets;
use rustls::ticketer::TicketRotator;

/// How long one ticket key encrypts new tickets (tickets stay valid for twice this).
/// Six hours is what rustls' own ticketers use: frequent enough for timely key erasure.
const TICKET_KEY_LIFETIME_SECS: u32 = 6 * 60 * 60;
const KEY_NAME_LEN: usize = 16;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;

/// AES-256-GCM from OpenSSL's default provider, fetched once.
fn aes_256_gcm() -> Option<&'static Cipher> {
    static CIPHER: OnceLock<Option<Cipher>> = OnceLock::new();
    CIPHER
        .get_or_init(|| Cipher::fetch(None, "AES-256-GCM", Some("provider=default")).ok())
        .as_ref()
}

/// One AEAD operation: `aad` authenticated, `input` encrypted or decrypted with `key` and
/// `nonce`; on encryption the tag is written into `tag`, on decryption it is checked.
fn seal_or_open(
    encrypt: bool,
    key: &[u8; 32],
    nonce: &[u8],
    aad: &[u8],
    input: &[u8],
    tag: &mut [u8; TAG_LEN],
) -> Option<Vec<u8>> {
    let cipher = aes_256_gcm()?;
    let mut ctx = CipherCtx::new().ok()?;
    if encrypt {
        ctx.encrypt_init(Some(cipher), Some(key), Some(nonce))
            .ok()?;
    } else {
        ctx.decrypt_init(Some(cipher), Some(key), Some(nonce))
            .ok()?;
        ctx.set_tag(tag).ok()?;
    }
    ctx.cipher_update(aad, None).ok()?;
    let mut out = Vec::with_capacity(input.len() + 16);
    ctx.cipher_update_vec(input, &mut out).ok()?;
    ctx.cipher_final_vec(&mut out).ok()?;
    if encrypt {
        ctx.tag(tag).ok()?;
    }
    Some(out)
}

/// A rotating ticketer whose ticket keys are fresh OpenSSL AES-256-GCM keys.
pub(super) fn new() -> Result<Arc<dyn ProducesTickets>, rustls::Error> {
    Ok(Arc::new(TicketRotator::new(
        TICKET_KEY_LIFETIME_SECS,
        generate,
    )?))
}

fn generate() -> Result<Box<dyn ProducesTickets>, GetRandomFailed> {
    let mut key = [0u8; 32];
    let mut key_name = [0u8; KEY_NAME_LEN];
    rand_bytes(&mut key).map_err(|_| GetRandomFailed)?;
    rand_bytes(&mut key_name).map_err(|_| GetRandomFailed)?;
    Ok(Box::new(AeadTicketer {
        key,
        key_name,
        lifetime: TICKET_KEY_LIFETIME_SECS,
    }))
}

struct AeadTicketer {
    key: [u8; 32],
    key_name: [u8; KEY_NAME_LEN],
    lifetime: u32,
}

impl std::fmt::Debug for AeadTicketer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("AeadTicketer")
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}

impl ProducesTickets for AeadTicketer {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        self.lifetime
    }

    /// Ticket layout: key name || nonce || ciphertext || tag; the key name is the AAD, so a
    /// ticket from another key fails authentication instead of decrypting to garbage.
    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let mut nonce = [0u8; NONCE_LEN];
        rand_bytes(&mut nonce).ok()?;
        let mut tag = [0u8; TAG_LEN];
        let ciphertext = seal_or_open(true, &self.key, &nonce, &self.key_name, plain, &mut tag)?;
        let mut out = Vec::with_capacity(KEY_NAME_LEN + NONCE_LEN + ciphertext.len() + TAG_LEN);
        out.extend_from_slice(&self.key_name);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ciphertext);
        out.extend_from_slice(&tag);
        Some(out)
    }

    fn decrypt(&self, ticket: &[u8]) -> Option<Vec<u8>> {
        if ticket.len() < KEY_NAME_LEN + NONCE_LEN + TAG_LEN {
            return None;
        }
        let (key_name, rest) = ticket.split_at(KEY_NAME_LEN);
        if key_name != self.key_name {
            return None;
        }
        let (nonce, rest) = rest.split_at(NONCE_LEN);
        let (ciphertext, tag) = rest.split_at(rest.len() - TAG_LEN);
        let mut tag: [u8; TAG_LEN] = tag.try_into().ok()?;
        seal_or_open(false, &self.key, nonce, key_name, ciphertext, &mut tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_tamper_detection() {
        let t = new().unwrap();
        let ticket = t.encrypt(b"session state").unwrap();
        assert_eq!(t.decrypt(&ticket).unwrap(), b"session state");
        let mut bad = ticket.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(t.decrypt(&bad).is_none());
        assert!(t.decrypt(&ticket[..10]).is_none());
        // Another ticketer's key cannot open it.
        assert!(new().unwrap().decrypt(&ticket).is_none());
    }
}
