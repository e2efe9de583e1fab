//! The admin listener: `/healthz` (the process is up), `/readyz` (listeners are bound and
//! not draining), `/metrics` (Prometheus text format), and, when `admin.token_file` is set,
//! `POST /admin/tls` (switch a listener's provider and certificate; see [`crate::switch`]).
//! Bound to loopback by default; optionally over TLS with its own certificate. Bounded
//! like the data path: a connection cap, a header timer that also closes idle keep-alive
//! connections, a body deadline, and a token check that reveals neither the token nor its
//! length.

use crate::metrics::Metrics;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::rt::TokioTimer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::switch::{SwitchRequest, TlsSwitch};

/// Shared state the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    /// The metrics registry.
    pub metrics: Metrics,
    /// True once every listener is bound, false again when draining.
    pub ready: Arc<AtomicBool>,
    /// The TLS switch and the bearer token that authorises it; None: endpoint off.
    pub switch: Option<(Arc<TlsSwitch>, AdminToken)>,
}

/// The admin bearer token, kept as its SHA-256 digest: a presented token is hashed and the
/// digests compared in constant time, so neither the time taken nor an early length check
/// tells a guesser how long the token is or how much of it was right.
#[derive(Clone)]
pub struct AdminToken([u8; 32]);

impl AdminToken {
    /// The token as read from its file.
    pub fn new(token: &str) -> Self {
        Self(openssl::sha::sha256(token.as_bytes()))
    }

    fn matches(&self, given: &[u8]) -> bool {
        openssl::memcmp::eq(&openssl::sha::sha256(given), &self.0)
    }
}

/// How the admin listener guards itself.
pub struct AdminGuards {
    /// See `admin.max_connections`.
    pub max_connections: usize,
    /// See `admin.header_read_timeout`.
    pub header_read_timeout: std::time::Duration,
    /// Serve over TLS with this configuration.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// Largest switch request body we read.
const MAX_ADMIN_BODY: usize = 64 * 1024;
/// Largest admin request head (hyper's minimum buffer).
const MAX_ADMIN_HEAD: usize = 8192;

/// Serves the admin endpoints until `shutdown` fires.
pub async fn serve(
    listener: TcpListener,
    state: AdminState,
    guards: AdminGuards,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(guards.max_connections));
    let tls = guards.tls.map(TlsAcceptor::from);
    let timeout = guards.header_read_timeout;
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => return,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Closed at once: waiting would hold a descriptor per excess connection.
            state.metrics.admin_refused("connections");
            crate::peer_warn!(%peer, limit = guards.max_connections, "admin: connection refused: too many open admin connections");
            continue;
        };
        let state = state.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _slot = slot;
            match tls {
                None => serve_connection(stream, state, timeout).await,
                Some(acceptor) => {
                    match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
                        Ok(Ok(tls_stream)) => serve_connection(tls_stream, state, timeout).await,
                        Ok(Err(e)) => {
                            crate::peer_warn!(%peer, error = %e, "admin: TLS handshake failed")
                        }
                        Err(_) => crate::peer_warn!(%peer, "admin: TLS handshake timed out"),
                    }
                }
            }
        });
    }
}

async fn serve_connection<IO>(io: IO, state: AdminState, timeout: std::time::Duration)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req| {
        let state = state.clone();
        async move {
            if req.uri().path() == "/admin/tls" {
                return Ok::<_, Infallible>(switch_tls(&state, req, timeout).await);
            }
            Ok::<_, Infallible>(route(&state, &req))
        }
    });
    let _ = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        .max_buf_size(MAX_ADMIN_HEAD)
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

fn route(state: &AdminState, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: &'static str| {
        Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .expect("static response parts are valid")
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    match req.uri().path() {
        "/healthz" | "/livez" => text(StatusCode::OK, "ok\n"),
        "/readyz" => {
            if state.ready.load(Ordering::Acquire) {
                text(StatusCode::OK, "ready\n")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
            }
        }
        "/metrics" => Response::builder()
            .header(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )
            .body(Full::new(Bytes::from(state.metrics.render())))
            .expect("static response parts are valid"),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; try /metrics, /healthz or /readyz\n",
        ),
    }
}

fn json(status: StatusCode, value: serde_json::Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(value.to_string())))
        .expect("static response parts are valid")
}

/// `POST /admin/tls` with `Authorization: Bearer <token>` and a [`SwitchRequest`] body.
async fn switch_tls(
    state: &AdminState,
    req: Request<Incoming>,
    body_timeout: std::time::Duration,
) -> Response<Full<Bytes>> {
    let err = |status: StatusCode, msg: String| json(status, serde_json::json!({ "error": msg }));
    let Some((switch, token)) = &state.switch else {
        return err(
            StatusCode::FORBIDDEN,
            "the TLS switch is off: start the proxy with admin.token_file (--admin-token-file)"
                .into(),
        );
    };
    if req.method() != Method::POST {
        return err(StatusCode::METHOD_NOT_ALLOWED, "use POST".into());
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if !token.matches(given.as_bytes()) {
        state.metrics.admin_refused("token");
        crate::peer_warn!("admin: TLS switch refused: missing or wrong bearer token");
        return err(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token".into(),
        );
    }
    let body = match tokio::time::timeout(
        body_timeout,
        Limited::new(req.into_body(), MAX_ADMIN_BODY).collect(),
    )
    .await
    {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) => return err(StatusCode::BAD_REQUEST, format!("reading the body: {e}")),
        Err(_) => {
            return err(
                StatusCode::REQUEST_TIMEOUT,
                format!("the body did not arrive within {body_timeout:?}"),
            )
        }
    };
    let request: SwitchRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return err(
                StatusCode::BAD_REQUEST,
                format!("expected {{\"provider\", \"cert\", \"key\", optional \"listener\"}}: {e}"),
            )
        }
    };
    let switch = switch.clone();
    // Key loading and the QAT proof block; keep them off the reactor.
    match tokio::task::spawn_blocking(move || switch.apply(&request)).await {
        Ok(Ok(outcomes)) => json(StatusCode::OK, serde_json::json!({ "switched": outcomes })),
        Ok(Err(e @ crate::switch::SwitchError::UnknownListener(_))) => {
            err(StatusCode::NOT_FOUND, e.to_string())
        }
        Ok(Err(e)) => err(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
        Err(e) => err(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("switch task: {e}"),
        ),
    }
}
