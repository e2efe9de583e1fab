//! `embedded-qdrant`: a Qdrant-compatible server (REST on HTTP/1.1, gRPC on h2c) backed by
//! Qdrant's own storage engine (the `qdrant-edge` crate), so the benchmark's main job runs
//! where no Qdrant server or container engine is installed.

// No unsafe code of its own: Qdrant's engine and the TLS stack carry theirs.
#![deny(unsafe_code)]
#![deny(missing_docs)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use clap::Parser;
use embedded_qdrant::{auth, grpc, rest, store, tls};

use tokio_util::sync::CancellationToken;

/// A Qdrant-compatible REST and gRPC server on Qdrant's engine.
#[derive(Debug, Parser)]
#[command(name = "embedded-qdrant", version, about)]
struct Args {
    /// REST (HTTP/1.1) listen address (default: `--host` and `--http-port`).
    #[arg(long)]
    rest: Option<SocketAddr>,
    /// gRPC (HTTP/2 cleartext) listen address (default: `--host` and `--grpc-port`).
    #[arg(long)]
    grpc: Option<SocketAddr>,
    /// The address both ports bind to, as Qdrant's `service.host` (Qdrant's own default
    /// is 0.0.0.0; this one stays on loopback unless told).
    #[arg(long, env = "QDRANT__SERVICE__HOST", default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// The REST port, as Qdrant's `service.http_port`.
    #[arg(long, env = "QDRANT__SERVICE__HTTP_PORT", default_value_t = 6333)]
    http_port: u16,
    /// The gRPC port, as Qdrant's `service.grpc_port`.
    #[arg(long, env = "QDRANT__SERVICE__GRPC_PORT", default_value_t = 6334)]
    grpc_port: u16,
    /// Data folder (created if missing); collections persist here across restarts. As
    /// Qdrant's `storage.storage_path`.
    #[arg(
        long,
        env = "QDRANT__STORAGE__STORAGE_PATH",
        default_value = "./embedded-qdrant-data"
    )]
    data: PathBuf,
    /// Write the bound addresses as JSON here once listening (useful with port 0).
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Log filter (RUST_LOG wins).
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Require this API key on every request but the health checks, as Qdrant's
    /// `service.api_key` (`api-key` header or `authorization: Bearer`); REST answers 401
    /// and gRPC UNAUTHENTICATED without it.
    #[arg(long, env = "QDRANT__SERVICE__API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Serve both ports over TLS with this certificate chain (PEM), terminated in process
    /// by rustls with ring, as Qdrant's `service.enable_tls` with `tls.cert`.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&args.log_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("embedded-qdrant: error: cannot start the runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("embedded-qdrant: error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let api_key = match args.api_key.as_deref() {
        Some("") => anyhow::bail!("--api-key: the key must not be empty"),
        Some(k) => Some(auth::ApiKey::new(k.to_owned())),
        None => None,
    };
    // TLS first: a bad certificate or key is refused before anything is opened.
    let (rest_tls, grpc_tls) = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let tls = tls::load(cert, key)?;
            (Some(tls.rest), Some(tls.grpc))
        }
        _ => (None, None),
    };
    let store = Arc::new(tokio::task::block_in_place(|| {
        store::Store::open(&args.data)
    })?);
    let operation_ids = Arc::new(AtomicU64::new(0));
    let rest = args
        .rest
        .unwrap_or(SocketAddr::new(args.host, args.http_port));
    let grpc = args
        .grpc
        .unwrap_or(SocketAddr::new(args.host, args.grpc_port));
    let rest_listener = tokio::net::TcpListener::bind(rest)
        .await
        .map_err(|e| anyhow::anyhow!("REST on {rest}: {e}"))?;
    let grpc_listener = tokio::net::TcpListener::bind(grpc)
        .await
        .map_err(|e| anyhow::anyhow!("gRPC on {grpc}: {e}"))?;
    let rest_addr = rest_listener.local_addr()?;
    let grpc_addr = grpc_listener.local_addr()?;
    let shutdown = CancellationToken::new();

    let rest_task = tokio::spawn(rest::serve(
        rest_listener,
        Arc::new(rest::Rest {
            store: store.clone(),
            operation_ids: operation_ids.clone(),
            api_key: api_key.clone(),
        }),
        rest_tls,
        shutdown.clone(),
    ));
    let check_key = move |req: tonic::Request<()>| match &api_key {
        Some(key) if !key.admits(&req.metadata().clone().into_headers()) => {
            Err(tonic::Status::unauthenticated(auth::REFUSAL))
        }
        _ => Ok(req),
    };
    let service = grpc::Grpc {
        store: store.clone(),
        operation_ids,
    };
    // One UPSERT_100 of 1024-d vectors is ~450 KB of protobuf; allow large batches.
    const MAX_GRPC_MESSAGE: usize = 256 * 1024 * 1024;
    let grpc_shutdown = shutdown.clone();
    // grpc.health.v1.Health, which load balancers and the proxy's health checks ask; like
    // Qdrant's own checks it needs no key.
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let mut grpc_server = tonic::transport::Server::builder();
    if let Some(config) = grpc_tls {
        grpc_server = grpc_server
            .tls_config(config)
            .map_err(|e| anyhow::anyhow!("--tls-cert/--tls-key for gRPC: {e}"))?;
    }
    let grpc_task = tokio::spawn(
        grpc_server
            .add_service(health_service)
            // Qdrant's own service (health check, version) needs no key, as in Qdrant.
            .add_service(
                qdrant_client::qdrant::qdrant_server::QdrantServer::new(service.clone())
                    .max_decoding_message_size(MAX_GRPC_MESSAGE),
            )
            .add_service(tonic::service::interceptor::InterceptedService::new(
                qdrant_client::qdrant::collections_server::CollectionsServer::new(service.clone())
                    .max_decoding_message_size(MAX_GRPC_MESSAGE),
                check_key.clone(),
            ))
            .add_service(tonic::service::interceptor::InterceptedService::new(
                qdrant_client::qdrant::snapshots_server::SnapshotsServer::new(service.clone()),
                check_key.clone(),
            ))
            .add_service(tonic::service::interceptor::InterceptedService::new(
                qdrant_client::qdrant::points_server::PointsServer::new(service)
                    .max_decoding_message_size(MAX_GRPC_MESSAGE)
                    .max_encoding_message_size(MAX_GRPC_MESSAGE),
                check_key,
            ))
            .serve_with_incoming_shutdown(
                // Without TCP_NODELAY a unary answer (headers, message, trailers in separate
                // writes) meets Nagle and the client's delayed ACK: a 40 ms floor per call.
                tonic::transport::server::TcpIncoming::from(grpc_listener).with_nodelay(Some(true)),
                grpc_shutdown.cancelled_owned(),
            ),
    );
    if let Some(path) = &args.ready_file {
        write_ready(path, rest_addr, grpc_addr, args.tls_cert.is_some())?;
    }
    tracing::info!(rest = %rest_addr, grpc = %grpc_addr, data = %args.data.display(), tls = args.tls_cert.is_some(), "embedded-qdrant serving");

    let signal = wait_for_signal().await;
    tracing::info!(
        signal,
        "shutting down: finishing requests and flushing collections"
    );
    health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    shutdown.cancel();
    let _ = rest_task.await;
    let _ = grpc_task.await;
    store.flush_all().await;
    tracing::info!("flushed; bye");
    Ok(())
}

/// The ready file: both bound addresses, the pid and whether TLS is on, written whole (a
/// temporary file renamed) so a reader never sees half.
fn write_ready(
    path: &std::path::Path,
    rest: SocketAddr,
    grpc: SocketAddr,
    tls: bool,
) -> std::io::Result<()> {
    let doc = serde_json::json!({"rest": rest.to_string(), "grpc": grpc.to_string(), "pid": std::process::id(), "tls": tls});
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, doc.to_string())?;
    std::fs::rename(&tmp, path)
}

async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}
