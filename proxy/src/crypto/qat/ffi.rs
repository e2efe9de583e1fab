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

/// qat_sw's own poll call (`int qat_sw_poll(void)`), which QAT_Engine exports from every
/// build with qat_sw: with `enable_external_polling = 1` it computes every queue that holds
/// a whole batch at once, and a part batch when QAT_Engine's poll timeout (10 ms) has passed
/// since that queue was last computed. nginx's QAT module reaches it through
/// `ENGINE_ctrl("POLL")`, which only engine builds have; a provider build exports the
/// function itself, so it is looked up in the loaded module.
pub type PollFn = unsafe extern "C" fn() -> c_int;

/// The symbols of the loaded provider module that external polling needs.
pub(super) struct ModuleSymbols {
    /// The module's file, as the dynamic loader loaded it.
    pub(super) path: std::path::PathBuf,
    /// `qat_sw_poll`, where exported.
    pub(super) poll: Option<PollFn>,
    /// The provider's `enable_external_polling` as it read its settings, where exported.
    pub(super) external_polling: Option<bool>,
    /// qat_sw's `mb_poll_timeout_time`, where exported (see [`Self::compute_part_batches_at_once`]).
    poll_timeout: Option<*mut libc::timespec>,
}

impl ModuleSymbols {
    /// With external polling, makes the provider's poll call compute a queue holding less
    /// than a batch at once, instead of 10 ms after that queue was last computed. The
    /// signer submits a part batch only when it has decided that it goes now (it pays, and
    /// nothing more will come in time), so the provider's own wait for more would only
    /// delay it. qat_sw reads `mb_poll_timeout_time` only in its poll call (and its heuristic
    /// timeout, which the proxy never enables); the value is a plain `struct timespec`.
    /// False when the module does not export it (part batches then wait the 10 ms).
    pub(super) fn compute_part_batches_at_once(&self) -> bool {
        let Some(timeout) = self.poll_timeout else {
            return false;
        };
        // SAFETY: QAT_Engine's `struct timespec mb_poll_timeout_time` (qat_sw_polling.c),
        // written here once at start-up, before the signer thread submits anything.
        unsafe {
            (*timeout).tv_sec = 0;
            (*timeout).tv_nsec = 0;
        }
        true
    }
}

/// Finds the loaded module `<provider_name>.so` among the process's shared objects and
/// looks up what external polling needs; None when no such module is loaded.
pub(super) fn module_symbols(provider_name: &str) -> Option<ModuleSymbols> {
    let file_name = format!("{provider_name}.so");
    let path = loaded_object_named(&file_name)?;
    let c_path = cstring(&path.to_string_lossy()).ok()?;
    // SAFETY: RTLD_NOLOAD only takes another reference to an object already loaded (OpenSSL
    // loaded it and keeps it for the process); the reference is never released, so the
    // symbols stay valid.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return None;
    }
    // SAFETY: a live handle and NUL-terminated names; the results are checked for null.
    let (poll, flag, timeout) = unsafe {
        (
            libc::dlsym(handle, c"qat_sw_poll".as_ptr()),
            libc::dlsym(handle, c"enable_external_polling".as_ptr()),
            libc::dlsym(handle, c"mb_poll_timeout_time".as_ptr()),
        )
    };
    Some(ModuleSymbols {
        path,
        // SAFETY: QAT_Engine defines `int qat_sw_poll(void)` (qat_sw_polling.c).
        poll: (!poll.is_null())
            .then(|| unsafe { std::mem::transmute::<*mut libc::c_void, PollFn>(poll) }),
        // SAFETY: QAT_Engine defines `int enable_external_polling` (e_qat.c), set once when
        // the provider read its settings, before this call.
        external_polling: (!flag.is_null()).then(|| unsafe { *(flag as *const c_int) } != 0),
        poll_timeout: (!timeout.is_null()).then_some(timeout.cast()),
    })
}

/// The path of the loaded shared object whose file name is `file_name`.
fn loaded_object_named(file_name: &str) -> Option<std::path::PathBuf> {
    struct Search<'a> {
        file_name: &'a str,
        found: Option<std::path::PathBuf>,
    }
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut libc::c_void,
    ) -> c_int {
        // SAFETY: `data` is the `Search` passed below, alive for the iteration; `info` is
        // the loader's, valid during this call.
        let search = unsafe { &mut *(data as *mut Search) };
        let name = unsafe { (*info).dlpi_name };
        if name.is_null() {
            return 0;
        }
        // SAFETY: the loader's NUL-terminated path.
        let path = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy();
        let path = std::path::Path::new(path.as_ref());
        if path.file_name().and_then(|n| n.to_str()) == Some(search.file_name) {
            search.found = Some(path.to_path_buf());
            return 1;
        }
        0
    }
    let mut search = Search {
        file_name,
        found: None,
    };
    // SAFETY: the callback only reads what the loader hands it and writes `search`.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut search as *mut Search).cast()) };
    search.found
}
