//! OpenSSL + Intel QuickAssist: loading an OpenSSL 3 provider module that performs the
//! asymmetric operations, steering OpenSSL's fetches to it, polling it, and proving at
//! start-up that signatures really are fetched from it.
//!
//! Everything here acts on OpenSSL's default library context, which is what rustls-openssl
//! uses; so once [`activate`] has run, the `openssl` provider's signatures go to the loaded
//! provider. The sequence follows the QAT provider's application-integration guide: load the
//! default provider alongside it, instantiate the DRBG *before* biasing the property query
//! (the QAT provider has no DRBG), set `?provider=<name>`, push polling settings together
//! with `qat_init_provider`, then poll if polling is external.
//!
//! Machines without QAT test this same path with OpenSSL's own `default` provider standing
//! in, and the `legacy` module (a real, loadable, non-default provider that cannot sign)
//! proves the start-up check catches a provider that does not do the work.

mod ffi;
pub mod telemetry;

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The QAT provider's name as QAT_Engine builds it.
pub const DEFAULT_PROVIDER_NAME: &str = "qatprovider";
/// External polling interval. QAT's own internal poller defaults to 10 µs; 100 µs keeps a
/// dedicated poll thread well under a few percent of a core while adding at most 0.1 ms
/// to a handshake that takes milliseconds.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_micros(100);
/// Backstop for heuristic polling: poll at least this often even with nothing counted in
/// flight, so a completion never waits for an unrelated event.
const HEURISTIC_BACKSTOP: Duration = Duration::from_millis(5);

/// Who collects QAT completions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Polling {
    /// The provider's own polling thread.
    #[default]
    Internal,
    /// Our poll thread, at a fixed interval.
    External,
    /// Our poll thread, polling when requests are in flight (plus a backstop timer).
    Heuristic,
}

/// What to do when the provider is asked for but cannot be used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Fallback {
    /// Refuse to start (the default: a silent software fallback would make every figure
    /// measured with "openssl-qat" a lie).
    #[default]
    None,
    /// Run on software OpenSSL, with a log line and `proxy_qat_offload_active 0`.
    Software,
}

/// `[qat]` in the proxy configuration.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QatConfig {
    /// The OpenSSL provider to load (QAT_Engine builds `qatprovider`).
    pub provider_name: String,
    /// Where the module lives: a directory (the module search path) or the module file
    /// itself, whose stem must then be `provider_name`. Unset: OpenSSL's own search path,
    /// `OPENSSL_MODULES`, or what `OPENSSL_CONF` configures.
    pub module_path: Option<PathBuf>,
    /// The default property query; unset means `?provider=<provider_name>`.
    pub property_query: Option<String>,
    /// Who polls for completions.
    pub polling: Polling,
    /// Interval of our poll thread (external and heuristic polling).
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Behaviour when the provider cannot be used.
    pub fallback: Fallback,
    /// Root of the sysfs tree where QAT telemetry is looked for (tests point it at a
    /// recorded tree).
    pub telemetry_root: PathBuf,
    /// Write `1` to the in-kernel driver's telemetry `control` file if telemetry is off
    /// (needs root and debugfs).
    pub enable_telemetry: bool,
}

impl Default for QatConfig {
    fn default() -> Self {
        Self {
            provider_name: DEFAULT_PROVIDER_NAME.to_owned(),
            module_path: None,
            property_query: None,
            polling: Polling::Internal,
            poll_interval: DEFAULT_POLL_INTERVAL,
            fallback: Fallback::None,
            telemetry_root: PathBuf::from("/sys"),
            enable_telemetry: false,
        }
    }
}

impl QatConfig {
    /// The property query that will be set.
    pub fn effective_property_query(&self) -> String {
        self.property_query
            .clone()
            .unwrap_or_else(|| format!("?provider={}", self.provider_name))
    }
}

/// Why the provider could not be used. Every message says which module and name were
/// looked for.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct QatError(pub String);

/// The loaded provider, process-wide.
#[derive(Debug)]
pub struct QatState {
    /// The provider's name.
    pub name: String,
    /// The property query in force.
    pub property_query: String,
    /// The polling mode the provider reports as effective (`None`: the provider does not
    /// know QAT's polling parameters, e.g. a stand-in).
    pub effective_polling: Option<Polling>,
    provider: ffi::ProviderHandle,
    /// Poll calls made by our poll thread, and how many failed.
    pub polls: Arc<AtomicU64>,
    /// Failed poll calls.
    pub poll_failures: Arc<AtomicU64>,
    stop_polling: Arc<AtomicBool>,
}

static STATE: OnceLock<Result<Arc<QatState>, String>> = OnceLock::new();

/// The activated provider, if [`activate`] succeeded.
pub fn active() -> Option<Arc<QatState>> {
    STATE.get().and_then(|r| r.as_ref().ok().cloned())
}

/// Loads and activates the provider once per process (OpenSSL's default library context is
/// process-wide); later calls return the first outcome.
pub fn activate(cfg: &QatConfig) -> Result<Arc<QatState>, QatError> {
    STATE
        .get_or_init(|| activate_once(cfg).map(Arc::new).map_err(|e| e.0))
        .clone()
        .map_err(QatError)
}

fn activate_once(cfg: &QatConfig) -> Result<QatState, QatError> {
    openssl::init();
    let name = cfg.provider_name.as_str();
    let search_path = match &cfg.module_path {
        None => None,
        Some(p) if p.is_dir() => Some(p.clone()),
        Some(p) if p.is_file() => {
            let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
            if stem != name {
                return Err(QatError(format!(
                    "qat.module_path {} is a module named {stem:?}, but qat.provider_name is {name:?}; \
                     set provider_name to {stem:?} or point module_path at the directory holding {name}.so",
                    p.display()
                )));
            }
            p.parent().map(Path::to_path_buf)
        }
        Some(p) => {
            return Err(QatError(format!(
            "qat.module_path {}: no such file or directory (looking for OpenSSL provider {name:?})",
            p.display()
        )))
        }
    };
    let where_ = describe_search(search_path.as_deref());
    if let Some(dir) = &search_path {
        ffi::set_default_search_path(dir).map_err(|e| {
            QatError(format!(
                "cannot set the OpenSSL module search path to {}: {e}",
                dir.display()
            ))
        })?;
    }
    // The default provider stays available for everything the QAT provider does not
    // implement (and for the DRBG). Loading any provider explicitly turns off OpenSSL's
    // automatic loading of "default", so it is loaded explicitly too.
    ffi::load_provider("default")
        .map_err(|e| QatError(format!("cannot load OpenSSL's default provider: {e}")))?;
    let provider = ffi::load_provider(name).map_err(|e| {
        QatError(format!(
            "cannot load OpenSSL provider {name:?} ({where_}): {e}. Is QAT_Engine built with \
             --enable-qat_provider and installed there? See deploy/QAT.md"
        ))
    })?;
    // The DRBG must exist before fetches are biased towards a provider that has none.
    let mut seed = [0u8; 1];
    openssl::rand::rand_bytes(&mut seed)
        .map_err(|e| QatError(format!("OpenSSL's random generator failed: {e}")))?;
    let query = cfg.effective_property_query();
    ffi::set_default_properties(&query).map_err(|e| {
        QatError(format!(
            "cannot set OpenSSL's default property query {query:?}: {e}"
        ))
    })?;

    // Polling settings go in one call together with init, which the provider processes
    // last. Unknown parameters are left untouched, which tells a QAT provider from others.
    let (ext, heur) = match cfg.polling {
        Polling::Internal => (0, 0),
        Polling::External => (1, 0),
        Polling::Heuristic => (1, 1),
    };
    let params = provider.get_int_params(&[
        ("qat_enable_external_polling", ext),
        ("qat_enable_heuristic_polling", heur),
        ("qat_init_provider", 1),
    ]);
    let effective_polling = match params.as_deref() {
        Ok([Some(ext), Some(heur), Some(init)]) => {
            if *init != 1 {
                return Err(QatError(format!(
                    "OpenSSL provider {name:?} ({where_}) loaded, but qat_init_provider reported {init} \
                     (QAT device not initialised: check the driver, qatlib and the device's services)"
                )));
            }
            Some(match (ext, heur) {
                (0, _) => Polling::Internal,
                (_, 0) => Polling::External,
                _ => Polling::Heuristic,
            })
        }
        Ok(_) => None,
        Err(e) => {
            return Err(QatError(format!(
                "OpenSSL provider {name:?} ({where_}) rejected its parameters: {e}"
            )))
        }
    };
    if cfg.polling != Polling::Internal && effective_polling != Some(cfg.polling) {
        return Err(QatError(format!(
            "qat.polling = {:?} was asked for, but provider {name:?} reports {}",
            cfg.polling,
            effective_polling.map_or("no QAT polling parameters".to_owned(), |p| format!("{p:?}"))
        )));
    }

    let state = QatState {
        name: name.to_owned(),
        property_query: query,
        effective_polling,
        provider,
        polls: Arc::default(),
        poll_failures: Arc::default(),
        stop_polling: Arc::default(),
    };
    if matches!(cfg.polling, Polling::External | Polling::Heuristic) {
        state.start_poller(cfg.polling, cfg.poll_interval)?;
    }
    Ok(state)
}

fn describe_search(dir: Option<&Path>) -> String {
    match dir {
        Some(d) => format!("module search path {}", d.display()),
        None => format!(
            "OpenSSL's module search path{}{}",
            std::env::var("OPENSSL_MODULES")
                .map(|v| format!(", OPENSSL_MODULES={v}"))
                .unwrap_or_default(),
            std::env::var("OPENSSL_CONF")
                .map(|v| format!(", OPENSSL_CONF={v}"))
                .unwrap_or_default()
        ),
    }
}

impl QatState {
    fn start_poller(&self, mode: Polling, interval: Duration) -> Result<(), QatError> {
        let provider = self.provider.clone();
        let (polls, failures, stop) = (
            self.polls.clone(),
            self.poll_failures.clone(),
            self.stop_polling.clone(),
        );
        std::thread::Builder::new()
            .name("qat-poll".to_owned())
            .spawn(move || {
                let mut since_poll = Duration::ZERO;
                while !stop.load(Ordering::Relaxed) {
                    let due = match mode {
                        Polling::Heuristic => {
                            since_poll >= HEURISTIC_BACKSTOP || provider.requests_in_flight() > 0
                        }
                        _ => true,
                    };
                    if due {
                        polls.fetch_add(1, Ordering::Relaxed);
                        if !provider.poll() {
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                        since_poll = Duration::ZERO;
                    }
                    std::thread::sleep(interval);
                    since_poll += interval;
                }
            })
            .map(|_| ())
            .map_err(|e| QatError(format!("cannot start the QAT poll thread: {e}")))
    }

    /// Asynchronous requests in flight, as the provider counts them (0 when it does not).
    pub fn requests_in_flight(&self) -> i64 {
        self.provider.requests_in_flight()
    }

    /// Signs a probe with the private key in `key_pem` exactly as rustls-openssl does
    /// (default library context, default properties) and reports which provider the
    /// signature operation was fetched from. Errors unless it is this provider.
    pub fn prove_signing(&self, key_path: &Path) -> Result<SigningProof, QatError> {
        let pem = std::fs::read(key_path).map_err(|e| {
            QatError(format!(
                "cannot read private key {}: {e}",
                key_path.display()
            ))
        })?;
        let proof = ffi::probe_sign(&pem).map_err(|e| {
            QatError(format!(
                "signing with {} through OpenSSL failed: {e}",
                key_path.display()
            ))
        })?;
        if proof.signature_provider != self.name {
            return Err(QatError(format!(
                "start-up proof failed: a {} signature with {} was fetched from OpenSSL provider {:?}, \
                 not {:?} (property query {:?}); the provider does not implement it, so nothing would be offloaded",
                proof.operation,
                key_path.display(),
                proof.signature_provider,
                self.name,
                self.property_query
            )));
        }
        Ok(proof)
    }
}

impl Drop for QatState {
    fn drop(&mut self) {
        self.stop_polling.store(true, Ordering::Relaxed);
    }
}

/// What the start-up proof saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SigningProof {
    /// e.g. "RSA-PSS SHA-256".
    pub operation: String,
    /// The provider the signature operation was fetched from.
    pub signature_provider: String,
    /// The provider managing the key.
    pub key_provider: String,
    /// Signature length in bytes (the signature was really produced).
    pub signature_len: usize,
}

impl std::fmt::Display for SigningProof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} signature fetched from provider {:?} (key managed by {:?}, {} bytes)",
            self.operation, self.signature_provider, self.key_provider, self.signature_len
        )
    }
}

fn cstring(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"))
}

fn cstr_to_string(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        return "(none)".to_owned();
    }
    // SAFETY: callers pass pointers OpenSSL documents as NUL-terminated strings owned by
    // OpenSSL for the lifetime of the provider.
    #[allow(unsafe_code)]
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
