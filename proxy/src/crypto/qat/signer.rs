//! Asynchronous batched signing for openssl-qat: one thread that forms full batches of
//! signatures and runs each batch as OpenSSL ASYNC jobs, the way nginx and HAProxy drive
//! QAT_Engine, but with the batch formed here rather than left to the provider's timer.
//!
//! QAT (hardware, and qat_sw's multi-buffer code) gains only when a signature runs inside
//! an OpenSSL ASYNC job: the provider queues the request, pauses the job, and completes a
//! whole batch at once (qat_sw: eight RSA or ECDSA operations per AVX-512 pass), then wakes
//! each job. rustls signs synchronously, so a handshake's `Signer::sign` hands its message
//! to [`AsyncSigner`] and waits (on a blocking-pool thread, never a reactor thread: see
//! `tls::accept`), while the signer thread starts a job per request and resumes each one
//! when the provider calls back. All jobs run on the one signer thread on purpose: qat_sw's
//! request queues are thread-local, so requests batch only when submitted from one thread.
//!
//! **Only full batches reach the provider.** qat_sw computes a queue the moment its eighth
//! request arrives (it counts submissions per thread and wakes its polling thread at every
//! eighth), and otherwise only when its polling timer fires, 10 ms to 200 ms later: a part
//! batch sent there waits that long, costs the CPU of a full one, and shifts the count so
//! that later full batches wait for the timer too. So the signer holds signatures of one
//! kind (qat_sw's queue: RSA by modulus size, ECDSA by curve) until `batch` of them are
//! there and submits them together. A part batch waits ([`part_batch_waits`]) while the
//! signatures held plus the openssl-qat handshakes accepted that have not yet asked for
//! theirs ([`SignerStats::to_sign`]) make a batch, for at most `batch_wait`, and in any case
//! as long as one software signature of its kind takes (measured when the key is loaded):
//! a handshake waiting that long is delayed no more than signing would delay it. When it
//! stops waiting it is either completed with throw-away signatures, where the held ones
//! would cost more in software than a whole batch costs ([`padding_pays`], with the
//! fastest batch of the kind seen so far), or handed back: each handshake then signs in
//! software on its own thread, in parallel, as `openssl` would.
//!
//! The signer also keeps X25519 key pairs generated ahead in full batches (see `kx`).
//!
//! Below a batch's worth of openssl-qat handshakes under way nothing can fill, so the
//! signing step never leaves the thread that runs the handshake and signs in software
//! directly: a handshake at low load costs what it costs with `openssl`. QAT hardware,
//! which does not batch, runs with `batch = 1`: every signature goes to the provider.
//!
//! Only the signature goes to the QAT provider, fetched with an explicit property query;
//! the record layer, key exchange and everything else stay on OpenSSL's default provider.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::collections::VecDeque;
use std::ffi::{c_void, CStr, CString};
use std::os::raw::{c_char, c_int};
use std::ptr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use foreign_types::ForeignType;
use openssl::pkey::{Id, PKey, Private};
use openssl_sys as sys;

use super::kx;

/// How long a handshake waits for its signature before failing: far beyond any batch
/// wait, short enough that a wedged provider fails handshakes instead of hanging them.
const SIGN_TIMEOUT: Duration = Duration::from_secs(10);

thread_local! {
    /// Set while this thread runs a handshake's signing step that may wait for a batch
    /// (see [`AsyncSigner::offload_step`]).
    static MAY_WAIT_FOR_BATCH: Cell<bool> = const { Cell::new(false) };
    /// Set when that step's signature was handed to the signer, so the step knows its
    /// handshake no longer counts as one still to sign.
    static ASKED_THE_SIGNER: Cell<bool> = const { Cell::new(false) };
}

/// X25519 key pairs the signer keeps generated ahead, in batches: a handshake takes one
/// without waiting, and when fewer than half are left the signer generates batches up to
/// this again. Four batches cover a burst of 32 new connections (the study's clients).
const KEY_STOCK_BATCHES: usize = 4;

/// How soon a job the provider turned away (no free request slot) is tried again.
const RETRY_TICK: Duration = Duration::from_micros(50);

#[repr(C)]
struct AsyncJob {
    _private: [u8; 0],
}
#[repr(C)]
struct AsyncWaitCtx {
    _private: [u8; 0],
}

// ASYNC_start_job results and ASYNC_WAIT_CTX statuses (openssl/async.h).
const ASYNC_ERR: c_int = 0;
const ASYNC_NO_JOBS: c_int = 1;
const ASYNC_PAUSE: c_int = 2;
const ASYNC_FINISH: c_int = 3;
const ASYNC_STATUS_OK: c_int = 2;
const ASYNC_STATUS_EAGAIN: c_int = 3;

type JobFn = extern "C" fn(*mut c_void) -> c_int;
type CallbackFn = extern "C" fn(*mut c_void) -> c_int;

extern "C" {
    fn ASYNC_init_thread(max_size: usize, init_size: usize) -> c_int;
    fn ASYNC_start_job(
        job: *mut *mut AsyncJob,
        ctx: *mut AsyncWaitCtx,
        ret: *mut c_int,
        func: JobFn,
        args: *mut c_void,
        size: usize,
    ) -> c_int;
    fn ASYNC_WAIT_CTX_new() -> *mut AsyncWaitCtx;
    fn ASYNC_WAIT_CTX_set_callback(
        ctx: *mut AsyncWaitCtx,
        callback: CallbackFn,
        callback_arg: *mut c_void,
    ) -> c_int;
    fn ASYNC_WAIT_CTX_get_status(ctx: *mut AsyncWaitCtx) -> c_int;
    fn ASYNC_WAIT_CTX_set_status(ctx: *mut AsyncWaitCtx, status: c_int) -> c_int;
    fn EVP_DigestSignInit_ex(
        ctx: *mut sys::EVP_MD_CTX,
        pctx: *mut *mut sys::EVP_PKEY_CTX,
        mdname: *const c_char,
        libctx: *mut sys::OSSL_LIB_CTX,
        props: *const c_char,
        pkey: *mut sys::EVP_PKEY,
        params: *const sys::OSSL_PARAM,
    ) -> c_int;
    fn EVP_PKEY_CTX_get0_provider(ctx: *const sys::EVP_PKEY_CTX) -> *const sys::OSSL_PROVIDER;
    fn OSSL_PROVIDER_get0_name(prov: *const sys::OSSL_PROVIDER) -> *const c_char;
}

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
pub struct ProviderRef(pub(super) *const sys::OSSL_PROVIDER);

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
    /// Throw-away signatures that completed part batches (see [`padding_pays`]).
    pub padding: AtomicU64,
    /// openssl-qat handshakes under way, as counted by [`HandshakeInFlight`].
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
}

/// Counts one openssl-qat handshake under way while alive (see [`SignerStats::handshakes`]
/// and [`SignerStats::to_sign`]).
pub struct HandshakeInFlight {
    stats: Arc<SignerStats>,
    tx: mpsc::Sender<Message>,
    to_sign: bool,
}

impl HandshakeInFlight {
    /// Starts counting, as a handshake whose signature is still to come.
    pub fn new(signer: &AsyncSigner) -> Self {
        signer.stats.handshakes.fetch_add(1, Ordering::Relaxed);
        signer.stats.to_sign.fetch_add(1, Ordering::Relaxed);
        Self {
            stats: signer.stats.clone(),
            tx: signer.tx.clone(),
            to_sign: true,
        }
    }

    /// True when enough openssl-qat handshakes are under way that this one's signature may
    /// complete a batch (always, for `batch = 1`).
    pub fn may_fill_a_batch(&self, signer: &AsyncSigner) -> bool {
        self.stats.handshakes.load(Ordering::Relaxed) >= signer.batch as i64
    }

    /// This handshake will ask the signer for no signature (it signed elsewhere, was
    /// resumed, or failed): part batches held for it stop waiting.
    pub fn asks_no_more(&mut self) {
        if std::mem::take(&mut self.to_sign) {
            self.stats.to_sign.fetch_sub(1, Ordering::Relaxed);
            if self.stats.held.load(Ordering::Relaxed) > 0 {
                let _ = self.tx.send(Message::Review);
            }
        }
    }
}

impl Drop for HandshakeInFlight {
    fn drop(&mut self) {
        self.asks_no_more();
        self.stats.handshakes.fetch_sub(1, Ordering::Relaxed);
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

/// Whether a part batch keeps waiting. While the signatures held (`held`) and those still
/// to come from handshakes under way (`to_come`) make a batch, for at most `batch_wait`;
/// and in any case for as long as one software signature of its kind takes
/// (`software_cost`: RSA-4096's 4 ms), since a handshake waiting that long is delayed no
/// more than signing it in software would delay it, and its thread burns no CPU meanwhile.
pub fn part_batch_waits(
    held: usize,
    to_come: i64,
    batch: usize,
    waited: Duration,
    batch_wait: Duration,
    software_cost: Duration,
) -> bool {
    let can_fill = held as i64 + to_come.max(0) >= batch as i64;
    held < batch && ((can_fill && waited < batch_wait.max(software_cost)) || waited < software_cost)
}

struct Request {
    kind: OperationKind,
    work: Work,
    /// What this signature costs in software here, measured when its key was loaded.
    software_cost: Duration,
    /// When it went to the provider.
    submitted: Option<Instant>,
    property_query: Arc<CString>,
    // Filled in by the job.
    output: Output,
    provider: ProviderRef,
    error: Option<String>,
    /// None for work no handshake waits for (the key stock's).
    reply: Option<mpsc::SyncSender<Answer>>,
}

impl Request {
    /// A copy of this signature's work that nobody waits for: completes a part batch.
    fn throwaway_copy(&self) -> Box<Request> {
        let work = match &self.work {
            Work::Sign {
                key,
                digest,
                padding,
                message,
            } => Work::Sign {
                key: key.clone(),
                digest,
                padding: *padding,
                message: message.clone(),
            },
            Work::X25519Keygen => Work::X25519Keygen,
        };
        Box::new(Request {
            kind: self.kind,
            work,
            software_cost: self.software_cost,
            submitted: None,
            property_query: self.property_query.clone(),
            output: Output::None,
            provider: ProviderRef(ptr::null()),
            error: None,
            reply: None,
        })
    }
}

/// Whether completing a part batch of `held` signatures with throw-away ones costs less
/// CPU than signing the held ones in software: `held` software signatures against one full
/// batch (its measured time; unknown until a full batch of the kind has run, then no).
pub fn padding_pays(held: usize, software_cost: Duration, batch_cost: Option<Duration>) -> bool {
    batch_cost.is_some_and(|batch| software_cost * held as u32 > batch)
}

/// What a job computes.
enum Work {
    /// One `EVP_DigestSign`.
    Sign {
        key: Arc<PKey<Private>>,
        digest: &'static CStr,
        padding: Padding,
        message: Vec<u8>,
    },
    /// An X25519 key generation, for the stock.
    X25519Keygen,
}

/// What a job produced.
enum Output {
    None,
    Signature(Vec<u8>),
    KeyPair(kx::RawKeyPair),
}

/// A job's outcome before it is told apart as a signature or a key pair.
struct Finished {
    output: Output,
    paused: bool,
    provider: ProviderRef,
}

/// What the signer thread answers.
enum Answer {
    /// The job finished (paused or not).
    Done(Result<Finished, SignError>),
    /// The part batch this signature was held in could not fill: sign it in software.
    SignInSoftware,
}

enum Message {
    /// A handshake's signature, to be batched.
    Sign(Box<Request>),
    /// Submit at once as one group, whatever its size (the start-up proof's full batch).
    /// Boxed one by one: a running job points at its request, which must not move while
    /// queues shuffle.
    #[allow(clippy::vec_box)]
    SignGroup(Vec<Box<Request>>),
    /// The provider finished (or may have finished) the job in this slot.
    Resume(usize),
    /// A handshake stopped counting as one still to sign: see whether a part batch can
    /// still fill.
    Review,
    /// The key stock runs low: generate a batch.
    RefillKeys,
}

/// The handle handshakes sign through; cheap to clone.
#[derive(Clone)]
pub struct AsyncSigner {
    tx: mpsc::Sender<Message>,
    property_query: Arc<CString>,
    stats: Arc<SignerStats>,
    batch: usize,
    keys: Arc<KeyStock>,
}

/// X25519 key pairs generated ahead in provider batches (see `kx`).
#[derive(Default)]
struct KeyStock {
    pairs: std::sync::Mutex<Vec<kx::RawKeyPair>>,
    /// A batch of key generations is under way (asked for once).
    refilling: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for AsyncSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncSigner")
            .field("property_query", &self.property_query)
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

impl AsyncSigner {
    /// Starts the signer thread with at most `max_in_flight` jobs at once (more requests
    /// queue in order); `batch` is the provider's batch width and `batch_wait` how long a
    /// part batch may wait to fill (see the module doc). `property_query` selects the
    /// provider for signatures only, e.g. `?provider=qatprovider`.
    pub fn start(
        property_query: &str,
        max_in_flight: usize,
        batch: usize,
        batch_wait: Duration,
    ) -> Result<Self, String> {
        let property_query = Arc::new(
            CString::new(property_query)
                .map_err(|_| format!("property query {property_query:?} contains a NUL byte"))?,
        );
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(SignerStats::default());
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let batch = batch.max(1);
        let keys = Arc::new(KeyStock::default());
        let thread = SignerThread::new(
            tx.clone(),
            max_in_flight.max(batch),
            batch,
            batch_wait,
            stats.clone(),
            keys.clone(),
            property_query.clone(),
        );
        std::thread::Builder::new()
            .name("qat-signer".to_owned())
            .spawn(move || thread.run(rx, ready_tx))
            .map_err(|e| format!("cannot start the QAT signer thread: {e}"))?;
        ready_rx
            .recv()
            .map_err(|_| "the QAT signer thread exited during start-up".to_owned())??;
        Ok(Self {
            tx,
            property_query,
            stats,
            batch,
            keys,
        })
    }

    /// Signatures submitted together.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Runs `f`, a handshake's offload step (the call that makes its key exchange and
    /// signature), on a thread that may block until the batches its work joins have been
    /// computed; `handshake` stops counting that work as still to come as soon as the
    /// signer has it, or when `f` returns. Work done outside such a step is done in
    /// software at once: a reactor thread must never wait for a batch.
    pub fn offload_step<R>(handshake: &mut HandshakeInFlight, f: impl FnOnce() -> R) -> R {
        MAY_WAIT_FOR_BATCH.set(true);
        ASKED_THE_SIGNER.set(false);
        let out = f();
        MAY_WAIT_FOR_BATCH.set(false);
        if ASKED_THE_SIGNER.take() {
            // `offload` already took it off `to_sign` when it handed the signature over.
            handshake.to_sign = false;
        }
        handshake.asks_no_more();
        out
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<SignerStats> {
        &self.stats
    }

    /// Hands `work` to the signer thread when the caller runs an
    /// [`offload_step`](Self::offload_step) and waits for it; None outside one, or when the
    /// part batch it joined could not fill (the caller then works in software).
    fn offload(
        &self,
        kind: OperationKind,
        work: Work,
        software_cost: Duration,
    ) -> Option<Result<Finished, SignError>> {
        if !MAY_WAIT_FOR_BATCH.get() {
            return None;
        }
        self.stats.in_flight.fetch_add(1, Ordering::Relaxed);
        let (request, answer) = self.request(kind, work, software_cost);
        // From here this handshake's signature is held, not to come (see `offload_step`).
        if !ASKED_THE_SIGNER.replace(true) {
            self.stats.to_sign.fetch_sub(1, Ordering::Relaxed);
        }
        let answered = if self.tx.send(Message::Sign(request)).is_err() {
            Err(SignError::Signer("its thread has exited"))
        } else {
            wait(&answer)
        };
        self.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
        match answered {
            Ok(Answer::Done(result)) => Some(result),
            Ok(Answer::SignInSoftware) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Signs `message` with `key`: batched on the signer thread inside an
    /// [`offload_step`](Self::offload_step), otherwise in software on this thread at once.
    /// A part batch that cannot fill is handed back and signed in software here too.
    #[allow(clippy::too_many_arguments)]
    pub fn sign(
        &self,
        key: &Arc<PKey<Private>>,
        kind: OperationKind,
        software_cost: Duration,
        digest: &'static CStr,
        padding: Padding,
        message: &[u8],
    ) -> Result<Signed, SignError> {
        let work = Work::Sign {
            key: key.clone(),
            digest,
            padding,
            message: message.to_vec(),
        };
        let outcome = if MAY_WAIT_FOR_BATCH.get() {
            self.offload(kind, work, software_cost)
                .map(|r| r.map(Finished::into_signed))
        } else {
            None
        }
        .unwrap_or_else(|| sign_in_software(key, digest, padding, message));
        self.count(&outcome);
        outcome
    }

    /// An X25519 key pair generated ahead in a provider batch, without waiting; None when
    /// the stock is empty (the caller generates one in software). Asks for the next batch
    /// when fewer than a batch are left.
    pub fn take_x25519(&self) -> Option<kx::RawKeyPair> {
        let (pair, left) = {
            let mut pairs = self.keys.pairs.lock().unwrap_or_else(|p| p.into_inner());
            (pairs.pop(), pairs.len())
        };
        if left < KEY_STOCK_BATCHES * self.batch / 2
            && !self.keys.refilling.swap(true, Ordering::AcqRel)
        {
            let _ = self.tx.send(Message::RefillKeys);
        }
        let counter = match pair {
            Some(_) => &self.stats.keys_from_stock,
            None => &self.stats.keys_in_software,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        pair
    }

    /// Signs in software on this thread at once, counted nowhere: a key's cost probe.
    pub fn sign_uncounted(
        &self,
        key: &PKey<Private>,
        digest: &CStr,
        padding: Padding,
        message: &[u8],
    ) -> Result<Signed, SignError> {
        sign_in_software(key, digest, padding, message)
    }

    /// Signs in software on this thread at once, counted as such: for keys whose
    /// signatures are not offloaded.
    pub fn sign_in_software(
        &self,
        key: &PKey<Private>,
        digest: &CStr,
        padding: Padding,
        message: &[u8],
    ) -> Result<Signed, SignError> {
        let outcome = sign_in_software(key, digest, padding, message);
        self.count(&outcome);
        outcome
    }

    /// Signs `message` `self.batch()` times as one group of ASYNC jobs, submitted at once
    /// (the start-up proof: the provider must take every one asynchronously).
    pub fn sign_batch(
        &self,
        key: &Arc<PKey<Private>>,
        digest: &'static CStr,
        padding: Padding,
        message: &[u8],
    ) -> Vec<Result<Signed, SignError>> {
        let kind = OperationKind::of(key);
        let (requests, answers): (Vec<_>, Vec<_>) = (0..self.batch)
            .map(|_| {
                let work = Work::Sign {
                    key: key.clone(),
                    digest,
                    padding,
                    message: message.to_vec(),
                };
                self.request(kind, work, Duration::ZERO)
            })
            .unzip();
        if self.tx.send(Message::SignGroup(requests)).is_err() {
            return vec![Err(SignError::Signer("its thread has exited"))];
        }
        answers
            .iter()
            .map(|a| {
                let outcome = match wait(a) {
                    Ok(Answer::Done(result)) => result.map(Finished::into_signed),
                    Ok(Answer::SignInSoftware) => Err(SignError::Signer(
                        "a group submitted at once was handed back",
                    )),
                    Err(e) => Err(e),
                };
                self.count(&outcome);
                outcome
            })
            .collect()
    }

    fn request(
        &self,
        kind: OperationKind,
        work: Work,
        software_cost: Duration,
    ) -> (Box<Request>, mpsc::Receiver<Answer>) {
        let (reply, answer) = mpsc::sync_channel(1);
        let request = Box::new(Request {
            kind,
            work,
            software_cost,
            submitted: None,
            property_query: self.property_query.clone(),
            output: Output::None,
            provider: ProviderRef(ptr::null()),
            error: None,
            reply: Some(reply),
        });
        (request, answer)
    }

    fn count(&self, outcome: &Result<Signed, SignError>) {
        let counter = match outcome {
            Ok(s) if s.paused => &self.stats.offloaded,
            Ok(s) if s.in_software => &self.stats.software,
            Ok(_) => &self.stats.inline,
            Err(_) => &self.stats.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

impl Finished {
    fn into_signed(self) -> Signed {
        Signed {
            signature: match self.output {
                Output::Signature(signature) => signature,
                _ => Vec::new(),
            },
            paused: self.paused,
            provider: self.provider,
            in_software: false,
        }
    }
}

/// Waits for the signer's answer.
fn wait(answer: &mpsc::Receiver<Answer>) -> Result<Answer, SignError> {
    answer
        .recv_timeout(SIGN_TIMEOUT)
        .map_err(|_| SignError::Signer("no signature within 10 s"))
}

/// Signs synchronously on the calling thread, with OpenSSL's default provider: a lone
/// signature gains nothing from qat_sw (it computes eight lanes for one), and its own
/// software path costs more than OpenSSL's. Nothing is copied or queued.
fn sign_in_software(
    key: &PKey<Private>,
    digest: &CStr,
    padding: Padding,
    message: &[u8],
) -> Result<Signed, SignError> {
    let mut signature = Vec::new();
    match digest_sign(key, digest, padding, None, message, &mut signature) {
        Ok(provider) => Ok(Signed {
            signature,
            paused: false,
            provider,
            in_software: true,
        }),
        Err((provider, reason)) => Err(SignError::Provider {
            provider: provider.name(),
            reason,
        }),
    }
}

/// What the provider's callback needs to wake a slot: where to send, which slot. One per
/// slot, never freed (see `SignerThread::new`).
struct Wake {
    tx: mpsc::Sender<Message>,
    slot: usize,
}

extern "C" fn wake_slot(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is a `Wake` leaked in `SignerThread::new`, alive for the process.
    let wake = unsafe { &*(arg as *const Wake) };
    // The signer may be gone at exit; nothing is waiting then.
    let _ = wake.tx.send(Message::Resume(wake.slot));
    1
}

struct Slot {
    job: *mut AsyncJob,
    ctx: *mut AsyncWaitCtx,
    request: Option<Box<Request>>,
    paused: bool,
}

/// Signatures of one kind held until they make a batch.
struct PartBatch {
    kind: OperationKind,
    #[allow(clippy::vec_box)] // boxed one by one: see `Message::SignGroup`
    held: Vec<Box<Request>>,
    /// When the oldest of `held` arrived.
    since: Instant,
    /// One software signature of its kind (see [`part_batch_waits`]).
    software_cost: Duration,
}

impl PartBatch {
    /// The latest it waits, whatever else happens.
    fn deadline(&self, batch_wait: Duration) -> Instant {
        self.since + batch_wait.max(self.software_cost)
    }
}

struct SignerThread {
    slots: Vec<Slot>,
    free: Vec<usize>,
    batch: usize,
    batch_wait: Duration,
    /// Part batches, one per kind with signatures held.
    forming: Vec<PartBatch>,
    /// Groups for the provider waiting for enough free slots; each is submitted whole, so
    /// that qat_sw sees its eighth request arrive at once.
    #[allow(clippy::vec_box)]
    ready: VecDeque<Vec<Box<Request>>>,
    retry: Vec<usize>,
    stats: Arc<SignerStats>,
    keys: Arc<KeyStock>,
    /// The query key generations for the stock are fetched with.
    property_query: Arc<CString>,
    /// Key generations of the stock's batch still under way.
    keys_coming: usize,
    /// The fastest a full batch of each kind took, from submission to its signatures: what
    /// completing a part batch with throw-away signatures costs (the fastest, because the
    /// provider's thread computes a batch alone, and any longer time is waiting for a CPU).
    batch_costs: Vec<(OperationKind, Duration)>,
    wakes: Vec<*mut Wake>,
}

// SAFETY: the raw pointers are created for the signer thread and only used there; the
// struct is moved into that thread before any of them is touched.
unsafe impl Send for SignerThread {}

impl SignerThread {
    fn new(
        tx: mpsc::Sender<Message>,
        slots: usize,
        batch: usize,
        batch_wait: Duration,
        stats: Arc<SignerStats>,
        keys: Arc<KeyStock>,
        property_query: Arc<CString>,
    ) -> Self {
        // The provider may call a slot's callback late (after the job already saw its
        // result and finished); a stale wake-up only makes us resume an idle slot, which is
        // ignored, so the callback arguments must outlive every job: they are leaked, a few
        // dozen bytes per slot, once per process.
        let wakes = (0..slots)
            .map(|slot| {
                Box::into_raw(Box::new(Wake {
                    tx: tx.clone(),
                    slot,
                }))
            })
            .collect();
        Self {
            slots: Vec::with_capacity(slots),
            free: (0..slots).rev().collect(),
            batch,
            batch_wait,
            forming: Vec::new(),
            ready: VecDeque::new(),
            retry: Vec::new(),
            stats,
            keys,
            property_query,
            keys_coming: 0,
            batch_costs: Vec::new(),
            wakes,
        }
    }

    fn run(mut self, rx: mpsc::Receiver<Message>, ready: mpsc::SyncSender<Result<(), String>>) {
        let n = self.wakes.len();
        // SAFETY: plain calls with sizes; the contexts are owned by this thread's slots.
        let init = unsafe { ASYNC_init_thread(n, n) } == 1;
        if !init {
            let _ = ready.send(Err(
                "OpenSSL's ASYNC_init_thread failed: asynchronous jobs are unavailable".into(),
            ));
            return;
        }
        for (i, wake) in self.wakes.iter().enumerate() {
            // SAFETY: a fresh context; the callback argument lives for the process.
            let ctx = unsafe { ASYNC_WAIT_CTX_new() };
            if ctx.is_null()
                || unsafe { ASYNC_WAIT_CTX_set_callback(ctx, wake_slot, *wake as *mut c_void) } != 1
            {
                let _ = ready.send(Err(format!("cannot create OpenSSL ASYNC wait context {i}")));
                return;
            }
            self.slots.push(Slot {
                job: ptr::null_mut(),
                ctx,
                request: None,
                paused: false,
            });
        }
        let _ = ready.send(Ok(()));
        // The first handshakes find key pairs ready.
        self.keys.refilling.store(true, Ordering::Release);
        self.refill_keys();
        loop {
            // Sleep until a message, or until the next part batch runs out of time, or (jobs
            // the provider turned away for want of a free request slot) a moment for its
            // poller before they are tried again.
            let deadline = self
                .forming
                .iter()
                .map(|p| p.deadline(self.batch_wait))
                .min();
            let timeout = match (deadline, self.retry.is_empty()) {
                (None, true) => None,
                (None, false) => Some(RETRY_TICK),
                (Some(d), retry) => {
                    let left = d.saturating_duration_since(Instant::now());
                    Some(if retry { left.min(RETRY_TICK) } else { left })
                }
            };
            let message = match timeout {
                None => match rx.recv() {
                    Ok(m) => Some(m),
                    Err(_) => return, // every AsyncSigner handle is gone
                },
                Some(t) => match rx.recv_timeout(t) {
                    Ok(m) => Some(m),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                },
            };
            if let Some(m) = message {
                self.handle(m);
            }
            while let Ok(m) = rx.try_recv() {
                self.handle(m);
            }
            self.review_part_batches();
            for slot in std::mem::take(&mut self.retry) {
                self.stats.retries.fetch_add(1, Ordering::Relaxed);
                self.step(slot);
            }
        }
    }

    /// Hands back every part batch that can no longer fill in time: its signatures are
    /// made in software by the handshakes that asked for them, in parallel.
    fn review_part_batches(&mut self) {
        let now = Instant::now();
        let to_come = self.stats.to_sign.load(Ordering::Relaxed);
        let batch = self.batch;
        let mut i = 0;
        while i < self.forming.len() {
            let part = &self.forming[i];
            if part_batch_waits(
                part.held.len(),
                to_come,
                batch,
                now.duration_since(part.since),
                self.batch_wait,
                part.software_cost,
            ) {
                i += 1;
                continue;
            }
            let mut part = self.forming.swap_remove(i);
            self.stats
                .held
                .fetch_sub(part.held.len() as i64, Ordering::Relaxed);
            let batch_cost = self
                .batch_costs
                .iter()
                .find(|(k, _)| *k == part.kind)
                .map(|(_, c)| *c);
            if padding_pays(part.held.len(), part.held[0].software_cost, batch_cost) {
                // The held signatures in software would cost more than a whole batch:
                // complete it with throw-away copies of the first one.
                let first = &part.held[0];
                let fill: Vec<Box<Request>> = (part.held.len()..batch)
                    .map(|_| first.throwaway_copy())
                    .collect();
                self.stats
                    .padding
                    .fetch_add(fill.len() as u64, Ordering::Relaxed);
                part.held.extend(fill);
                self.stats.batches.fetch_add(1, Ordering::Relaxed);
                self.ready.push_back(part.held);
                self.submit_ready();
                continue;
            }
            self.stats.released.fetch_add(1, Ordering::Relaxed);
            for request in part.held {
                if let Some(reply) = &request.reply {
                    let _ = reply.send(Answer::SignInSoftware);
                }
            }
        }
    }

    /// Adds a handshake's signature to the part batch of its kind; a batch that is full
    /// goes to the provider whole.
    fn hold(&mut self, request: Box<Request>) {
        let kind = request.kind;
        let at = match self.forming.iter().position(|p| p.kind == kind) {
            Some(at) => at,
            None => {
                self.forming.push(PartBatch {
                    kind,
                    held: Vec::with_capacity(self.batch),
                    since: Instant::now(),
                    software_cost: request.software_cost,
                });
                self.forming.len() - 1
            }
        };
        self.forming[at].held.push(request);
        if self.forming[at].held.len() < self.batch {
            self.stats.held.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let full = self.forming.swap_remove(at);
        self.stats
            .held
            .fetch_sub(full.held.len() as i64 - 1, Ordering::Relaxed);
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.ready.push_back(full.held);
        self.submit_ready();
    }

    /// Submits waiting groups, each whole, while there are slots for it.
    fn submit_ready(&mut self) {
        while self
            .ready
            .front()
            .is_some_and(|group| group.len() <= self.free.len())
        {
            let now = Instant::now();
            for mut request in self.ready.pop_front().expect("checked above") {
                request.submitted = Some(now);
                let slot = self.free.pop().expect("counted above");
                self.slots[slot].request = Some(request);
                self.slots[slot].paused = false;
                self.step(slot);
            }
        }
    }

    /// Generates batches of X25519 key pairs until the stock is full, unless some are
    /// under way already.
    fn refill_keys(&mut self) {
        let stocked = self
            .keys
            .pairs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len();
        let missing = (KEY_STOCK_BATCHES * self.batch).saturating_sub(stocked);
        if self.keys_coming > 0 || missing < self.batch {
            self.keys.refilling.store(false, Ordering::Release);
            return;
        }
        for _ in 0..missing / self.batch {
            let group = (0..self.batch)
                .map(|_| {
                    Box::new(Request {
                        kind: OperationKind::X25519,
                        work: Work::X25519Keygen,
                        software_cost: Duration::ZERO,
                        submitted: None,
                        property_query: self.property_query.clone(),
                        output: Output::None,
                        provider: ProviderRef(ptr::null()),
                        error: None,
                        reply: None,
                    })
                })
                .collect();
            self.keys_coming += self.batch;
            self.ready.push_back(group);
        }
        self.submit_ready();
    }

    fn handle(&mut self, message: Message) {
        match message {
            Message::Sign(request) if self.batch == 1 => {
                // Nothing to form (QAT hardware): straight to the provider.
                self.stats.batches.fetch_add(1, Ordering::Relaxed);
                self.ready.push_back(vec![request]);
                self.submit_ready();
            }
            Message::Sign(request) => self.hold(request),
            Message::SignGroup(requests) => {
                self.ready.push_back(requests);
                self.submit_ready();
            }
            Message::Resume(slot) => {
                // A wake-up for an idle slot is stale (see `new`).
                if self.slots[slot].request.is_some() && !self.slots[slot].job.is_null() {
                    self.step(slot);
                }
            }
            // `run` reviews the part batches after every round of messages.
            Message::Review => {}
            Message::RefillKeys => self.refill_keys(),
        }
    }

    /// Hands a finished job's outcome to whoever waits for it: a handshake, or the stock.
    fn finished(&mut self, request: Box<Request>, paused: bool, ok: bool) {
        if let (Some(submitted), true) = (request.submitted, paused) {
            // Every job of a batch finishes when the batch does: each one's time is the
            // batch's (the start-up proof's batch is the first measured).
            let took = submitted.elapsed();
            match self
                .batch_costs
                .iter_mut()
                .find(|(k, _)| *k == request.kind)
            {
                Some((_, cost)) => *cost = (*cost).min(took),
                None => self.batch_costs.push((request.kind, took)),
            }
        }
        let stock = matches!(request.work, Work::X25519Keygen);
        finish(request, paused, ok, &self.keys, &self.stats);
        if stock {
            self.keys_coming -= 1;
            if self.keys_coming == 0 {
                // Asked again by the next handshake that finds the stock low.
                self.keys.refilling.store(false, Ordering::Release);
            }
        }
    }

    /// Starts or resumes the job in `slot`.
    fn step(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        let Some(request) = s.request.as_mut() else {
            return;
        };
        let mut arg: *mut Request = &mut **request;
        let mut ret: c_int = 0;
        // SAFETY: `s.job` is null (start) or the paused job of this slot (resume); `s.ctx`
        // is this slot's wait context. OpenSSL copies `arg` (the pointer itself) into the
        // job; the request it points to stays in the slot until the job has finished.
        let status = unsafe {
            ASYNC_WAIT_CTX_set_status(s.ctx, ASYNC_STATUS_OK);
            ASYNC_start_job(
                &mut s.job,
                s.ctx,
                &mut ret,
                sign_job,
                (&mut arg as *mut *mut Request).cast(),
                std::mem::size_of::<*mut Request>(),
            )
        };
        match status {
            ASYNC_PAUSE => {
                s.paused = true;
                // SAFETY: the slot's live context.
                if unsafe { ASYNC_WAIT_CTX_get_status(s.ctx) } == ASYNC_STATUS_EAGAIN {
                    self.retry.push(slot);
                }
            }
            ASYNC_FINISH => {
                s.job = ptr::null_mut();
                let paused = s.paused;
                let request = s.request.take().expect("checked above");
                self.free.push(slot);
                self.finished(request, paused, ret == 1);
                self.submit_ready();
            }
            ASYNC_NO_JOBS => {
                // Cannot happen with as many slots as the pool has jobs; requeue if it does.
                let request = s.request.take().expect("checked above");
                self.free.push(slot);
                self.ready.push_front(vec![request]);
            }
            other => {
                debug_assert_eq!(other, ASYNC_ERR);
                s.job = ptr::null_mut();
                let mut request = s.request.take().expect("checked above");
                self.free.push(slot);
                request.error = Some(format!(
                    "ASYNC_start_job failed: {}",
                    super::ffi::openssl_errors()
                ));
                self.finished(request, false, false);
            }
        }
    }
}

fn finish(mut request: Box<Request>, paused: bool, ok: bool, keys: &KeyStock, stats: &SignerStats) {
    let result = result_of(&mut request, paused, ok);
    match request.reply.take() {
        // The handshake may have timed out and gone; nothing to do then.
        Some(reply) => {
            let _ = reply.send(Answer::Done(result));
        }
        None => match result {
            Ok(Finished {
                output: Output::KeyPair(pair),
                ..
            }) => keys
                .pairs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(pair),
            // A throw-away signature that completed a batch.
            Ok(_) => {}
            Err(_) if matches!(request.work, Work::Sign { .. }) => {}
            Err(_) => {
                stats.keys_failed.fetch_add(1, Ordering::Relaxed);
            }
        },
    }
}

/// Takes the outcome out of a finished request.
fn result_of(request: &mut Request, paused: bool, ok: bool) -> Result<Finished, SignError> {
    match (ok, request.error.take()) {
        (true, None) => Ok(Finished {
            output: std::mem::replace(&mut request.output, Output::None),
            paused,
            provider: request.provider,
        }),
        (_, error) => Err(SignError::Provider {
            provider: request.provider.name(),
            reason: error.unwrap_or_else(|| "no further detail from OpenSSL".to_owned()),
        }),
    }
}

/// The job body: the request's work with its operations fetched per the request's
/// property query. Runs on the signer thread's ASYNC fibre; the provider pauses it while
/// the request is in a batch.
extern "C" fn sign_job(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` points at the copy OpenSSL made of the `*mut Request` passed to
    // ASYNC_start_job; the request outlives the job (see `SignerThread::step`).
    let request = unsafe { &mut **(arg as *mut *mut Request) };
    let outcome = match &request.work {
        Work::Sign {
            key,
            digest,
            padding,
            message,
        } => {
            let mut signature = Vec::new();
            let signed = digest_sign(
                key,
                digest,
                *padding,
                Some(&request.property_query),
                message,
                &mut signature,
            );
            request.output = Output::Signature(signature);
            signed
        }
        Work::X25519Keygen => match kx::generate_raw(&request.property_query) {
            Ok(pair) => {
                request.output = Output::KeyPair(pair);
                Ok(ProviderRef(ptr::null()))
            }
            Err(e) => Err((ProviderRef(ptr::null()), e)),
        },
    };
    match outcome {
        Ok(provider) => {
            request.provider = provider;
            1
        }
        Err((provider, e)) => {
            request.provider = provider;
            request.error = Some(e);
            0
        }
    }
}

/// The provider an operation context was fetched from.
pub(super) fn pkey_ctx_provider(ctx: *mut sys::EVP_PKEY_CTX) -> *const sys::OSSL_PROVIDER {
    // SAFETY: a live context; the provider pointer is OpenSSL's, alive for the process.
    unsafe { EVP_PKEY_CTX_get0_provider(ctx) }
}

/// One `EVP_DigestSign` into `signature`, the signature fetched with `property_query`
/// (`None`: OpenSSL's defaults). Returns the provider it was fetched from; on failure also
/// OpenSSL's errors.
fn digest_sign(
    key: &PKey<Private>,
    digest: &CStr,
    padding: Padding,
    property_query: Option<&CStr>,
    message: &[u8],
    signature: &mut Vec<u8>,
) -> Result<ProviderRef, (ProviderRef, String)> {
    struct MdCtx(*mut sys::EVP_MD_CTX);
    impl Drop for MdCtx {
        fn drop(&mut self) {
            // SAFETY: allocated by EVP_MD_CTX_new below and freed exactly once.
            unsafe { sys::EVP_MD_CTX_free(self.0) }
        }
    }
    let mut provider = ProviderRef(ptr::null());
    // SAFETY: every pointer is created and freed here or borrowed for the call; return
    // codes are checked before results are used.
    unsafe {
        let md = MdCtx(sys::EVP_MD_CTX_new());
        if md.0.is_null() {
            return Err((provider, super::ffi::openssl_errors()));
        }
        let mut pctx: *mut sys::EVP_PKEY_CTX = ptr::null_mut();
        if EVP_DigestSignInit_ex(
            md.0,
            &mut pctx,
            digest.as_ptr(),
            ptr::null_mut(),
            property_query.map_or(ptr::null(), CStr::as_ptr),
            key.as_ptr(),
            ptr::null(),
        ) != 1
            || pctx.is_null()
        {
            return Err((provider, super::ffi::openssl_errors()));
        }
        provider = ProviderRef(EVP_PKEY_CTX_get0_provider(pctx));
        let padded = match padding {
            Padding::None => true,
            Padding::Pkcs1 => sys::EVP_PKEY_CTX_set_rsa_padding(pctx, sys::RSA_PKCS1_PADDING) == 1,
            Padding::Pss => {
                sys::EVP_PKEY_CTX_set_rsa_padding(pctx, sys::RSA_PKCS1_PSS_PADDING) == 1
                    // -1: RSA_PSS_SALTLEN_DIGEST, the salt length TLS requires.
                    && sys::EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, -1) == 1
            }
        };
        if !padded {
            return Err((provider, super::ffi::openssl_errors()));
        }
        let mut len = key.size();
        signature.resize(len, 0);
        if sys::EVP_DigestSign(
            md.0,
            signature.as_mut_ptr(),
            &mut len,
            message.as_ptr(),
            message.len(),
        ) != 1
        {
            return Err((provider, super::ffi::openssl_errors()));
        }
        signature.truncate(len);
    }
    Ok(provider)
}

#[cfg(test)]
mod tests {
    //! The batch former with OpenSSL's default provider behind it: real ASYNC jobs, which
    //! the default provider completes without pausing (no QAT here), so what is tested is
    //! which signatures are grouped, handed back, and when.
    use super::*;

    const BATCH: usize = 4;

    fn signer(batch_wait: Duration) -> AsyncSigner {
        openssl::init();
        AsyncSigner::start("?provider=default", 16, BATCH, batch_wait).unwrap()
    }

    fn p256() -> Arc<PKey<Private>> {
        let group =
            openssl::ec::EcGroup::from_curve_name(openssl::nid::Nid::X9_62_PRIME256V1).unwrap();
        Arc::new(PKey::from_ec_key(openssl::ec::EcKey::generate(&group).unwrap()).unwrap())
    }

    /// Signs once per handshake, each on its own thread inside an offload step, as
    /// `tls::accept` runs them; returns the outcomes and how long each took.
    fn sign_from_threads(
        signer: &AsyncSigner,
        key: &Arc<PKey<Private>>,
        handshakes: Vec<HandshakeInFlight>,
    ) -> Vec<(Signed, Duration)> {
        let threads: Vec<_> = handshakes
            .into_iter()
            .map(|mut handshake| {
                let (signer, key) = (signer.clone(), key.clone());
                std::thread::spawn(move || {
                    let started = Instant::now();
                    let signed = AsyncSigner::offload_step(&mut handshake, || {
                        signer.sign(
                            &key,
                            OperationKind::of(&key),
                            Duration::ZERO,
                            c"SHA256",
                            Padding::None,
                            b"transcript",
                        )
                    })
                    .unwrap();
                    (signed, started.elapsed())
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    fn under_way(signer: &AsyncSigner, n: usize) -> Vec<HandshakeInFlight> {
        (0..n).map(|_| HandshakeInFlight::new(signer)).collect()
    }

    #[test]
    fn a_part_batch_waits_only_while_it_can_fill_and_not_past_its_time() {
        let wait = Duration::from_millis(5);
        let (ms0, ms1, ms9) = (
            Duration::ZERO,
            Duration::from_millis(1),
            Duration::from_millis(9),
        );
        let (cheap, rsa4096) = (Duration::from_micros(250), Duration::from_millis(4));
        assert!(
            part_batch_waits(3, 5, 8, ms1, wait, cheap),
            "3 held + 5 to come fill 8"
        );
        assert!(
            !part_batch_waits(3, 4, 8, ms1, wait, cheap),
            "3 + 4 cannot fill 8, and a software signature would be done by now"
        );
        assert!(
            part_batch_waits(3, 4, 8, ms0, wait, cheap),
            "but it may wait as long as a software signature takes"
        );
        assert!(
            !part_batch_waits(3, 5, 8, ms9, wait, cheap),
            "past batch_wait"
        );
        assert!(
            !part_batch_waits(8, 0, 8, ms0, wait, cheap),
            "a full batch does not wait"
        );
        assert!(
            !part_batch_waits(1, -3, 8, ms1, wait, cheap),
            "a negative count is none"
        );
        assert!(
            part_batch_waits(1, 0, 8, ms1, wait, rsa4096),
            "as long as software takes"
        );
        assert!(!part_batch_waits(1, 0, 8, ms9, wait, rsa4096), "not longer");
        assert!(
            part_batch_waits(1, 7, 8, Duration::from_millis(3), ms1, rsa4096),
            "one that can fill waits as long as a software signature, beyond batch_wait"
        );
    }

    #[test]
    fn a_full_batch_is_submitted_whole() {
        let signer = signer(Duration::from_secs(5));
        let key = p256();
        let out = sign_from_threads(&signer, &key, under_way(&signer, BATCH));
        assert_eq!(out.len(), BATCH);
        for (signed, _) in &out {
            assert!(!signed.in_software, "signed through a job");
            assert!(!signed.signature.is_empty());
        }
        let stats = signer.stats();
        assert_eq!(stats.batches.load(Ordering::Relaxed), 1);
        assert_eq!(stats.released.load(Ordering::Relaxed), 0);
        assert_eq!(stats.held.load(Ordering::Relaxed), 0);
        assert_eq!(stats.to_sign.load(Ordering::Relaxed), 0);
        assert_eq!(stats.handshakes.load(Ordering::Relaxed), 0);
    }

    /// Three signatures and nobody else under way: they cannot make a batch of four, so
    /// they are signed in software at once, not after batch_wait.
    #[test]
    fn a_part_batch_that_cannot_fill_is_signed_in_software_at_once() {
        let signer = signer(Duration::from_secs(5));
        let key = p256();
        let out = sign_from_threads(&signer, &key, under_way(&signer, BATCH - 1));
        for (signed, took) in &out {
            assert!(signed.in_software);
            assert!(*took < Duration::from_secs(2), "waited {took:?}");
        }
        let stats = signer.stats();
        assert_eq!(stats.software.load(Ordering::Relaxed), (BATCH - 1) as u64);
        assert_eq!(stats.batches.load(Ordering::Relaxed), 0);
        assert!(stats.released.load(Ordering::Relaxed) >= 1);
    }

    /// Three signatures held while a fourth handshake is under way: they wait for it; when
    /// it ends without signing (a failed or resumed handshake) they are handed back then,
    /// well before batch_wait.
    #[test]
    fn a_part_batch_waits_for_a_handshake_under_way_and_is_released_when_it_ends() {
        let signer = signer(Duration::from_secs(5));
        let key = p256();
        let mut handshakes = under_way(&signer, BATCH);
        let last = handshakes.pop().unwrap();
        let ends_after = Duration::from_millis(300);
        let ender = std::thread::spawn(move || {
            std::thread::sleep(ends_after);
            drop(last);
        });
        let out = sign_from_threads(&signer, &key, handshakes);
        ender.join().unwrap();
        for (signed, took) in &out {
            assert!(signed.in_software);
            assert!(
                *took >= ends_after / 2,
                "released after {took:?}, before the end"
            );
            assert!(*took < Duration::from_secs(3), "released after {took:?}");
        }
        assert_eq!(signer.stats().batches.load(Ordering::Relaxed), 0);
    }

    /// A handshake under way that never signs (a client that stalls) holds a part batch
    /// for batch_wait at most.
    #[test]
    fn a_part_batch_waits_no_longer_than_batch_wait() {
        let batch_wait = Duration::from_millis(200);
        let signer = signer(batch_wait);
        let key = p256();
        let mut handshakes = under_way(&signer, BATCH);
        let stalled = handshakes.pop().unwrap();
        let out = sign_from_threads(&signer, &key, handshakes);
        for (signed, took) in &out {
            assert!(signed.in_software);
            assert!(*took >= batch_wait / 2, "released after {took:?}");
            assert!(*took < Duration::from_secs(3), "released after {took:?}");
        }
        drop(stalled);
        let stats = signer.stats();
        assert_eq!(stats.to_sign.load(Ordering::Relaxed), 0);
        assert_eq!(stats.held.load(Ordering::Relaxed), 0);
    }

    /// Outside a signing step (a reactor or handshake-pool thread) nothing waits.
    #[test]
    fn outside_an_offload_step_signatures_are_made_in_software() {
        let signer = signer(Duration::from_secs(5));
        let key = p256();
        let _under_way = under_way(&signer, BATCH * 2);
        let signed = signer
            .sign(
                &key,
                OperationKind::of(&key),
                Duration::ZERO,
                c"SHA256",
                Padding::None,
                b"m",
            )
            .unwrap();
        assert!(signed.in_software);
        assert_eq!(signer.stats().in_flight.load(Ordering::Relaxed), 0);
    }
}
