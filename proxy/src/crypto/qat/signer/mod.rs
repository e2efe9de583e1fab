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
//! **Only full batches reach the provider**, unless a part batch pays. The signer holds
//! signatures of one kind (qat_sw's queue: RSA by modulus size, ECDSA by curve) until
//! `batch` of them are there and submits them together. A part batch waits
//! ([`part_batch_waits`]) while the signatures held plus the openssl-qat handshakes accepted
//! that have not yet asked for theirs ([`SignerStats::to_sign`]) make a batch, for the
//! longer of `batch_wait` and twice the time a batch takes to arrive at the measured rate
//! (rate-aware: measured in the lesser of wall-clock and process CPU time, so that time
//! frozen by a CPU quota is not counted as waiting), and in any case as long as one software
//! signature of its kind takes (measured when the key is loaded): a handshake waiting that
//! long is delayed no more than signing would delay it. When it stops waiting it either
//! goes to the provider as it is, where the held ones would cost more in software than a
//! whole batch costs ([`part_batch_pays`], with the fastest batch of the kind seen so far),
//! or is handed back: each handshake then signs in software on its own thread, in
//! parallel, as `openssl` would.
//!
//! **Who computes a batch.** With `qat.polling = "internal"` qat_sw's own polling thread
//! does, woken at every eighth request of any kind and otherwise by its 10 ms timer: a part
//! batch submitted there waits for the timer and shifts the count, so that a remainder of
//! every later full batch waits for the timer too. With `"external"` (qat_sw) the signer
//! calls the module's `qat_sw_poll` itself right after submitting, with qat_sw's part-batch
//! timeout set to zero, so every batch it submits is computed at once on this thread and
//! no other thread is woken (see `ffi::ModuleSymbols`).
//!
//! The signer also keeps X25519 key pairs generated ahead in full batches (see `kx`).
//!
//! A signature goes to the signer only when a batch can form: a batch's worth of
//! openssl-qat handshakes is under way, or the provider computes even a lone signature of
//! its kind faster than software (qat_sw's P-384 against OpenSSL 3.0's). Otherwise it is
//! signed in software at once, on the blocking thread the handshake runs on: a handshake at
//! low load costs what it costs with `openssl`. QAT hardware, which does not batch, runs
//! with `batch = 1`: every signature goes to the provider.
//!
//! Only the signature goes to the QAT provider, fetched with an explicit property query;
//! the record layer, key exchange and everything else stay on OpenSSL's default provider.
#![allow(unsafe_code)]

mod job;
mod kinds;
mod thread;

use std::cell::Cell;
use std::ffi::{CStr, CString};
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use openssl::pkey::{PKey, Private};

pub use super::ffi::PollFn;
use super::kx;
use job::{sign_in_software, wait, Answer, Finished, Message, Output, Request, Work};
pub use kinds::{
    part_batch_pays, part_batch_waits, rate_aware_wait, OperationKind, Padding, ProviderRef,
    SignError, Signed, SignerStats, Waited, THROTTLED_WAIT_LIMIT,
};
use kinds::{KeyStock, KEY_STOCK_BATCHES};
use thread::{Drive, SignerThread};

thread_local! {
    /// Set while this thread runs a handshake's signing step that may wait for a batch
    /// (see [`AsyncSigner::offload_step`]).
    static MAY_WAIT_FOR_BATCH: Cell<bool> = const { Cell::new(false) };
    /// Set when that step's signature was handed to the signer, so the step knows its
    /// handshake no longer counts as one still to sign.
    static ASKED_THE_SIGNER: Cell<bool> = const { Cell::new(false) };
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
        signer.batch_can_fill()
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

/// The handle handshakes sign through; cheap to clone.
#[derive(Clone)]
pub struct AsyncSigner {
    tx: mpsc::Sender<Message>,
    property_query: Arc<CString>,
    stats: Arc<SignerStats>,
    batch: usize,
    keys: Arc<KeyStock>,
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
    ///
    /// `poll` is the provider's poll call when it is polled externally (`qat.polling =
    /// "external"`): the signer thread then computes each batch itself, right after
    /// submitting it.
    pub fn start(
        property_query: &str,
        max_in_flight: usize,
        batch: usize,
        batch_wait: Duration,
        poll: Option<PollFn>,
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
        let drive = Drive {
            slots: max_in_flight.max(batch),
            batch,
            batch_wait,
            poll,
        };
        let thread = SignerThread::new(
            tx.clone(),
            drive,
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
            // The signer thread takes it off `to_sign` when it receives the signature.
            handshake.to_sign = false;
        }
        handshake.asks_no_more();
        out
    }

    /// Whether a signature of `kind` goes to the signer: when enough openssl-qat handshakes
    /// are under way to fill a batch (always, for `batch = 1`), or when the provider makes
    /// even a lone one faster than software does (qat_sw's P-384 against OpenSSL 3.0's: a
    /// whole batch in about a third of one software signature), so that a part batch of one
    /// pays. Otherwise it is signed in software at once: nothing can fill a batch, and
    /// holding it would only delay it.
    fn worth_offloading(&self, kind: OperationKind, software_cost: Duration) -> bool {
        self.batch_can_fill() || part_batch_pays(1, software_cost, self.stats.batch_cost(kind))
    }

    /// A batch's worth of openssl-qat handshakes is under way.
    fn batch_can_fill(&self) -> bool {
        self.stats.handshakes.load(Ordering::Relaxed) >= self.batch as i64
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
        let (mut request, answer) = self.request(kind, work, software_cost);
        // The signer thread takes this handshake's signature off `to_sign` when it holds it
        // (see `Request::counted_to_sign`); the handshake no longer counts it itself (see
        // `offload_step`).
        request.counted_to_sign = !ASKED_THE_SIGNER.replace(true);
        let counted = request.counted_to_sign;
        let answered = if self.tx.send(Message::Sign(request)).is_err() {
            if counted {
                self.stats.to_sign.fetch_sub(1, Ordering::Relaxed);
            }
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
        let outcome = if MAY_WAIT_FOR_BATCH.get() && self.worth_offloading(kind, software_cost) {
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
            counted_to_sign: false,
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

#[cfg(test)]
mod tests {
    //! The batch former with OpenSSL's default provider behind it: real ASYNC jobs, which
    //! the default provider completes without pausing (no QAT here), so what is tested is
    //! which signatures are grouped, handed back, and when.
    use super::*;
    use std::time::Instant;

    const BATCH: usize = 4;

    fn signer(batch_wait: Duration) -> AsyncSigner {
        openssl::init();
        AsyncSigner::start("?provider=default", 16, BATCH, batch_wait, None).unwrap()
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
        // Unthrottled: the process's CPU time runs as the wall clock does.
        let both = |d: Duration| Waited { wall: d, cpu: d };
        assert!(
            part_batch_waits(3, 5, 8, both(ms1), wait, cheap),
            "3 held + 5 to come fill 8"
        );
        assert!(
            !part_batch_waits(3, 4, 8, both(ms1), wait, cheap),
            "3 + 4 cannot fill 8, and a software signature would be done by now"
        );
        assert!(
            part_batch_waits(3, 4, 8, both(ms0), wait, cheap),
            "but it may wait as long as a software signature takes"
        );
        assert!(
            !part_batch_waits(3, 5, 8, both(ms9), wait, cheap),
            "past batch_wait"
        );
        assert!(
            !part_batch_waits(8, 0, 8, both(ms0), wait, cheap),
            "a full batch does not wait"
        );
        assert!(
            !part_batch_waits(1, -3, 8, both(ms1), wait, cheap),
            "a negative count is none"
        );
        assert!(
            part_batch_waits(1, 0, 8, both(ms1), wait, rsa4096),
            "as long as software takes"
        );
        assert!(
            !part_batch_waits(1, 0, 8, both(ms9), wait, rsa4096),
            "not longer"
        );
        assert!(
            part_batch_waits(1, 7, 8, both(Duration::from_millis(3)), ms1, rsa4096),
            "one that can fill waits as long as a software signature, beyond batch_wait"
        );
        // Under a CPU quota the process is frozen most of each period: time in which the
        // handshakes that could fill the batch could not run does not count...
        let frozen = |wall: u64, cpu: u64| Waited {
            wall: Duration::from_millis(wall),
            cpu: Duration::from_millis(cpu),
        };
        assert!(
            part_batch_waits(3, 5, 8, frozen(60, 1), wait, cheap),
            "60 ms frozen, 1 ms of progress: still waiting"
        );
        assert!(
            !part_batch_waits(3, 5, 8, frozen(60, 6), wait, cheap),
            "past batch_wait of progress"
        );
        // ...but no longer than one CFS period, and never when nothing can fill it.
        assert!(!part_batch_waits(
            3,
            5,
            8,
            frozen(THROTTLED_WAIT_LIMIT.as_millis() as u64, 1),
            wait,
            cheap
        ));
        assert!(
            !part_batch_waits(3, 4, 8, frozen(60, 0), wait, cheap),
            "at low load a handshake waits one software signature at most"
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
        assert_settled(stats);
        assert_eq!(stats.handshakes.load(Ordering::Relaxed), 0);
    }

    /// Nothing held, nothing counted as still to come.
    fn assert_settled(stats: &SignerStats) {
        assert_eq!(stats.held.load(Ordering::Relaxed), 0);
        assert_eq!(stats.to_sign.load(Ordering::Relaxed), 0);
    }

    /// Three signatures and nobody else under way: they cannot make a batch of four, and no
    /// batch has shown that a lone one pays in the provider, so they are signed in software
    /// at once, without a trip to the signer.
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
        assert_eq!(stats.released.load(Ordering::Relaxed), 0);
        assert_eq!(stats.held.load(Ordering::Relaxed), 0);
    }

    /// A lone signature whose kind the provider has been measured to batch faster than one
    /// software signature goes to the signer and on to the provider as a part batch of one,
    /// after waiting at most one software signature's time for company.
    #[test]
    fn a_lone_signature_goes_to_the_provider_where_a_batch_of_one_pays() {
        let signer = signer(Duration::from_secs(5));
        let key = p256();
        let kind = OperationKind::of(&key);
        signer
            .stats()
            .record_batch_cost(kind, Duration::from_nanos(1));
        let mut handshake = HandshakeInFlight::new(&signer);
        let software_cost = Duration::from_millis(1);
        let started = Instant::now();
        let signed = AsyncSigner::offload_step(&mut handshake, || {
            signer.sign(
                &key,
                kind,
                software_cost,
                c"SHA256",
                Padding::None,
                b"transcript",
            )
        })
        .unwrap();
        drop(handshake);
        assert!(!signed.in_software, "signed through a job");
        let took = started.elapsed();
        assert!(took < Duration::from_secs(2), "waited {took:?}");
        let stats = signer.stats();
        assert_eq!(stats.part_batches.load(Ordering::Relaxed), 1);
        assert_eq!(stats.software.load(Ordering::Relaxed), 0);
        assert_settled(stats);
    }

    /// The wait for a part batch that can fill follows the rate its kind arrives at.
    #[test]
    fn the_part_batch_wait_follows_the_arrival_rate() {
        let wait = Duration::from_millis(5);
        assert_eq!(rate_aware_wait(wait, None, 8), wait);
        // Eight arrivals 1 ms apart take 8 ms: wait twice that.
        assert_eq!(
            rate_aware_wait(wait, Some(Duration::from_millis(1)), 8),
            Duration::from_millis(16)
        );
        // Fast arrivals never shorten the configured wait.
        assert_eq!(
            rate_aware_wait(wait, Some(Duration::from_micros(10)), 8),
            wait
        );
        // Slow arrivals are capped at two CFS periods, a longer configured wait is kept.
        assert_eq!(
            rate_aware_wait(wait, Some(Duration::from_millis(50)), 8),
            THROTTLED_WAIT_LIMIT
        );
        let long = Duration::from_millis(500);
        assert_eq!(
            rate_aware_wait(long, Some(Duration::from_millis(50)), 8),
            long
        );
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
        assert_settled(signer.stats());
    }

    #[test]
    fn a_part_batch_goes_as_it_is_only_where_its_signatures_cost_more_than_a_batch() {
        let batch = Some(Duration::from_millis(9));
        let rsa4096 = Duration::from_millis(4);
        assert!(
            !part_batch_pays(2, rsa4096, batch),
            "8 ms in software < a 9 ms batch"
        );
        assert!(
            part_batch_pays(3, rsa4096, batch),
            "12 ms in software > a 9 ms batch"
        );
        assert!(!part_batch_pays(7, rsa4096, None), "no batch measured yet");
    }

    /// Outside an offload step (a reactor or handshake-pool thread) nothing waits.
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
