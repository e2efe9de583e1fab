//! The unsafe edge: OpenSSL 3 provider and configuration calls that the
//! `openssl` crate does not wrap. Each function owns its pointers for the duration of the
//! call and turns OpenSSL's error queue into a message.
#![allow(unsafe_code)]

use std::os::raw::{c_char, c_int};
use std::path::Path;
use std::ptr;

use openssl_sys as sys;

use super::cstring;

extern "C" {
    fn EVP_PKEY_CTX_get0_provider(ctx: *const sys::EVP_PKEY_CTX) -> *const sys::OSSL_PROVIDER;
    fn OSSL_PARAM_construct_utf8_ptr(
        key: *const std::os::raw::c_char,
        buf: *mut *mut std::os::raw::c_char,
        bsize: usize,
    ) -> sys::OSSL_PARAM;
    fn OSSL_PROVIDER_get_params(
        prov: *const sys::OSSL_PROVIDER,
        params: *mut sys::OSSL_PARAM,
    ) -> c_int;
    fn EVP_set_default_properties(libctx: *mut sys::OSSL_LIB_CTX, propq: *const c_char) -> c_int;
    fn OSSL_PROVIDER_available(libctx: *mut sys::OSSL_LIB_CTX, name: *const c_char) -> c_int;
    fn OSSL_LIB_CTX_load_config(ctx: *mut sys::OSSL_LIB_CTX, config_file: *const c_char) -> c_int;
}

/// OpenSSL's error queue as one message (and emptied).
pub(super) fn openssl_errors() -> String {
    let stack = openssl::error::ErrorStack::get();
    if stack.errors().is_empty() {
        "no further detail from OpenSSL".to_owned()
    } else {
        stack.to_string()
    }
}

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

/// Takes a reference to the provider `name` (loading it if needed) and keeps it for the
/// life of the process: providers are never unloaded while the proxy runs. Returns the
/// provider's own description (its `name` parameter, e.g. "QAT Provider for QAT_SW"),
/// empty when it gives none.
pub(super) fn load_provider(name: &str) -> Result<String, String> {
    let c_name = cstring(name)?;
    // SAFETY: NULL selects the default library context; `c_name` outlives the call. The
    // reference is deliberately never released.
    let p = unsafe { sys::OSSL_PROVIDER_load(ptr::null_mut(), c_name.as_ptr()) };
    if p.is_null() {
        return Err(openssl_errors());
    }
    let mut described: *mut std::os::raw::c_char = ptr::null_mut();
    // SAFETY: a live provider; the parameter array asks for a UTF-8 pointer the provider
    // owns for its lifetime, read before anything could unload it.
    unsafe {
        let mut params = [
            OSSL_PARAM_construct_utf8_ptr(c"name".as_ptr(), &mut described, 0),
            sys::OSSL_PARAM_construct_end(),
        ];
        if OSSL_PROVIDER_get_params(p, params.as_mut_ptr()) != 1 || described.is_null() {
            return Ok(String::new());
        }
        Ok(std::ffi::CStr::from_ptr(described)
            .to_string_lossy()
            .into_owned())
    }
}

/// True when the default library context already has `name` loaded and active (as
/// `OPENSSL_CONF` does when its file activates the provider).
pub(super) fn provider_available(name: &str) -> bool {
    let Ok(c_name) = cstring(name) else {
        return false;
    };
    // SAFETY: NULL selects the default library context; `c_name` outlives the call.
    unsafe { OSSL_PROVIDER_available(ptr::null_mut(), c_name.as_ptr()) == 1 }
}

/// Loads an OpenSSL configuration file into the default library context (activating the
/// providers it lists, with their settings).
pub(super) fn load_config(path: &Path) -> Result<(), String> {
    let c_path = cstring(&path.to_string_lossy())?;
    // SAFETY: NULL selects the default library context; `c_path` outlives the call.
    if unsafe { OSSL_LIB_CTX_load_config(ptr::null_mut(), c_path.as_ptr()) } == 1 {
        Ok(())
    } else {
        Err(openssl_errors())
    }
}

/// Sets the default library context's default property query.
pub(super) fn set_default_properties(query: &str) -> Result<(), String> {
    let q = cstring(query)?;
    // SAFETY: NULL selects the default library context; `q` outlives the call.
    if unsafe { EVP_set_default_properties(ptr::null_mut(), q.as_ptr()) } == 1 {
        Ok(())
    } else {
        Err(openssl_errors())
    }
}

/// The provider an operation context was fetched from.
pub(super) fn pkey_ctx_provider(ctx: *mut sys::EVP_PKEY_CTX) -> *const sys::OSSL_PROVIDER {
    // SAFETY: a live context; the provider pointer is OpenSSL's, alive for the process.
    unsafe { EVP_PKEY_CTX_get0_provider(ctx) }
}
