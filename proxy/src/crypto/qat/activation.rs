//! Activating the provider once per process: loading it with the settings it reads (or
//! those of an `OPENSSL_CONF` that already did), who polls it, the signer started on it,
//! and which provider a listener that asks for openssl-qat is served by
//! ([`provider_in_effect`]: the start-up proof, and the software fallback `qat.fallback`
//! allows).

use std::path::Path;
use std::sync::{Arc, OnceLock};

use super::super::ProviderName;
use super::ffi;
use super::settings::{Fallback, Polling, QatConfig, ROUTE_EVERYTHING_ELSE};
use super::signer::{self, AsyncSigner};
use super::QatError;

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
    pub(super) signer: AsyncSigner,
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
