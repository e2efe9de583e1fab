//! The Collections service: collections created, read, changed, listed and deleted, and
//! their aliases.

use super::conversions::*;
use super::*;

impl Grpc {
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
}
