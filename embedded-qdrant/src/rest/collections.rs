//! The handlers of collections, aliases, payload indexes, server info and health checks.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{header, StatusCode};
use qdrant_edge::{FieldIndexOperations, JsonPath, UpdateOperation};
use serde_json::{json, Value};

use super::bodies::{AliasesBody, CreateBody, CreateIndexBody, UpdateCollectionBody};
use super::{answer, json_reply, ApiError, JsonBody, PathArgs, Rest, Wait};
use crate::convert::ReportedConfig;
use crate::store::{
    distance_name, parse_distance, AliasChange, Collection, StoreError, VectorParams,
};

/// `GET /`: which server this is, outside the envelope as Qdrant answers it.
pub(super) async fn server_info() -> Response {
    json_reply(
        StatusCode::OK,
        &json!({
            "title": crate::SERVER_TITLE,
            "version": crate::QDRANT_API_VERSION,
            "commit": null,
        }),
    )
}

/// `GET /healthz`, `/livez`, `/readyz`: Qdrant's plain-text answer.
pub(super) async fn health() -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain")],
        "healthz check passed",
    )
        .into_response()
}

/// `GET /collections`.
pub(super) async fn list(State(rest): State<Arc<Rest>>) -> Response {
    answer(async {
        let names = rest.store.names();
        Ok(json!({"collections": names.iter().map(|n| json!({"name": n})).collect::<Vec<_>>()}))
    })
    .await
}

/// `PUT /collections/{name}`: one dense vector of the given size and distance.
pub(super) async fn create(
    State(rest): State<Arc<Rest>>,
    PathArgs(name): PathArgs<String>,
    JsonBody(body): JsonBody<CreateBody>,
) -> Response {
    answer(async {
        let distance = parse_distance(&body.vectors.distance).ok_or_else(|| {
            ApiError::wrong_input(format!(
                "unknown distance {:?}; expected Cosine, Euclid, Dot or Manhattan",
                body.vectors.distance
            ))
        })?;
        let size = body.vectors.size;
        rest.store.create(&name, VectorParams { size, distance })?;
        Ok(json!(true))
    })
    .await
}

/// `GET /collections/{name}`: counts, the payload indexes and the configuration.
pub(super) async fn info(
    State(rest): State<Arc<Rest>>,
    PathArgs(name): PathArgs<String>,
) -> Response {
    answer(async { Ok(collection_json(&*rest.store.get(&name)?).await?) }).await
}

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

/// `PATCH /collections/{name}`: HNSW and optimizer settings; any other field set is
/// refused by name rather than ignored.
pub(super) async fn update(
    State(rest): State<Arc<Rest>>,
    PathArgs(name): PathArgs<String>,
    JsonBody(body): JsonBody<UpdateCollectionBody>,
) -> Response {
    answer(async {
        if let Some((field, _)) = body.other.iter().find(|(_, v)| !v.is_null()) {
            return Err(ApiError::wrong_input(format!(
                "updating {field} is not supported by embedded-qdrant"
            )));
        }
        let c = rest.store.get(&name)?;
        c.update_config(body.hnsw_config, body.optimizers_config)
            .await?;
        Ok(json!(true))
    })
    .await
}

/// `DELETE /collections/{name}`: `true` if it existed.
pub(super) async fn remove(
    State(rest): State<Arc<Rest>>,
    PathArgs(name): PathArgs<String>,
) -> Response {
    answer(async { Ok(json!(rest.store.delete(&name))) }).await
}

/// `GET /collections/{name}/exists`.
pub(super) async fn exists(
    State(rest): State<Arc<Rest>>,
    PathArgs(name): PathArgs<String>,
) -> Response {
    answer(async { Ok(json!({"exists": rest.store.get(&name).is_ok()})) }).await
}

/// `GET /aliases`.
pub(super) async fn all_aliases(State(rest): State<Arc<Rest>>) -> Response {
    answer(async { Ok(aliases_json(rest.store.aliases(None))) }).await
}

/// `GET /collections/{name}/aliases`.
pub(super) async fn aliases_of(
    State(rest): State<Arc<Rest>>,
    PathArgs(name): PathArgs<String>,
) -> Response {
    answer(async {
        let c = rest.store.get(&name)?;
        Ok(aliases_json(rest.store.aliases(Some(&c.name))))
    })
    .await
}

/// `POST /collections/aliases`: the actions applied all or none.
pub(super) async fn change_aliases(
    State(rest): State<Arc<Rest>>,
    JsonBody(body): JsonBody<AliasesBody>,
) -> Response {
    answer(async {
        let changes: Vec<AliasChange> = body.actions.into_iter().map(AliasChange::from).collect();
        rest.store.change_aliases(&changes)?;
        Ok(json!(true))
    })
    .await
}

/// Aliases in Qdrant's REST shape.
fn aliases_json(aliases: Vec<(String, String)>) -> Value {
    json!({"aliases": aliases.into_iter().map(|(a, c)| json!({"alias_name": a, "collection_name": c})).collect::<Vec<_>>()})
}

/// `PUT /collections/{name}/index`: a payload index.
pub(super) async fn create_index(
    State(rest): State<Arc<Rest>>,
    PathArgs(name): PathArgs<String>,
    Wait(wait): Wait,
    JsonBody(body): JsonBody<CreateIndexBody>,
) -> Response {
    let op = UpdateOperation::FieldIndexOperation(FieldIndexOperations::CreateIndex(body));
    answer(super::points::apply(&rest, &name, op, wait)).await
}

/// `DELETE /collections/{name}/index/{field}`.
pub(super) async fn delete_index(
    State(rest): State<Arc<Rest>>,
    PathArgs((name, field)): PathArgs<(String, String)>,
    Wait(wait): Wait,
) -> Response {
    answer(async {
        let field: JsonPath = field
            .parse()
            .map_err(|_| ApiError::wrong_input(format!("{field:?} is not a payload key")))?;
        let op = UpdateOperation::FieldIndexOperation(FieldIndexOperations::DeleteIndex(field));
        super::points::apply(&rest, &name, op, wait).await
    })
    .await
}
