//! The signer thread: the ASYNC jobs in their slots, the part batches it forms per kind,
//! the groups it submits whole, the provider's wake-ups, and the key stock's refills.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::ffi::{c_void, CString};
use std::os::raw::c_int;
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::ffi::PollFn;
use super::job::{
    finish, sign_job, ASYNC_WAIT_CTX_get_status, ASYNC_WAIT_CTX_new, ASYNC_WAIT_CTX_set_callback,
    ASYNC_WAIT_CTX_set_status, ASYNC_init_thread, ASYNC_start_job, Answer, AsyncJob, AsyncWaitCtx,
    Message, Output, Request, Work, ASYNC_ERR, ASYNC_FINISH, ASYNC_NO_JOBS, ASYNC_PAUSE,
    ASYNC_STATUS_EAGAIN, ASYNC_STATUS_OK,
};
use super::kinds::{
    part_batch_pays, part_batch_waits, rate_aware_wait, KeyStock, OperationKind, ProviderRef,
    SignerStats, Waited, KEY_STOCK_BATCHES, THROTTLED_WAIT_LIMIT,
};

/// How soon a job the provider turned away (no free request slot) is tried again.
pub(super) const RETRY_TICK: Duration = Duration::from_micros(50);

/// With external polling, how often the signer polls while jobs wait in the provider:
/// qat_sw's own poll timeout (QAT_SW_POLL_TIMEOUT_NSEC, 10 ms), after which its poll call
/// computes a part batch. Polling sooner would find nothing to compute.
pub(super) const EXTERNAL_POLL_PERIOD: Duration = Duration::from_millis(10);

/// What the provider's callback needs to wake a slot: where to send, which slot. One per
/// slot, never freed (see `SignerThread::new`).
pub(super) struct Wake {
    tx: mpsc::Sender<Message>,
    slot: usize,
}

pub(super) extern "C" fn wake_slot(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is a `Wake` leaked in `SignerThread::new`, alive for the process.
    let wake = unsafe { &*(arg as *const Wake) };
    // The signer may be gone at exit; nothing is waiting then.
    let _ = wake.tx.send(Message::Resume(wake.slot));
    1
}

pub(super) struct Slot {
    job: *mut AsyncJob,
    ctx: *mut AsyncWaitCtx,
    request: Option<Box<Request>>,
    paused: bool,
}

/// How fast signatures of one kind arrive: the gap between two, in progress (the lesser of
/// wall-clock and process CPU time, as a part batch's wait is measured), smoothed.
pub(super) struct Arrivals {
    kind: OperationKind,
    last_wall: Instant,
    last_cpu: Duration,
    gap: Option<Duration>,
}

impl Arrivals {
    /// Counts one arrival at `now` (process CPU time `cpu`).
    fn arrived(&mut self, now: Instant, cpu: Duration) {
        let sample = now
            .duration_since(self.last_wall)
            .min(cpu.saturating_sub(self.last_cpu));
        // An exponentially weighted mean over about the last eight gaps: a batch's worth.
        self.gap = Some(match self.gap {
            None => sample,
            Some(gap) => (gap * 7 + sample) / 8,
        });
        self.last_wall = now;
        self.last_cpu = cpu;
    }
}

/// Signatures of one kind held until they make a batch.
pub(super) struct PartBatch {
    kind: OperationKind,
    #[allow(clippy::vec_box)] // boxed one by one: see `Message::SignGroup`
    held: Vec<Box<Request>>,
    /// When the oldest of `held` arrived.
    since: Instant,
    /// The process's CPU time then.
    since_cpu: Duration,
    /// One software signature of its kind (see [`part_batch_waits`]).
    software_cost: Duration,
}

impl PartBatch {
    /// When to look at it again: at the end of its wall-clock time, and past that (it waits
    /// on while the process was frozen by its CPU quota) every millisecond, until the limit.
    fn deadline(&self, batch_wait: Duration, now: Instant) -> Instant {
        let first = self.since + batch_wait.max(self.software_cost);
        if now < first {
            first
        } else {
            (now + Duration::from_millis(1)).min(self.since + batch_wait.max(THROTTLED_WAIT_LIMIT))
        }
    }
}

/// The process's CPU time, every thread's (CLOCK_PROCESS_CPUTIME_ID): what a part batch's
/// wait is measured in beside the wall clock.
pub(super) fn process_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own; CLOCK_PROCESS_CPUTIME_ID exists on
    // every Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

pub(super) struct SignerThread {
    slots: Vec<Slot>,
    free: Vec<usize>,
    batch: usize,
    batch_wait: Duration,
    /// Part batches, one per kind with signatures held.
    forming: Vec<PartBatch>,
    /// How fast each kind's signatures arrive (see `wait_limit`).
    arrivals: Vec<Arrivals>,
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
    wakes: Vec<*mut Wake>,
    /// External polling: the provider's poll call, made by this thread (see `poll`).
    poll: Option<PollFn>,
    /// When it was last made.
    last_poll: Instant,
}

// SAFETY: the raw pointers are created for the signer thread and only used there; the
// struct is moved into that thread before any of them is touched.
unsafe impl Send for SignerThread {}

/// How the signer thread drives the provider: its job slots, the batch it forms and how
/// long a part batch may wait, and the provider's poll call under external polling.
pub(super) struct Drive {
    pub(super) slots: usize,
    pub(super) batch: usize,
    pub(super) batch_wait: Duration,
    pub(super) poll: Option<PollFn>,
}

impl SignerThread {
    pub(super) fn new(
        tx: mpsc::Sender<Message>,
        drive: Drive,
        stats: Arc<SignerStats>,
        keys: Arc<KeyStock>,
        property_query: Arc<CString>,
    ) -> Self {
        let Drive {
            slots,
            batch,
            batch_wait,
            poll,
        } = drive;
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
            arrivals: Vec::new(),
            ready: VecDeque::new(),
            retry: Vec::new(),
            stats,
            keys,
            property_query,
            keys_coming: 0,
            wakes,
            poll,
            last_poll: Instant::now(),
        }
    }

    pub(super) fn run(
        mut self,
        rx: mpsc::Receiver<Message>,
        ready: mpsc::SyncSender<Result<(), String>>,
    ) {
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
            let now = Instant::now();
            let deadline = self
                .forming
                .iter()
                .map(|p| p.deadline(self.wait_limit(p.kind), now))
                .min();
            let timeout = match (deadline, self.retry.is_empty()) {
                (None, true) => None,
                (None, false) => Some(RETRY_TICK),
                (Some(d), retry) => {
                    let left = d.saturating_duration_since(Instant::now());
                    Some(if retry { left.min(RETRY_TICK) } else { left })
                }
            };
            // Jobs waiting in a provider polled externally are computed only when polled.
            let timeout = match (timeout, self.next_poll()) {
                (Some(t), Some(p)) => Some(t.min(p)),
                (t, p) => t.or(p),
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
            self.poll_provider(&rx);
            for slot in std::mem::take(&mut self.retry) {
                self.stats.retries.fetch_add(1, Ordering::Relaxed);
                self.step(slot);
            }
        }
    }

    /// External polling: how long until the provider must be polled again, while jobs wait
    /// in it; None when nothing waits (or the provider polls itself).
    fn next_poll(&self) -> Option<Duration> {
        self.poll?;
        self.jobs_in_provider().then(|| {
            (self.last_poll + EXTERNAL_POLL_PERIOD).saturating_duration_since(Instant::now())
        })
    }

    fn jobs_in_provider(&self) -> bool {
        self.slots.iter().any(|s| s.paused && s.request.is_some())
    }

    /// External polling: while jobs wait in the provider, calls its poll, which computes
    /// every whole batch at once (and a part batch once its queue has waited the provider's
    /// poll timeout) on this thread and wakes their jobs through the slots' callbacks; the
    /// jobs are resumed at once. Polled after every round of messages, so a batch is computed
    /// right after its eighth request, without waking another thread.
    fn poll_provider(&mut self, rx: &mpsc::Receiver<Message>) {
        let Some(poll) = self.poll else {
            return;
        };
        // Each poll may complete a batch whose resumed jobs free slots for groups waiting
        // in `ready`, which are submitted at once and may make another whole batch.
        while self.jobs_in_provider() {
            // SAFETY: QAT_Engine's `int qat_sw_poll(void)`, called from the one thread that
            // submits requests (its queues are this thread's, see `ffi::module_symbols`).
            unsafe { poll() };
            self.last_poll = Instant::now();
            let mut resumed = false;
            while let Ok(m) = rx.try_recv() {
                resumed |= matches!(m, Message::Resume(_));
                self.handle(m);
            }
            if !resumed {
                return;
            }
        }
    }

    /// Hands back every part batch that can no longer fill in time: its signatures are
    /// made in software by the handshakes that asked for them, in parallel.
    fn review_part_batches(&mut self) {
        let now = Instant::now();
        let cpu = process_cpu_time();
        let to_come = self.stats.to_sign.load(Ordering::Relaxed);
        let batch = self.batch;
        let mut i = 0;
        while i < self.forming.len() {
            let part = &self.forming[i];
            let waited = Waited {
                wall: now.duration_since(part.since),
                cpu: cpu.saturating_sub(part.since_cpu),
            };
            if part_batch_waits(
                part.held.len(),
                to_come,
                batch,
                waited,
                self.wait_limit(part.kind),
                part.software_cost,
            ) {
                i += 1;
                continue;
            }
            let part = self.forming.swap_remove(i);
            self.stats
                .held
                .fetch_sub(part.held.len() as i64, Ordering::Relaxed);
            let batch_cost = self.stats.batch_cost(part.kind);
            if part_batch_pays(part.held.len(), part.held[0].software_cost, batch_cost) {
                // The held signatures in software would cost more than a whole batch: they
                // go to the provider as they are, and qat_sw computes them when its poll
                // timer fires (10 ms). Completing the batch with throw-away signatures was
                // measured to cost more: each is a whole job of its own.
                self.stats.part_batches.fetch_add(1, Ordering::Relaxed);
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

    /// How long (in progress) a part batch of `kind` that can fill may wait, at the rate its
    /// signatures arrive ([`rate_aware_wait`]).
    fn wait_limit(&self, kind: OperationKind) -> Duration {
        let gap = self
            .arrivals
            .iter()
            .find(|a| a.kind == kind)
            .and_then(|a| a.gap);
        rate_aware_wait(self.batch_wait, gap, self.batch)
    }

    /// Adds a handshake's signature to the part batch of its kind; a batch that is full
    /// goes to the provider whole.
    fn hold(&mut self, request: Box<Request>) {
        let kind = request.kind;
        let (now, cpu) = (Instant::now(), process_cpu_time());
        match self.arrivals.iter_mut().find(|a| a.kind == kind) {
            Some(arrivals) => arrivals.arrived(now, cpu),
            None => self.arrivals.push(Arrivals {
                kind,
                last_wall: now,
                last_cpu: cpu,
                gap: None,
            }),
        }
        let at = match self.forming.iter().position(|p| p.kind == kind) {
            Some(at) => at,
            None => {
                self.forming.push(PartBatch {
                    kind,
                    held: Vec::with_capacity(self.batch),
                    since: now,
                    since_cpu: cpu,
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
                        counted_to_sign: false,
                    })
                })
                .collect();
            self.keys_coming += self.batch;
            self.ready.push_back(group);
        }
        self.submit_ready();
    }

    fn handle(&mut self, message: Message) {
        if let Message::Sign(request) = &message {
            if request.counted_to_sign {
                // Held from here (or submitted at once): no longer to come.
                self.stats.to_sign.fetch_sub(1, Ordering::Relaxed);
            }
        }
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
            self.stats
                .record_batch_cost(request.kind, submitted.elapsed());
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
                    super::super::ffi::openssl_errors()
                ));
                self.finished(request, false, false);
            }
        }
    }
}
