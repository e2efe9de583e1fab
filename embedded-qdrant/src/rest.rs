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
    CountRequest, CreateIndex, DeletePayloadOp, FieldIndexOperations, Filter, JsonPath, NamedQuery,
    PayloadOps, PointId, PointInsertOperations, PointOperations, QueryEnum, ScrollRequest,
    SearchRequest, SetPayloadOp, UpdateOperation, VectorInternal, WithPayloadInterface, WithVector,
};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::convert::{id_json, record_json, scored_json, ReportedConfig};
use crate::store::{
    distance_name, parse_distance, AliasChange, Collection, Store, StoreError, VectorParams,
};

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

/// Serves until `shutdown` fires (in-flight requests finish); over TLS when `tls` is given,
/// each handshake in its connection's own task, so a slow client holds up nobody else.
pub async fn serve(
    listener: TcpListener,
    rest: Arc<Rest>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: CancellationToken,
) {
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
        StoreError::NoCollection(_) | StoreError::NoAlias(_) => StatusCode::NOT_FOUND,
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

/// `query` of `POST /points/query`: a vector or a point id, bare or as `{"nearest": ...}`
/// (the official clients send the latter).
#[derive(Deserialize)]
#[serde(untagged)]
enum QueryInput {
    Vector(Vec<f32>),
    Id(PointId),
    Nearest { nearest: NearestInput },
}

#[derive(Deserialize)]
#[serde(untagged)]
enum NearestInput {
    Vector(Vec<f32>),
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

/// Which points a deletion or a payload change applies to: a list of ids or a filter.
#[derive(Deserialize)]
#[serde(untagged)]
enum PointsSelector {
    Ids { points: Vec<PointId> },
    Filter { filter: Filter },
}

/// `PATCH /collections/{name}`: what the engine applies, and every other field of
/// Qdrant's body, refused by name when set.
#[derive(Deserialize)]
struct UpdateCollectionBody {
    optimizers_config: Option<serde_json::Map<String, Value>>,
    hnsw_config: Option<serde_json::Map<String, Value>>,
    #[serde(flatten)]
    other: serde_json::Map<String, Value>,
}

#[derive(Deserialize)]
struct AliasesBody {
    actions: Vec<AliasAction>,
}

/// One action of `POST /collections/aliases`, in Qdrant's spelling.
#[derive(Deserialize)]
enum AliasAction {
    #[serde(rename = "create_alias")]
    Create {
        collection_name: String,
        alias_name: String,
    },
    #[serde(rename = "delete_alias")]
    Delete { alias_name: String },
    #[serde(rename = "rename_alias")]
    Rename {
        old_alias_name: String,
        new_alias_name: String,
    },
}

impl From<AliasAction> for AliasChange {
    fn from(a: AliasAction) -> Self {
        match a {
            AliasAction::Create {
                collection_name,
                alias_name,
            } => AliasChange::Create {
                collection: collection_name,
                alias: alias_name,
            },
            AliasAction::Delete { alias_name } => AliasChange::Delete { alias: alias_name },
            AliasAction::Rename {
                old_alias_name,
                new_alias_name,
            } => AliasChange::Rename {
                old: old_alias_name,
                new: new_alias_name,
            },
        }
    }
}

/// `POST /collections/{name}/points/payload/delete`.
#[derive(Deserialize)]
struct DeletePayloadBody {
    keys: Vec<String>,
    #[serde(flatten)]
    selector: PointsSelector,
}

/// Aliases in Qdrant's REST shape.
fn aliases_json(aliases: Vec<(String, String)>) -> Value {
    json!({"aliases": aliases.into_iter().map(|(a, c)| json!({"alias_name": a, "collection_name": c})).collect::<Vec<_>>()})
}

/// `GET /collections/{name}`: counts, the payload indexes and the configuration.
async fn collection_json(c: &Collection) -> Result<Value, StoreError> {
    let points = c.count().await?;
    let info = c.info().await?;
    let config = ReportedConfig::of(&c.config());
    Ok(json!({
        "status": "green",
        "optimizer_status": "ok",
        "points_count": points,
        "indexed_vectors_count": info.indexed_vectors_count,
        "segments_count": info.segments_count,
        "config": config.rest_json(json!({
            "size": c.params.size,
            "distance": distance_name(c.params.distance),
        })),
        "payload_schema": serde_json::to_value(&info.payload_schema).unwrap_or_else(|_| json!({})),
    }))
}

impl Rest {
    /// One request: the API key, the body, then Qdrant's route table. It stays one function
    /// because the match over (method, path segments) is the route table: one arm per
    /// route, each a call into the store, read top to bottom like Qdrant's OpenAPI paths;
    /// split, the table would be spread over files and an unrouted path harder to see.
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
        match (method.clone(), segments.as_slice()) {
            (Method::GET, []) => reply(
                StatusCode::OK,
                json!({
                    "title": crate::SERVER_TITLE,
                    "version": crate::QDRANT_API_VERSION,
                    "commit": null,
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
            (Method::GET, ["aliases"]) => ok(aliases_json(self.store.aliases(None)), started),
            (Method::POST, ["collections", "aliases"]) => {
                let parsed: AliasesBody = match parse(&body, started) {
                    Ok(b) => b,
                    Err(r) => return *r,
                };
                let changes: Vec<AliasChange> =
                    parsed.actions.into_iter().map(AliasChange::from).collect();
                match self.store.change_aliases(&changes) {
                    Ok(()) => ok(json!(true), started),
                    Err(e) => store_error(&e, started),
                }
            }
            (Method::GET, ["collections", name, "aliases"]) => match self.store.get(name) {
                Ok(c) => ok(aliases_json(self.store.aliases(Some(&c.name))), started),
                Err(e) => store_error(&e, started),
            },
            (Method::GET, ["collections", name]) => match self.store.get(name) {
                Ok(c) => match collection_json(&c).await {
                    Ok(v) => ok(v, started),
                    Err(e) => store_error(&e, started),
                },
                Err(e) => store_error(&e, started),
            },
            (Method::PATCH, ["collections", name]) => {
                let parsed: UpdateCollectionBody = match parse(&body, started) {
                    Ok(b) => b,
                    Err(r) => return *r,
                };
                if let Some((field, _)) = parsed.other.iter().find(|(_, v)| !v.is_null()) {
                    return error(
                        StatusCode::BAD_REQUEST,
                        &format!(
                            "Wrong input: updating {field} is not supported by embedded-qdrant"
                        ),
                        started,
                    );
                }
                let c = match self.store.get(name) {
                    Ok(c) => c,
                    Err(e) => return store_error(&e, started),
                };
                match c
                    .update_config(parsed.hnsw_config, parsed.optimizers_config)
                    .await
                {
                    Ok(()) => ok(json!(true), started),
                    Err(e) => store_error(&e, started),
                }
            }
            (Method::PUT, ["collections", name, "index"]) => {
                let parsed: CreateIndex = match parse(&body, started) {
                    Ok(b) => b,
                    Err(r) => return *r,
                };
                let op =
                    UpdateOperation::FieldIndexOperation(FieldIndexOperations::CreateIndex(parsed));
                self.update(name, op, wait, started).await
            }
            (Method::DELETE, ["collections", name, "index", field]) => {
                let field: JsonPath = match field.parse() {
                    Ok(f) => f,
                    Err(_) => {
                        return error(
                            StatusCode::BAD_REQUEST,
                            &format!("Wrong input: {field:?} is not a payload key"),
                            started,
                        )
                    }
                };
                let op =
                    UpdateOperation::FieldIndexOperation(FieldIndexOperations::DeleteIndex(field));
                self.update(name, op, wait, started).await
            }
            (Method::POST | Method::PUT, ["collections", name, "points", "payload"]) => {
                let parsed: SetPayloadOp = match parse(&body, started) {
                    Ok(b) => b,
                    Err(r) => return *r,
                };
                if parsed.points.is_none() && parsed.filter.is_none() {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "Wrong input: either points or filter is required",
                        started,
                    );
                }
                // POST sets the given keys; PUT replaces the whole payload (Qdrant's
                // overwrite_payload).
                let op = if method == Method::PUT {
                    PayloadOps::OverwritePayload(parsed)
                } else {
                    PayloadOps::SetPayload(parsed)
                };
                self.update(name, UpdateOperation::PayloadOperation(op), wait, started)
                    .await
            }
            (Method::POST, ["collections", name, "points", "payload", "delete"]) => {
                let parsed: DeletePayloadBody = match parse(&body, started) {
                    Ok(b) => b,
                    Err(r) => return *r,
                };
                let keys = match parsed
                    .keys
                    .iter()
                    .map(|k| k.parse::<JsonPath>())
                    .collect::<Result<Vec<_>, _>>()
                {
                    Ok(k) => k,
                    Err(_) => {
                        return error(
                            StatusCode::BAD_REQUEST,
                            "Wrong input: bad payload key",
                            started,
                        )
                    }
                };
                let (points, filter) = match parsed.selector {
                    PointsSelector::Ids { points } => (Some(points), None),
                    PointsSelector::Filter { filter } => (None, Some(filter)),
                };
                let op = PayloadOps::DeletePayload(DeletePayloadOp {
                    keys,
                    points,
                    filter,
                });
                self.update(name, UpdateOperation::PayloadOperation(op), wait, started)
                    .await
            }
            (Method::POST, ["collections", name, "points", "payload", "clear"]) => {
                let parsed: PointsSelector = match parse(&body, started) {
                    Ok(b) => b,
                    Err(r) => return *r,
                };
                let op = match parsed {
                    PointsSelector::Ids { points } => PayloadOps::ClearPayload { points },
                    PointsSelector::Filter { filter } => PayloadOps::ClearPayloadByFilter(filter),
                };
                self.update(name, UpdateOperation::PayloadOperation(op), wait, started)
                    .await
            }
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
                let parsed: PointsSelector = match parse(&body, started) {
                    Ok(b) => b,
                    Err(r) => return *r,
                };
                let op = UpdateOperation::PointOperation(match parsed {
                    PointsSelector::Ids { points } => PointOperations::DeletePoints { ids: points },
                    PointsSelector::Filter { filter } => {
                        PointOperations::DeletePointsByFilter(filter)
                    }
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
                    QueryInput::Vector(v)
                    | QueryInput::Nearest {
                        nearest: NearestInput::Vector(v),
                    } => v,
                    QueryInput::Id(id)
                    | QueryInput::Nearest {
                        nearest: NearestInput::Id(id),
                    } => match self.vector_of(name, id).await {
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

/// The request bodies the handlers read, by number (for the fuzz targets: each is parsed
/// as its handler parses it); the status of the answer to a body that does not parse.
pub(crate) fn decode_body(kind: u8, body: &[u8]) -> Result<(), StatusCode> {
    fn check<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<(), StatusCode> {
        parse::<T>(body, Instant::now())
            .map(drop)
            .map_err(|reply| reply.status())
    }
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

fn parse<T: serde::de::DeserializeOwned>(body: &[u8], started: Instant) -> Result<T, Box<Reply>> {
    serde_json::from_slice(body).map_err(|e| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            &format!("Format error in JSON body: {e}"),
            started,
        ))
    })
}
