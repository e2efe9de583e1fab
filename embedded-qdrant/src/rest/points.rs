//! The handlers of points and payloads: writes go through [`apply`] (one operation id
//! each, answered when acknowledged or, with `?wait=true`, when applied); reads and
//! searches call the collection directly.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use http::{Method, StatusCode};
use qdrant_edge::{
    CountRequest, DeletePayloadOp, JsonPath, NamedQuery, PayloadOps, PointId, PointOperations,
    QueryEnum, ScrollRequest, SearchRequest, UpdateOperation, VectorInternal, WithVector,
};
use serde_json::{json, Value};

use super::bodies::{
    CountBody, DeletePayloadBody, PointsSelector, QueryBody, QueryTarget, RetrieveBody, ScrollBody,
    SearchBody, SetPayloadBody, UpsertBody, VectorInput,
};
use super::{answer, ApiError, JsonBody, JsonOrEmpty, PathArgs, Rest, Wait};
use crate::convert::{id_json, record_json, scored_json};

/// Applies one update to collection `name`: `{"operation_id", "status"}` as Qdrant
/// answers it.
pub(super) async fn apply(
    rest: &Rest,
    name: &str,
    op: UpdateOperation,
    wait: bool,
) -> Result<Value, ApiError> {
    let c = rest.store.get(name)?;
    let operation_id = rest.operation_ids.fetch_add(1, Ordering::Relaxed);
    c.update(op, wait).await?;
    Ok(json!({
        "operation_id": operation_id,
        "status": if wait { "completed" } else { "acknowledged" },
    }))
}

/// `PUT /collections/{name}/points`.
pub(super) async fn upsert(
    State(rest): State<Arc<Rest>>,
    PathArgs(name): PathArgs<String>,
    Wait(wait): Wait,
    JsonBody(body): JsonBody<UpsertBody>,
) -> Response {
    let op = UpdateOperation::PointOperation(PointOperations::UpsertPoints(body.op));
    answer(apply(&rest, &name, op, wait)).await
}

/// `POST /collections/{name}/points/delete`: by ids or by filter.
pub(super) async fn delete(
    State(rest): State<Arc<Rest>>,
    PathArgs(name): PathArgs<String>,
    Wait(wait): Wait,
    JsonBody(selector): JsonBody<PointsSelector>,
) -> Response {
    let op = UpdateOperation::PointOperation(match selector {
        PointsSelector::Ids { points } => PointOperations::DeletePoints { ids: points },
        PointsSelector::Filter { filter } => PointOperations::DeletePointsByFilter(filter),
    });
    answer(apply(&rest, &name, op, wait)).await
}

/// `POST /collections/{name}/points/payload` sets the given keys; `PUT` replaces the whole
/// payload (Qdrant's overwrite_payload).
pub(super) async fn set_payload(
    method: Method,
    State(rest): State<Arc<Rest>>,
    PathArgs(name): PathArgs<String>,
    Wait(wait): Wait,
    JsonBody(body): JsonBody<SetPayloadBody>,
) -> Response {
    answer(async {
        if body.points.is_none() && body.filter.is_none() {
            return Err(ApiError::wrong_input("either points or filter is required"));
        }
        let op = if method == Method::PUT {
            PayloadOps::OverwritePayload(body)
        } else {
            PayloadOps::SetPayload(body)
        };
        apply(&rest, &name, UpdateOperation::PayloadOperation(op), wait).await
    })
    .await
}

/// `POST /collections/{name}/points/payload/delete`: the given keys.
pub(super) async fn delete_payload(
    State(rest): State<Arc<Rest>>,
    PathArgs(name): PathArgs<String>,
    Wait(wait): Wait,
    JsonBody(body): JsonBody<DeletePayloadBody>,
) -> Response {
    answer(async {
        let keys = body
            .keys
            .iter()
            .map(|k| k.parse::<JsonPath>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| ApiError::wrong_input("bad payload key"))?;
        let (points, filter) = match body.selector {
            PointsSelector::Ids { points } => (Some(points), None),
            PointsSelector::Filter { filter } => (None, Some(filter)),
        };
        let op = PayloadOps::DeletePayload(DeletePayloadOp {
            keys,
            points,
            filter,
        });
        apply(&rest, &name, UpdateOperation::PayloadOperation(op), wait).await
    })
    .await
}

/// `POST /collections/{name}/points/payload/clear`: every key.
pub(super) async fn clear_payload(
    State(rest): State<Arc<Rest>>,
    PathArgs(name): PathArgs<String>,
    Wait(wait): Wait,
    JsonBody(selector): JsonBody<PointsSelector>,
) -> Response {
    let op = match selector {
        PointsSelector::Ids { points } => PayloadOps::ClearPayload { points },
        PointsSelector::Filter { filter } => PayloadOps::ClearPayloadByFilter(filter),
    };
    answer(apply(
        &rest,
        &name,
        UpdateOperation::PayloadOperation(op),
        wait,
    ))
    .await
}

/// `POST /collections/{name}/points/search`: the scored points as a bare list.
pub(super) async fn search(
    State(rest): State<Arc<Rest>>,
    PathArgs(name): PathArgs<String>,
    JsonBody(body): JsonBody<SearchBody>,
) -> Response {
    let (using, vector) = match body.vector {
        VectorInput::Plain(v) => (None, v),
        VectorInput::Named { name, vector } => (Some(name), vector),
    };
    let request = body.options.request(vector, using);
    answer(async { Ok(json!(nearest(&rest, &name, request).await?)) }).await
}

/// `POST /collections/{name}/points/query`: by a vector or by a stored point's vector;
/// the scored points under `points`.
pub(super) async fn query(
    State(rest): State<Arc<Rest>>,
    PathArgs(name): PathArgs<String>,
    JsonBody(body): JsonBody<QueryBody>,
) -> Response {
    answer(async {
        let vector = match QueryTarget::from(body.query) {
            QueryTarget::Vector(v) => v,
            QueryTarget::Point(id) => vector_of(&rest, &name, id).await?,
        };
        let request = body.options.request(vector, body.using);
        Ok(json!({"points": nearest(&rest, &name, request).await?}))
    })
    .await
}

/// The scored points of `request`, the query vector's length checked first with
/// Qdrant's words.
async fn nearest(rest: &Rest, name: &str, request: SearchRequest) -> Result<Vec<Value>, ApiError> {
    let c = rest.store.get(name)?;
    if let QueryEnum::Nearest(NamedQuery {
        query: VectorInternal::Dense(v),
        ..
    }) = &request.query
    {
        if v.len() != c.params.size {
            return Err(ApiError::wrong_input(format!(
                "Vector dimension error: expected dim: {}, got {}",
                c.params.size,
                v.len()
            )));
        }
    }
    Ok(c.search(request).await?.iter().map(scored_json).collect())
}

/// The dense vector of point `id`; 404 when there is no such point.
async fn vector_of(rest: &Rest, name: &str, id: PointId) -> Result<Vec<f32>, ApiError> {
    let records = rest
        .store
        .get(name)?
        .retrieve(vec![id], false, true)
        .await?;
    records
        .first()
        .and_then(|r| crate::convert::dense_vector(&r.vector))
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("Not found: No point with id {}", id_json(&id)),
            )
        })
}

/// `POST /collections/{name}/points/count`.
pub(super) async fn count(
    State(rest): State<Arc<Rest>>,
    PathArgs(name): PathArgs<String>,
    JsonOrEmpty(body): JsonOrEmpty<CountBody>,
) -> Response {
    answer(async {
        let request = CountRequest {
            filter: body.filter,
            exact: body.exact,
        };
        let n = rest.store.get(&name)?.count_filtered(request).await?;
        Ok(json!({"count": n}))
    })
    .await
}

/// `POST /collections/{name}/points`: points by id.
pub(super) async fn retrieve(
    State(rest): State<Arc<Rest>>,
    PathArgs(name): PathArgs<String>,
    JsonBody(body): JsonBody<RetrieveBody>,
) -> Response {
    answer(async {
        let records = rest
            .store
            .get(&name)?
            .retrieve(body.ids, body.with_payload, body.with_vector)
            .await?;
        Ok(json!(records.iter().map(record_json).collect::<Vec<_>>()))
    })
    .await
}

/// `POST /collections/{name}/points/scroll`: a page and the offset of the next.
pub(super) async fn scroll(
    State(rest): State<Arc<Rest>>,
    PathArgs(name): PathArgs<String>,
    JsonOrEmpty(body): JsonOrEmpty<ScrollBody>,
) -> Response {
    answer(async {
        let request = ScrollRequest {
            offset: body.offset,
            limit: body.limit,
            filter: body.filter,
            with_payload: body.with_payload,
            with_vector: body.with_vector.unwrap_or(WithVector::Bool(false)),
            order_by: None,
        };
        let (records, next) = rest.store.get(&name)?.scroll(request).await?;
        Ok(json!({
            "points": records.iter().map(record_json).collect::<Vec<_>>(),
            "next_page_offset": next.as_ref().map(id_json),
        }))
    })
    .await
}
