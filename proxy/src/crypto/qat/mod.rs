//! OpenSSL + Intel QuickAssist: loading QAT_Engine's OpenSSL 3 provider with the settings
//! it really reads, signing through it asynchronously and batched, and proving at start-up
//! that it offloads; and which provider a listener that asks for openssl-qat is served by
//! ([`provider_in_effect`]: the proof, and the software fallback `qat.fallback` allows).
//!
//! QAT_Engine's provider (v1.8 and later) takes its settings from its section of an OpenSSL
//! configuration file (`enable_external_polling`, `qat_poll_interval`, ...), read once when
//! the provider is activated; it answers no settings through `OSSL_PROVIDER_get_params`.
//! So the proxy writes that section from `[qat]` and loads it with
//! `OSSL_LIB_CTX_load_config`, unless `OPENSSL_CONF` already activated the provider, in
//! which case that file's settings are the ones in force and the log says so.
//!
//! Nothing else of OpenSSL is pointed at the provider: no default property query is set, so
//! the record layer (AES-GCM), hashes and key exchange stay on OpenSSL's default provider,
//! and only signatures are fetched from QAT, with an explicit property query, inside the
//! ASYNC jobs of [`signer::AsyncSigner`]. A provider that signs without pausing its job is
//! loaded but not offloading, and the start-up proof says so.

// Rooms: `settings` ([qat] and the section written for the provider), `activation` (loading
// it once, who polls it, the signer, which provider a listener gets), `proof` (the start-up
// proof), `signer` (batched asynchronous signing), `key` and `kx` (the rustls side),
// `telemetry` (QAT hardware's counters), `ffi` (the OpenSSL and loader calls).
mod activation;
mod ffi;
pub mod key;
pub mod kx;
mod proof;
mod settings;
pub mod signer;
pub mod telemetry;

use std::ffi::CString;

pub use activation::{
    activate, activate_per_fallback, active, provider_in_effect, Activation, InEffect, Mode,
    QatState, SettingsSource,
};
pub use proof::SigningProof;
pub use settings::{
    Fallback, Polling, QatConfig, DEFAULT_BATCH, DEFAULT_BATCH_WAIT,
    DEFAULT_MAX_SIGNATURES_IN_FLIGHT, DEFAULT_POLL_INTERVAL, DEFAULT_PROVIDER_NAME,
    ROUTE_EVERYTHING_ELSE,
};

/// Why the provider could not be used, by what failed: callers decide on it (a key that
/// cannot be read is never "fixed" by the software fallback). Every message says which
/// module, name or key file was involved.
#[derive(Clone, Debug, thiserror::Error)]
pub enum QatError {
    /// `[qat]` cannot be used as written.
    #[error("{0}")]
    Config(String),
    /// The provider could not be loaded or set up (module missing, OpenSSL refused it,
    /// the signer thread would not start).
    #[error("{0}")]
    Unavailable(String),
    /// The key the start-up proof signs with cannot be read.
    #[error("{0}")]
    Key(String),
    /// Nothing would be offloaded: the key is of a kind QAT does not sign, or a signature
    /// failed inside the provider, came from another provider, ran without pausing its
    /// job, or does not verify.
    #[error("{0}")]
    NotOffloading(String),
}

/// Whether `/proc/cpuinfo` lists CPU flags without `avx512ifma` (false when unreadable).
/// The proxy reads it only when a signature failed inside the provider, to name the likely
/// cause: qat_sw's multi-buffer RSA and ECDSA (crypto_mb) need AVX-512 IFMA.
pub fn cpu_lacks_avx512_ifma() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|info| {
        info.lines()
            .find(|l| l.starts_with("flags"))
            .is_some_and(|flags| !flags.split_whitespace().any(|f| f == "avx512ifma"))
    })
}

/// Whether handshakes with a certificate of this algorithm (its metric label, e.g.
/// "ecdsa-p256") send their signatures to the active QAT provider.
pub fn offloads_signatures_of(algorithm_label: &str) -> bool {
    active().is_some_and(|state| state.offload_p256 || algorithm_label != "ecdsa-p256")
}

/// Whether handshakes with a certificate of this algorithm (its metric label) sign on a
/// blocking thread even when no batch can form: where one software signature holds a
/// reactor thread long enough to starve its accept loop (RSA from 3072 bits: milliseconds;
/// P-384 and P-521, which OpenSSL 3.0 signs without a fast implementation: about 0.8 ms,
/// and which a qat_sw batch of one beats). RSA-2048 (0.25 ms) and P-256 sign on the reactor
/// below a batch's worth of handshakes: under `loadgen compare`'s 0.1-core budget, handing
/// every RSA-2048 handshake to a blocking thread cost a quarter of openssl-qat's
/// requests/s (77.6 against 102 for openssl).
pub fn signs_off_the_reactor(algorithm_label: &str) -> bool {
    !matches!(algorithm_label, "rsa2048" | "ecdsa-p256")
}

fn cstring(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"))
}
