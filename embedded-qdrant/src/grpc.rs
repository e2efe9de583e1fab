//! Qdrant's gRPC API (HTTP/2 cleartext) over the store, on the message types and server
//! traits generated in the `qdrant-client` crate. Filters are read by the engine's REST
//! parser (`grpc_filter`), so they mean the same over both APIs; a condition the server
//! cannot evaluate gets UNIMPLEMENTED rather than an unfiltered answer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use qdrant_client::qdrant::{
    self as pb, point_id::PointIdOptions, points_selector::PointsSelectorOneOf, query, value::Kind,
    vector_input, vectors::VectorsOptions, vectors_config,
    with_payload_selector::SelectorOptions as PayloadSel,
    with_vectors_selector::SelectorOptions as VectorSel,
};
use qdrant_edge::{
    CountRequest, CreateIndex, DeletePayloadOp, FieldIndexOperations, Filter, JsonPath, NamedQuery,
    Payload, PayloadOps, PointId, PointInsertOperations, PointOperations, PointStructPersisted,
    QueryEnum, Record, ScoredPoint, ScrollRequest, SearchRequest, SetPayloadOp, UpdateOperation,
    VectorInternal, VectorPersisted, VectorStructPersisted, WithPayloadInterface, WithVector,
};
use tonic::{Request, Response, Status};

use crate::convert::{dense_vector, point_id, ReportedConfig};
use crate::grpc_filter;
use crate::store::{parse_distance, AliasChange, Store, StoreError, VectorParams};

/// The gRPC services' shared state.
#[derive(Clone)]
pub struct Grpc {
    /// The collections.
    pub store: Arc<Store>,
    /// Operation ids, shared with REST.
    pub operation_ids: Arc<AtomicU64>,
}

fn status(e: StoreError) -> Status {
    match e {
        StoreError::NoCollection(_) | StoreError::NoAlias(_) => Status::not_found(e.to_string()),
        StoreError::Exists(_) => Status::already_exists(e.to_string()),
        StoreError::BadRequest(_) => Status::invalid_argument(e.to_string()),
        StoreError::Internal(_) => Status::internal(e.to_string()),
    }
}

/// Which points an operation applies to: ids, or a filter.
enum Selection {
    Ids(Vec<PointId>),
    Filter(Filter),
}

impl Selection {
    /// As the engine's payload operations take it: ids or a filter, one of them set.
    fn split(self) -> (Option<Vec<PointId>>, Option<Filter>) {
        match self {
            Selection::Ids(ids) => (Some(ids), None),
            Selection::Filter(f) => (None, Some(f)),
        }
    }
}

fn selection(sel: Option<pb::PointsSelector>) -> Result<Selection, Status> {
    match sel.and_then(|p| p.points_selector_one_of) {
        Some(PointsSelectorOneOf::Points(list)) => list
            .ids
            .iter()
            .map(|id| point_id(Some(id)))
            .collect::<Result<Vec<_>, _>>()
            .map(Selection::Ids),
        Some(PointsSelectorOneOf::Filter(f)) => grpc_filter::to_engine(&f).map(Selection::Filter),
        None => Err(Status::invalid_argument("points selector missing")),
    }
}

fn json_payload(payload: &HashMap<String, pb::Value>) -> Payload {
    Payload(
        payload
            .iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect(),
    )
}

fn json_path(key: &str) -> Result<JsonPath, Status> {
    key.parse()
        .map_err(|_| Status::invalid_argument(format!("Wrong input: {key:?} is not a payload key")))
}

/// A payload index's type as the protocol numbers it (`qdrant.PayloadSchemaType`).
fn schema_type_out(t: &qdrant_edge::PayloadSchemaType) -> i32 {
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
fn schema_type_in(field_type: i32) -> Result<qdrant_edge::PayloadFieldSchema, Status> {
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
fn diff_json<T: serde::Serialize>(pairs: T) -> Option<serde_json::Map<String, serde_json::Value>> {
    match serde_json::to_value(pairs) {
        Ok(serde_json::Value::Object(m)) => {
            Some(m.into_iter().filter(|(_, v)| !v.is_null()).collect())
        }
        _ => None,
    }
}

fn secs(started: Instant) -> f64 {
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

fn point_id_out(id: &PointId) -> pb::PointId {
    pb::PointId {
        point_id_options: Some(match id {
            PointId::NumId(n) => PointIdOptions::Num(*n),
            PointId::Uuid(u) => PointIdOptions::Uuid(u.to_string()),
        }),
    }
}

fn value_to_json(v: &pb::Value) -> serde_json::Value {
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

fn json_to_value(v: &serde_json::Value) -> pb::Value {
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

fn payload_out(p: &Option<Payload>) -> HashMap<String, pb::Value> {
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
fn dense(v: &pb::Vector) -> Result<Vec<f32>, Status> {
    match &v.vector {
        Some(pb::vector::Vector::Dense(d)) => Ok(d.data.clone()),
        Some(_) => Err(Status::invalid_argument(
            "only dense vectors are supported by embedded-qdrant",
        )),
        None => Ok(v.data.clone()),
    }
}

fn vectors_out(v: &Option<qdrant_edge::VectorStructInternal>) -> Option<pb::VectorsOutput> {
    dense_vector(v).map(|data| pb::VectorsOutput {
        vectors_options: Some(pb::vectors_output::VectorsOptions::Vector(
            pb::VectorOutput {
                vector: Some(pb::vector_output::Vector::Dense(pb::DenseVector { data })),
                ..Default::default()
            },
        )),
    })
}

fn scored_out(p: &ScoredPoint) -> pb::ScoredPoint {
    pb::ScoredPoint {
        id: Some(point_id_out(&p.id)),
        payload: payload_out(&p.payload),
        score: p.score,
        version: p.version,
        vectors: vectors_out(&p.vector),
        ..Default::default()
    }
}

fn record_out(r: &Record) -> pb::RetrievedPoint {
    pb::RetrievedPoint {
        id: Some(point_id_out(&r.id)),
        payload: payload_out(&r.payload),
        vectors: vectors_out(&r.vector),
        ..Default::default()
    }
}

fn with_payload(sel: &Option<pb::WithPayloadSelector>, default: bool) -> bool {
    match sel.as_ref().and_then(|s| s.selector_options.as_ref()) {
        Some(PayloadSel::Enable(b)) => *b,
        Some(_) => true,
        None => default,
    }
}

fn with_vectors(sel: &Option<pb::WithVectorsSelector>) -> bool {
    match sel.as_ref().and_then(|s| s.selector_options.as_ref()) {
        Some(VectorSel::Enable(b)) => *b,
        Some(_) => true,
        None => false,
    }
}

/// A nearest-vector search, as Search and Query both ask for it.
struct Nearest {
    vector: Vec<f32>,
    filter: Option<Filter>,
    using: Option<String>,
    limit: usize,
    offset: usize,
    payload: bool,
    vectors: bool,
    score_threshold: Option<f32>,
}

impl Grpc {
    pub(crate) async fn health_check(
        &self,
        _request: Request<pb::HealthCheckRequest>,
    ) -> Result<Response<pb::HealthCheckReply>, Status> {
        Ok(Response::new(pb::HealthCheckReply {
            title: crate::SERVER_TITLE.to_owned(),
            version: crate::QDRANT_API_VERSION.to_owned(),
            commit: None,
        }))
    }

    pub(crate) async fn collection_create(
        &self,
        request: Request<pb::CreateCollection>,
    ) -> Result<Response<pb::CollectionOperationResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let params = match req.vectors_config.and_then(|c| c.config) {
            Some(vectors_config::Config::Params(p)) => p,
            Some(vectors_config::Config::ParamsMap(_)) => {
                return Err(Status::unimplemented(
                    "named vectors are not implemented by embedded-qdrant",
                ))
            }
            None => return Err(Status::invalid_argument("vectors_config is required")),
        };
        let distance = pb::Distance::try_from(params.distance)
            .ok()
            .and_then(|d| parse_distance(d.as_str_name()))
            .ok_or_else(|| {
                Status::invalid_argument(format!("unknown distance {}", params.distance))
            })?;
        self.store
            .create(
                &req.collection_name,
                VectorParams {
                    size: params.size as usize,
                    distance,
                },
            )
            .map_err(status)?;
        Ok(Response::new(pb::CollectionOperationResponse {
            result: true,
            time: secs(started),
        }))
    }

    pub(crate) async fn collection_get(
        &self,
        request: Request<pb::GetCollectionInfoRequest>,
    ) -> Result<Response<pb::GetCollectionInfoResponse>, Status> {
        let started = Instant::now();
        let c = self
            .store
            .get(&request.get_ref().collection_name)
            .map_err(status)?;
        let count = c.count().await.map_err(status)? as u64;
        let info = c.info().await.map_err(status)?;
        let config = ReportedConfig::of(&c.config());
        let distance = match c.params.distance {
            qdrant_edge::Distance::Cosine => pb::Distance::Cosine,
            qdrant_edge::Distance::Euclid => pb::Distance::Euclid,
            qdrant_edge::Distance::Dot => pb::Distance::Dot,
            qdrant_edge::Distance::Manhattan => pb::Distance::Manhattan,
        };
        let h = &config.hnsw;
        let payload_schema = info
            .payload_schema
            .iter()
            .map(|(key, index)| {
                (
                    key.to_string(),
                    pb::PayloadSchemaInfo {
                        data_type: schema_type_out(&index.data_type),
                        params: None,
                        points: Some(index.points as u64),
                    },
                )
            })
            .collect();
        Ok(Response::new(pb::GetCollectionInfoResponse {
            result: Some(pb::CollectionInfo {
                status: pb::CollectionStatus::Green as i32,
                optimizer_status: Some(pb::OptimizerStatus {
                    ok: true,
                    error: String::new(),
                }),
                segments_count: info.segments_count as u64,
                points_count: Some(count),
                indexed_vectors_count: Some(info.indexed_vectors_count as u64),
                payload_schema,
                config: Some(pb::CollectionConfig {
                    params: Some(pb::CollectionParams {
                        shard_number: 1,
                        replication_factor: Some(1),
                        write_consistency_factor: Some(1),
                        vectors_config: Some(pb::VectorsConfig {
                            config: Some(vectors_config::Config::Params(pb::VectorParams {
                                size: c.params.size as u64,
                                distance: distance as i32,
                                ..Default::default()
                            })),
                        }),
                        ..Default::default()
                    }),
                    hnsw_config: Some(pb::HnswConfigDiff {
                        m: Some(h.m as u64),
                        ef_construct: Some(h.ef_construct as u64),
                        full_scan_threshold: Some(h.full_scan_threshold as u64),
                        max_indexing_threads: Some(h.max_indexing_threads as u64),
                        payload_m: h.payload_m.map(|m| m as u64),
                        ..Default::default()
                    }),
                    optimizer_config: Some(pb::OptimizersConfigDiff {
                        deleted_threshold: Some(config.deleted_threshold),
                        vacuum_min_vector_number: Some(config.vacuum_min_vector_number as u64),
                        default_segment_number: Some(config.default_segment_number as u64),
                        max_segment_size: config.max_segment_size.map(|s| s as u64),
                        indexing_threshold: Some(config.indexing_threshold as u64),
                        flush_interval_sec: Some(config.flush_interval_sec),
                        prevent_unoptimized: config.prevent_unoptimized,
                        ..Default::default()
                    }),
                    wal_config: Some(pb::WalConfigDiff {
                        wal_capacity_mb: Some(config.wal_capacity_mb as u64),
                        wal_segments_ahead: Some(config.wal_segments_ahead as u64),
                        wal_retain_closed: None,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            time: secs(started),
        }))
    }

    pub(crate) async fn collection_update(
        &self,
        request: Request<pb::UpdateCollection>,
    ) -> Result<Response<pb::CollectionOperationResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let refused = [
            ("params", req.params.is_some()),
            ("vectors_config", req.vectors_config.is_some()),
            ("quantization_config", req.quantization_config.is_some()),
            ("sparse_vectors_config", req.sparse_vectors_config.is_some()),
            ("strict_mode_config", req.strict_mode_config.is_some()),
            ("metadata", !req.metadata.is_empty()),
        ];
        if let Some((field, _)) = refused.iter().find(|(_, set)| *set) {
            return Err(Status::invalid_argument(format!(
                "Wrong input: updating {field} is not supported by embedded-qdrant"
            )));
        }
        let c = self.store.get(&req.collection_name).map_err(status)?;
        // `on_disk` is deprecated in the protocol but still what older clients send.
        #[allow(deprecated)]
        let hnsw = req.hnsw_config.map(|h| {
            diff_json(serde_json::json!({
                "m": h.m, "ef_construct": h.ef_construct,
                "full_scan_threshold": h.full_scan_threshold,
                "max_indexing_threads": h.max_indexing_threads,
                "on_disk": h.on_disk, "payload_m": h.payload_m,
            }))
            .unwrap_or_default()
        });
        let optimizers = req.optimizers_config.map(|o| {
            diff_json(serde_json::json!({
                "deleted_threshold": o.deleted_threshold,
                "vacuum_min_vector_number": o.vacuum_min_vector_number,
                "default_segment_number": o.default_segment_number,
                "max_segment_size": o.max_segment_size,
                "memmap_threshold": o.memmap_threshold,
                "indexing_threshold": o.indexing_threshold,
                "flush_interval_sec": o.flush_interval_sec,
                "max_optimization_threads": o.max_optimization_threads.map(|_| true),
                "prevent_unoptimized": o.prevent_unoptimized,
            }))
            .unwrap_or_default()
        });
        c.update_config(hnsw, optimizers).await.map_err(status)?;
        Ok(Response::new(pb::CollectionOperationResponse {
            result: true,
            time: secs(started),
        }))
    }

    pub(crate) async fn collection_update_aliases(
        &self,
        request: Request<pb::ChangeAliases>,
    ) -> Result<Response<pb::CollectionOperationResponse>, Status> {
        use pb::alias_operations::Action;
        let started = Instant::now();
        let changes = request
            .into_inner()
            .actions
            .into_iter()
            .map(|a| match a.action {
                Some(Action::CreateAlias(c)) => Ok(AliasChange::Create {
                    collection: c.collection_name,
                    alias: c.alias_name,
                }),
                Some(Action::DeleteAlias(d)) => Ok(AliasChange::Delete {
                    alias: d.alias_name,
                }),
                Some(Action::RenameAlias(r)) => Ok(AliasChange::Rename {
                    old: r.old_alias_name,
                    new: r.new_alias_name,
                }),
                None => Err(Status::invalid_argument("alias action missing")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.store.change_aliases(&changes).map_err(status)?;
        Ok(Response::new(pb::CollectionOperationResponse {
            result: true,
            time: secs(started),
        }))
    }

    fn aliases_out(&self, of: Option<&str>, started: Instant) -> pb::ListAliasesResponse {
        pb::ListAliasesResponse {
            aliases: self
                .store
                .aliases(of)
                .into_iter()
                .map(|(alias_name, collection_name)| pb::AliasDescription {
                    alias_name,
                    collection_name,
                })
                .collect(),
            time: secs(started),
        }
    }

    pub(crate) async fn collection_list_aliases(
        &self,
        request: Request<pb::ListCollectionAliasesRequest>,
    ) -> Result<Response<pb::ListAliasesResponse>, Status> {
        let started = Instant::now();
        let c = self
            .store
            .get(&request.get_ref().collection_name)
            .map_err(status)?;
        Ok(Response::new(self.aliases_out(Some(&c.name), started)))
    }

    pub(crate) async fn list_aliases(
        &self,
        _request: Request<pb::ListAliasesRequest>,
    ) -> Result<Response<pb::ListAliasesResponse>, Status> {
        Ok(Response::new(self.aliases_out(None, Instant::now())))
    }

    pub(crate) async fn points_create_field_index(
        &self,
        request: Request<pb::CreateFieldIndexCollection>,
    ) -> Result<Response<pb::PointsOperationResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        if req.field_index_params.is_some() {
            return Err(Status::unimplemented(
                "payload index parameters are not implemented by embedded-qdrant (give the field type only)",
            ));
        }
        let field_schema = req.field_type.map(schema_type_in).transpose()?;
        let op =
            UpdateOperation::FieldIndexOperation(FieldIndexOperations::CreateIndex(CreateIndex {
                field_name: json_path(&req.field_name)?,
                field_schema,
            }));
        self.apply(&req.collection_name, op, req.wait.unwrap_or(false), started)
            .await
    }

    pub(crate) async fn points_delete_field_index(
        &self,
        request: Request<pb::DeleteFieldIndexCollection>,
    ) -> Result<Response<pb::PointsOperationResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let op = UpdateOperation::FieldIndexOperation(FieldIndexOperations::DeleteIndex(
            json_path(&req.field_name)?,
        ));
        self.apply(&req.collection_name, op, req.wait.unwrap_or(false), started)
            .await
    }

    /// A payload operation, applied as every update is (`wait` unset: acknowledged).
    async fn apply_payload(
        &self,
        collection: &str,
        op: PayloadOps,
        wait: Option<bool>,
        started: Instant,
    ) -> Result<Response<pb::PointsOperationResponse>, Status> {
        let op = UpdateOperation::PayloadOperation(op);
        self.apply(collection, op, wait.unwrap_or(false), started)
            .await
    }

    async fn payload_change(
        &self,
        req: pb::SetPayloadPoints,
        overwrite: bool,
    ) -> Result<Response<pb::PointsOperationResponse>, Status> {
        let started = Instant::now();
        let (points, filter) = selection(req.points_selector)?.split();
        let op = SetPayloadOp {
            payload: json_payload(&req.payload),
            points,
            filter,
            key: req.key.as_deref().map(json_path).transpose()?,
        };
        let op = if overwrite {
            PayloadOps::OverwritePayload(op)
        } else {
            PayloadOps::SetPayload(op)
        };
        self.apply_payload(&req.collection_name, op, req.wait, started)
            .await
    }

    pub(crate) async fn points_set_payload(
        &self,
        request: Request<pb::SetPayloadPoints>,
    ) -> Result<Response<pb::PointsOperationResponse>, Status> {
        self.payload_change(request.into_inner(), false).await
    }

    pub(crate) async fn points_overwrite_payload(
        &self,
        request: Request<pb::SetPayloadPoints>,
    ) -> Result<Response<pb::PointsOperationResponse>, Status> {
        self.payload_change(request.into_inner(), true).await
    }

    pub(crate) async fn points_delete_payload(
        &self,
        request: Request<pb::DeletePayloadPoints>,
    ) -> Result<Response<pb::PointsOperationResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let (points, filter) = selection(req.points_selector)?.split();
        let keys = req
            .keys
            .iter()
            .map(|k| json_path(k))
            .collect::<Result<Vec<_>, _>>()?;
        let op = PayloadOps::DeletePayload(DeletePayloadOp {
            keys,
            points,
            filter,
        });
        self.apply_payload(&req.collection_name, op, req.wait, started)
            .await
    }

    pub(crate) async fn points_clear_payload(
        &self,
        request: Request<pb::ClearPayloadPoints>,
    ) -> Result<Response<pb::PointsOperationResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let op = match selection(req.points)? {
            Selection::Ids(points) => PayloadOps::ClearPayload { points },
            Selection::Filter(f) => PayloadOps::ClearPayloadByFilter(f),
        };
        self.apply_payload(&req.collection_name, op, req.wait, started)
            .await
    }

    pub(crate) async fn collection_list(
        &self,
        _request: Request<pb::ListCollectionsRequest>,
    ) -> Result<Response<pb::ListCollectionsResponse>, Status> {
        let started = Instant::now();
        Ok(Response::new(pb::ListCollectionsResponse {
            collections: self
                .store
                .names()
                .into_iter()
                .map(|name| pb::CollectionDescription { name })
                .collect(),
            time: secs(started),
        }))
    }

    pub(crate) async fn collection_delete(
        &self,
        request: Request<pb::DeleteCollection>,
    ) -> Result<Response<pb::CollectionOperationResponse>, Status> {
        let started = Instant::now();
        let deleted = self.store.delete(&request.get_ref().collection_name);
        Ok(Response::new(pb::CollectionOperationResponse {
            result: deleted,
            time: secs(started),
        }))
    }

    pub(crate) async fn collection_collection_exists(
        &self,
        request: Request<pb::CollectionExistsRequest>,
    ) -> Result<Response<pb::CollectionExistsResponse>, Status> {
        let started = Instant::now();
        let exists = self.store.get(&request.get_ref().collection_name).is_ok();
        Ok(Response::new(pb::CollectionExistsResponse {
            result: Some(pb::CollectionExists { exists }),
            time: secs(started),
        }))
    }

    async fn apply(
        &self,
        collection: &str,
        op: UpdateOperation,
        wait: bool,
        started: Instant,
    ) -> Result<Response<pb::PointsOperationResponse>, Status> {
        let c = self.store.get(collection).map_err(status)?;
        let operation_id = self.operation_ids.fetch_add(1, Ordering::Relaxed);
        c.update(op, wait).await.map_err(status)?;
        let update_status = if wait {
            pb::UpdateStatus::Completed
        } else {
            pb::UpdateStatus::Acknowledged
        };
        Ok(Response::new(pb::PointsOperationResponse {
            result: Some(pb::UpdateResult {
                operation_id: Some(operation_id),
                status: update_status as i32,
            }),
            time: secs(started),
            usage: None,
        }))
    }

    pub(crate) async fn points_upsert(
        &self,
        request: Request<pb::UpsertPoints>,
    ) -> Result<Response<pb::PointsOperationResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        if req.update_filter.is_some() {
            return Err(Status::unimplemented(
                "conditional upserts are not implemented by embedded-qdrant",
            ));
        }
        let points = points_in(req.points)?;
        let op = UpdateOperation::PointOperation(PointOperations::UpsertPoints(
            PointInsertOperations::PointsList(points),
        ));
        self.apply(&req.collection_name, op, req.wait.unwrap_or(false), started)
            .await
    }

    pub(crate) async fn points_delete(
        &self,
        request: Request<pb::DeletePoints>,
    ) -> Result<Response<pb::PointsOperationResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let op = UpdateOperation::PointOperation(match selection(req.points)? {
            Selection::Ids(ids) => PointOperations::DeletePoints { ids },
            Selection::Filter(f) => PointOperations::DeletePointsByFilter(f),
        });
        self.apply(&req.collection_name, op, req.wait.unwrap_or(false), started)
            .await
    }

    pub(crate) async fn points_get(
        &self,
        request: Request<pb::GetPoints>,
    ) -> Result<Response<pb::GetResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let ids = req
            .ids
            .iter()
            .map(|id| point_id(Some(id)))
            .collect::<Result<Vec<_>, _>>()?;
        let c = self.store.get(&req.collection_name).map_err(status)?;
        let records = c
            .retrieve(
                ids,
                with_payload(&req.with_payload, true),
                with_vectors(&req.with_vectors),
            )
            .await
            .map_err(status)?;
        Ok(Response::new(pb::GetResponse {
            result: records.iter().map(record_out).collect(),
            time: secs(started),
            usage: None,
        }))
    }

    async fn nearest(&self, collection: &str, q: Nearest) -> Result<Vec<pb::ScoredPoint>, Status> {
        let Nearest {
            vector,
            filter,
            using,
            limit,
            offset,
            payload,
            vectors,
            score_threshold,
        } = q;
        let c = self.store.get(collection).map_err(status)?;
        if vector.len() != c.params.size {
            return Err(Status::invalid_argument(format!(
                "Wrong input: Vector dimension error: expected dim: {}, got {}",
                c.params.size,
                vector.len()
            )));
        }
        let points = c
            .search(SearchRequest {
                query: QueryEnum::Nearest(NamedQuery {
                    query: VectorInternal::Dense(vector),
                    using: using.filter(|u| !u.is_empty()),
                }),
                filter,
                params: None,
                limit,
                offset,
                with_payload: Some(WithPayloadInterface::Bool(payload)),
                with_vector: Some(WithVector::Bool(vectors)),
                score_threshold,
            })
            .await
            .map_err(status)?;
        Ok(points.iter().map(scored_out).collect())
    }

    pub(crate) async fn points_search(
        &self,
        request: Request<pb::SearchPoints>,
    ) -> Result<Response<pb::SearchResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let filter = grpc_filter::optional(&req.filter)?;
        let result = self
            .nearest(
                &req.collection_name,
                Nearest {
                    vector: req.vector,
                    filter,
                    using: req.vector_name,
                    limit: req.limit as usize,
                    offset: req.offset.unwrap_or(0) as usize,
                    payload: with_payload(&req.with_payload, false),
                    vectors: with_vectors(&req.with_vectors),
                    score_threshold: req.score_threshold,
                },
            )
            .await?;
        Ok(Response::new(pb::SearchResponse {
            result,
            time: secs(started),
            usage: None,
        }))
    }

    pub(crate) async fn points_query(
        &self,
        request: Request<pb::QueryPoints>,
    ) -> Result<Response<pb::QueryResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let filter = grpc_filter::optional(&req.filter)?;
        if !req.prefetch.is_empty() {
            return Err(Status::unimplemented(
                "prefetch queries are not implemented by embedded-qdrant",
            ));
        }
        let vector = match req.query.and_then(|q| q.variant) {
            Some(query::Variant::Nearest(input)) => match input.variant {
                Some(vector_input::Variant::Dense(d)) => d.data,
                Some(vector_input::Variant::Id(id)) => {
                    let id = point_id(Some(&id))?;
                    let c = self.store.get(&req.collection_name).map_err(status)?;
                    let records = c.retrieve(vec![id], false, true).await.map_err(status)?;
                    records
                        .first()
                        .and_then(|r| dense_vector(&r.vector))
                        .ok_or_else(|| Status::not_found("no point with that id"))?
                }
                _ => {
                    return Err(Status::unimplemented(
                        "only dense vectors and point ids are supported as nearest queries",
                    ))
                }
            },
            Some(_) => {
                return Err(Status::unimplemented(
                    "only nearest-vector queries are implemented by embedded-qdrant",
                ))
            }
            None => return Err(Status::invalid_argument("query missing")),
        };
        let result = self
            .nearest(
                &req.collection_name,
                Nearest {
                    vector,
                    filter,
                    using: req.using,
                    limit: req.limit.unwrap_or(10) as usize,
                    offset: req.offset.unwrap_or(0) as usize,
                    payload: with_payload(&req.with_payload, false),
                    vectors: with_vectors(&req.with_vectors),
                    score_threshold: req.score_threshold,
                },
            )
            .await?;
        Ok(Response::new(pb::QueryResponse {
            result,
            time: secs(started),
            usage: None,
        }))
    }

    pub(crate) async fn points_count(
        &self,
        request: Request<pb::CountPoints>,
    ) -> Result<Response<pb::CountResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let filter = grpc_filter::optional(&req.filter)?;
        let c = self.store.get(&req.collection_name).map_err(status)?;
        let count = c
            .count_filtered(CountRequest {
                filter,
                exact: req.exact.unwrap_or(true),
            })
            .await
            .map_err(status)?;
        Ok(Response::new(pb::CountResponse {
            result: Some(pb::CountResult {
                count: count as u64,
            }),
            time: secs(started),
            usage: None,
        }))
    }

    pub(crate) async fn points_scroll(
        &self,
        request: Request<pb::ScrollPoints>,
    ) -> Result<Response<pb::ScrollResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let filter = grpc_filter::optional(&req.filter)?;
        let offset = req
            .offset
            .as_ref()
            .map(|id| point_id(Some(id)))
            .transpose()?;
        let c = self.store.get(&req.collection_name).map_err(status)?;
        let (records, next) = c
            .scroll(ScrollRequest {
                offset,
                limit: Some(req.limit.unwrap_or(10) as usize),
                filter,
                with_payload: Some(WithPayloadInterface::Bool(with_payload(
                    &req.with_payload,
                    true,
                ))),
                with_vector: WithVector::Bool(with_vectors(&req.with_vectors)),
                order_by: None,
            })
            .await
            .map_err(status)?;
        Ok(Response::new(pb::ScrollResponse {
            next_page_offset: next.as_ref().map(point_id_out),
            result: records.iter().map(record_out).collect(),
            time: secs(started),
            usage: None,
        }))
    }
}
