//! Asynchronous batched signing for openssl-qat: one thread that keeps many OpenSSL ASYNC
//! jobs in flight, the way nginx and HAProxy drive QAT_Engine.
//!
//! QAT (hardware, and qat_sw's multi-buffer code) gains only when a signature runs inside
//! an OpenSSL ASYNC job: the provider queues the request, pauses the job, and completes a
//! whole batch at once (qat_sw: eight RSA or ECDSA operations per AVX-512 pass), then wakes
//! each job. Called synchronously it signs alone, in software. rustls signs synchronously,
//! so a handshake's `Signer::sign` hands its message to [`AsyncSigner`] and waits (on a
//! blocking-pool thread, never a reactor thread: see `tls::accept`), while the signer
//! thread starts a job per request and resumes each one when the provider calls back.
//!
//! All jobs run on the one signer thread on purpose: qat_sw's request queues are
//! thread-local, so requests batch only when they are submitted from the same thread.
//!
//! Whether a signature is worth a job is decided per request. qat_sw computes a queue the
//! moment it holds eight requests (its multi-buffer width), and otherwise only when its
//! polling thread's timer expires, 10 ms later: a lone handshake sent there would wait that
//! long, and a batch of one costs the CPU of eight. So a signature goes to the provider
//! only while at least a batch's worth of openssl-qat handshakes is under way
//! ([`HandshakeInFlight`]); then the handshake's signing step runs on a blocking thread
//! that waits for it. With fewer, the step runs where the listener's other handshakes run
//! and signs at once with OpenSSL's default provider (what `openssl` costs), so a
//! handshake at low load is neither delayed nor handed between threads. For QAT hardware, which does not batch, `batch = 1` sends every
//! signature to the provider.
//!
//! Only the signature goes to the QAT provider, fetched with an explicit property query;
//! the record layer, key exchange and everything else stay on OpenSSL's default provider.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::ffi::{c_void, CStr, CString};
use std::os::raw::{c_char, c_int};
use std::ptr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use foreign_types::ForeignType;
use openssl::pkey::{PKey, Private};
use openssl_sys as sys;

/// How long a handshake waits for its signature before failing: far beyond any batch
/// timeout, short enough that a wedged provider fails handshakes instead of hanging them.
const SIGN_TIMEOUT: Duration = Duration::from_secs(10);
thread_local! {
    /// Set while this thread runs a signing step that may wait for the provider (see
    /// [`AsyncSigner::may_wait_for_batch`]).
    static MAY_WAIT_FOR_BATCH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

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
pub struct ProviderRef(*const sys::OSSL_PROVIDER);

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

/// Counters the metrics read.
#[derive(Debug, Default)]
pub struct SignerStats {
    /// Jobs started and not yet finished (paused in the provider, or waiting for a slot).
    pub in_flight: AtomicI64,
    /// Signatures the provider took asynchronously.
    pub offloaded: AtomicU64,
    /// Signatures the provider produced inside a job without pausing (not offloaded).
    pub inline: AtomicU64,
    /// Signatures made in software by OpenSSL's default provider because too few
    /// handshakes were under way to fill a batch.
    pub software: AtomicU64,
    /// Signatures that failed.
    pub failed: AtomicU64,
    /// Times a job was resumed because the provider had no free request slot (EAGAIN).
    pub retries: AtomicU64,
    /// openssl-qat handshakes under way, as counted by [`HandshakeInFlight`]: the demand a
    /// partial batch may wait for.
    pub handshakes: AtomicI64,
}

/// Counts one handshake under way while alive (see [`SignerStats::handshakes`]).
pub struct HandshakeInFlight(Arc<SignerStats>);

impl HandshakeInFlight {
    /// Starts counting.
    pub fn new(signer: &AsyncSigner) -> Self {
        signer.stats.handshakes.fetch_add(1, Ordering::Relaxed);
        Self(signer.stats.clone())
    }
}

impl Drop for HandshakeInFlight {
    fn drop(&mut self) {
        self.0.handshakes.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Request {
    key: Arc<PKey<Private>>,
    digest: &'static CStr,
    padding: Padding,
    message: Vec<u8>,
    property_query: Arc<CString>,
    // Filled in by the job.
    signature: Vec<u8>,
    provider: ProviderRef,
    error: Option<String>,
    reply: mpsc::SyncSender<Answer>,
}

/// What the signer thread answers: the job finished (paused or not).
enum Answer {
    Done(Result<Signed, SignError>),
}

enum Message {
    /// A handshake's signature, for the provider.
    Sign(Box<Request>),
    /// Submit at once as one group (the start-up proof's full batch). Boxed one by one: a
    /// running job points at its request, which must not move while queues shuffle.
    #[allow(clippy::vec_box)]
    SignGroup(Vec<Box<Request>>),
    /// The provider finished (or may have finished) the job in this slot.
    Resume(usize),
}

/// The handle handshakes sign through; cheap to clone.
#[derive(Clone)]
pub struct AsyncSigner {
    tx: mpsc::Sender<Message>,
    property_query: Arc<CString>,
    stats: Arc<SignerStats>,
    batch: usize,
}

impl std::fmt::Debug for AsyncSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncSigner")
            .field("property_query", &self.property_query)
            .finish_non_exhaustive()
    }
}

impl AsyncSigner {
    /// Starts the signer thread with at most `max_in_flight` jobs at once (more requests
    /// queue in order); `batch` is the provider's batch width (see the module doc).
    /// `property_query` selects the provider for signatures only, e.g.
    /// `?provider=qatprovider`.
    pub fn start(property_query: &str, max_in_flight: usize, batch: usize) -> Result<Self, String> {
        let property_query = Arc::new(
            CString::new(property_query)
                .map_err(|_| format!("property query {property_query:?} contains a NUL byte"))?,
        );
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(SignerStats::default());
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let batch = batch.max(1);
        let thread = SignerThread::new(tx.clone(), max_in_flight.max(batch), stats.clone());
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
        })
    }

    /// Requests submitted together.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// True when a signature sent to the provider now can expect its batch to fill: at
    /// least a batch's worth of openssl-qat handshakes under way (always, for `batch = 1`).
    pub fn batches_fill(&self) -> bool {
        self.stats.handshakes.load(Ordering::Relaxed) >= self.batch as i64
    }

    /// Runs `f` (a handshake's signing step) on a thread that may block until the
    /// provider has computed its batch. Signatures made outside it are made in software
    /// at once: a reactor thread must never wait for a batch.
    pub fn may_wait_for_batch<R>(f: impl FnOnce() -> R) -> R {
        MAY_WAIT_FOR_BATCH.set(true);
        let out = f();
        MAY_WAIT_FOR_BATCH.set(false);
        out
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<SignerStats> {
        &self.stats
    }

    /// Signs `message` with `key`: inside an ASYNC job on the signer thread when it can
    /// batch and the caller may wait ([`may_wait_for_batch`](Self::may_wait_for_batch)),
    /// otherwise in software on this thread at once.
    pub fn sign(
        &self,
        key: &Arc<PKey<Private>>,
        digest: &'static CStr,
        padding: Padding,
        message: &[u8],
    ) -> Result<Signed, SignError> {
        self.stats.in_flight.fetch_add(1, Ordering::Relaxed);
        let outcome = if !MAY_WAIT_FOR_BATCH.get() || (self.batch > 1 && !self.batches_fill()) {
            sign_in_software(key, digest, padding, message)
        } else {
            let (request, answer) = self.request(key, digest, padding, message);
            if self.tx.send(Message::Sign(request)).is_err() {
                Err(SignError::Signer("its thread has exited"))
            } else {
                wait(&answer)
            }
        };
        self.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
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
        let (requests, answers): (Vec<_>, Vec<_>) = (0..self.batch)
            .map(|_| self.request(key, digest, padding, message))
            .unzip();
        if self.tx.send(Message::SignGroup(requests)).is_err() {
            return vec![Err(SignError::Signer("its thread has exited"))];
        }
        answers
            .iter()
            .map(|a| {
                let outcome = wait(a);
                self.count(&outcome);
                outcome
            })
            .collect()
    }

    fn request(
        &self,
        key: &Arc<PKey<Private>>,
        digest: &'static CStr,
        padding: Padding,
        message: &[u8],
    ) -> (Box<Request>, mpsc::Receiver<Answer>) {
        let (reply, answer) = mpsc::sync_channel(1);
        let request = Box::new(Request {
            key: key.clone(),
            digest,
            padding,
            message: message.to_vec(),
            property_query: self.property_query.clone(),
            signature: Vec::new(),
            provider: ProviderRef(ptr::null()),
            error: None,
            reply,
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

/// Waits for the signer's answer.
fn wait(answer: &mpsc::Receiver<Answer>) -> Result<Signed, SignError> {
    match answer.recv_timeout(SIGN_TIMEOUT) {
        Ok(Answer::Done(result)) => result,
        Err(_) => Err(SignError::Signer("no signature within 10 s")),
    }
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

struct SignerThread {
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// Requests for the provider waiting for a free slot.
    ready: VecDeque<Box<Request>>,
    retry: Vec<usize>,
    stats: Arc<SignerStats>,
    wakes: Vec<*mut Wake>,
}

// SAFETY: the raw pointers are created for the signer thread and only used there; the
// struct is moved into that thread before any of them is touched.
unsafe impl Send for SignerThread {}

impl SignerThread {
    fn new(tx: mpsc::Sender<Message>, slots: usize, stats: Arc<SignerStats>) -> Self {
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
            ready: VecDeque::new(),
            retry: Vec::new(),
            stats,
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
        loop {
            let message = if self.retry.is_empty() {
                match rx.recv() {
                    Ok(m) => Some(m),
                    Err(_) => return, // every AsyncSigner handle is gone
                }
            } else {
                // Jobs the provider turned away for want of a free request slot: give its
                // poller a moment, then try them again.
                match rx.recv_timeout(RETRY_TICK) {
                    Ok(m) => Some(m),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            };
            if let Some(m) = message {
                self.handle(m);
            }
            while let Ok(m) = rx.try_recv() {
                self.handle(m);
            }
            for slot in std::mem::take(&mut self.retry) {
                self.stats.retries.fetch_add(1, Ordering::Relaxed);
                self.step(slot);
            }
        }
    }

    fn submit_ready(&mut self) {
        while !self.ready.is_empty() {
            let Some(slot) = self.free.pop() else {
                return;
            };
            let request = self.ready.pop_front().expect("checked above");
            self.slots[slot].request = Some(request);
            self.slots[slot].paused = false;
            self.step(slot);
        }
    }

    fn handle(&mut self, message: Message) {
        match message {
            Message::Sign(request) => {
                self.ready.push_back(request);
                self.submit_ready();
            }
            Message::SignGroup(requests) => {
                self.ready.extend(requests);
                self.submit_ready();
            }
            Message::Resume(slot) => {
                // A wake-up for an idle slot is stale (see `new`).
                if self.slots[slot].request.is_some() && !self.slots[slot].job.is_null() {
                    self.step(slot);
                }
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
                finish(request, paused, ret == 1);
                self.submit_ready();
            }
            ASYNC_NO_JOBS => {
                // Cannot happen with as many slots as the pool has jobs; requeue if it does.
                let request = s.request.take().expect("checked above");
                self.free.push(slot);
                self.ready.push_front(request);
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
                finish(request, false, false);
            }
        }
    }
}

fn finish(mut request: Box<Request>, paused: bool, ok: bool) {
    let result = result_of(&mut request, paused, ok);
    // The handshake may have timed out and gone; nothing to do then.
    let _ = request.reply.send(Answer::Done(result));
}

/// Takes the outcome out of a finished request.
fn result_of(request: &mut Request, paused: bool, ok: bool) -> Result<Signed, SignError> {
    match (ok, request.error.take()) {
        (true, None) => Ok(Signed {
            in_software: false,
            signature: std::mem::take(&mut request.signature),
            paused,
            provider: request.provider,
        }),
        (_, error) => Err(SignError::Provider {
            provider: request.provider.name(),
            reason: error.unwrap_or_else(|| "no further detail from OpenSSL".to_owned()),
        }),
    }
}

/// The job body: one EVP_DigestSign with the signature fetched per the request's property
/// query. Runs on the signer thread's ASYNC fibre; the provider pauses it while the
/// request is in the batch.
extern "C" fn sign_job(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` points at the copy OpenSSL made of the `*mut Request` passed to
    // ASYNC_start_job; the request outlives the job (see `SignerThread::step`).
    let request = unsafe { &mut **(arg as *mut *mut Request) };
    let outcome = digest_sign(
        &request.key,
        request.digest,
        request.padding,
        Some(&request.property_query),
        &request.message,
        &mut request.signature,
    );
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
