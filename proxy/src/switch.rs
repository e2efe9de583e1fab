//! Run-time TLS switching: a listener's provider and certificate replaced while it serves.
//!
//! Each listener reads its current [`ListenerTls`] once per accepted connection from an
//! `ArcSwap`, so a switch is one atomic pointer store: connections accepted afterwards
//! handshake with the new configuration, established ones keep theirs, and nothing is
//! dropped. The new configuration is built exactly as start-up builds it (provider with the
//! listener's key-exchange groups, key loaded through the provider and proven against the
//! certificate, the QAT signing proof for openssl-qat), so a bad request changes nothing.
//!
//! `loadgen compare --proxy-admin URL` drives this through `POST /admin/tls`, authorised by
//! the bearer token in `admin.token_file`. SIGHUP reloads every listener's certificate and
//! key from the files it serves from (certificate rotation), each listener on its own: a
//! listener whose new files do not load keeps what it had.

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use serde::{Deserialize, Serialize};

use crate::config::TlsPolicy;
use crate::crypto::qat::{Fallback, QatState};
use crate::crypto::ProviderName;
use crate::metrics::{ListenerMetrics, Metrics};
use crate::tls;

/// One file's identity for change detection (see [`TlsSwitch::file_stamps`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileStamp {
    /// Device, inode, size, modification time (ns since the epoch).
    Present(u64, u64, u64, i128),
    /// The file could not be read (mid-replacement, removed): the error's kind.
    Missing(std::io::ErrorKind),
}

impl FileStamp {
    fn of(path: &std::path::Path) -> Self {
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

/// A further certificate of a listener, for clients that ask for one of its names.
pub struct SniTls {
    /// The names, lowercase, as configured (`*.example.com` wildcards included).
    pub names: Vec<String>,
    /// The rustls configuration serving this certificate.
    pub config: Arc<ServerConfig>,
    /// Metrics labelled with this certificate's algorithm.
    pub metrics: ListenerMetrics,
    /// The certificate's algorithm label.
    pub algorithm: &'static str,
    /// Where the certificate chain was read from.
    pub cert: PathBuf,
    /// Where the private key was read from.
    pub key: PathBuf,
    /// The certificate's notAfter, seconds since the epoch.
    pub not_after: i64,
}

/// Lists a listener's SNI certificates in the metrics, once they are in effect.
pub fn list_sni(metrics: &Metrics, listener: &str, sni: &[SniTls]) {
    let listed: Vec<(String, &'static str, i64)> = sni
        .iter()
        .map(|s| (s.names.join(","), s.algorithm, s.not_after))
        .collect();
    metrics.set_sni_certificates(listener, &listed);
}

/// What a listener handshakes with right now.
pub struct ListenerTls {
    /// The rustls configuration.
    pub config: Arc<ServerConfig>,
    /// Metrics labelled with this provider and algorithm.
    pub metrics: ListenerMetrics,
    /// The provider in effect.
    pub provider: ProviderName,
    /// The certificate's algorithm label.
    pub algorithm: &'static str,
    /// Where the certificate chain was read from (what a reload reads again).
    pub cert: PathBuf,
    /// Where the private key was read from.
    pub key: PathBuf,
    /// Certificates chosen by server name; the one above serves every other name.
    pub sni: Vec<SniTls>,
}

impl ListenerTls {
    /// The SNI certificate for the name a client asked for: an exact name first, then a
    /// wildcard; `None`: the default certificate.
    pub fn sni_for(&self, server_name: Option<&str>) -> Option<&SniTls> {
        let name = server_name?;
        self.sni
            .iter()
            .find(|s| {
                s.names
                    .iter()
                    .any(|p| !p.starts_with("*.") && p.eq_ignore_ascii_case(name))
            })
            .or_else(|| {
                self.sni.iter().find(|s| {
                    s.names
                        .iter()
                        .any(|p| crate::config::server_name_matches(p, name))
                })
            })
    }

    /// The configuration for a client that asked for `server_name`.
    pub fn config_for(&self, server_name: Option<&str>) -> Arc<ServerConfig> {
        self.sni_for(server_name)
            .map_or(&self.config, |s| &s.config)
            .clone()
    }

    /// The metrics of the certificate served to a client that asked for `server_name`.
    pub fn metrics_for(&self, server_name: Option<&str>) -> &ListenerMetrics {
        self.sni_for(server_name)
            .map_or(&self.metrics, |s| &s.metrics)
    }

    /// Handshakes wait for the asynchronous QAT signer (openssl-qat in effect).
    pub fn waits_for_signer(&self) -> bool {
        self.provider == ProviderName::OpensslQat
    }
}

/// A listener's SNI certificate as configured: names, certificate and key files.
pub type SniSource = (Vec<String>, PathBuf, PathBuf);

/// What a listener's TLS is built from, besides its provider and default certificate.
pub struct ListenerTlsShape<'a> {
    /// The listener's name.
    pub name: &'a str,
    /// Its TLS policy.
    pub policy: &'a TlsPolicy,
    /// ALPN protocols when the policy lists none.
    pub default_alpn: &'a [&'a [u8]],
    /// `http` or `tcp`, for metric labels.
    pub mode_label: &'static str,
    /// Where handshakes sign, for metric labels.
    pub offload_label: &'static str,
}

/// Builds a listener's SNI certificates with `provider` (the one in effect for its default
/// certificate), exactly as the default is built: key proven against the certificate, the
/// QAT proof for openssl-qat. Blocking.
pub fn build_sni(
    sources: &[SniSource],
    provider: ProviderName,
    shape: &ListenerTlsShape<'_>,
    qat: Option<&QatState>,
    metrics: &Metrics,
) -> Result<Vec<SniTls>, String> {
    let mut built = Vec::with_capacity(sources.len());
    for (names, cert_path, key_path) in sources {
        let resolved = tls::resolve_listener_tls(
            provider,
            cert_path,
            key_path,
            shape.policy,
            shape.default_alpn,
            qat,
            Fallback::None,
        )
        .map_err(|e| format!("SNI certificate {}: {e}", cert_path.display()))?;
        let algorithm = resolved.cert.algorithm.label();
        if let Some(warning) = resolved.cert.expiry_warning() {
            tracing::warn!(listener = %shape.name, certificate = %cert_path.display(), "{warning}");
        }
        built.push(SniTls {
            names: names.iter().map(|n| n.to_ascii_lowercase()).collect(),
            config: resolved.config,
            metrics: metrics.listener(
                shape.name,
                provider.as_str(),
                algorithm,
                shape.mode_label,
                tls::handshake_label(provider, shape.offload_label),
            ),
            algorithm,
            cert: cert_path.clone(),
            key: key_path.clone(),
            not_after: resolved.cert.not_after,
        });
    }
    Ok(built)
}

/// One listener's switchable TLS state and what a rebuild needs.
pub struct SwitchableListener {
    /// Listener name.
    pub name: String,
    current: ArcSwap<ListenerTls>,
    policy: TlsPolicy,
    default_alpn: Vec<Vec<u8>>,
    mode_label: &'static str,
    offload_label: &'static str,
}

impl SwitchableListener {
    /// Wraps the start-up state of a listener.
    pub fn new(
        name: String,
        initial: ListenerTls,
        policy: TlsPolicy,
        default_alpn: &[&[u8]],
        mode_label: &'static str,
        offload_label: &'static str,
    ) -> Self {
        Self {
            name,
            current: ArcSwap::from_pointee(initial),
            policy,
            default_alpn: default_alpn.iter().map(|p| p.to_vec()).collect(),
            mode_label,
            offload_label,
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
    /// The provider, key or certificate could not be used.
    #[error("{0}")]
    Invalid(String),
}

/// Largest certificate chain or key file the admin API reads; real chains are a few KiB.
const MAX_PEM_FILE_BYTES: u64 = 1024 * 1024;

fn check_pem_file(path: &std::path::Path) -> Result<(), SwitchError> {
    let meta = std::fs::metadata(path)
        .map_err(|e| SwitchError::Invalid(format!("{}: {e}", path.display())))?;
    if !meta.is_file() {
        return Err(SwitchError::Invalid(format!(
            "{}: not a regular file",
            path.display()
        )));
    }
    if meta.len() > MAX_PEM_FILE_BYTES {
        return Err(SwitchError::Invalid(format!(
            "{}: {} bytes, more than the {MAX_PEM_FILE_BYTES} a certificate or key file may have",
            path.display(),
            meta.len()
        )));
    }
    Ok(())
}

/// Every switchable listener of the process.
pub struct TlsSwitch {
    listeners: Vec<Arc<SwitchableListener>>,
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
            listeners,
            metrics,
            qat,
            changing: std::sync::Mutex::new(()),
        }
    }

    /// Builds every new configuration first, then installs them; on any error nothing is
    /// installed. Blocking (key loading, the signing proof): call from a blocking thread.
    pub fn apply(&self, req: &SwitchRequest) -> Result<Vec<SwitchOutcome>, SwitchError> {
        // The paths come from a remote request: read nothing but modest regular files
        // (not /dev/zero, a FIFO that never ends, or a multi-gigabyte file).
        for path in [&req.cert, &req.key] {
            check_pem_file(path)?;
        }
        let _one_at_a_time = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        self.install(req, "TLS configuration switched")
    }

    /// What the certificate and key files of every listener are right now, as far as a
    /// replacement shows: each path followed through its symlinks (Kubernetes swaps a
    /// `..data` link) to the file's device, inode, size and modification time, or the error
    /// reading them. Two equal stamps mean nothing was replaced in between.
    pub fn file_stamps(&self) -> Vec<FileStamp> {
        self.listeners
            .iter()
            .flat_map(|l| {
                let current = l.current();
                let mut paths = vec![current.cert.clone(), current.key.clone()];
                for s in &current.sni {
                    paths.extend([s.cert.clone(), s.key.clone()]);
                }
                paths
            })
            .map(|path| FileStamp::of(&path))
            .collect()
    }

    /// Reads every listener's certificate and key again from the same files, with the same
    /// provider; each listener on its own, so one bad file pair stops only its listener's
    /// reload. Returns `(listener, outcome)` for each. Blocking, like [`Self::apply`].
    pub fn reload(&self) -> Vec<(String, Result<SwitchOutcome, SwitchError>)> {
        let _one_at_a_time = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        self.listeners
            .iter()
            .map(|l| {
                let current = l.current();
                let req = SwitchRequest {
                    listener: Some(l.name.clone()),
                    provider: current.provider,
                    cert: current.cert.clone(),
                    key: current.key.clone(),
                };
                let outcome = self
                    .install(&req, "TLS certificate reloaded")
                    .map(|mut o| o.remove(0));
                self.metrics.tls_reloaded(&l.name, outcome.is_ok());
                (l.name.clone(), outcome)
            })
            .collect()
    }

    fn install(
        &self,
        req: &SwitchRequest,
        what: &'static str,
    ) -> Result<Vec<SwitchOutcome>, SwitchError> {
        let targets: Vec<&Arc<SwitchableListener>> = match &req.listener {
            Some(name) => vec![self
                .listeners
                .iter()
                .find(|l| &l.name == name)
                .ok_or_else(|| SwitchError::UnknownListener(name.clone()))?],
            None => self.listeners.iter().collect(),
        };
        let invalid = |l: &SwitchableListener, e: &dyn std::fmt::Display| {
            SwitchError::Invalid(format!("listener {:?}: {e}", l.name))
        };
        let mut built = Vec::with_capacity(targets.len());
        for l in &targets {
            let alpn: Vec<&[u8]> = l.default_alpn.iter().map(Vec::as_slice).collect();
            // Strict: a switch to openssl-qat without a working QAT provider is refused,
            // never quietly served in software.
            let tls::ResolvedTls {
                provider,
                cert,
                config,
                ..
            } = tls::resolve_listener_tls(
                req.provider,
                &req.cert,
                &req.key,
                &l.policy,
                &alpn,
                self.qat.as_deref(),
                Fallback::None,
            )
            .map_err(|e| invalid(l, &e))?;
            if let Some(warning) = cert.expiry_warning() {
                tracing::warn!(listener = %l.name, certificate = %req.cert.display(), "{warning}");
            }
            // The SNI certificates keep their files and follow the default's provider.
            let sources: Vec<SniSource> = l
                .current()
                .sni
                .iter()
                .map(|s| (s.names.clone(), s.cert.clone(), s.key.clone()))
                .collect();
            let sni = build_sni(
                &sources,
                provider.name(),
                &ListenerTlsShape {
                    name: &l.name,
                    policy: &l.policy,
                    default_alpn: &alpn,
                    mode_label: l.mode_label,
                    offload_label: l.offload_label,
                },
                self.qat.as_deref(),
                &self.metrics,
            )
            .map_err(|e| invalid(l, &e))?;
            built.push((
                l,
                provider,
                cert.algorithm.label(),
                cert.not_after,
                config,
                sni,
            ));
        }
        let mut outcomes = Vec::with_capacity(built.len());
        for (l, provider, algorithm, not_after, config, sni) in built {
            let old = l.current();
            list_sni(&self.metrics, &l.name, &sni);
            let metrics = self.metrics.listener(
                &l.name,
                provider.name().as_str(),
                algorithm,
                l.mode_label,
                tls::handshake_label(provider.name(), l.offload_label),
            );
            l.current.store(Arc::new(ListenerTls {
                config,
                metrics,
                provider: provider.name(),
                algorithm,
                cert: req.cert.clone(),
                key: req.key.clone(),
                sni,
            }));
            self.metrics.set_certificate_expiry(&l.name, not_after);
            if (old.provider, old.algorithm) != (provider.name(), algorithm) {
                self.metrics.retire_listener_info(
                    &l.name,
                    old.provider.as_str(),
                    old.algorithm,
                    l.mode_label,
                    tls::handshake_label(old.provider, l.offload_label),
                );
            }
            tracing::info!(
                listener = %l.name,
                from_provider = old.provider.as_str(),
                from_algorithm = old.algorithm,
                provider = provider.name().as_str(),
                algorithm,
                certificate = %req.cert.display(),
                "{what}"
            );
            outcomes.push(SwitchOutcome {
                listener: l.name.clone(),
                provider: provider.name().to_string(),
                algorithm: algorithm.to_owned(),
                library: provider.library_version(),
            });
        }
        Ok(outcomes)
    }
}
