//! What the signer works with and counts: the kinds of operation it batches, the
//! signatures it returns, its counters, the key stock, and the two decisions of its batch
//! former ([`part_batch_waits`], [`part_batch_pays`]) as plain functions of what it knows.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::os::raw::{c_char, c_int};
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::time::Duration;

use openssl::pkey::{Id, PKey, Private};
use openssl_sys as sys;

use super::super::kx;

extern "C" {
    fn OSSL_PROVIDER_get0_name(prov: *const sys::OSSL_PROVIDER) -> *const c_char;
}

/// X25519 key pairs the signer keeps generated ahead, in batches: a handshake takes one
/// without waiting, and when fewer than half are left the signer generates batches up to
/// this again. Four batches cover a burst of 32 new connections (the study's clients).
pub(super) const KEY_STOCK_BATCHES: usize = 4;

/// How an RSA signature is padded (ECDSA has none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding {
    /// ECDSA, or anything without RSA padding.
    None,
    /// RSASSA-PKCS1-v1_5 (TLS 1.2).
    Pkcs1,
    /// RSASSA-PSS with a salt as long as the digest (TLS 1.3 and modern TLS 1.2).
    Pss,
}

/// A finished signature and what the signer saw while producing it.
#[derive(Debug)]
pub struct Signed {
    /// The signature.
    pub signature: Vec<u8>,
    /// True when the provider paused the job, i.e. really took the request asynchronously
    /// (offloaded); false when it signed inline, as a provider that is loaded but not
    /// offloading does (qat_sw switched off for the CPU, no QAT device).
    pub paused: bool,
    /// The provider the signature operation was fetched from.
    pub provider: ProviderRef,
    /// Signed by OpenSSL's default provider on purpose (low load), not through QAT.
    pub in_software: bool,
}

/// The provider an operation was fetched from, kept as OpenSSL's handle so that a
/// handshake's signature costs no string; [`name`](Self::name) when it is wanted.
#[derive(Clone, Copy, Debug)]
pub struct ProviderRef(pub(crate) *const sys::OSSL_PROVIDER);

// SAFETY: a pointer to a provider OpenSSL keeps loaded for the life of the process; it is
// only read (its name), never freed.
unsafe impl Send for ProviderRef {}

impl ProviderRef {
    /// The provider's name, or "(not fetched)".
    pub fn name(&self) -> String {
        if self.0.is_null() {
            return "(not fetched)".to_owned();
        }
        // SAFETY: a live provider handle from OpenSSL; the name is a NUL-terminated string
        // the provider owns for the life of the process.
        unsafe { CStr::from_ptr(OSSL_PROVIDER_get0_name(self.0)) }
            .to_string_lossy()
            .into_owned()
    }
}

/// Why a signature failed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// OpenSSL (the provider) reported an error; the text is OpenSSL's error queue.
    #[error("OpenSSL provider {provider:?} failed to sign: {reason}")]
    Provider {
        /// Where the signature operation was fetched from ("(not fetched)" when the fetch
        /// itself failed).
        provider: String,
        /// OpenSSL's error queue.
        reason: String,
    },
    /// The signer thread is gone or did not answer in time.
    #[error("the QAT signer did not answer: {0}")]
    Signer(&'static str),
}

/// Counters the metrics read, and the demand the batch former reads.
#[derive(Debug, Default)]
pub struct SignerStats {
    /// Signatures asked of the signer and not yet returned (held for a batch, paused in the
    /// provider, or waiting for a job slot).
    pub in_flight: AtomicI64,
    /// Signatures the provider took asynchronously.
    pub offloaded: AtomicU64,
    /// Signatures the provider produced inside a job without pausing (not offloaded).
    pub inline: AtomicU64,
    /// Signatures made in software by OpenSSL's default provider: too few handshakes were
    /// under way to fill a batch, or a part batch was handed back because it could not fill.
    pub software: AtomicU64,
    /// Signatures that failed.
    pub failed: AtomicU64,
    /// Times a job was resumed because the provider had no free request slot (EAGAIN).
    pub retries: AtomicU64,
    /// Full batches submitted to the provider.
    pub batches: AtomicU64,
    /// Part batches handed back to be signed in software (the signatures are counted in
    /// `software`).
    pub released: AtomicU64,
    /// Part batches submitted as they were (see [`part_batch_pays`]).
    pub part_batches: AtomicU64,
    /// openssl-qat handshakes under way, as counted by [`HandshakeInFlight`](super::HandshakeInFlight).
    pub handshakes: AtomicI64,
    /// Of those, the ones whose signature has not yet been asked for: the signatures still
    /// to come that a part batch may wait for.
    pub to_sign: AtomicI64,
    /// X25519 key pairs handshakes took from the stock generated in provider batches.
    pub keys_from_stock: AtomicU64,
    /// X25519 key pairs generated in software because the stock was empty.
    pub keys_in_software: AtomicU64,
    /// X25519 key generations that failed in the provider.
    pub keys_failed: AtomicU64,
    /// Signatures held in part batches right now; a handshake that stops counting towards
    /// `to_sign` without a signature nudges the signer only while this is non-zero.
    pub held: AtomicI64,
    /// The fastest a batch of each kind took, from submission to its signatures: what a part
    /// batch sent to the provider costs (the fastest, because the provider computes a batch
    /// alone, and any longer time is waiting for a CPU). Written by the signer thread, read
    /// by handshakes deciding whether a lone signature pays in the provider.
    batch_costs: std::sync::RwLock<Vec<(OperationKind, Duration)>>,
}

impl SignerStats {
    /// The fastest batch of `kind` measured so far.
    pub fn batch_cost(&self, kind: OperationKind) -> Option<Duration> {
        let costs = self.batch_costs.read().unwrap_or_else(|p| p.into_inner());
        costs.iter().find(|(k, _)| *k == kind).map(|(_, c)| *c)
    }

    pub(super) fn record_batch_cost(&self, kind: OperationKind, took: Duration) {
        let mut costs = self.batch_costs.write().unwrap_or_else(|p| p.into_inner());
        match costs.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, cost)) => *cost = (*cost).min(took),
            None => costs.push((kind, took)),
        }
    }
}

/// What kind of private-key operation a signature is. qat_sw keeps one queue per kind (RSA
/// by modulus size, ECDSA by curve) and computes eight of one kind per pass, so a batch is
/// formed of one kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OperationKind {
    id: c_int,
    bits: u32,
}

impl OperationKind {
    /// An X25519 key generation (qat_sw batches it).
    pub const X25519: Self = Self {
        id: sys::EVP_PKEY_X25519,
        bits: 253,
    };

    /// True for ECDSA on P-256, whose batches gain least (see `QatConfig::offload_p256`).
    pub fn is_p256(&self) -> bool {
        self.id == Id::EC.as_raw() && self.bits == 256
    }

    /// The kind of a signature made with `key`.
    pub fn of(key: &PKey<Private>) -> Self {
        Self {
            id: key.id().as_raw(),
            bits: key.bits(),
        }
    }

    /// "RSA-2048", "EC-256", for logs.
    pub fn describe(&self) -> String {
        let name = match Id::from_raw(self.id) {
            Id::RSA => "RSA",
            Id::EC => "EC",
            Id::X25519 => "X25519",
            _ => "key",
        };
        format!("{name}-{}", self.bits)
    }
}

/// How long a part batch has waited: on the wall clock, and in the process's CPU time (what
/// the handshakes that could fill it had to run on).
#[derive(Clone, Copy, Debug)]
pub struct Waited {
    /// Wall-clock time since its oldest signature arrived.
    pub wall: Duration,
    /// The process's CPU time since then, all threads together.
    pub cpu: Duration,
}

/// The longest a part batch that can fill waits on the wall clock, however little CPU the
/// process got meanwhile (or `batch_wait`, where that is longer): two CFS periods as systemd
/// (`CPUQuotaPeriodSec=`) and Kubernetes set them (100 ms), so that a batch begun at the end
/// of one quota slice can fill in the next after the process was frozen in between; the
/// most qat_sw's own poll timer waits too (it steps from 10 ms up to 200 ms).
pub const THROTTLED_WAIT_LIMIT: Duration = Duration::from_millis(200);

/// How long (in progress: see [`part_batch_waits`]) a part batch that can fill may wait:
/// `batch_wait`, or twice the time a whole batch takes to arrive at the measured gap between
/// two signatures of its kind where that is longer, up to [`THROTTLED_WAIT_LIMIT`]. Under a
/// CPU budget RSA-4096 signatures arrive several milliseconds of process CPU apart (every
/// handshake also decrypts its request), and a fixed wait shorter than a batch's arrival sent
/// on part batches that the next few arrivals would have filled.
pub fn rate_aware_wait(
    batch_wait: Duration,
    arrival_gap: Option<Duration>,
    batch: usize,
) -> Duration {
    let to_fill = arrival_gap.map_or(Duration::ZERO, |gap| gap * 2 * batch as u32);
    batch_wait.max(to_fill.min(THROTTLED_WAIT_LIMIT))
}

/// Whether a part batch keeps waiting. While the signatures held (`held`) and those still
/// to come from handshakes under way (`to_come`) make a batch, for `batch_wait` of progress:
/// the lesser of wall-clock and process CPU time, so that a proxy under a CPU budget, frozen
/// by its quota while its handshakes queue, does not count the frozen time as waiting
/// (the rate-aware gate QAT_Engine's poll timer and Envoy's CryptoMB timer are), though
/// never past [`THROTTLED_WAIT_LIMIT`] (or `batch_wait`, where that is longer). And in any case for as long as one software
/// signature of its kind takes on the wall clock (`software_cost`: RSA-4096's 4 ms), since
/// a handshake waiting that long is delayed no more than signing it in software would
/// delay it, and its thread burns no CPU meanwhile: at low load, when nothing can fill, that
/// is all a handshake ever waits.
pub fn part_batch_waits(
    held: usize,
    to_come: i64,
    batch: usize,
    waited: Waited,
    batch_wait: Duration,
    software_cost: Duration,
) -> bool {
    let can_fill = held as i64 + to_come.max(0) >= batch as i64;
    let progress = waited.wall.min(waited.cpu);
    held < batch
        && ((can_fill
            && progress < batch_wait.max(software_cost)
            && waited.wall < batch_wait.max(THROTTLED_WAIT_LIMIT))
            || waited.wall < software_cost)
}

/// Whether a part batch of `held` signatures goes to the provider as it is rather than to
/// software: when `held` software signatures cost more than one whole batch (its fastest
/// measured time; unknown until a batch of the kind has run, then no).
pub fn part_batch_pays(held: usize, software_cost: Duration, batch_cost: Option<Duration>) -> bool {
    batch_cost.is_some_and(|batch| software_cost * held as u32 > batch)
}

/// X25519 key pairs generated ahead in provider batches (see `kx`).
#[derive(Default)]
pub(super) struct KeyStock {
    pub(super) pairs: std::sync::Mutex<Vec<kx::RawKeyPair>>,
    /// A batch of key generations is under way (asked for once).
    pub(super) refilling: std::sync::atomic::AtomicBool,
}
