//! The Points service: upserts, deletes, payload changes and field indexes, and the reads
//! (get, search, query, count, scroll).

use super::conversions::*;
use super::filters;
use super::*;

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
        let filter = filters::optional(&req.filter)?;
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
        let filter = filters::optional(&req.filter)?;
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
        let filter = filters::optional(&req.filter)?;
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
        let filter = filters::optional(&req.filter)?;
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
