//! Shapes shared by REST and gRPC: engine records to JSON, vectors out of the engine, gRPC
//! point ids into the engine's.

use qdrant_client::qdrant::{self as pb, point_id::PointIdOptions};
use qdrant_edge::{PointId, Record, ScoredPoint, VectorInternal, VectorStructInternal};
use serde_json::{json, Value};
use tonic::Status;

/// A point id from the protocol.
pub(crate) fn point_id(id: Option<&pb::PointId>) -> Result<PointId, Status> {
    match id.and_then(|p| p.point_id_options.as_ref()) {
        Some(PointIdOptions::Num(n)) => Ok(PointId::NumId(*n)),
        Some(PointIdOptions::Uuid(s)) => uuid::Uuid::parse_str(s)
            .map(PointId::Uuid)
            .map_err(|e| Status::invalid_argument(format!("point id {s:?} is not a UUID: {e}"))),
        None => Err(Status::invalid_argument("point id missing")),
    }
}

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

/// Qdrant's default `flush_interval_sec`: the engine here has no flush timer (it flushes on
/// `wait=true` and at shutdown), so it reports what a default Qdrant collection does.
const QDRANT_FLUSH_INTERVAL_SEC: u64 = 5;
/// Qdrant's default vacuum settings, reported where the engine's configuration leaves
/// them unset (it applies the same defaults).
const QDRANT_DELETED_THRESHOLD: f64 = 0.2;
const QDRANT_VACUUM_MIN_VECTOR_NUMBER: usize = 1000;

/// A collection's configuration as Qdrant reports it (`config` of `GET /collections/{name}`
/// and of gRPC `Collections/Get`): the engine's own settings, and Qdrant's defaults for
/// the ones the engine has no notion of, so that no field a client requires is missing.
pub struct ReportedConfig {
    /// HNSW settings, as the engine applies them.
    pub hnsw: qdrant_edge::HnswIndexConfig,
    /// Vacuum: fraction of deleted points.
    pub deleted_threshold: f64,
    /// Vacuum: smallest segment.
    pub vacuum_min_vector_number: usize,
    /// Target number of segments (0: chosen by the engine).
    pub default_segment_number: usize,
    /// Largest segment in KB, if set.
    pub max_segment_size: Option<usize>,
    /// Segments above this many KB get an HNSW index.
    pub indexing_threshold: usize,
    /// Qdrant's flush timer (see [`QDRANT_FLUSH_INTERVAL_SEC`]).
    pub flush_interval_sec: u64,
    /// Whether unoptimized points are deferred, if set.
    pub prevent_unoptimized: Option<bool>,
    /// WAL segment size in MB.
    pub wal_capacity_mb: usize,
    /// WAL segments created ahead.
    pub wal_segments_ahead: usize,
    /// Payload on disk (mmap) or in RAM.
    pub on_disk_payload: bool,
}

impl ReportedConfig {
    /// What `config` reports.
    pub fn of(config: &qdrant_edge::EdgeConfig) -> Self {
        let o = &config.optimizers;
        let wal = config.wal_options.clone().unwrap_or_default();
        Self {
            hnsw: config.hnsw_config,
            deleted_threshold: o.deleted_threshold.unwrap_or(QDRANT_DELETED_THRESHOLD),
            vacuum_min_vector_number: o
                .vacuum_min_vector_number
                .unwrap_or(QDRANT_VACUUM_MIN_VECTOR_NUMBER),
            default_segment_number: o.default_segment_number.unwrap_or(0),
            max_segment_size: o.max_segment_size,
            indexing_threshold: o.get_indexing_threshold_kb(),
            flush_interval_sec: QDRANT_FLUSH_INTERVAL_SEC,
            prevent_unoptimized: o.prevent_unoptimized,
            wal_capacity_mb: wal.segment_capacity / (1024 * 1024),
            wal_segments_ahead: wal.segment_queue_len,
            on_disk_payload: config.on_disk_payload,
        }
    }

    /// The REST form of `config`, with the collection's vector parameters.
    pub fn rest_json(&self, vectors: Value) -> Value {
        json!({
            "params": {
                "vectors": vectors,
                "shard_number": 1,
                "replication_factor": 1,
                "write_consistency_factor": 1,
                "on_disk_payload": self.on_disk_payload,
            },
            "hnsw_config": serde_json::to_value(self.hnsw).unwrap_or(Value::Null),
            "optimizer_config": {
                "deleted_threshold": self.deleted_threshold,
                "vacuum_min_vector_number": self.vacuum_min_vector_number,
                "default_segment_number": self.default_segment_number,
                "max_segment_size": self.max_segment_size,
                "memmap_threshold": null,
                "indexing_threshold": self.indexing_threshold,
                "flush_interval_sec": self.flush_interval_sec,
                "max_optimization_threads": null,
                "prevent_unoptimized": self.prevent_unoptimized,
            },
            "wal_config": {
                "wal_capacity_mb": self.wal_capacity_mb,
                "wal_segments_ahead": self.wal_segments_ahead,
            },
            "quantization_config": null,
        })
    }
}
