//! Run-time TLS switching: a listener's provider and certificate replaced while it serves.
//!
//! Each listener reads its current [`ListenerTls`] once per accepted connection from an
//! `ArcSwap`, so a switch is one atomic pointer store: connections accepted afterwards
//! handshake with the new configuration, established ones keep theirs, and nothing is
//! dropped. The new configuration is built from the listener's [`TlsPlan`] by the function
//! start-up and `check-config` use, [`build_listener_tls`] (provider with the listener's
//! key-exchange groups, key loaded through the provider and proven against the
//! certificate, the QAT signing proof for openssl-qat), so a bad request changes nothing.
//!
//! `loadgen compare --proxy-admin URL` drives this through `POST /admin/tls`, authorised by
//! the bearer token in `admin.token_file`. SIGHUP reloads every listener's certificate and
//! key from the files it serves from (certificate rotation), each listener on its own: a
//! listener whose new files do not load keeps what it had.

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};

use crate::crypto::qat::QatState;
use crate::crypto::ProviderName;
use crate::metrics::Metrics;
use crate::tls::{
    self, build_listener_tls, BuiltTls, ListenerLabels, ListenerTls, TlsBuildError, TlsPlan,
};

/// One file's identity for change detection (see [`TlsSwitch::file_stamps`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileStamp {
    /// Device, inode, size, modification time (ns since the epoch).
    Present(u64, u64, u64, i128),
    /// The file could not be read (mid-replacement, removed): the error's kind.
    Missing(std::io::ErrorKind),
}

impl FileStamp {
    /// The stamp of `path` now.
    pub fn of(path: &std::path::Path) -> Self {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(path) {
            Ok(m) => Self::Present(
                m.dev(),
                m.ino(),
                m.len(),
                i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ),
            Err(e) => Self::Missing(e.kind()),
        }
    }
}

/// One listener's switchable TLS state.
pub struct SwitchableListener {
    /// Name and fixed labels.
    pub labels: ListenerLabels,
    current: ArcSwap<ListenerTls>,
}

impl SwitchableListener {
    /// Wraps the start-up state of a listener and publishes it in the metrics.
    pub fn new(labels: ListenerLabels, initial: ListenerTls, metrics: &Metrics) -> Self {
        initial.publish(metrics, &labels.name);
        Self {
            labels,
            current: ArcSwap::from_pointee(initial),
        }
    }

    /// The state a new connection should use.
    pub fn current(&self) -> Arc<ListenerTls> {
        self.current.load_full()
    }
}

/// A switch request, as `POST /admin/tls` takes it (JSON).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchRequest {
    /// Which listener; all listeners when absent.
    #[serde(default)]
    pub listener: Option<String>,
    /// The provider to switch to.
    pub provider: ProviderName,
    /// Certificate chain, PEM, as a path on the proxy's host.
    pub cert: PathBuf,
    /// Private key, PEM, as a path on the proxy's host.
    pub key: PathBuf,
}

/// What a switch did, per listener.
#[derive(Debug, Serialize)]
pub struct SwitchOutcome {
    /// Listener name.
    pub listener: String,
    /// Provider now in effect.
    pub provider: String,
    /// Certificate algorithm now in effect.
    pub algorithm: String,
    /// Library behind the provider.
    pub library: String,
}

/// Why a switch was refused; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    /// No listener by that name.
    #[error("no listener named {0:?}")]
    UnknownListener(String),
    /// A certificate or key path the request names is not a modest regular file.
    #[error("{}: {problem}", path.display())]
    File {
        /// The path as requested.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// A listener's new TLS could not be built.
    #[error("listener {listener:?}: {source}")]
    Build {
        /// The listener.
        listener: String,
        /// What failed.
        source: TlsBuildError,
    },
}

/// Largest certificate chain or key file the admin API reads; real chains are a few KiB.
const MAX_PEM_FILE_BYTES: u64 = 1024 * 1024;

fn check_pem_file(path: &std::path::Path) -> Result<(), SwitchError> {
    let problem = |problem: String| SwitchError::File {
        path: path.to_owned(),
        problem,
    };
    let meta = std::fs::metadata(path).map_err(|e| problem(e.to_string()))?;
    if !meta.is_file() {
        return Err(problem("not a regular file".to_owned()));
    }
    if meta.len() > MAX_PEM_FILE_BYTES {
        return Err(problem(format!(
            "{} bytes, more than the {MAX_PEM_FILE_BYTES} a certificate or key file may have",
            meta.len()
        )));
    }
    Ok(())
}

/// Every switchable listener of the process.
pub struct TlsSwitch {
    /// The listeners in service: replaced when a configuration reload adds or removes one.
    listeners: ArcSwap<Vec<Arc<SwitchableListener>>>,
    metrics: Metrics,
    qat: Option<Arc<QatState>>,
    /// One change at a time: a SIGHUP reload reads a listener's current files and installs
    /// them again, which must not undo an admin switch landing in between.
    changing: std::sync::Mutex<()>,
}

impl TlsSwitch {
    /// `qat` is the activated QAT provider, when the process loaded one at start-up.
    pub fn new(
        listeners: Vec<Arc<SwitchableListener>>,
        metrics: Metrics,
        qat: Option<Arc<QatState>>,
    ) -> Self {
        Self {
            listeners: ArcSwap::from_pointee(listeners),
            metrics,
            qat,
            changing: std::sync::Mutex::new(()),
        }
    }

    /// The listeners in service after a configuration reload.
    pub fn set_listeners(&self, listeners: Vec<Arc<SwitchableListener>>) {
        self.listeners.store(Arc::new(listeners));
    }

    /// Builds `l`'s TLS from a new `plan` (a configuration reload changed its certificate,
    /// provider or policy) and installs it; on failure the old TLS stays. Counted and
    /// logged as a certificate reload. Blocking, like [`Self::apply`].
    pub fn rebuild(
        &self,
        l: &SwitchableListener,
        plan: &TlsPlan,
    ) -> Result<SwitchOutcome, SwitchError> {
        let _one_at_a_time = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        let outcome = self
            .build(l, plan)
            .map(|b| self.install(l, b, "TLS rebuilt from the reloaded configuration"));
        self.metrics.tls_reloaded(&l.labels.name, outcome.is_ok());
        outcome
    }

    /// Builds every new configuration first, then installs them; on any error nothing is
    /// installed. Blocking (key loading, the signing proof): call from a blocking thread.
    pub fn apply(&self, req: &SwitchRequest) -> Result<Vec<SwitchOutcome>, SwitchError> {
        // The paths come from a remote request: read nothing but modest regular files
        // (not /dev/zero, a FIFO that never ends, or a multi-gigabyte file).
        for path in [&req.cert, &req.key] {
            check_pem_file(path)?;
        }
        let listeners = self.listeners.load();
        let targets: Vec<&Arc<SwitchableListener>> = match &req.listener {
            Some(name) => vec![listeners
                .iter()
                .find(|l| &l.labels.name == name)
                .ok_or_else(|| SwitchError::UnknownListener(name.clone()))?],
            None => listeners.iter().collect(),
        };
        let _one_at_a_time = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        let mut built = Vec::with_capacity(targets.len());
        for l in targets {
            // Strict: a switch to openssl-qat without a working QAT provider is refused,
            // never quietly served in software (`switched` turns the fallback off).
            let plan = l
                .current()
                .plan
                .switched(req.provider, req.cert.clone(), req.key.clone());
            built.push((l, self.build(l, &plan)?));
        }
        Ok(built
            .into_iter()
            .map(|(l, b)| self.install(l, b, "TLS configuration switched"))
            .collect())
    }

    /// What the certificate and key files of every listener are right now, as far as a
    /// replacement shows: each path followed through its symlinks (Kubernetes swaps a
    /// `..data` link) to the file's device, inode, size and modification time, or the error
    /// reading them. Two equal stamps mean nothing was replaced in between.
    pub fn file_stamps(&self) -> Vec<FileStamp> {
        self.listeners
            .load()
            .iter()
            .flat_map(|l| {
                let current = l.current();
                current.plan.files().map(FileStamp::of).collect::<Vec<_>>()
            })
            .collect()
    }

    /// Builds every listener's TLS again from the plan in effect (same files, same
    /// provider), but those named in `skip`; each listener on its own, so one bad file pair
    /// stops only its listener's reload. Returns `(listener, outcome)` for each. Blocking,
    /// like [`Self::apply`].
    pub fn reload(&self, skip: &[String]) -> Vec<(String, Result<SwitchOutcome, SwitchError>)> {
        let _one_at_a_time = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        self.listeners
            .load()
            .iter()
            .filter(|l| !skip.contains(&l.labels.name))
            .map(|l| {
                let plan = l.current().plan.clone();
                let outcome = self
                    .build(l, &plan)
                    .map(|b| self.install(l, b, "TLS certificate reloaded"));
                self.metrics.tls_reloaded(&l.labels.name, outcome.is_ok());
                (l.labels.name.clone(), outcome)
            })
            .collect()
    }

    fn build(&self, l: &SwitchableListener, plan: &TlsPlan) -> Result<BuiltTls, SwitchError> {
        build_listener_tls(plan, &l.labels, self.qat.as_deref(), &self.metrics).map_err(|source| {
            SwitchError::Build {
                listener: l.labels.name.clone(),
                source,
            }
        })
    }

    fn install(
        &self,
        l: &SwitchableListener,
        built: BuiltTls,
        what: &'static str,
    ) -> SwitchOutcome {
        let new = built.tls;
        let old = l.current();
        new.publish(&self.metrics, &l.labels.name);
        let (provider, algorithm) = (new.provider(), new.algorithm);
        let certificate = new.plan.cert.display().to_string();
        l.current.store(Arc::new(new));
        if (old.provider(), old.algorithm) != (provider, algorithm) {
            self.metrics.retire_listener_info(
                &l.labels.name,
                old.provider().as_str(),
                old.algorithm,
                l.labels.mode,
                tls::handshake_label(old.provider(), l.labels.offload),
            );
        }
        tracing::info!(
            listener = %l.labels.name,
            from_provider = old.provider().as_str(),
            from_algorithm = old.algorithm,
            provider = provider.as_str(),
            algorithm,
            certificate,
            "{what}"
        );
        SwitchOutcome {
            listener: l.labels.name.clone(),
            provider: provider.to_string(),
            algorithm: algorithm.to_owned(),
            library: built.provider.library_version(),
        }
    }
}
