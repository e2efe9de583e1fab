//! A listener's TLS: what it is built from (`TlsPlan`, checked once by `plan`), what it
//! handshakes with (`ListenerTls`: the default certificate and the SNI certificates, chosen
//! by server name), and the one function that builds the second from the first
//! ([`build_listener_tls`]) for start-up, `check-config`, reloads and run-time switches.
//! Replacing it while a listener serves is `switch.rs`'s.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::ServerConfig;

use super::TlsPolicy;
use crate::crypto::qat::{Fallback, QatState};
use crate::crypto::{CryptoError, LoadedCert, Provider, ProviderName};
use crate::metrics::{ListenerMetrics, Metrics};

/// What a listener's TLS is built from: rebuilt from this on every reload and switch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsPlan {
    /// The provider asked for (the listener's, else the top-level one). What is in effect
    /// may be software OpenSSL when openssl-qat falls back: see `fallback`.
    pub provider: ProviderName,
    /// The default certificate chain: for clients that name no SNI certificate's server.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// Certificates chosen by server name; they follow the default's provider.
    pub sni: Vec<SniPlan>,
    /// Versions, groups, resumption, ALPN, client CA.
    pub policy: TlsPolicy,
    /// ALPN protocols when the policy lists none (the mode's default).
    pub default_alpn: &'static [&'static [u8]],
    /// Whether an openssl-qat provider that is missing or fails its proof may be replaced
    /// by software OpenSSL. Start-up follows `qat.fallback`; a run-time switch or reload
    /// never falls back (a switch that quietly lands on software would be a lie).
    pub fallback: Fallback,
}

impl TlsPlan {
    /// The same listener with another provider and default certificate, as `POST
    /// /admin/tls` asks: SNI certificates keep their files, nothing falls back.
    pub fn switched(&self, provider: ProviderName, cert: PathBuf, key: PathBuf) -> Self {
        Self {
            provider,
            cert,
            key,
            fallback: Fallback::None,
            ..self.clone()
        }
    }

    /// Every private key file it reads, default first.
    pub fn keys(&self) -> impl Iterator<Item = &std::path::Path> {
        std::iter::once(self.key.as_path()).chain(self.sni.iter().map(|s| s.key.as_path()))
    }

    /// Every certificate and key file it reads, default first.
    pub fn files(&self) -> impl Iterator<Item = &std::path::Path> {
        [self.cert.as_path(), self.key.as_path()].into_iter().chain(
            self.sni
                .iter()
                .flat_map(|s| [s.cert.as_path(), s.key.as_path()]),
        )
    }
}

/// A certificate served to clients that ask for one of its names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SniPlan {
    /// The names, lowercase (`*.example.com` wildcards included).
    pub names: Vec<String>,
    /// Certificate chain.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
}

/// A further certificate of a listener, for clients that ask for one of its names.
pub struct SniTls {
    /// The rustls configuration serving this certificate (for the names of the
    /// [`SniPlan`] at the same position in the listener's plan).
    pub config: Arc<ServerConfig>,
    /// Metrics labelled with this certificate's algorithm.
    pub metrics: ListenerMetrics,
    /// The certificate's algorithm label.
    pub algorithm: &'static str,
    /// The certificate's notAfter, seconds since the epoch.
    pub not_after: i64,
}

/// What a listener handshakes with right now.
pub struct ListenerTls {
    /// The rustls configuration.
    pub config: Arc<ServerConfig>,
    /// Metrics labelled with this provider and algorithm.
    pub metrics: ListenerMetrics,
    /// The certificate's algorithm label.
    pub algorithm: &'static str,
    /// The certificate's notAfter, seconds since the epoch.
    pub not_after: i64,
    /// Certificates chosen by server name, in the order of `plan.sni`; the one above serves
    /// every other name.
    pub sni: Vec<SniTls>,
    /// What this was built from, with the provider in effect and no fallback: what a
    /// reload builds again and a switch starts from.
    pub plan: TlsPlan,
}

impl ListenerTls {
    /// The SNI certificate for the name a client asked for: an exact name first, then a
    /// wildcard; `None`: the default certificate.
    pub fn sni_for(&self, server_name: Option<&str>) -> Option<&SniTls> {
        let name = server_name?;
        let with_names = || self.sni.iter().zip(&self.plan.sni);
        with_names()
            .find(|(_, p)| {
                p.names
                    .iter()
                    .any(|n| !n.starts_with("*.") && n.eq_ignore_ascii_case(name))
            })
            .or_else(|| {
                with_names().find(|(_, p)| p.names.iter().any(|n| server_name_matches(n, name)))
            })
            .map(|(s, _)| s)
    }

    /// The provider in effect.
    pub fn provider(&self) -> ProviderName {
        self.plan.provider
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

    /// Whether handshakes may wait for the asynchronous QAT signer (openssl-qat in effect,
    /// with a certificate whose signatures are offloaded), and when they leave the reactor
    /// for it.
    pub fn qat_signing(&self) -> super::QatSigning {
        let algorithms =
            || std::iter::once(self.algorithm).chain(self.sni.iter().map(|s| s.algorithm));
        if self.plan.provider != ProviderName::OpensslQat
            || !algorithms().any(crate::crypto::qat::offloads_signatures_of)
        {
            super::QatSigning::No
        } else if algorithms().any(crate::crypto::qat::signs_off_the_reactor) {
            super::QatSigning::OffTheReactor
        } else {
            super::QatSigning::WhenBatchesForm
        }
    }

    /// Publishes what this listener serves in the metrics: the default certificate's
    /// expiry and the SNI certificates. Called when it comes into effect.
    pub(crate) fn publish(&self, metrics: &Metrics, listener: &str) {
        metrics.set_certificate_expiry(listener, self.not_after);
        let listed: Vec<(String, &'static str, i64)> = self
            .sni
            .iter()
            .zip(&self.plan.sni)
            .map(|(s, p)| (p.names.join(","), s.algorithm, s.not_after))
            .collect();
        metrics.set_sni_certificates(listener, &listed);
    }
}

/// A listener's name and the metric labels that do not change with its TLS.
#[derive(Clone, Debug)]
pub struct ListenerLabels {
    /// The listener's name.
    pub name: String,
    /// `http` or `tcp`.
    pub mode: &'static str,
    /// Where handshakes sign (`tls::Offload::label`).
    pub offload: &'static str,
}

/// A listener's TLS as built from its plan, with what start-up reports about it.
pub struct BuiltTls {
    /// What the listener handshakes with.
    pub tls: ListenerTls,
    /// The provider in effect, for its library version.
    pub provider: Provider,
    /// The default certificate, loaded and proven against its key.
    pub cert: LoadedCert,
    /// openssl-qat: the start-up proof that signatures are offloaded.
    pub qat_proof: Option<String>,
    /// openssl-qat was asked for and software OpenSSL is in effect, and why.
    pub fell_back: Option<String>,
}

/// Why a listener's TLS could not be built from its plan.
#[derive(Debug, thiserror::Error)]
pub enum TlsBuildError {
    /// The default certificate, its key or its provider.
    #[error(transparent)]
    Default(CryptoError),
    /// An SNI certificate, its key, or the provider in effect for it.
    #[error("SNI certificate {}: {source}", cert.display())]
    Sni {
        /// The certificate file.
        cert: PathBuf,
        /// What failed.
        source: CryptoError,
    },
}

/// Builds a listener's TLS from `plan`: the default certificate with the provider the plan
/// asks for (the QAT proof and fallback for openssl-qat: `crypto::qat::provider_in_effect`), then
/// each SNI certificate exactly the same way with the provider in effect for the default,
/// never falling back. The one way start-up, `check-config`, reloads and switches build a
/// listener's TLS. Blocking (key loading, the signing proof).
pub fn build_listener_tls(
    plan: &TlsPlan,
    labels: &ListenerLabels,
    qat: Option<&QatState>,
    metrics: &Metrics,
) -> Result<BuiltTls, TlsBuildError> {
    let resolved = super::resolve_listener_tls(
        plan.provider,
        &plan.cert,
        &plan.key,
        &plan.policy,
        plan.default_alpn,
        qat,
        plan.fallback,
    )
    .map_err(TlsBuildError::Default)?;
    let provider = resolved.provider.name();
    let listener_metrics = |algorithm: &'static str| {
        metrics.listener(
            &labels.name,
            provider.as_str(),
            algorithm,
            labels.mode,
            super::handshake_label(provider, labels.offload),
        )
    };
    let mut sni = Vec::with_capacity(plan.sni.len());
    for entry in &plan.sni {
        let built = super::resolve_listener_tls(
            provider,
            &entry.cert,
            &entry.key,
            &plan.policy,
            plan.default_alpn,
            qat,
            Fallback::None,
        )
        .map_err(|source| TlsBuildError::Sni {
            cert: entry.cert.clone(),
            source,
        })?;
        if let Some(warning) = built.cert.expiry_warning() {
            tracing::warn!(listener = %labels.name, certificate = %entry.cert.display(), "{warning}");
        }
        let algorithm = built.cert.algorithm.label();
        sni.push(SniTls {
            config: built.config,
            metrics: listener_metrics(algorithm),
            algorithm,
            not_after: built.cert.not_after,
        });
    }
    if let Some(warning) = resolved.cert.expiry_warning() {
        tracing::warn!(listener = %labels.name, certificate = %plan.cert.display(), "{warning}");
    }
    let algorithm = resolved.cert.algorithm.label();
    Ok(BuiltTls {
        tls: ListenerTls {
            config: resolved.config,
            metrics: listener_metrics(algorithm),
            algorithm,
            not_after: resolved.cert.not_after,
            sni,
            plan: TlsPlan {
                provider,
                fallback: Fallback::None,
                ..plan.clone()
            },
        },
        provider: resolved.provider,
        cert: resolved.cert,
        qat_proof: resolved.qat_proof,
        fell_back: resolved.fell_back,
    })
}

/// Whether `pattern` (a configured name, lowercase) covers the client's `name`: equal, or
/// `*.rest` and `name` is one more label in front of `rest`.
pub fn server_name_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(rest) => name
            .split_once('.')
            .is_some_and(|(label, tail)| !label.is_empty() && tail.eq_ignore_ascii_case(rest)),
        None => pattern.eq_ignore_ascii_case(name),
    }
}
