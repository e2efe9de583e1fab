//! Qdrant's REST API (HTTP/1.1) over the store: the subset an ingestion benchmark and its
//! checks use, with Qdrant's shapes and status codes.
//!
//! The route table is [`router`]: one axum route per path and method, each going to a
//! handler in `collections` (collections, aliases, payload indexes, server info) or
//! `points` (points and payloads). Handlers take typed extractors (`JsonBody`,
//! `JsonOrEmpty`, `PathArgs`, `Wait`) whose rejections answer in Qdrant's error envelope, and
//! answer through `answer`, which wraps a result in `{"result", "status", "time"}` as Qdrant's
//! own handlers do. The API key is one middleware over every route but the health checks;
//! paths and methods not served get Qdrant's 404 envelope. [`serve`] runs the router on
//! hyper, over TLS or not, each connection in its own task.

mod bodies;
mod collections;
mod points;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::Router;
use bytes::Bytes;
use http::request::Parts;
use http::{header, Method, StatusCode, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::store::{Store, StoreError};

/// Largest request body: a few thousand 1024-d points in JSON.
const MAX_BODY_BYTES: usize = 256 * 1024 * 1024;

/// Shared state of the REST server.
pub struct Rest {
    /// The collections.
    pub store: Arc<Store>,
    /// Operation ids handed out for updates.
    pub operation_ids: Arc<AtomicU64>,
    /// Required on every request but the health checks, as Qdrant's `service.api_key`.
    pub api_key: Option<crate::auth::ApiKey>,
}

/// The REST API's route table over `rest`.
pub fn router(rest: Arc<Rest>) -> Router {
    router_with_body_limit(rest, MAX_BODY_BYTES)
}

fn router_with_body_limit(rest: Arc<Rest>, body_limit: usize) -> Router {
    use collections as c;
    use points as p;
    let api = Router::new()
        .route("/", get(c::server_info))
        .route("/collections", get(c::list))
        .route(
            "/collections/{name}",
            get(c::info)
                .put(c::create)
                .patch(c::update)
                .delete(c::remove),
        )
        .route("/collections/{name}/exists", get(c::exists))
        .route("/aliases", get(c::all_aliases))
        .route("/collections/aliases", post(c::change_aliases))
        .route("/collections/{name}/aliases", get(c::aliases_of))
        .route("/collections/{name}/index", put(c::create_index))
        .route("/collections/{name}/index/{field}", delete(c::delete_index))
        .route(
            "/collections/{name}/points",
            put(p::upsert).post(p::retrieve),
        )
        .route("/collections/{name}/points/delete", post(p::delete))
        .route("/collections/{name}/points/search", post(p::search))
        .route("/collections/{name}/points/query", post(p::query))
        .route("/collections/{name}/points/count", post(p::count))
        .route("/collections/{name}/points/scroll", post(p::scroll))
        .route(
            "/collections/{name}/points/payload",
            post(p::set_payload).put(p::set_payload),
        )
        .route(
            "/collections/{name}/points/payload/delete",
            post(p::delete_payload),
        )
        .route(
            "/collections/{name}/points/payload/clear",
            post(p::clear_payload),
        )
        .fallback(not_served)
        .method_not_allowed_fallback(not_served)
        .layer(middleware::from_fn_with_state(
            rest.clone(),
            require_api_key,
        ));
    // The health checks answer without the key, as Qdrant's do.
    Router::new()
        .route("/healthz", get(c::health))
        .route("/livez", get(c::health))
        .route("/readyz", get(c::health))
        .merge(api)
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(rest)
}

/// Serves until `shutdown` fires (in-flight requests finish); over TLS when `tls` is given,
/// each handshake in its connection's own task, so a slow client holds up nobody else.
pub async fn serve(
    listener: TcpListener,
    rest: Arc<Rest>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: CancellationToken,
) {
    let routes = router(rest);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (stream, _peer): (_, SocketAddr) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "REST accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let svc = TowerToHyperService::new(routes.clone());
        let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        match &tls {
            None => {
                let conn = graceful.watch(
                    builder
                        .serve_connection(TokioIo::new(stream), svc)
                        .into_owned(),
                );
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            Some(acceptor) => {
                let accept = acceptor.accept(stream);
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let stream =
                        match tokio::time::timeout(crate::tls::HANDSHAKE_TIMEOUT, accept).await {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => {
                                tracing::debug!(error = %e, "REST TLS handshake failed");
                                return;
                            }
                            Err(_) => return,
                        };
                    let conn = builder
                        .serve_connection(TokioIo::new(stream), svc)
                        .into_owned();
                    let _ = watcher.watch(conn).await;
                });
            }
        }
    }
    let _ = tokio::time::timeout(std::time::Duration::from_secs(30), graceful.shutdown()).await;
}

/// A JSON answer with `status`.
fn json_reply(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// Runs a handler's work and answers in Qdrant's envelope, `time` being how long the work
/// took (Qdrant's handlers time themselves the same way).
async fn answer(work: impl Future<Output = Result<Value, ApiError>>) -> Response {
    let started = Instant::now();
    match work.await {
        Ok(result) => json_reply(
            StatusCode::OK,
            &json!({"result": result, "status": "ok", "time": started.elapsed().as_secs_f64()}),
        ),
        Err(e) => e.reply(started),
    }
}

/// A request refused, as Qdrant words and numbers it.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// 400 with Qdrant's "Wrong input: " prefix.
    fn wrong_input(message: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::BAD_REQUEST, format!("Wrong input: {message}"))
    }

    fn reply(self, started: Instant) -> Response {
        json_reply(
            self.status,
            &json!({"status": {"error": self.message}, "time": started.elapsed().as_secs_f64()}),
        )
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let status = match e {
            StoreError::NoCollection(_) | StoreError::NoAlias(_) => StatusCode::NOT_FOUND,
            StoreError::Exists(_) => StatusCode::CONFLICT,
            StoreError::BadRequest(_) => StatusCode::BAD_REQUEST,
            StoreError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, e.to_string())
    }
}

/// Rejections by the extractors: refused before any work, so `time` is the refusal's own.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.reply(Instant::now())
    }
}

/// A JSON request body of type `T`, parsed whatever the Content-Type (as Qdrant does);
/// a body that does not parse is a 400 "Format error in JSON body".
pub(crate) struct JsonBody<T>(T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        parse(&read_body(req, state).await?).map(Self)
    }
}

/// Like [`JsonBody`], with `T::default()` for an empty body (count and scroll take one).
pub(crate) struct JsonOrEmpty<T>(T);

impl<T: DeserializeOwned + Default, S: Send + Sync> FromRequest<S> for JsonOrEmpty<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let body = read_body(req, state).await?;
        if body.is_empty() {
            return Ok(Self(T::default()));
        }
        parse(&body).map(Self)
    }
}

async fn read_body<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|e| {
        ApiError::new(
            e.status(),
            format!("cannot read the request body: {}", e.body_text()),
        )
    })
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("Format error in JSON body: {e}"),
        )
    })
}

/// The path's parameters (`{name}`, `{field}`), percent-decoded; one that cannot be
/// decoded is a 400 in Qdrant's envelope.
pub(crate) struct PathArgs<T>(T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for PathArgs<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(args)| Self(args))
            .map_err(|e| ApiError::wrong_input(e.body_text()))
    }
}

/// `?wait=true` (or a bare `?wait`): answer an update once it is applied, not when it is
/// acknowledged.
pub(crate) struct Wait(bool);

impl<S: Send + Sync> FromRequestParts<S> for Wait {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let wait = parts
            .uri
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "wait=true" || kv == "wait"));
        Ok(Self(wait))
    }
}

/// Qdrant's `service.api_key`: without the key, 401 before the body is read.
async fn require_api_key(State(rest): State<Arc<Rest>>, req: Request, next: Next) -> Response {
    if let Some(key) = &rest.api_key {
        if !key.admits(req.headers()) {
            return ApiError::new(StatusCode::UNAUTHORIZED, crate::auth::REFUSAL).into_response();
        }
    }
    next.run(req).await
}

/// Every path and method the table does not hold.
async fn not_served(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "Not found: {method} {} is not served by embedded-qdrant",
            uri.path()
        ),
    )
}

/// The request bodies the handlers read, by number (for the fuzz targets: each is parsed
/// as its handler parses it); the status of the answer to a body that does not parse.
pub(crate) fn decode_body(kind: u8, body: &[u8]) -> Result<(), StatusCode> {
    fn check<T: DeserializeOwned>(body: &[u8]) -> Result<(), StatusCode> {
        parse::<T>(body).map(drop).map_err(|e| e.status)
    }
    use bodies::*;
    match kind % 10 {
        0 => check::<CreateBody>(body),
        1 => check::<UpsertBody>(body),
        2 => check::<SearchBody>(body),
        3 => check::<QueryBody>(body),
        4 => check::<CountBody>(body),
        5 => check::<RetrieveBody>(body),
        6 => check::<ScrollBody>(body),
        7 => check::<UpdateCollectionBody>(body),
        8 => check::<AliasesBody>(body),
        _ => check::<DeletePayloadBody>(body),
    }
}

#[cfg(test)]
mod tests;
