//! Qdrant's REST API (HTTP/1.1) over the store: the subset an ingestion benchmark and its
//! checks use. Shapes and status codes follow Qdrant's API reference.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use qdrant_edge::{
    CountRequest, Filter, NamedQuery, PointId, PointInsertOperations, PointOperations, QueryEnum,
    ScrollRequest, SearchRequest, UpdateOperation, VectorInternal, WithPayloadInterface,
    WithVector,
};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::convert::{id_json, record_json, scored_json};
use crate::store::{distance_name, parse_distance, Store, StoreError, VectorParams};

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

type Reply = Response<Full<Bytes>>;

/// Serves until `shutdown` fires (in-flight requests finish).
pub async fn serve(listener: TcpListener, rest: Arc<Rest>, shutdown: CancellationToken) {
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
        let rest = rest.clone();
        let svc = service_fn(move |req| {
            let rest = rest.clone();
            async move { Ok::<_, Infallible>(rest.handle(req).await) }
        });
        let conn = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(stream), svc)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    let _ = tokio::time::timeout(std::time::Duration::from_secs(30), graceful.shutdown()).await;
}

fn reply(status: StatusCode, body: Value) -> Reply {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("static response parts are valid")
}

fn ok(result: Value, started: Instant) -> Reply {
    reply(
        StatusCode::OK,
        json!({"result": result, "status": "ok", "time": started.elapsed().as_secs_f64()}),
    )
}

fn error(status: StatusCode, msg: &str, started: Instant) -> Reply {
    reply(
        status,
        json!({"status": {"error": msg}, "time": started.elapsed().as_secs_f64()}),
    )
}

fn store_error(e: &StoreError, started: Instant) -> Reply {
    let status = match e {
        StoreError::NoCollection(_) => StatusCode::NOT_FOUND,
        StoreError::Exists(_) => StatusCode::CONFLICT,
        StoreError::BadRequest(_) => StatusCode::BAD_REQUEST,
        StoreError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, &e.to_string(), started)
}

/// A vector in a search body: a bare array, or `{"name": ..., "vector": [...]}`.
#[derive(Deserialize)]
#[serde(untagged)]
enum VectorInput {
    Plain(Vec<f32>),
    Named { name: String, vector: Vec<f32> },
}

#[derive(Deserialize)]
struct CreateBody {
    vectors: VectorsBody,
}

#[derive(Deserialize)]
struct VectorsBody {
    size: usize,
    distance: String,
}

#[derive(Deserialize)]
struct UpsertBody {
    #[serde(flatten)]
    op: PointInsertOperations,
}

/// What search and query bodies share.
#[derive(Deserialize)]
struct NearestOptions {
    #[serde(default = "default_limit")]
    limit: usize,
    #[serde(default)]
    offset: usize,
    filter: Option<Filter>,
    with_payload: Option<WithPayloadInterface>,
    #[serde(alias = "with_vectors")]
    with_vector: Option<WithVector>,
    score_threshold: Option<f32>,
}

impl NearestOptions {
    fn request(self, vector: Vec<f32>, using: Option<String>) -> SearchRequest {
        SearchRequest {
            query: QueryEnum::Nearest(NamedQuery {
                query: VectorInternal::Dense(vector),
                using,
            }),
            filter: self.filter,
            params: None,
            limit: self.limit,
            offset: self.offset,
            with_payload: self.with_payload,
            with_vector: self.with_vector,
            score_threshold: self.score_threshold,
        }
    }
}

#[derive(Deserialize)]
struct SearchBody {
    vector: VectorInput,
    #[serde(flatten)]
    options: NearestOptions,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum QueryInput {
    Vector(Vec<f32>),
    Nearest { nearest: Vec<f32> },
    Id(PointId),
}

#[derive(Deserialize)]
struct QueryBody {
    query: QueryInput,
    using: Option<String>,
    #[serde(flatten)]
    options: NearestOptions,
}

fn default_limit() -> usize {
    10
}

#[derive(Deserialize)]
struct CountBody {
    filter: Option<Filter>,
    #[serde(default = "default_true")]
    exact: bool,
}

fn default_true() -> bool {
    true
}

#[derive(Deserialize)]
struct RetrieveBody {
    ids: Vec<PointId>,
    #[serde(default = "default_true")]
    with_payload: bool,
    #[serde(default, alias = "with_vectors")]
    with_vector: bool,
}

#[derive(Deserialize)]
struct ScrollBody {
    offset: Option<PointId>,
    limit: Option<usize>,
    filter: Option<Filter>,
    with_payload: Option<WithPayloadInterface>,
    #[serde(alias = "with_vectors")]
    with_vector: Option<WithVector>,
}

#[derive(Deserialize)]
struct DeletePointsBody {
    points: Vec<PointId>,
}

impl Rest {
    async fn handle(&self, req: Request<Incoming>) -> Reply {
        let started = Instant::now();
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        if let Some(key) = &self.api_key {
            let health = matches!(path.as_str(), "/healthz" | "/livez" | "/readyz");
            if !health && !key.admits(req.headers()) {
                return error(StatusCode::UNAUTHORIZED, crate::auth::REFUSAL, started);
            }
        }
        let wait = req
            .uri()
            .query()
            .map(|q| q.split('&').any(|kv| kv == "wait=true" || kv == "wait"))
            .unwrap_or(false);
        let segments: Vec<&str> = path
            .trim_matches('/')
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        let body = match Limited::new(req.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                return error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!("cannot read the request body: {e}"),
                    started,
                )
            }
        };
        match (method, segments.as_slice()) {
            (Method::GET, []) => reply(
                StatusCode::OK,
                json!({
                    "title": "qdrant - vector search engine (embedded-qdrant)",
                    "version": concat!("embedded-qdrant ", env!("CARGO_PKG_VERSION"), " (qdrant-edge 0.7.0)"),
                }),
            ),
            (Method::GET, ["healthz" | "livez" | "readyz"]) => Response::builder()
                .header(header::CONTENT_TYPE, "text/plain")
                .body(Full::new(Bytes::from_static(b"healthz check passed")))
                .expect("static response parts are valid"),
            (Method::GET, ["collections"]) => ok(
                json!({"collections": self.store.names().iter().map(|n| json!({"name": n})).collect::<Vec<_>>()}),
                started,
            ),
            (Method::PUT, ["collections", name]) => {
                let parsed: CreateBody = match parse(&body, started) {
                    Ok(b) => b,
                    Err(r) => return *r,
                };
                let Some(distance) = parse_distance(&parsed.vectors.distance) else {
                    return error(
                        StatusCode::BAD_REQUEST,
                        &format!(
                            "Wrong input: unknown distance {:?}; expected Cosine, Euclid, Dot or Manhattan",
                            parsed.vectors.distance
                        ),
                        started,
                    );
                };
                match self.store.create(
                    name,
                    VectorParams {
                        size: parsed.vectors.size,
                        distance,
                    },
                ) {
                    Ok(()) => ok(json!(true), started),
                    Err(e) => store_error(&e, started),
                }
            }
            (Method::GET, ["collections", name]) => match self.store.get(name) {
                Ok(c) => match c.count().await {
                    Ok(n) => ok(
                        json!({
                            "status": "green",
                            "optimizer_status": "ok",
                            "points_count": n,
                            "indexed_vectors_count": 0,
                            "segments_count": c.segments(),
                            "config": {"params": {"vectors": {
                                "size": c.params.size,
                                "distance": distance_name(c.params.distance),
                            }}},
                            "payload_schema": {},
                        }),
                        started,
                    ),
                    Err(e) => store_error(&e, started),
                },
                Err(e) => store_error(&e, started),
            },
            (Method::DELETE, ["collections", name]) => ok(json!(self.store.delete(name)), started),
            (Method::GET, ["collections", name, "exists"]) => {
                ok(json!({"exists": self.store.get(name).is_ok()}), started)
            }
            (Method::PUT, ["collections", name, "points"]) => {
                let parsed: UpsertBody = match parse(&body, started) {
                    Ok(b) => b,
                    Err(r) => return *r,
                };
                let op = UpdateOperation::PointOperation(PointOperations::UpsertPoints(parsed.op));
                self.update(name, op, wait, started).await
            }
            (Method::POST, ["collections", name, "points", "delete"]) => {
                let parsed: DeletePointsBody = match parse(&body, started) {
                    Ok(b) => b,
                    Err(r) => return *r,
                };
                let op = UpdateOperation::PointOperation(PointOperations::DeletePoints {
                    ids: parsed.points,
                });
                self.update(name, op, wait, started).await
            }
            (Method::POST, ["collections", name, "points", "search"]) => {
                let parsed: SearchBody = match parse(&body, started) {
                    Ok(b) => b,
                    Err(r) => return *r,
                };
                let (using, vector) = match parsed.vector {
                    VectorInput::Plain(v) => (None, v),
                    VectorInput::Named { name, vector } => (Some(name), vector),
                };
                let request = parsed.options.request(vector, using);
                self.search(name, request, started, false).await
            }
            (Method::POST, ["collections", name, "points", "query"]) => {
                let parsed: QueryBody = match parse(&body, started) {
                    Ok(b) => b,
                    Err(r) => return *r,
                };
                let vector = match parsed.query {
                    QueryInput::Vector(v) | QueryInput::Nearest { nearest: v } => v,
                    QueryInput::Id(id) => match self.vector_of(name, id).await {
                        Ok(v) => v,
                        Err(r) => return r(started),
                    },
                };
                let request = parsed.options.request(vector, parsed.using);
                self.search(name, request, started, true).await
            }
            (Method::POST, ["collections", name, "points", "count"]) => {
                let parsed: CountBody = if body.is_empty() {
                    CountBody {
                        filter: None,
                        exact: true,
                    }
                } else {
                    match parse(&body, started) {
                        Ok(b) => b,
                        Err(r) => return *r,
                    }
                };
                match self.store.get(name) {
                    Ok(c) => match c
                        .count_filtered(CountRequest {
                            filter: parsed.filter,
                            exact: parsed.exact,
                        })
                        .await
                    {
                        Ok(n) => ok(json!({"count": n}), started),
                        Err(e) => store_error(&e, started),
                    },
                    Err(e) => store_error(&e, started),
                }
            }
            (Method::POST, ["collections", name, "points"]) => {
                let parsed: RetrieveBody = match parse(&body, started) {
                    Ok(b) => b,
                    Err(r) => return *r,
                };
                match self.store.get(name) {
                    Ok(c) => match c
                        .retrieve(parsed.ids, parsed.with_payload, parsed.with_vector)
                        .await
                    {
                        Ok(records) => ok(
                            json!(records.iter().map(record_json).collect::<Vec<_>>()),
                            started,
                        ),
                        Err(e) => store_error(&e, started),
                    },
                    Err(e) => store_error(&e, started),
                }
            }
            (Method::POST, ["collections", name, "points", "scroll"]) => {
                let parsed: ScrollBody = if body.is_empty() {
                    ScrollBody {
                        offset: None,
                        limit: None,
                        filter: None,
                        with_payload: None,
                        with_vector: None,
                    }
                } else {
                    match parse(&body, started) {
                        Ok(b) => b,
                        Err(r) => return *r,
                    }
                };
                let request = ScrollRequest {
                    offset: parsed.offset,
                    limit: parsed.limit,
                    filter: parsed.filter,
                    with_payload: parsed.with_payload,
                    with_vector: parsed.with_vector.unwrap_or(WithVector::Bool(false)),
                    order_by: None,
                };
                match self.store.get(name) {
                    Ok(c) => match c.scroll(request).await {
                        Ok((records, next)) => ok(
                            json!({
                                "points": records.iter().map(record_json).collect::<Vec<_>>(),
                                "next_page_offset": next.as_ref().map(id_json),
                            }),
                            started,
                        ),
                        Err(e) => store_error(&e, started),
                    },
                    Err(e) => store_error(&e, started),
                }
            }
            (m, _) => error(
                StatusCode::NOT_FOUND,
                &format!("Not found: {m} {path} is not served by embedded-qdrant"),
                started,
            ),
        }
    }

    async fn update(&self, name: &str, op: UpdateOperation, wait: bool, started: Instant) -> Reply {
        let c = match self.store.get(name) {
            Ok(c) => c,
            Err(e) => return store_error(&e, started),
        };
        let operation_id = self.operation_ids.fetch_add(1, Ordering::Relaxed);
        match c.update(op, wait).await {
            Ok(()) => ok(
                json!({
                    "operation_id": operation_id,
                    "status": if wait { "completed" } else { "acknowledged" },
                }),
                started,
            ),
            Err(e) => store_error(&e, started),
        }
    }

    async fn search(
        &self,
        name: &str,
        request: SearchRequest,
        started: Instant,
        query_shape: bool,
    ) -> Reply {
        let c = match self.store.get(name) {
            Ok(c) => c,
            Err(e) => return store_error(&e, started),
        };
        if let QueryEnum::Nearest(NamedQuery {
            query: VectorInternal::Dense(v),
            ..
        }) = &request.query
        {
            if v.len() != c.params.size {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!(
                        "Wrong input: Vector dimension error: expected dim: {}, got {}",
                        c.params.size,
                        v.len()
                    ),
                    started,
                );
            }
        }
        match c.search(request).await {
            Ok(points) => {
                let points: Vec<Value> = points.iter().map(scored_json).collect();
                if query_shape {
                    ok(json!({"points": points}), started)
                } else {
                    ok(json!(points), started)
                }
            }
            Err(e) => store_error(&e, started),
        }
    }

    async fn vector_of(
        &self,
        name: &str,
        id: PointId,
    ) -> Result<Vec<f32>, impl FnOnce(Instant) -> Reply> {
        let looked_up = match self.store.get(name) {
            Ok(c) => c.retrieve(vec![id], false, true).await,
            Err(e) => Err(e),
        };
        match looked_up {
            Ok(records) => match records
                .first()
                .and_then(|r| crate::convert::dense_vector(&r.vector))
            {
                Some(v) => Ok(v),
                None => Err(Box::new(move |t| {
                    error(
                        StatusCode::NOT_FOUND,
                        &format!("Not found: No point with id {}", id_json(&id)),
                        t,
                    )
                }) as Box<dyn FnOnce(Instant) -> Reply>),
            },
            Err(e) => {
                Err(Box::new(move |t| store_error(&e, t)) as Box<dyn FnOnce(Instant) -> Reply>)
            }
        }
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8], started: Instant) -> Result<T, Box<Reply>> {
    serde_json::from_slice(body).map_err(|e| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            &format!("Format error in JSON body: {e}"),
            started,
        ))
    })
}
