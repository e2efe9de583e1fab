//! TLS: building each listener's `ServerConfig` from its policy and the provider in effect
//! (`listener.rs`: what a listener's TLS is built from and what it handshakes with), and
//! driving handshakes, either inline on the reactor, with the signing step on a dedicated
//! pool, or (openssl-qat) waiting for the asynchronous QAT signer on a blocking thread.

pub mod client;
mod listener;
pub mod measure;
mod settings;

use std::io;
use std::path::Path;
use std::sync::Arc;

use rustls::server::{NoServerSessionStorage, ServerSessionMemoryCache, WebPkiClientVerifier};
use rustls::sign::SingleCertAndKey;
use rustls::version::{TLS12, TLS13};
use rustls::{ProtocolVersion, ServerConfig, SupportedProtocolVersion};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;
use tokio_rustls::LazyConfigAcceptor;

use crate::crypto::qat::{provider_in_effect, Fallback, QatState};
use crate::crypto::{
    load_certified_key, load_client_ca, CryptoError, LoadedCert, Provider, ProviderName,
};
pub use listener::{
    build_listener_tls, server_name_matches, BuiltTls, ListenerLabels, ListenerTls, SniPlan,
    SniTls, TlsBuildError, TlsPlan,
};
pub use settings::{HandshakeOffload, TlsPolicy, TlsVersion};

/// Stateful session cache size: enough for a busy benchmark's clients (TLS 1.2 session
/// ids) at a few hundred bytes each.
const SESSION_CACHE_SIZE: usize = 4096;

/// What a listener's TLS resolved to: the provider in effect (openssl-qat may have fallen
/// back to openssl), the checked certificate, the rustls configuration, and the QAT signing
/// proof when offload is on.
pub struct ResolvedTls {
    /// The provider in effect.
    pub provider: Provider,
    /// The certificate, proven to match its key.
    pub cert: LoadedCert,
    /// The rustls configuration.
    pub config: Arc<ServerConfig>,
    /// openssl-qat only: the start-up proof that signatures come from the QAT provider.
    pub qat_proof: Option<String>,
    /// openssl-qat was asked for and software OpenSSL is in effect, and why.
    pub fell_back: Option<String>,
}

/// A listener's TLS with the provider in effect for `requested` (the QAT proof and fallback
/// are `crypto::qat::provider_in_effect`'s), for start-up, `check-config`, reloads and the
/// run-time switch alike.
pub fn resolve_listener_tls(
    requested: ProviderName,
    cert: &Path,
    key: &Path,
    policy: &TlsPolicy,
    default_alpn: &[&[u8]],
    qat: Option<&QatState>,
    fallback: Fallback,
) -> Result<ResolvedTls, CryptoError> {
    let in_effect = provider_in_effect(requested, key, qat, fallback)?;
    let (provider, cert, config) =
        listener_tls(in_effect.provider, cert, key, policy, default_alpn)?;
    Ok(ResolvedTls {
        provider,
        cert,
        config,
        qat_proof: in_effect.qat_proof,
        fell_back: in_effect.fell_back,
    })
}

/// A listener's provider, checked certificate and rustls configuration (see
/// [`resolve_listener_tls`] for the provider choice and the QAT proof).
pub fn listener_tls(
    provider: ProviderName,
    cert: &Path,
    key: &Path,
    policy: &TlsPolicy,
    default_alpn: &[&[u8]],
) -> Result<(Provider, LoadedCert, Arc<ServerConfig>), CryptoError> {
    let provider = Provider::with_groups(provider, policy.kx_groups.as_deref())?;
    let loaded = load_certified_key(&provider, cert, key)?;
    let config = server_config(&provider, &loaded, policy, default_alpn)?;
    Ok((provider, loaded, config))
}

/// Builds a listener's TLS configuration.
///
/// `default_alpn` is used when the policy does not list ALPN protocols itself.
pub fn server_config(
    provider: &Provider,
    cert: &LoadedCert,
    policy: &TlsPolicy,
    default_alpn: &[&[u8]],
) -> Result<Arc<ServerConfig>, CryptoError> {
    let versions: Vec<&'static SupportedProtocolVersion> =
        [(TlsVersion::Tls12, &TLS12), (TlsVersion::Tls13, &TLS13)]
            .into_iter()
            .filter(|(v, _)| (policy.min_version..=policy.max_version).contains(v))
            .map(|(_, s)| s)
            .collect();

    let builder = ServerConfig::builder_with_provider(provider.crypto().clone())
        .with_protocol_versions(&versions)?;
    let builder = match &policy.client_ca {
        Some(path) => {
            let roots = load_client_ca(path)?;
            let verifier = WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider.crypto().clone(),
            )
            .build()
            .map_err(|e| CryptoError::BadPem {
                what: "client CA",
                path: path.clone(),
                reason: e.to_string(),
            })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config =
        builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(cert.certified.clone())));
    // The server's cipher order (the provider's, AES-128-GCM first) wins over the client's:
    // clients such as rustls and Go list AES-256-GCM first, which costs more per record and
    // per handshake for no gain a server operator asked for.
    config.ignore_client_order = true;

    if policy.resumption {
        config.session_storage = ServerSessionMemoryCache::new(SESSION_CACHE_SIZE);
        config.ticketer = provider.ticketer()?;
    } else {
        config.session_storage = Arc::new(NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
    }
    config.alpn_protocols = match &policy.alpn {
        Some(list) => list.iter().map(|p| p.as_bytes().to_vec()).collect(),
        None => default_alpn.iter().map(|p| p.to_vec()).collect(),
    };
    Ok(Arc::new(config))
}

/// Where the signing step of a handshake runs.
#[derive(Clone, Debug)]
pub enum Offload {
    /// On the reactor thread that accepted the connection.
    Inline,
    /// On the dedicated handshake pool.
    Pool(tokio::runtime::Handle),
}

impl Offload {
    /// The config value this placement came from, for labels.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Inline => "inline",
            Self::Pool(_) => "pool",
        }
    }
}

/// The `handshake_offload` label of a listener: where its handshakes sign. openssl-qat
/// listeners sign through the asynchronous QAT signer whatever `offload` says.
pub fn handshake_label(provider: ProviderName, offload: &'static str) -> &'static str {
    if provider == ProviderName::OpensslQat {
        "qat-async"
    } else {
        offload
    }
}

/// The dedicated handshake pool: a separate multi-threaded runtime whose workers only turn
/// ClientHellos into the server's first flight (the step that signs).
pub struct HandshakePool {
    // An Option so that Drop can take it: a runtime must be shut down without blocking when
    // dropped from async code (a start-up error drops the pool inside the main runtime).
    runtime: Option<tokio::runtime::Runtime>,
}

impl HandshakePool {
    /// Starts `threads` workers (at least one).
    pub fn start(threads: usize) -> io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("tls-handshake")
            .enable_all()
            .build()?;
        Ok(Self {
            runtime: Some(runtime),
        })
    }

    /// A placement that uses this pool.
    pub fn offload(&self) -> Offload {
        match &self.runtime {
            Some(rt) => Offload::Pool(rt.handle().clone()),
            None => Offload::Inline,
        }
    }

    /// Stops the workers without waiting for queued handshakes.
    pub fn shutdown(self) {
        drop(self);
    }
}

impl Drop for HandshakePool {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Picks the offload placement for the configuration, starting a pool when needed.
pub fn offload_for(
    mode: HandshakeOffload,
    threads: usize,
) -> io::Result<(Offload, Option<HandshakePool>)> {
    match mode {
        HandshakeOffload::Inline => Ok((Offload::Inline, None)),
        HandshakeOffload::Pool => {
            let threads = if threads == 0 {
                std::thread::available_parallelism().map_or(1, |n| n.get())
            } else {
                threads
            };
            let pool = HandshakePool::start(threads)?;
            Ok((pool.offload(), Some(pool)))
        }
    }
}

/// Why a handshake failed, as a bounded metric label plus the error for the log.
#[derive(Debug, thiserror::Error)]
#[error("{kind}: {source}")]
pub struct HandshakeError {
    /// `client_hello` (not TLS, or a ClientHello we cannot parse), `handshake` (TLS failed
    /// after the ClientHello) or `offload` (the pool is gone).
    pub kind: &'static str,
    /// What happened.
    pub source: io::Error,
}

/// Where an openssl-qat listener's handshakes sign (see [`accept`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QatSigning {
    /// Not through the QAT signer: another provider, or a certificate kept in software.
    No,
    /// On a blocking thread, through the signer, while a batch's worth of openssl-qat
    /// handshakes is under way; otherwise where `offload` says, in software.
    WhenBatchesForm,
    /// Always on a blocking thread (the signer decides there whether the signature joins a
    /// batch): a software signature of the listener's algorithm would hold a reactor thread
    /// for milliseconds (see `crypto::qat::signs_off_the_reactor`).
    OffTheReactor,
}

/// Reads the ClientHello, builds the connection (where the server signs) according to
/// `offload`, and completes the handshake. `qat` (openssl-qat) overrides `offload` when the
/// signing step leaves the reactor: it then runs on tokio's blocking threads, as many at
/// once as there are handshakes (a pool of a few workers would cap the batch at the pool's
/// size), and the signer decides there whether the signature joins a batch on the QAT
/// signer thread (the step then only waits for it) or is made in software at once.
///
/// Signing RSA-4096 in software on a reactor thread held the accept loop for the
/// signature's whole time: connections waited in the listen queue, where no count sees
/// them, fewer handshakes were under way than a batch needs, and the next signature went
/// to software on the reactor too. Under a 0.1-core budget with 32 clients, rounds that
/// fell into that state offloaded 4-31 % of RSA-4096 signatures, the others 90 %.
///
/// `choose` picks the configuration by the server name the client asked for (SNI), once
/// its ClientHello has arrived.
pub async fn accept<IO, C>(
    io: IO,
    choose: C,
    offload: &Offload,
    qat: QatSigning,
) -> Result<TlsStream<IO>, HandshakeError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    C: FnOnce(Option<&str>) -> Arc<ServerConfig>,
{
    // Counted from accept to the last flight, so that the QAT signer knows how many
    // signatures are still to come: a part batch waits only while they can fill it.
    let state = (qat != QatSigning::No)
        .then(crate::crypto::qat::active)
        .flatten();
    let mut counted = state
        .as_ref()
        .map(|state| crate::crypto::qat::signer::HandshakeInFlight::new(state.signer()));
    let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io)
        .await
        .map_err(|source| HandshakeError {
            kind: "client_hello",
            source,
        })?;
    let config = choose(start.client_hello().server_name());
    let leaves_reactor = match (&state, &counted) {
        (Some(state), Some(handshake)) => {
            qat == QatSigning::OffTheReactor || handshake.may_fill_a_batch(state.signer())
        }
        _ => false,
    };
    if !leaves_reactor {
        // Signed in software where `offload` says: no work for a batch to wait for.
        if let Some(handshake) = counted.as_mut() {
            handshake.asks_no_more();
        }
    }
    let accept = match offload {
        _ if leaves_reactor => {
            let mut handshake = counted
                .take()
                .expect("leaves the reactor only with a counted handshake");
            let (handshake, accept) = tokio::task::spawn_blocking(move || {
                let accept =
                    crate::crypto::qat::signer::AsyncSigner::offload_step(&mut handshake, || {
                        start.into_stream(config)
                    });
                (handshake, accept)
            })
            .await
            .map_err(|e| HandshakeError {
                kind: "offload",
                source: io::Error::other(e),
            })?;
            // Still under way until its last flight.
            counted = Some(handshake);
            accept
        }
        Offload::Inline => start.into_stream(config),
        // The pool returns the not-yet-finished handshake future on purpose: only building it
        // signs; the remaining flights are I/O and go back to this connection's reactor.
        #[allow(clippy::async_yields_async)]
        Offload::Pool(pool) => pool
            .spawn(async move { start.into_stream(config) })
            .await
            .map_err(|e| HandshakeError {
                kind: "offload",
                source: io::Error::other(e),
            })?,
    };
    let stream = accept.await.map_err(|source| HandshakeError {
        kind: "handshake",
        source,
    });
    drop(counted);
    stream
}

impl HandshakeError {
    /// The bounded reason of `proxy_tls_handshake_failures_total`
    /// (`metrics::HANDSHAKE_FAILURE_REASONS`).
    pub fn reason(&self) -> &'static str {
        if self.kind == "offload" {
            return "offload";
        }
        if let Some(e) = self
            .source
            .get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>())
        {
            return match e {
                // Bytes that are no TLS record at all, where a ClientHello should be.
                rustls::Error::InvalidMessage(_) if self.kind == "client_hello" => "not_tls",
                rustls::Error::PeerIncompatible(_) => "incompatible",
                rustls::Error::AlertReceived(_) => "alert_received",
                rustls::Error::NoCertificatesPresented | rustls::Error::InvalidCertificate(_) => {
                    "client_certificate"
                }
                rustls::Error::InvalidMessage(_)
                | rustls::Error::InappropriateMessage { .. }
                | rustls::Error::InappropriateHandshakeMessage { .. }
                | rustls::Error::PeerMisbehaved(_)
                | rustls::Error::DecryptError => "protocol",
                _ => "other",
            };
        }
        match self.source.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => "eof",
            io::ErrorKind::InvalidData if self.kind == "client_hello" => "not_tls",
            io::ErrorKind::InvalidData => "protocol",
            _ => "other",
        }
    }
}

/// What a completed handshake negotiated, for `proxy_tls_negotiated_total`: the cipher
/// suite's IANA name and the key-exchange group's (`none` where there was no key
/// exchange, a TLS 1.2 resumption).
pub fn negotiated<IO>(stream: &TlsStream<IO>) -> (&'static str, &'static str) {
    let (_, conn) = stream.get_ref();
    let suite = conn
        .negotiated_cipher_suite()
        .and_then(|s| s.suite().as_str())
        .unwrap_or("other");
    let group = match conn.negotiated_key_exchange_group() {
        Some(g) => crate::crypto::KxGroupName::from_named_group(g.name())
            .map_or("other", crate::crypto::KxGroupName::as_str),
        None => "none",
    };
    (suite, group)
}

/// What a completed handshake negotiated, for metrics.
pub fn describe<IO>(stream: &TlsStream<IO>) -> (&'static str, bool, bool) {
    let (_, conn) = stream.get_ref();
    let version = match conn.protocol_version() {
        Some(ProtocolVersion::TLSv1_3) => "1.3",
        Some(ProtocolVersion::TLSv1_2) => "1.2",
        _ => "other",
    };
    let resumed = matches!(conn.handshake_kind(), Some(rustls::HandshakeKind::Resumed));
    let h2 = conn.alpn_protocol() == Some(b"h2");
    (version, resumed, h2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::{generate_cert_set, CertAlgorithmName, KxGroupName};
    use rustls::CipherSuite;

    /// A client that lists AES-256-GCM first (as rustls and Go clients do) still gets the
    /// server's first choice, AES-128-GCM, from every software provider.
    #[test]
    fn server_cipher_order_wins_over_the_clients() {
        let dir = std::env::temp_dir().join(format!("tls-order-{}", std::process::id()));
        let set = generate_cert_set(&dir, &[CertAlgorithmName::EcdsaP256], &[]).unwrap();
        let (_, cert, key) = &set.servers[0];
        let client = client::ClientTls {
            versions: vec![TlsVersion::Tls13],
            cipher_order: client::CipherOrder::Shipped,
            ..client::ClientTls::trusting(&set.ca_cert)
        }
        .build()
        .unwrap();
        assert_eq!(
            client.crypto_provider().cipher_suites[0].suite(),
            CipherSuite::TLS13_AES_256_GCM_SHA384,
            "the client offers AES-256-GCM first"
        );
        let mut wire = (Vec::new(), Vec::new());
        for provider in ProviderName::SOFTWARE {
            let policy = TlsPolicy {
                kx_groups: Some(vec![KxGroupName::X25519]),
                ..TlsPolicy::default()
            };
            let (_, _, server) = listener_tls(provider, cert, key, &policy, &[]).unwrap();
            let (_, s) = measure::server_side_handshake(&server, &client, &mut wire).unwrap();
            let suite = s.negotiated_cipher_suite().unwrap().suite();
            assert_eq!(
                suite,
                CipherSuite::TLS13_AES_128_GCM_SHA256,
                "{provider:?} chose {suite:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
