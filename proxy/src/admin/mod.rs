//! The admin listener: `/healthz` (the process is up), `/readyz` (listeners are bound and
//! not draining), `/metrics` (Prometheus text format), and, when `admin.token_file` is set,
//! `POST /admin/tls` (switch a listener's provider and certificate; see [`crate::switch`]).
//! Bound to loopback by default.

mod metrics;
mod process;
mod qat;

pub use qat::QatMetrics;

pub use metrics::{ListenerMetrics, Metrics};

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
use tokio::net::TcpListener;
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
    pub switch: Option<(Arc<TlsSwitch>, String)>,
}

/// Largest switch request body we read.
const MAX_ADMIN_BODY: usize = 64 * 1024;

/// Serves the admin endpoints until `shutdown` fires.
pub async fn serve(listener: TcpListener, state: AdminState, shutdown: CancellationToken) {
    loop {
        let (stream, _) = tokio::select! {
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
        let state = state.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let state = state.clone();
                async move {
                    if req.uri().path() == "/admin/tls" {
                        return Ok::<_, Infallible>(switch_tls(&state, req).await);
                    }
                    Ok::<_, Infallible>(route(&state, &req))
                }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
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

/// Compares without an early exit, so the time taken does not reveal how much of a guessed
/// token was right.
fn token_matches(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// `POST /admin/tls` with `Authorization: Bearer <token>` and a [`SwitchRequest`] body.
async fn switch_tls(state: &AdminState, req: Request<Incoming>) -> Response<Full<Bytes>> {
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
    if !token_matches(given.as_bytes(), token.as_bytes()) {
        tracing::warn!("admin: TLS switch refused: missing or wrong bearer token");
        return err(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token".into(),
        );
    }
    let body = match Limited::new(req.into_body(), MAX_ADMIN_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => return err(StatusCode::BAD_REQUEST, format!("reading the body: {e}")),
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
