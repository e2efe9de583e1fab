//! The unsafe edge: OpenSSL 3 provider, property-query and parameter calls that the
//! `openssl` crate does not wrap. Each function owns its pointers for the duration of the
//! call and turns OpenSSL's error queue into a message.
#![allow(unsafe_code)]

use std::os::raw::{c_char, c_int};
use std::path::Path;
use std::ptr;
use std::sync::Arc;

use foreign_types::ForeignType;
use openssl::pkey::{Id, PKey};
use openssl_sys as sys;

use super::{cstr_to_string, cstring, SigningProof};

extern "C" {
    fn OSSL_PROVIDER_get_params(
        prov: *const sys::OSSL_PROVIDER,
        params: *mut sys::OSSL_PARAM,
    ) -> c_int;
    fn OSSL_PROVIDER_get0_name(prov: *const sys::OSSL_PROVIDER) -> *const c_char;
    fn EVP_set_default_properties(libctx: *mut sys::OSSL_LIB_CTX, propq: *const c_char) -> c_int;
    fn EVP_PKEY_CTX_get0_provider(ctx: *const sys::EVP_PKEY_CTX) -> *const sys::OSSL_PROVIDER;
    fn EVP_PKEY_get0_provider(key: *const sys::EVP_PKEY) -> *const sys::OSSL_PROVIDER;
    fn EVP_DigestSignInit_ex(
        ctx: *mut sys::EVP_MD_CTX,
        pctx: *mut *mut sys::EVP_PKEY_CTX,
        mdname: *const c_char,
        libctx: *mut sys::OSSL_LIB_CTX,
        props: *const c_char,
        pkey: *mut sys::EVP_PKEY,
        params: *const sys::OSSL_PARAM,
    ) -> c_int;
    fn OSSL_PARAM_construct_int(key: *const c_char, buf: *mut c_int) -> sys::OSSL_PARAM;
}

fn openssl_errors() -> String {
    let stack = openssl::error::ErrorStack::get();
    if stack.errors().is_empty() {
        "no further detail from OpenSSL".to_owned()
    } else {
        stack.to_string()
    }
}

/// A loaded provider. Providers are never unloaded: the proxy uses them until it exits.
#[derive(Clone, Debug)]
pub(super) struct ProviderHandle(Arc<RawProvider>);

#[derive(Debug)]
struct RawProvider(*mut sys::OSSL_PROVIDER);

// SAFETY: an OSSL_PROVIDER is reference-counted and internally locked by OpenSSL; its
// get_params entry point is documented as callable from any thread.
unsafe impl Send for RawProvider {}
// SAFETY: see above; we never mutate the pointer itself.
unsafe impl Sync for RawProvider {}

pub(super) fn set_default_search_path(dir: &Path) -> Result<(), String> {
    let path = cstring(&dir.to_string_lossy())?;
    // SAFETY: NULL selects the default library context; `path` outlives the call.
    let ok = unsafe { sys::OSSL_PROVIDER_set_default_search_path(ptr::null_mut(), path.as_ptr()) };
    if ok == 1 {
        Ok(())
    } else {
        Err(openssl_errors())
    }
}

pub(super) fn load_provider(name: &str) -> Result<ProviderHandle, String> {
    let c_name = cstring(name)?;
    // SAFETY: NULL selects the default library context; `c_name` outlives the call. The
    // returned reference is kept for the life of the process.
    let p = unsafe { sys::OSSL_PROVIDER_load(ptr::null_mut(), c_name.as_ptr()) };
    if p.is_null() {
        Err(openssl_errors())
    } else {
        Ok(ProviderHandle(Arc::new(RawProvider(p))))
    }
}

pub(super) fn set_default_properties(query: &str) -> Result<(), String> {
    let q = cstring(query)?;
    // SAFETY: NULL selects the default library context; `q` outlives the call.
    let ok = unsafe { EVP_set_default_properties(ptr::null_mut(), q.as_ptr()) };
    if ok == 1 {
        Ok(())
    } else {
        Err(openssl_errors())
    }
}

impl ProviderHandle {
    /// One `OSSL_PROVIDER_get_params` call with integer parameters, each pre-filled with its
    /// value (the QAT provider reads them as settings and commands). Returns what the
    /// provider wrote back, `None` for a parameter it left untouched (does not know).
    pub(super) fn get_int_params(
        &self,
        params: &[(&str, i32)],
    ) -> Result<Vec<Option<i32>>, String> {
        let keys: Vec<_> = params
            .iter()
            .map(|(k, _)| cstring(k))
            .collect::<Result<_, _>>()?;
        let mut values: Vec<c_int> = params.iter().map(|(_, v)| *v).collect();
        let mut raw: Vec<sys::OSSL_PARAM> = Vec::with_capacity(params.len() + 1);
        for (key, value) in keys.iter().zip(values.iter_mut()) {
            // SAFETY: `key` and `value` outlive `raw`, which is used only within this call.
            raw.push(unsafe { OSSL_PARAM_construct_int(key.as_ptr(), value) });
        }
        // SAFETY: constructs the terminating element; no pointers involved.
        raw.push(unsafe { sys::OSSL_PARAM_construct_end() });
        // SAFETY: `raw` is a terminated OSSL_PARAM array whose data pointers are live.
        let ok = unsafe { OSSL_PROVIDER_get_params(self.0 .0, raw.as_mut_ptr()) };
        if ok != 1 {
            return Err(openssl_errors());
        }
        let modified: Vec<bool> = raw[..params.len()]
            .iter()
            // SAFETY: each element is a valid OSSL_PARAM from the array above.
            .map(|p| unsafe { sys::OSSL_PARAM_modified(p) } == 1)
            .collect();
        Ok(values
            .into_iter()
            .zip(modified)
            .map(|(v, m)| m.then_some(v))
            .collect())
    }

    /// One external poll; true when the provider reports it serviced.
    pub(super) fn poll(&self) -> bool {
        matches!(
            self.get_int_params(&[("qat_poll", 1)]).as_deref(),
            Ok([Some(1)])
        )
    }

    /// Asymmetric, KDF and cipher requests in flight plus multi-buffer items queued.
    pub(super) fn requests_in_flight(&self) -> i64 {
        const COUNTERS: [&str; 6] = [
            "qat_num_asym_requests_in_flight",
            "qat_num_kdf_requests_in_flight",
            "qat_num_cipher_requests_in_flight",
            "qat_num_asym_mb_items_in_queue",
            "qat_num_kdf_mb_items_in_queue",
            "qat_num_sym_mb_items_in_queue",
        ];
        let params: Vec<(&str, i32)> = COUNTERS.iter().map(|k| (*k, 0)).collect();
        self.get_int_params(&params)
            .map(|v| v.into_iter().flatten().map(i64::from).sum())
            .unwrap_or(0)
    }
}

/// Signs a probe with the PEM private key through the default library context and default
/// properties (as rustls-openssl does) and reports which providers did the work.
pub(super) fn probe_sign(pem: &[u8]) -> Result<SigningProof, String> {
    const PROBE: &[u8] = b"tls-proxy QAT start-up proof";
    let pkey = PKey::private_key_from_pem(pem).map_err(|e| e.to_string())?;
    let (digest, operation, rsa) = match pkey.id() {
        Id::RSA => ("SHA256", format!("RSA-{} PSS SHA-256", pkey.bits()), true),
        Id::EC if pkey.bits() <= 256 => ("SHA256", "ECDSA P-256 SHA-256".to_owned(), false),
        Id::EC if pkey.bits() <= 384 => ("SHA384", "ECDSA P-384 SHA-384".to_owned(), false),
        Id::EC => ("SHA512", "ECDSA P-521 SHA-512".to_owned(), false),
        other => return Err(format!("key type {other:?} is not used with QAT offload")),
    };
    let md = cstring(digest)?;
    // SAFETY: every pointer below is created and freed in this block; `pkey` and `md`
    // outlive it. Return codes are checked before results are used.
    unsafe {
        let mdctx = sys::EVP_MD_CTX_new();
        if mdctx.is_null() {
            return Err(openssl_errors());
        }
        struct Free(*mut sys::EVP_MD_CTX);
        impl Drop for Free {
            fn drop(&mut self) {
                // SAFETY: allocated by EVP_MD_CTX_new above and freed exactly once.
                unsafe { sys::EVP_MD_CTX_free(self.0) }
            }
        }
        let _free = Free(mdctx);
        let mut pctx: *mut sys::EVP_PKEY_CTX = ptr::null_mut();
        if EVP_DigestSignInit_ex(
            mdctx,
            &mut pctx,
            md.as_ptr(),
            ptr::null_mut(),
            ptr::null(),
            pkey.as_ptr(),
            ptr::null(),
        ) != 1
        {
            return Err(openssl_errors());
        }
        if rsa
            && (sys::EVP_PKEY_CTX_set_rsa_padding(pctx, sys::RSA_PKCS1_PSS_PADDING) != 1
                || sys::EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, -1) != 1)
        {
            return Err(openssl_errors());
        }
        if pctx.is_null() {
            return Err("EVP_DigestSignInit_ex succeeded but gave no key context".to_owned());
        }
        let signature_provider = provider_name(EVP_PKEY_CTX_get0_provider(pctx));
        let mut len = 0usize;
        if sys::EVP_DigestSign(
            mdctx,
            ptr::null_mut(),
            &mut len,
            PROBE.as_ptr(),
            PROBE.len(),
        ) != 1
        {
            return Err(openssl_errors());
        }
        let mut sig = vec![0u8; len];
        if sys::EVP_DigestSign(
            mdctx,
            sig.as_mut_ptr(),
            &mut len,
            PROBE.as_ptr(),
            PROBE.len(),
        ) != 1
        {
            return Err(openssl_errors());
        }
        let key_provider = provider_name(EVP_PKEY_get0_provider(pkey.as_ptr()));
        Ok(SigningProof {
            operation,
            signature_provider,
            key_provider,
            signature_len: len,
        })
    }
}

/// The name of `prov`; OpenSSL returns no provider for legacy (engine or built-in)
/// implementations, and OSSL_PROVIDER_get0_name dereferences its argument unchecked.
fn provider_name(prov: *const sys::OSSL_PROVIDER) -> String {
    if prov.is_null() {
        return "(no provider: a legacy implementation)".to_owned();
    }
    // SAFETY: `prov` is a live provider handle OpenSSL returned; the name it gives is a
    // NUL-terminated string owned by the provider.
    cstr_to_string(unsafe { OSSL_PROVIDER_get0_name(prov) })
}
