//! Qdrant's gRPC API (HTTP/2 cleartext) over the store, on the message types and server
//! traits generated in the `qdrant-client` crate; the mirror of `rest`. Filters are read by
//! the engine's REST parser (`filters`), so they mean the same over both APIs; a condition
//! the server cannot evaluate gets UNIMPLEMENTED rather than an unfiltered answer.
//!
//! Its rooms: `services` (the service traits, every method listed: the served ones
//! delegate to the handlers, the others answer UNIMPLEMENTED), one handler module per
//! service of Qdrant's API, `collections` (Collections) and `points` (Points), the
//! conversions they share (`conversions`) and `filters`. The Qdrant service's HealthCheck
//! and the shared state are here. A new method: its handler in `collections` or `points`,
//! its delegation in `services`.

mod collections;
mod conversions;
pub(crate) mod filters;
mod points;
mod services;

pub(crate) use conversions::points_in;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

// What the handler modules (`collections`, `points`) share through `use super::*`.
use qdrant_client::qdrant::{self as pb, query, vector_input, vectors_config};
use qdrant_edge::{
    CountRequest, CreateIndex, DeletePayloadOp, FieldIndexOperations, Filter, NamedQuery,
    PayloadOps, PointInsertOperations, PointOperations, QueryEnum, ScrollRequest, SearchRequest,
    SetPayloadOp, UpdateOperation, VectorInternal, WithPayloadInterface, WithVector,
};
use tonic::{Request, Response, Status};

use crate::convert::{dense_vector, point_id, ReportedConfig};
use crate::store::{parse_distance, AliasChange, Store, VectorParams};

/// The gRPC services' shared state.
#[derive(Clone)]
pub struct Grpc {
    /// The collections.
    pub store: Arc<Store>,
    /// Operation ids, shared with REST.
    pub operation_ids: Arc<AtomicU64>,
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
}
