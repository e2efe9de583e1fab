//! Conversions between the protocol's messages and the engine's types, and the store's
//! errors as gRPC statuses: what both services share.

use std::collections::HashMap;
use std::time::Instant;

use qdrant_client::qdrant::{
    self as pb, point_id::PointIdOptions, points_selector::PointsSelectorOneOf, value::Kind,
    vectors::VectorsOptions, with_payload_selector::SelectorOptions as PayloadSel,
    with_vectors_selector::SelectorOptions as VectorSel,
};
use qdrant_edge::{
    Filter, JsonPath, Payload, PointId, PointStructPersisted, Record, ScoredPoint, VectorPersisted,
    VectorStructPersisted,
};
use tonic::Status;

use super::filters;
use crate::convert::{dense_vector, point_id};
use crate::store::StoreError;

pub(super) fn status(e: StoreError) -> Status {
    match e {
        StoreError::NoCollection(_) | StoreError::NoAlias(_) => Status::not_found(e.to_string()),
        StoreError::Exists(_) => Status::already_exists(e.to_string()),
        StoreError::BadRequest(_) => Status::invalid_argument(e.to_string()),
        StoreError::Internal(_) => Status::internal(e.to_string()),
    }
}

/// Which points an operation applies to: ids, or a filter.
pub(super) enum Selection {
    Ids(Vec<PointId>),
    Filter(Filter),
}

impl Selection {
    /// As the engine's payload operations take it: ids or a filter, one of them set.
    pub(super) fn split(self) -> (Option<Vec<PointId>>, Option<Filter>) {
        match self {
            Selection::Ids(ids) => (Some(ids), None),
            Selection::Filter(f) => (None, Some(f)),
        }
    }
}

pub(super) fn selection(sel: Option<pb::PointsSelector>) -> Result<Selection, Status> {
    match sel.and_then(|p| p.points_selector_one_of) {
        Some(PointsSelectorOneOf::Points(list)) => list
            .ids
            .iter()
            .map(|id| point_id(Some(id)))
            .collect::<Result<Vec<_>, _>>()
            .map(Selection::Ids),
        Some(PointsSelectorOneOf::Filter(f)) => filters::to_engine(&f).map(Selection::Filter),
        None => Err(Status::invalid_argument("points selector missing")),
    }
}

pub(super) fn json_payload(payload: &HashMap<String, pb::Value>) -> Payload {
    Payload(
        payload
            .iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect(),
    )
}

pub(super) fn json_path(key: &str) -> Result<JsonPath, Status> {
    key.parse()
        .map_err(|_| Status::invalid_argument(format!("Wrong input: {key:?} is not a payload key")))
}

/// A payload index's type as the protocol numbers it (`qdrant.PayloadSchemaType`).
pub(super) fn schema_type_out(t: &qdrant_edge::PayloadSchemaType) -> i32 {
    let name = serde_json::to_value(t)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let mut proto_name = name.clone();
    if let Some(first) = proto_name.get_mut(0..1) {
        first.make_ascii_uppercase();
    }
    pb::PayloadSchemaType::from_str_name(&proto_name).unwrap_or(pb::PayloadSchemaType::UnknownType)
        as i32
}

/// A payload index's type from the protocol, in the engine's (REST) spelling.
pub(super) fn schema_type_in(field_type: i32) -> Result<qdrant_edge::PayloadFieldSchema, Status> {
    let t = pb::FieldType::try_from(field_type)
        .map_err(|_| Status::invalid_argument(format!("unknown field type {field_type}")))?;
    serde_json::from_value(serde_json::Value::String(
        t.as_str_name()
            .trim_start_matches("FieldType")
            .to_ascii_lowercase(),
    ))
    .map_err(|e| Status::invalid_argument(format!("field type {}: {e}", t.as_str_name())))
}

/// A protobuf diff's set fields, in the REST diff form [`crate::store::Collection::update_config`] takes.
pub(super) fn diff_json<T: serde::Serialize>(
    pairs: T,
) -> Option<serde_json::Map<String, serde_json::Value>> {
    match serde_json::to_value(pairs) {
        Ok(serde_json::Value::Object(m)) => {
            Some(m.into_iter().filter(|(_, v)| !v.is_null()).collect())
        }
        _ => None,
    }
}

pub(super) fn secs(started: Instant) -> f64 {
    started.elapsed().as_secs_f64()
}

/// An upsert's points as the engine takes them: each with its id, its vector (one dense
/// vector, or named ones) and its payload; a point without vectors, a sparse or
/// multi-vector or a bad id is refused as Qdrant refuses it.
pub(crate) fn points_in(points: Vec<pb::PointStruct>) -> Result<Vec<PointStructPersisted>, Status> {
    let mut out = Vec::with_capacity(points.len());
    for p in points {
        let vector = match p.vectors.and_then(|v| v.vectors_options) {
            Some(VectorsOptions::Vector(v)) => VectorStructPersisted::Single(dense(&v)?),
            Some(VectorsOptions::Vectors(named)) => {
                let mut map = HashMap::with_capacity(named.vectors.len());
                for (name, v) in named.vectors {
                    map.insert(name, VectorPersisted::Dense(dense(&v)?));
                }
                VectorStructPersisted::Named(map)
            }
            None => return Err(Status::invalid_argument("a point without vectors")),
        };
        let payload = (!p.payload.is_empty()).then(|| {
            Payload(
                p.payload
                    .iter()
                    .map(|(k, v)| (k.clone(), value_to_json(v)))
                    .collect(),
            )
        });
        out.push(PointStructPersisted {
            id: point_id(p.id.as_ref())?,
            vector,
            payload,
        });
    }
    Ok(out)
}

pub(super) fn point_id_out(id: &PointId) -> pb::PointId {
    pb::PointId {
        point_id_options: Some(match id {
            PointId::NumId(n) => PointIdOptions::Num(*n),
            PointId::Uuid(u) => PointIdOptions::Uuid(u.to_string()),
        }),
    }
}

pub(super) fn value_to_json(v: &pb::Value) -> serde_json::Value {
    use serde_json::Value as J;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => J::Null,
        Some(Kind::BoolValue(b)) => J::Bool(*b),
        Some(Kind::IntegerValue(i)) => J::from(*i),
        Some(Kind::DoubleValue(d)) => serde_json::Number::from_f64(*d).map_or(J::Null, J::Number),
        Some(Kind::StringValue(s)) => J::String(s.clone()),
        Some(Kind::StructValue(s)) => J::Object(
            s.fields
                .iter()
                .map(|(k, v)| (k.clone(), value_to_json(v)))
                .collect(),
        ),
        Some(Kind::ListValue(l)) => J::Array(l.values.iter().map(value_to_json).collect()),
    }
}

pub(super) fn json_to_value(v: &serde_json::Value) -> pb::Value {
    use serde_json::Value as J;
    let kind = match v {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(*b),
        J::Number(n) => match n.as_i64() {
            Some(i) => Kind::IntegerValue(i),
            None => Kind::DoubleValue(n.as_f64().unwrap_or(0.0)),
        },
        J::String(s) => Kind::StringValue(s.clone()),
        J::Array(a) => Kind::ListValue(pb::ListValue {
            values: a.iter().map(json_to_value).collect(),
        }),
        J::Object(o) => Kind::StructValue(pb::Struct {
            fields: o
                .iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        }),
    };
    pb::Value { kind: Some(kind) }
}

pub(super) fn payload_out(p: &Option<Payload>) -> HashMap<String, pb::Value> {
    p.as_ref()
        .map(|p| {
            p.0.iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect()
        })
        .unwrap_or_default()
}

// Clients before Qdrant 1.13 send dense vectors in the deprecated `data` field.
#[allow(deprecated)]
pub(super) fn dense(v: &pb::Vector) -> Result<Vec<f32>, Status> {
    match &v.vector {
        Some(pb::vector::Vector::Dense(d)) => Ok(d.data.clone()),
        Some(_) => Err(Status::invalid_argument(
            "only dense vectors are supported by embedded-qdrant",
        )),
        None => Ok(v.data.clone()),
    }
}

pub(super) fn vectors_out(
    v: &Option<qdrant_edge::VectorStructInternal>,
) -> Option<pb::VectorsOutput> {
    dense_vector(v).map(|data| pb::VectorsOutput {
        vectors_options: Some(pb::vectors_output::VectorsOptions::Vector(
            pb::VectorOutput {
                vector: Some(pb::vector_output::Vector::Dense(pb::DenseVector { data })),
                ..Default::default()
            },
        )),
    })
}

pub(super) fn scored_out(p: &ScoredPoint) -> pb::ScoredPoint {
    pb::ScoredPoint {
        id: Some(point_id_out(&p.id)),
        payload: payload_out(&p.payload),
        score: p.score,
        version: p.version,
        vectors: vectors_out(&p.vector),
        ..Default::default()
    }
}

pub(super) fn record_out(r: &Record) -> pb::RetrievedPoint {
    pb::RetrievedPoint {
        id: Some(point_id_out(&r.id)),
        payload: payload_out(&r.payload),
        vectors: vectors_out(&r.vector),
        ..Default::default()
    }
}

pub(super) fn with_payload(sel: &Option<pb::WithPayloadSelector>, default: bool) -> bool {
    match sel.as_ref().and_then(|s| s.selector_options.as_ref()) {
        Some(PayloadSel::Enable(b)) => *b,
        Some(_) => true,
        None => default,
    }
}

pub(super) fn with_vectors(sel: &Option<pb::WithVectorsSelector>) -> bool {
    match sel.as_ref().and_then(|s| s.selector_options.as_ref()) {
        Some(VectorSel::Enable(b)) => *b,
        Some(_) => true,
        None => false,
    }
}
