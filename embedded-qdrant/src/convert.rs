//! Shapes shared by REST and gRPC: engine records to JSON, vectors out of the engine.

use qdrant_edge::{PointId, Record, ScoredPoint, VectorInternal, VectorStructInternal};
use serde_json::{json, Value};

/// A point id as Qdrant's REST API writes it (number or UUID string).
pub fn id_json(id: &PointId) -> Value {
    serde_json::to_value(id).unwrap_or(Value::Null)
}

/// Dense vectors as arrays; named vectors as an object of arrays.
pub fn vector_json(v: &Option<VectorStructInternal>) -> Value {
    match v {
        None => Value::Null,
        Some(VectorStructInternal::Single(d)) => json!(d),
        Some(VectorStructInternal::MultiDense(m)) => json!(m.multi_vectors().collect::<Vec<_>>()),
        Some(VectorStructInternal::Named(map)) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let value = match v {
                        VectorInternal::Dense(d) => json!(d),
                        _ => Value::Null,
                    };
                    (k.clone(), value)
                })
                .collect(),
        ),
    }
}

/// The single dense vector of a point, whichever way the engine returned it.
pub fn dense_vector(v: &Option<VectorStructInternal>) -> Option<Vec<f32>> {
    match v {
        Some(VectorStructInternal::Single(d)) => Some(d.clone()),
        Some(VectorStructInternal::Named(map)) => match map.get("") {
            Some(VectorInternal::Dense(d)) => Some(d.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// A search hit in REST form.
pub fn scored_json(p: &ScoredPoint) -> Value {
    json!({
        "id": id_json(&p.id),
        "version": p.version,
        "score": p.score,
        "payload": p.payload.as_ref().map(|p| Value::Object(p.0.clone())),
        "vector": vector_json(&p.vector),
    })
}

/// A stored point in REST form.
pub fn record_json(r: &Record) -> Value {
    json!({
        "id": id_json(&r.id),
        "payload": r.payload.as_ref().map(|p| Value::Object(p.0.clone())),
        "vector": vector_json(&r.vector),
    })
}
