//! OpenSSL + Intel QuickAssist: loading QAT_Engine's OpenSSL 3 provider with the settings
//! it really reads, signing through it asynchronously and batched, and proving at start-up
//! that it offloads; and which provider a listener that asks for openssl-qat is served by
//! ([`provider_in_effect`]: the proof, and the software fallback `qat.fallback` allows).
//!
//! QAT_Engine's provider (v1.8 and later) takes its settings from its section of an OpenSSL
//! configuration file (`enable_external_polling`, `qat_poll_interval`, ...), read once when
//! the provider is activated; it answers no settings through `OSSL_PROVIDER_get_params`.
//! So the proxy writes that section from `[qat]` and loads it with
//! `OSSL_LIB_CTX_load_config`, unless `OPENSSL_CONF` already activated the provider, in
//! which case that file's settings are the ones in force and the log says so.
//!
//! Nothing else of OpenSSL is pointed at the provider: no default property query is set, so
//! the record layer (AES-GCM), hashes and key exchange stay on OpenSSL's default provider,
//! and only signatures are fetched from QAT, with an explicit property query, inside the
//! ASYNC jobs of [`signer::AsyncSigner`]. A provider that signs without pausing its job is
//! loaded but not offloading, and the start-up proof says so.

mod ffi;
pub mod key;
pub mod kx;
pub mod signer;
pub mod telemetry;

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ProviderName;
use signer::{AsyncSigner, Padding};

/// The default property query while QAT is active: OpenSSL's default provider for
/// everything a signature query does not override.
pub const ROUTE_EVERYTHING_ELSE: &str = "?provider=default";
/// The QAT provider's name as QAT_Engine builds it.
pub const DEFAULT_PROVIDER_NAME: &str = "qatprovider";
/// QAT_Engine's own default for `qat_poll_interval` (its internal poll thread, QAT
/// hardware): 10 µs.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_micros(10);
/// QAT_Engine's default `qat_max_retry_count`.
const DEFAULT_MAX_RETRY_COUNT: u32 = 5;
/// QAT_Engine's default `qat_epoll_timeout` (ms); only event-driven polling uses it, which
/// the provider cannot use without external polling, so it is written as the default.
const EPOLL_TIMEOUT_MS: u32 = 1000;
/// Signatures in flight on the signer: enough for 8 full qat_sw batches of 8, well under
/// qat_sw's 128 request slots per queue.
pub const DEFAULT_MAX_SIGNATURES_IN_FLIGHT: usize = 64;
/// qat_sw's multi-buffer width: it computes eight RSA or ECDSA operations per pass, and a
/// queue of eight at once.
pub const DEFAULT_BATCH: usize = 8;
/// The longest a part batch waits for the handshakes under way to fill it before its
/// signatures are made in software: half of qat_sw's own shortest poll timeout (10 ms).
/// A batch fills in about `batch` handshake arrivals, so at the study's load (32 and more
/// clients) it fills well within this; a part batch that cannot fill is handed back at
/// once, not after this wait (see `signer`).
pub const DEFAULT_BATCH_WAIT: Duration = Duration::from_millis(5);

/// Who collects QAT completions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Polling {
    /// The provider's own polling thread (qat_sw: one per signing thread, woken at every
    /// eighth request and flushing part batches every 10 ms; QAT hardware: every
    /// `poll_interval`).
    #[default]
    Internal,
    /// QAT hardware only: the requesting thread busy-polls for its own response
    /// (`enable_inline_polling`); no effect on qat_sw.
    Inline,
    /// qat_sw: `enable_external_polling`, and the signer thread computes each batch itself
    /// by calling the module's `qat_sw_poll` right after submitting it (QAT_Engine's external
    /// polling, what nginx's QAT module does through `ENGINE_ctrl("POLL")`, which provider
    /// builds lack but whose function they export). No wake-up of another thread, and no
    /// request count to keep aligned: the internal thread is woken at every eighth request
    /// of any kind, so one part batch leaves a remainder of every later batch to its 10 ms
    /// timer. Refused where the module exports no `qat_sw_poll` (QAT hardware builds).
    External,
    /// Refused: heuristic polling is nginx's and HAProxy's own schedule for calling the
    /// engine's poll; the signer's batching plays that part here (use `external`).
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
    /// The property query signatures are fetched with; unset means
    /// `?provider=<provider_name>`. It applies to signatures only.
    pub property_query: Option<String>,
    /// Who polls for completions (`enable_inline_polling`; see [`Polling`]).
    pub polling: Polling,
    /// `qat_poll_interval`: the provider's internal poll period (QAT hardware).
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// `enable_sw_fallback`: QAT hardware only, the provider signs in software while a
    /// device is down (the start-up proof still requires offload at start).
    pub sw_fallback: bool,
    /// `qat_max_retry_count`: QAT hardware only, resubmissions of a request the device
    /// refused because its ring was full.
    pub max_retry_count: u32,
    /// `enable_instance_for_thread`: QAT hardware only, one device instance per thread.
    pub instance_for_thread: bool,
    /// Signatures the proxy keeps in flight in the provider at once; more wait in order.
    pub max_signatures_in_flight: usize,
    /// The longest a part batch waits to fill before its signatures are made in software
    /// (qat_sw; no effect with `batch = 1`).
    #[serde(with = "humantime_serde")]
    pub batch_wait: Duration,
    /// Send ECDSA P-256 signatures to the provider too. Off by default: qat_sw signs P-256
    /// only 1.2x-1.3x faster than OpenSSL (a 20 us signature), less than a handshake's
    /// round trip to the signer thread costs, so they are signed in software where the
    /// handshake runs. QAT hardware, which takes the whole signature off the CPU, may gain.
    pub offload_p256: bool,
    /// Generate X25519 key pairs ahead in provider batches (the signer's key stock). Off by
    /// default: with qat_sw 1.8.1 the stock corrupted the heap (`malloc(): corrupted size
    /// vs. prev_size`, the proxy aborted) once 32 clients resumed their sessions at once,
    /// handshakes that use the stock without a signature; found 2026-12-07, not yet traced
    /// to its cause. X25519 on OpenSSL's default provider costs about 50 us a handshake.
    pub offload_x25519: bool,
    /// The provider's batch width: 8 for qat_sw (a signature goes to the provider only
    /// when a batch of 8 can fill soon, else it is signed in software), 1 for QAT
    /// hardware (every signature goes to the provider at once).
    pub batch: usize,
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
            sw_fallback: false,
            max_retry_count: DEFAULT_MAX_RETRY_COUNT,
            instance_for_thread: false,
            max_signatures_in_flight: DEFAULT_MAX_SIGNATURES_IN_FLIGHT,
            batch: DEFAULT_BATCH,
            batch_wait: DEFAULT_BATCH_WAIT,
            offload_p256: false,
            offload_x25519: false,
            fallback: Fallback::None,
            telemetry_root: PathBuf::from("/sys"),
            enable_telemetry: false,
        }
    }
}

impl QatConfig {
    /// The property query signatures are fetched with.
    pub fn effective_property_query(&self) -> String {
        self.property_query
            .clone()
            .unwrap_or_else(|| format!("?provider={}", self.provider_name))
    }

    /// What is wrong with these settings, for `Config::validate`.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.polling == Polling::Heuristic {
            problems.push(
                "qat.polling = \"heuristic\": heuristic polling is a schedule for an application's poll \
                 calls (nginx's and HAProxy's); the proxy's signer already polls right after each batch \
                 it forms: use \"external\" (qat_sw), \"internal\" (qat_sw and QAT hardware) or \
                 \"inline\" (QAT hardware)"
                    .to_owned(),
            );
        }
        if self.batch == 0 || self.batch > 64 {
            problems.push("qat.batch must be between 1 and 64".to_owned());
        }
        if self.batch_wait > Duration::from_secs(1) {
            problems.push(format!(
                "qat.batch_wait = {:?}: at most 1s (a handshake waits this long for its batch)",
                self.batch_wait
            ));
        }
        if self.max_signatures_in_flight < self.batch {
            problems.push(format!(
                "qat.max_signatures_in_flight ({}) must be at least qat.batch ({})",
                self.max_signatures_in_flight, self.batch
            ));
        }

        if self.poll_interval.as_nanos() == 0 || self.poll_interval.as_nanos() > i32::MAX as u128 {
            problems.push("qat.poll_interval must be between 1 ns and 2 s".to_owned());
        }
        if self.provider_name.is_empty()
            || !self
                .provider_name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            problems.push(format!(
                "qat.provider_name {:?}: a provider name is letters, digits, '_' and '-'",
                self.provider_name
            ));
        }
        problems
    }

    /// The settings QAT_Engine's provider reads from its configuration section, as
    /// `key = value` pairs. All of them are always written: the provider reads the others
    /// only when `enable_external_polling` is present, and then without a check.
    pub fn provider_settings(&self) -> Vec<(&'static str, String)> {
        let flag = |b: bool| u8::from(b).to_string();
        vec![
            (
                "enable_external_polling",
                flag(self.polling == Polling::External),
            ),
            ("enable_heuristic_polling", "0".to_owned()),
            ("enable_sw_fallback", flag(self.sw_fallback)),
            (
                "enable_inline_polling",
                flag(self.polling == Polling::Inline),
            ),
            (
                "qat_poll_interval",
                self.poll_interval.as_nanos().to_string(),
            ),
            ("qat_epoll_timeout", EPOLL_TIMEOUT_MS.to_string()),
            ("enable_event_driven_polling", "0".to_owned()),
            ("enable_instance_for_thread", flag(self.instance_for_thread)),
            ("qat_max_retry_count", self.max_retry_count.to_string()),
        ]
    }

    /// The OpenSSL configuration the proxy loads to activate the provider with
    /// [`provider_settings`](Self::provider_settings): the default provider stays active
    /// beside it (for everything QAT does not implement, and the DRBG).
    pub fn openssl_config(&self, module_file: Option<&Path>) -> String {
        let mut text = format!(
            "# Written by the proxy from [qat]; loaded with OSSL_LIB_CTX_load_config.\n\
             openssl_conf = openssl_init\n\n[openssl_init]\nproviders = provider_sect\n\n\
             [provider_sect]\ndefault = default_sect\n{name} = qat_sect\n\n\
             [default_sect]\nactivate = 1\n\n[qat_sect]\n",
            name = self.provider_name
        );
        if let Some(module) = module_file {
            text.push_str(&format!("module = {}\n", module.display()));
        }
        text.push_str("activate = 1\n");
        for (key, value) in self.provider_settings() {
            text.push_str(&format!("{key} = {value}\n"));
        }
        text
    }
}

/// Why the provider could not be used, by what failed: callers decide on it (a key that
/// cannot be read is never "fixed" by the software fallback). Every message says which
/// module, name or key file was involved.
#[derive(Clone, Debug, thiserror::Error)]
pub enum QatError {
    /// `[qat]` cannot be used as written.
    #[error("{0}")]
    Config(String),
    /// The provider could not be loaded or set up (module missing, OpenSSL refused it,
    /// the signer thread would not start).
    #[error("{0}")]
    Unavailable(String),
    /// The key the start-up proof signs with cannot be read.
    #[error("{0}")]
    Key(String),
    /// Nothing would be offloaded: the key is of a kind QAT does not sign, or a signature
    /// failed inside the provider, came from another provider, ran without pausing its
    /// job, or does not verify.
    #[error("{0}")]
    NotOffloading(String),
}

/// Whether `/proc/cpuinfo` lists CPU flags without `avx512ifma` (false when unreadable).
/// The proxy reads it only when a signature failed inside the provider, to name the likely
/// cause: qat_sw's multi-buffer RSA and ECDSA (crypto_mb) need AVX-512 IFMA.
pub fn cpu_lacks_avx512_ifma() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|info| {
        info.lines()
            .find(|l| l.starts_with("flags"))
            .is_some_and(|flags| !flags.split_whitespace().any(|f| f == "avx512ifma"))
    })
}

/// Where the provider's settings came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SettingsSource {
    /// The proxy wrote them from `[qat]`.
    Proxy(Vec<(&'static str, String)>),
    /// `OPENSSL_CONF` had already activated the provider; that file's section is in force.
    OpensslConf(String),
}

impl std::fmt::Display for SettingsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Proxy(settings) => {
                let pairs: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
                write!(f, "from [qat]: {}", pairs.join(" "))
            }
            Self::OpensslConf(path) => {
                write!(f, "from OPENSSL_CONF={path} ([qat] settings not applied)")
            }
        }
    }
}

/// What computes the QAT provider's work, by the provider's own description.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// QAT_Engine's software mode: crypto_mb's multi-buffer code on AVX-512 IFMA.
    Software,
    /// A QuickAssist device.
    Hardware,
    /// A provider that does not say (not QAT_Engine's).
    Unknown,
}

impl Mode {
    /// From the provider's `name` parameter: QAT_Engine says "QAT Provider for QAT_SW"
    /// or "... QAT_HW" (both, with a device and qat_sw, count as hardware).
    pub fn of(described: &str) -> Self {
        if described.contains("QAT_HW") {
            Self::Hardware
        } else if described.contains("QAT_SW") {
            Self::Software
        } else {
            Self::Unknown
        }
    }

    /// The metric label: `qat_sw`, `qat_hw` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Software => "qat_sw",
            Self::Hardware => "qat_hw",
            Self::Unknown => "unknown",
        }
    }
}

/// The loaded provider and its signer, process-wide.
#[derive(Debug)]
pub struct QatState {
    /// The provider's name.
    pub name: String,
    /// What computes its work.
    pub mode: Mode,
    /// The property query signatures are fetched with.
    pub property_query: String,
    /// Who polls the provider for completions, as in effect.
    pub polling: Polling,
    /// Where the provider's settings came from.
    pub settings: SettingsSource,
    /// ECDSA P-256 signatures go to the provider (`qat.offload_p256`).
    pub offload_p256: bool,
    /// X25519 key pairs come from the provider's batches (`qat.offload_x25519`).
    pub offload_x25519: bool,
    signer: AsyncSigner,
}

static STATE: OnceLock<Result<Arc<QatState>, QatError>> = OnceLock::new();

/// The activated provider, if [`activate`] succeeded.
pub fn active() -> Option<Arc<QatState>> {
    STATE.get().and_then(|r| r.as_ref().ok().cloned())
}

/// What activating the provider came to under `qat.fallback`.
pub enum Activation {
    /// The provider is active.
    Active(Arc<QatState>),
    /// It could not be activated and `qat.fallback = "software"`: openssl-qat listeners
    /// sign in software OpenSSL, for this reason.
    FellBack(QatError),
}

/// The provider a listener that asked for `requested` signs with, and what start-up reports
/// about it (see [`provider_in_effect`]).
#[derive(Debug)]
pub struct InEffect {
    /// The provider in effect: `requested`, or software OpenSSL where openssl-qat fell back.
    pub provider: ProviderName,
    /// openssl-qat in effect: the proof that signatures with the listener's key are offloaded.
    pub qat_proof: Option<String>,
    /// openssl-qat was asked for and software OpenSSL is in effect, and why.
    pub fell_back: Option<String>,
}

/// Which provider is in effect for a listener: the one answer start-up, `check-config`,
/// reloads and the run-time switch all use. `requested` as planned; `state` the activated
/// QAT provider, if any; `fallback` whether an openssl-qat request whose provider is missing
/// or does not offload may be served by software OpenSSL. For openssl-qat the signing
/// proof runs here with the listener's key, so a provider that does not offload is named as
/// such before the key is loaded through it (where its error would read as a key problem).
pub fn provider_in_effect(
    requested: ProviderName,
    key: &Path,
    state: Option<&QatState>,
    fallback: Fallback,
) -> Result<InEffect, QatError> {
    let in_effect = |provider, qat_proof, fell_back| InEffect {
        provider,
        qat_proof,
        fell_back,
    };
    if requested != ProviderName::OpensslQat {
        return Ok(in_effect(requested, None, None));
    }
    let Some(state) = state else {
        return match fallback {
            Fallback::Software => Ok(in_effect(
                ProviderName::Openssl,
                None,
                Some("the QAT provider is not active".to_owned()),
            )),
            Fallback::None => Err(QatError::Unavailable(
                "the QAT provider is not active in this process".to_owned(),
            )),
        };
    };
    match state.prove_signing(key) {
        Ok(proof) => Ok(in_effect(requested, Some(proof.to_string()), None)),
        // A key that cannot be read is the key's problem: software would not read it either.
        Err(e @ QatError::Key(_)) => Err(e),
        Err(e) if fallback == Fallback::Software => {
            Ok(in_effect(ProviderName::Openssl, None, Some(e.to_string())))
        }
        Err(e) => Err(e),
    }
}

/// [`activate`], with `cfg.fallback` applied: the one place the process-wide fallback is
/// decided, for `run` and `check-config` alike. An error means no fallback was allowed.
pub fn activate_per_fallback(cfg: &QatConfig) -> Result<Activation, QatError> {
    match activate(cfg) {
        Ok(state) => Ok(Activation::Active(state)),
        Err(e) if cfg.fallback == Fallback::Software => Ok(Activation::FellBack(e)),
        Err(e) => Err(e),
    }
}

/// Loads and activates the provider once per process (OpenSSL's default library context is
/// process-wide); later calls return the first outcome.
pub fn activate(cfg: &QatConfig) -> Result<Arc<QatState>, QatError> {
    STATE
        .get_or_init(|| activate_once(cfg).map(Arc::new))
        .clone()
}

fn activate_once(cfg: &QatConfig) -> Result<QatState, QatError> {
    if let Some(problem) = cfg.problems().into_iter().next() {
        return Err(QatError::Config(problem));
    }
    openssl::init();
    let name = cfg.provider_name.as_str();
    let (search_path, module_file) = match &cfg.module_path {
        None => (None, None),
        Some(p) if p.is_dir() => (Some(p.clone()), None),
        Some(p) if p.is_file() => {
            let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
            if stem != name {
                return Err(QatError::Config(format!(
                    "qat.module_path {} is a module named {stem:?}, but qat.provider_name is {name:?}; \
                     set provider_name to {stem:?} or point module_path at the directory holding {name}.so",
                    p.display()
                )));
            }
            (p.parent().map(Path::to_path_buf), Some(p.clone()))
        }
        Some(p) => {
            return Err(QatError::Config(format!(
            "qat.module_path {}: no such file or directory (looking for OpenSSL provider {name:?})",
            p.display()
        )))
        }
    };
    let where_ = describe_search(search_path.as_deref());
    if let Some(dir) = &search_path {
        ffi::set_default_search_path(dir).map_err(|e| {
            QatError::Unavailable(format!(
                "cannot set the OpenSSL module search path to {}: {e}",
                dir.display()
            ))
        })?;
    }
    let settings = if ffi::provider_available(name) {
        SettingsSource::OpensslConf(
            std::env::var("OPENSSL_CONF")
                .unwrap_or_else(|_| "(OpenSSL's default configuration file)".to_owned()),
        )
    } else {
        load_with_settings(cfg, module_file.as_deref()).map_err(|e| {
            QatError::Unavailable(format!(
                "cannot load OpenSSL provider {name:?} ({where_}): {e}. Is QAT_Engine built with \
                 --enable-qat_provider and installed there? See deploy/QAT.md"
            ))
        })?;
        SettingsSource::Proxy(cfg.provider_settings())
    };
    // A second reference to the already-active provider keeps it loaded for the process.
    let described = ffi::load_provider(name).map_err(|e| {
        QatError::Unavailable(format!(
            "cannot load OpenSSL provider {name:?} ({where_}): {e}"
        ))
    })?;
    // Everything else prefers OpenSSL's default provider. Without a preference OpenSSL may
    // fetch any implementation of a name, and QAT_Engine registers AES-GCM, X25519, ECDH
    // and SHA-2 too: the record layer and key schedule would land in the QAT provider,
    // outside any asynchronous job, in its slower synchronous path (and AES-GCM decryption
    // there crashes in QAT_Engine v1.8.1). The signer's explicit query overrides this
    // preference for signatures only.
    ffi::set_default_properties(ROUTE_EVERYTHING_ELSE).map_err(|e| {
        QatError::Unavailable(format!(
            "cannot set OpenSSL's default property query {ROUTE_EVERYTHING_ELSE:?}: {e}"
        ))
    })?;
    let query = cfg.effective_property_query();
    let (polling, poll) = polling_in_effect(cfg, &settings)?;
    let signer = AsyncSigner::start(
        &query,
        cfg.max_signatures_in_flight,
        cfg.batch,
        cfg.batch_wait,
        poll,
    )
    .map_err(QatError::Unavailable)?;
    Ok(QatState {
        name: name.to_owned(),
        mode: Mode::of(&described),
        property_query: query,
        polling,
        settings,
        offload_p256: cfg.offload_p256,
        offload_x25519: cfg.offload_x25519,
        signer,
    })
}

/// Who polls the active provider, as it read its settings (its own `enable_external_polling`
/// where the module exports it, else what the proxy wrote), and the poll call external
/// polling makes: the settings of an `OPENSSL_CONF` that activated the provider win over
/// `qat.polling`, and a provider polled externally with no poll call to make is refused,
/// since nothing would ever complete its jobs.
fn polling_in_effect(
    cfg: &QatConfig,
    settings: &SettingsSource,
) -> Result<(Polling, Option<signer::PollFn>), QatError> {
    let symbols = ffi::module_symbols(&cfg.provider_name);
    let external = match (&symbols, settings) {
        (
            Some(ffi::ModuleSymbols {
                external_polling: Some(on),
                ..
            }),
            _,
        ) => *on,
        (_, SettingsSource::Proxy(_)) => cfg.polling == Polling::External,
        (_, SettingsSource::OpensslConf(_)) => false,
    };
    let module = symbols.as_ref().map_or_else(
        || format!("{}.so", cfg.provider_name),
        |s| s.path.display().to_string(),
    );
    if !external {
        if cfg.polling == Polling::External {
            return Err(QatError::Config(format!(
                "qat.polling = \"external\", but the provider in {module} was activated with \
                 enable_external_polling = 0 (by {settings}); set it to 1 there, or use \
                 qat.polling = \"internal\"",
                settings = match settings {
                    SettingsSource::Proxy(_) => "the proxy's [qat]".to_owned(),
                    SettingsSource::OpensslConf(path) => format!("OPENSSL_CONF={path}"),
                }
            )));
        }
        return Ok((cfg.polling, None));
    }
    match symbols.as_ref().and_then(|s| s.poll) {
        Some(poll) => {
            let at_once = symbols.is_some_and(|s| s.compute_part_batches_at_once());
            if !at_once {
                tracing::warn!(
                    module,
                    "the QAT provider exports no mb_poll_timeout_time: part batches the signer \
                     submits wait qat_sw's 10 ms poll timeout"
                );
            }
            Ok((Polling::External, Some(poll)))
        }
        None => Err(QatError::Unavailable(format!(
            "the provider in {module} is polled externally (enable_external_polling = 1), but \
             exports no qat_sw_poll for the proxy to call (a QAT hardware build?): use \
             qat.polling = \"internal\" or \"inline\""
        ))),
    }
}

/// Writes the provider's configuration to a private temporary file and loads it into the
/// default library context (OpenSSL 3.0 has no call taking the text itself).
fn load_with_settings(cfg: &QatConfig, module_file: Option<&Path>) -> Result<(), String> {
    let dir = std::env::temp_dir();
    let path = dir.join(format!("proxy-qat-{}.cnf", std::process::id()));
    let text = cfg.openssl_config(module_file);
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        // O_EXCL: never write through a file or symlink someone else put at this name in a
        // shared temporary directory; a stale one of ours (a reused pid) is removed first.
        let create = || {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
        };
        let mut file = create()
            .or_else(|_| std::fs::remove_file(&path).and_then(|()| create()))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        file.write_all(text.as_bytes())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let loaded = ffi::load_config(&path);
    let _ = std::fs::remove_file(&path);
    loaded
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

/// Whether handshakes with a certificate of this algorithm (its metric label, e.g.
/// "ecdsa-p256") send their signatures to the active QAT provider.
pub fn offloads_signatures_of(algorithm_label: &str) -> bool {
    active().is_some_and(|state| state.offload_p256 || algorithm_label != "ecdsa-p256")
}

/// Whether handshakes with a certificate of this algorithm (its metric label) sign on a
/// blocking thread even when no batch can form: where one software signature holds a
/// reactor thread long enough to starve its accept loop (RSA from 3072 bits: milliseconds;
/// P-384 and P-521, which OpenSSL 3.0 signs without a fast implementation: about 0.8 ms,
/// and which a qat_sw batch of one beats). RSA-2048 (0.25 ms) and P-256 sign on the reactor
/// below a batch's worth of handshakes: under `loadgen compare`'s 0.1-core budget, handing
/// every RSA-2048 handshake to a blocking thread cost a quarter of openssl-qat's
/// requests/s (77.6 against 102 for openssl).
pub fn signs_off_the_reactor(algorithm_label: &str) -> bool {
    !matches!(algorithm_label, "rsa2048" | "ecdsa-p256")
}

impl QatState {
    /// The signer handshakes sign through.
    pub fn signer(&self) -> &AsyncSigner {
        &self.signer
    }

    /// Signs a batch of probes (RSA: one PKCS#1 v1.5 batch, one PSS batch) with the private
    /// key in `key_path` through the signer, as handshakes do under load, and checks that
    /// the provider did the work asynchronously: each signature was fetched from this
    /// provider, the provider paused every job (a provider that is loaded but not
    /// offloading signs inline), and the signatures verify.
    pub fn prove_signing(&self, key_path: &Path) -> Result<SigningProof, QatError> {
        let pem = std::fs::read(key_path).map_err(|e| {
            QatError::Key(format!(
                "cannot read private key {}: {e}",
                key_path.display()
            ))
        })?;
        let key = openssl::pkey::PKey::private_key_from_pem(&pem).map_err(|e| {
            QatError::Key(format!(
                "private key {} cannot be read by OpenSSL: {e}",
                key_path.display()
            ))
        })?;
        let bits = key.bits();
        // RSA: PKCS#1 v1.5 (what TLS 1.2 clients may ask for) and PSS (TLS 1.3), each a
        // batch; ECDSA: its curve's hash.
        let probes: Vec<(&'static CStr, Padding, String)> = match key.id() {
            openssl::pkey::Id::RSA => vec![
                (
                    c"SHA256",
                    Padding::Pkcs1,
                    format!("RSA-{bits} PKCS#1 SHA-256"),
                ),
                (c"SHA256", Padding::Pss, format!("RSA-{bits} PSS SHA-256")),
            ],
            openssl::pkey::Id::EC if bits <= 256 => {
                vec![(c"SHA256", Padding::None, "ECDSA P-256 SHA-256".to_owned())]
            }
            openssl::pkey::Id::EC if bits <= 384 => {
                vec![(c"SHA384", Padding::None, "ECDSA P-384 SHA-384".to_owned())]
            }
            openssl::pkey::Id::EC => {
                vec![(c"SHA512", Padding::None, "ECDSA P-521 SHA-512".to_owned())]
            }
            other => {
                // Readable, but nothing QAT signs: the software fallback can serve it.
                return Err(QatError::NotOffloading(format!(
                    "private key {} is {other:?}: QAT offloads RSA and ECDSA signatures only",
                    key_path.display()
                )));
            }
        };
        let key = Arc::new(key);
        let mut proof = None;
        for (digest, padding, operation) in probes {
            proof = Some(self.prove_one(&key, key_path, digest, padding, operation)?);
        }
        proof.ok_or_else(|| QatError::NotOffloading("start-up proof: no probe to sign".to_owned()))
    }

    /// One probe batch of the proof (see [`prove_signing`](Self::prove_signing)).
    fn prove_one(
        &self,
        key: &Arc<openssl::pkey::PKey<openssl::pkey::Private>>,
        key_path: &Path,
        digest: &'static CStr,
        padding: Padding,
        operation: String,
    ) -> Result<SigningProof, QatError> {
        const PROBE: &[u8] = b"tls-proxy QAT start-up proof";
        // A full batch, as handshakes submit them: every one must be taken asynchronously.
        let mut signed = None;
        let mut all_paused = true;
        for result in self.signer.sign_batch(key, digest, padding, PROBE) {
            let one = result.map_err(|e| {
                QatError::NotOffloading(format!(
                    "start-up proof failed: a {operation} signature with {} failed inside the provider, \
                     not because of the key or certificate: {e}{}",
                    key_path.display(),
                    if cpu_lacks_avx512_ifma() {
                        "; note: this CPU has no AVX-512 IFMA, which QAT_Engine's software mode \
                         (qat_sw) needs for RSA and ECDSA, yet v1.8 enables qat_sw on any CPU with \
                         VAES and AVX2 (QAT hardware does not need it)"
                    } else {
                        ""
                    }
                ))
            })?;
            all_paused &= one.paused;
            signed = Some(one);
        }
        let Some(signed) = signed else {
            return Err(QatError::NotOffloading(
                "start-up proof: the signer returned no signature".to_owned(),
            ));
        };
        let signature_provider = signed.provider.name();
        if signature_provider != self.name {
            return Err(QatError::NotOffloading(format!(
                "start-up proof failed: a {operation} signature with {} was fetched from OpenSSL provider {:?}, \
                 not {:?} (property query {:?}); the provider does not implement it, so nothing would be offloaded",
                key_path.display(),
                signature_provider,
                self.name,
                self.property_query
            )));
        }
        if !all_paused {
            return Err(QatError::NotOffloading(format!(
                "start-up proof failed: provider {:?} produced the {operation} signature with {} without pausing \
                 its asynchronous job, so it is loaded but not offloading (qat_sw switched off for this CPU, \
                 or no QAT device or instance available); every signature would run in software",
                self.name,
                key_path.display()
            )));
        }
        let verifies = verify(key, digest, padding, PROBE, &signed.signature).map_err(|e| {
            QatError::NotOffloading(format!(
                "start-up proof: cannot verify the probe signature: {e}"
            ))
        })?;
        if !verifies {
            return Err(QatError::NotOffloading(format!(
                "start-up proof failed: provider {:?} returned a {operation} signature with {} that does not verify",
                self.name,
                key_path.display()
            )));
        }
        Ok(SigningProof {
            operation,
            signature_provider,
            signature_len: signed.signature.len(),
            batch: self.signer.batch(),
        })
    }
}

/// Verifies with OpenSSL's default provider (the library context's defaults).
fn verify(
    key: &openssl::pkey::PKey<openssl::pkey::Private>,
    digest: &CStr,
    padding: Padding,
    message: &[u8],
    signature: &[u8],
) -> Result<bool, openssl::error::ErrorStack> {
    use openssl::hash::MessageDigest;
    let md = match digest.to_bytes() {
        b"SHA384" => MessageDigest::sha384(),
        b"SHA512" => MessageDigest::sha512(),
        _ => MessageDigest::sha256(),
    };
    let mut verifier = openssl::sign::Verifier::new(md, key)?;
    match padding {
        Padding::Pss => {
            verifier.set_rsa_padding(openssl::rsa::Padding::PKCS1_PSS)?;
            verifier.set_rsa_pss_saltlen(openssl::sign::RsaPssSaltlen::DIGEST_LENGTH)?;
        }
        Padding::Pkcs1 => verifier.set_rsa_padding(openssl::rsa::Padding::PKCS1)?,
        Padding::None => {}
    }
    verifier.verify_oneshot(signature, message)
}

/// What the start-up proof saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SigningProof {
    /// e.g. "RSA-2048 PSS SHA-256".
    pub operation: String,
    /// The provider the signature operation was fetched from.
    pub signature_provider: String,
    /// Signature length in bytes (the signature was really produced, and verified).
    pub signature_len: usize,
    /// Signatures submitted together in the proof, all taken asynchronously.
    pub batch: usize,
}

impl std::fmt::Display for SigningProof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} signature fetched from provider {:?}, offloaded (a batch of {}: the provider paused every \
             asynchronous job), {} bytes, verified",
            self.operation, self.signature_provider, self.batch, self.signature_len
        )
    }
}

fn cstring(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key QAT_Engine's provider reads is written, with [qat]'s values, in the
    /// section OpenSSL's provider configuration module hands to the provider.
    #[test]
    fn the_openssl_section_carries_every_provider_setting() {
        let cfg = QatConfig {
            polling: Polling::Inline,
            poll_interval: Duration::from_micros(25),
            sw_fallback: true,
            max_retry_count: 9,
            ..QatConfig::default()
        };
        let text = cfg.openssl_config(Some(Path::new("/opt/qat/qatprovider.so")));
        for line in [
            "qatprovider = qat_sect",
            "module = /opt/qat/qatprovider.so",
            "activate = 1",
            "enable_external_polling = 0",
            "enable_heuristic_polling = 0",
            "enable_sw_fallback = 1",
            "enable_inline_polling = 1",
            "qat_poll_interval = 25000",
            "qat_epoll_timeout = 1000",
            "enable_event_driven_polling = 0",
            "enable_instance_for_thread = 0",
            "qat_max_retry_count = 9",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing from:\n{text}"
            );
        }
        assert_eq!(cfg.provider_settings().len(), 9);
        assert!(cfg.problems().is_empty(), "{:?}", cfg.problems());
        let external = QatConfig {
            polling: Polling::External,
            ..QatConfig::default()
        };
        let text = external.openssl_config(None);
        assert!(
            text.lines().any(|l| l == "enable_external_polling = 1"),
            "{text}"
        );
        assert!(
            text.lines().any(|l| l == "enable_inline_polling = 0"),
            "{text}"
        );
        assert!(external.problems().is_empty(), "{:?}", external.problems());
    }

    #[test]
    fn settings_the_provider_cannot_honour_are_refused() {
        let cfg = QatConfig {
            polling: Polling::Heuristic,
            ..QatConfig::default()
        };
        let problems = cfg.problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("use \"external\""), "{problems:?}");
        let cfg = QatConfig {
            batch: 16,
            max_signatures_in_flight: 8,
            provider_name: "qat provider".to_owned(),
            ..QatConfig::default()
        };
        let problems = cfg.problems().join("\n");
        assert!(
            problems.contains("must be at least qat.batch"),
            "{problems}"
        );
        assert!(problems.contains("provider name"), "{problems}");
    }
}
