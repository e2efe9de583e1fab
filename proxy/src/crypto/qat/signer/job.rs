//! One signer job: the OpenSSL ASYNC calls, what a job computes (a signature, an X25519
//! key pair for the stock) and produces, the messages between the signer thread and the
//! threads that wait for it, and the software path a handshake takes instead.
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr, CString};
use std::os::raw::{c_char, c_int};
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use foreign_types::ForeignType;
use openssl::pkey::{PKey, Private};
use openssl_sys as sys;

use super::super::{ffi, kx};
use super::kinds::{KeyStock, OperationKind, Padding, ProviderRef, SignError, Signed, SignerStats};

/// How long a handshake waits for its signature before failing: far beyond any batch
/// wait, short enough that a wedged provider fails handshakes instead of hanging them.
pub(super) const SIGN_TIMEOUT: Duration = Duration::from_secs(10);

#[repr(C)]
pub(super) struct AsyncJob {
    _private: [u8; 0],
}
#[repr(C)]
pub(super) struct AsyncWaitCtx {
    _private: [u8; 0],
}

// ASYNC_start_job results and ASYNC_WAIT_CTX statuses (openssl/async.h).
pub(super) const ASYNC_ERR: c_int = 0;
pub(super) const ASYNC_NO_JOBS: c_int = 1;
pub(super) const ASYNC_PAUSE: c_int = 2;
pub(super) const ASYNC_FINISH: c_int = 3;
pub(super) const ASYNC_STATUS_OK: c_int = 2;
pub(super) const ASYNC_STATUS_EAGAIN: c_int = 3;

pub(super) type JobFn = extern "C" fn(*mut c_void) -> c_int;
pub(super) type CallbackFn = extern "C" fn(*mut c_void) -> c_int;

extern "C" {
    pub(super) fn ASYNC_init_thread(max_size: usize, init_size: usize) -> c_int;
    pub(super) fn ASYNC_start_job(
        job: *mut *mut AsyncJob,
        ctx: *mut AsyncWaitCtx,
        ret: *mut c_int,
        func: JobFn,
        args: *mut c_void,
        size: usize,
    ) -> c_int;
    pub(super) fn ASYNC_WAIT_CTX_new() -> *mut AsyncWaitCtx;
    pub(super) fn ASYNC_WAIT_CTX_set_callback(
        ctx: *mut AsyncWaitCtx,
        callback: CallbackFn,
        callback_arg: *mut c_void,
    ) -> c_int;
    pub(super) fn ASYNC_WAIT_CTX_get_status(ctx: *mut AsyncWaitCtx) -> c_int;
    pub(super) fn ASYNC_WAIT_CTX_set_status(ctx: *mut AsyncWaitCtx, status: c_int) -> c_int;
    fn EVP_DigestSignInit_ex(
        ctx: *mut sys::EVP_MD_CTX,
        pctx: *mut *mut sys::EVP_PKEY_CTX,
        mdname: *const c_char,
        libctx: *mut sys::OSSL_LIB_CTX,
        props: *const c_char,
        pkey: *mut sys::EVP_PKEY,
        params: *const sys::OSSL_PARAM,
    ) -> c_int;
}

pub(super) struct Request {
    pub(super) kind: OperationKind,
    pub(super) work: Work,
    /// What this signature costs in software here, measured when its key was loaded.
    pub(super) software_cost: Duration,
    /// When it went to the provider.
    pub(super) submitted: Option<Instant>,
    pub(super) property_query: Arc<CString>,
    // Filled in by the job.
    pub(super) output: Output,
    pub(super) provider: ProviderRef,
    pub(super) error: Option<String>,
    /// None for work no handshake waits for (the key stock's).
    pub(super) reply: Option<mpsc::SyncSender<Answer>>,
    /// A handshake's signature still counted in `SignerStats::to_sign`: the signer thread
    /// takes it off when it holds the request, so that a signature on its way is counted
    /// either as to come or as held, never as neither (a part batch reviewed in between
    /// would be released as unable to fill).
    pub(super) counted_to_sign: bool,
}

/// What a job computes.
pub(super) enum Work {
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
pub(super) enum Output {
    None,
    Signature(Vec<u8>),
    KeyPair(kx::RawKeyPair),
}

/// A job's outcome before it is told apart as a signature or a key pair.
pub(super) struct Finished {
    pub(super) output: Output,
    pub(super) paused: bool,
    pub(super) provider: ProviderRef,
}

/// What the signer thread answers.
pub(super) enum Answer {
    /// The job finished (paused or not).
    Done(Result<Finished, SignError>),
    /// The part batch this signature was held in could not fill: sign it in software.
    SignInSoftware,
}

pub(super) enum Message {
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

impl Finished {
    pub(super) fn into_signed(self) -> Signed {
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
pub(super) fn wait(answer: &mpsc::Receiver<Answer>) -> Result<Answer, SignError> {
    answer
        .recv_timeout(SIGN_TIMEOUT)
        .map_err(|_| SignError::Signer("no signature within 10 s"))
}

/// Signs synchronously on the calling thread, with OpenSSL's default provider: a lone
/// signature gains nothing from qat_sw (it computes eight lanes for one), and its own
/// software path costs more than OpenSSL's. Nothing is copied or queued.
pub(super) fn sign_in_software(
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

pub(super) fn finish(
    mut request: Box<Request>,
    paused: bool,
    ok: bool,
    keys: &KeyStock,
    stats: &SignerStats,
) {
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
            // Nothing else is submitted without a handshake waiting for it.
            Ok(_) => {}
            Err(_) if matches!(request.work, Work::Sign { .. }) => {}
            Err(_) => {
                stats.keys_failed.fetch_add(1, Ordering::Relaxed);
            }
        },
    }
}

/// Takes the outcome out of a finished request.
pub(super) fn result_of(
    request: &mut Request,
    paused: bool,
    ok: bool,
) -> Result<Finished, SignError> {
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
pub(super) extern "C" fn sign_job(arg: *mut c_void) -> c_int {
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

/// One `EVP_DigestSign` into `signature`, the signature fetched with `property_query`
/// (`None`: OpenSSL's defaults). Returns the provider it was fetched from; on failure also
/// OpenSSL's errors.
pub(super) fn digest_sign(
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
            return Err((provider, ffi::openssl_errors()));
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
            return Err((provider, ffi::openssl_errors()));
        }
        provider = ProviderRef(ffi::pkey_ctx_provider(pctx));
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
            return Err((provider, ffi::openssl_errors()));
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
            return Err((provider, ffi::openssl_errors()));
        }
        signature.truncate(len);
    }
    Ok(provider)
}
