//! The gRPC service traits of qdrant-client 1.20, every method listed: the ones the
//! benchmark and its checks use delegate to [`Grpc`](super::Grpc)'s handlers, every other one answers
//! UNIMPLEMENTED with its name (never a hang). Written out from the trait definitions in
//! qdrant-client's generated `qdrant.rs`; regenerate when the client's protocol grows.

use ::qdrant_client::qdrant::*;
use tonic::{Request, Response, Status};

use super::Grpc;

fn unimplemented(method: &str) -> Status {
    Status::unimplemented(format!("{method} is not implemented by embedded-qdrant"))
}

#[tonic::async_trait]
impl collections_server::Collections for Grpc {
    async fn get(
        &self,
        request: Request<GetCollectionInfoRequest>,
    ) -> Result<Response<GetCollectionInfoResponse>, Status> {
        self.collection_get(request).await
    }

    async fn list(
        &self,
        request: Request<ListCollectionsRequest>,
    ) -> Result<Response<ListCollectionsResponse>, Status> {
        self.collection_list(request).await
    }

    async fn create(
        &self,
        request: Request<CreateCollection>,
    ) -> Result<Response<CollectionOperationResponse>, Status> {
        self.collection_create(request).await
    }

    async fn update(
        &self,
        request: Request<UpdateCollection>,
    ) -> Result<Response<CollectionOperationResponse>, Status> {
        self.collection_update(request).await
    }

    async fn delete(
        &self,
        request: Request<DeleteCollection>,
    ) -> Result<Response<CollectionOperationResponse>, Status> {
        self.collection_delete(request).await
    }

    async fn update_aliases(
        &self,
        request: Request<ChangeAliases>,
    ) -> Result<Response<CollectionOperationResponse>, Status> {
        self.collection_update_aliases(request).await
    }

    async fn list_collection_aliases(
        &self,
        request: Request<ListCollectionAliasesRequest>,
    ) -> Result<Response<ListAliasesResponse>, Status> {
        self.collection_list_aliases(request).await
    }

    async fn list_aliases(
        &self,
        request: Request<ListAliasesRequest>,
    ) -> Result<Response<ListAliasesResponse>, Status> {
        self.list_aliases(request).await
    }

    async fn collection_cluster_info(
        &self,
        request: Request<CollectionClusterInfoRequest>,
    ) -> Result<Response<CollectionClusterInfoResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Collections/CollectionClusterInfo"))
    }

    async fn collection_exists(
        &self,
        request: Request<CollectionExistsRequest>,
    ) -> Result<Response<CollectionExistsResponse>, Status> {
        self.collection_collection_exists(request).await
    }

    async fn update_collection_cluster_setup(
        &self,
        request: Request<UpdateCollectionClusterSetupRequest>,
    ) -> Result<Response<UpdateCollectionClusterSetupResponse>, Status> {
        let _ = request;
        Err(unimplemented(
            "qdrant.Collections/UpdateCollectionClusterSetup",
        ))
    }

    async fn create_shard_key(
        &self,
        request: Request<CreateShardKeyRequest>,
    ) -> Result<Response<CreateShardKeyResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Collections/CreateShardKey"))
    }

    async fn delete_shard_key(
        &self,
        request: Request<DeleteShardKeyRequest>,
    ) -> Result<Response<DeleteShardKeyResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Collections/DeleteShardKey"))
    }

    async fn list_shard_keys(
        &self,
        request: Request<ListShardKeysRequest>,
    ) -> Result<Response<ListShardKeysResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Collections/ListShardKeys"))
    }
}

#[tonic::async_trait]
impl points_server::Points for Grpc {
    async fn upsert(
        &self,
        request: Request<UpsertPoints>,
    ) -> Result<Response<PointsOperationResponse>, Status> {
        self.points_upsert(request).await
    }

    async fn delete(
        &self,
        request: Request<DeletePoints>,
    ) -> Result<Response<PointsOperationResponse>, Status> {
        self.points_delete(request).await
    }

    async fn get(&self, request: Request<GetPoints>) -> Result<Response<GetResponse>, Status> {
        self.points_get(request).await
    }

    async fn update_vectors(
        &self,
        request: Request<UpdatePointVectors>,
    ) -> Result<Response<PointsOperationResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Points/UpdateVectors"))
    }

    async fn delete_vectors(
        &self,
        request: Request<DeletePointVectors>,
    ) -> Result<Response<PointsOperationResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Points/DeleteVectors"))
    }

    async fn set_payload(
        &self,
        request: Request<SetPayloadPoints>,
    ) -> Result<Response<PointsOperationResponse>, Status> {
        self.points_set_payload(request).await
    }

    async fn overwrite_payload(
        &self,
        request: Request<SetPayloadPoints>,
    ) -> Result<Response<PointsOperationResponse>, Status> {
        self.points_overwrite_payload(request).await
    }

    async fn delete_payload(
        &self,
        request: Request<DeletePayloadPoints>,
    ) -> Result<Response<PointsOperationResponse>, Status> {
        self.points_delete_payload(request).await
    }

    async fn clear_payload(
        &self,
        request: Request<ClearPayloadPoints>,
    ) -> Result<Response<PointsOperationResponse>, Status> {
        self.points_clear_payload(request).await
    }

    async fn create_field_index(
        &self,
        request: Request<CreateFieldIndexCollection>,
    ) -> Result<Response<PointsOperationResponse>, Status> {
        self.points_create_field_index(request).await
    }

    async fn delete_field_index(
        &self,
        request: Request<DeleteFieldIndexCollection>,
    ) -> Result<Response<PointsOperationResponse>, Status> {
        self.points_delete_field_index(request).await
    }

    async fn create_vector_name(
        &self,
        request: Request<CreateVectorNameRequest>,
    ) -> Result<Response<PointsOperationResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Points/CreateVectorName"))
    }

    async fn delete_vector_name(
        &self,
        request: Request<DeleteVectorNameRequest>,
    ) -> Result<Response<PointsOperationResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Points/DeleteVectorName"))
    }

    async fn search(
        &self,
        request: Request<SearchPoints>,
    ) -> Result<Response<SearchResponse>, Status> {
        self.points_search(request).await
    }

    async fn search_batch(
        &self,
        request: Request<SearchBatchPoints>,
    ) -> Result<Response<SearchBatchResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Points/SearchBatch"))
    }

    async fn search_groups(
        &self,
        request: Request<SearchPointGroups>,
    ) -> Result<Response<SearchGroupsResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Points/SearchGroups"))
    }

    async fn scroll(
        &self,
        request: Request<ScrollPoints>,
    ) -> Result<Response<ScrollResponse>, Status> {
        self.points_scroll(request).await
    }

    async fn recommend(
        &self,
        request: Request<RecommendPoints>,
    ) -> Result<Response<RecommendResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Points/Recommend"))
    }

    async fn recommend_batch(
        &self,
        request: Request<RecommendBatchPoints>,
    ) -> Result<Response<RecommendBatchResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Points/RecommendBatch"))
    }

    async fn recommend_groups(
        &self,
        request: Request<RecommendPointGroups>,
    ) -> Result<Response<RecommendGroupsResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Points/RecommendGroups"))
    }

    async fn discover(
        &self,
        request: Request<DiscoverPoints>,
    ) -> Result<Response<DiscoverResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Points/Discover"))
    }

    async fn discover_batch(
        &self,
        request: Request<DiscoverBatchPoints>,
    ) -> Result<Response<DiscoverBatchResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Points/DiscoverBatch"))
    }

    async fn count(
        &self,
        request: Request<CountPoints>,
    ) -> Result<Response<CountResponse>, Status> {
        self.points_count(request).await
    }

    async fn update_batch(
        &self,
        request: Request<UpdateBatchPoints>,
    ) -> Result<Response<UpdateBatchResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Points/UpdateBatch"))
    }

    async fn query(
        &self,
        request: Request<QueryPoints>,
    ) -> Result<Response<QueryResponse>, Status> {
        self.points_query(request).await
    }

    async fn query_batch(
        &self,
        request: Request<QueryBatchPoints>,
    ) -> Result<Response<QueryBatchResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Points/QueryBatch"))
    }

    async fn query_groups(
        &self,
        request: Request<QueryPointGroups>,
    ) -> Result<Response<QueryGroupsResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Points/QueryGroups"))
    }

    async fn facet(
        &self,
        request: Request<FacetCounts>,
    ) -> Result<Response<FacetResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Points/Facet"))
    }

    async fn search_matrix_pairs(
        &self,
        request: Request<SearchMatrixPoints>,
    ) -> Result<Response<SearchMatrixPairsResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Points/SearchMatrixPairs"))
    }

    async fn search_matrix_offsets(
        &self,
        request: Request<SearchMatrixPoints>,
    ) -> Result<Response<SearchMatrixOffsetsResponse>, Status> {
        let _ = request;
        Err(unimplemented("qdrant.Points/SearchMatrixOffsets"))
    }
}

#[tonic::async_trait]
impl qdrant_server::Qdrant for Grpc {
    async fn health_check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckReply>, Status> {
        self.health_check(request).await
    }
}

/// Snapshots are not kept by embedded-qdrant: every call says so by name (without this
/// service, tonic would answer UNIMPLEMENTED with no message at all).
#[tonic::async_trait]
impl snapshots_server::Snapshots for Grpc {
    async fn create(
        &self,
        _request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        Err(unimplemented("qdrant.Snapshots/Create"))
    }

    async fn list(
        &self,
        _request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        Err(unimplemented("qdrant.Snapshots/List"))
    }

    async fn delete(
        &self,
        _request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        Err(unimplemented("qdrant.Snapshots/Delete"))
    }

    async fn create_full(
        &self,
        _request: Request<CreateFullSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        Err(unimplemented("qdrant.Snapshots/CreateFull"))
    }

    async fn list_full(
        &self,
        _request: Request<ListFullSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        Err(unimplemented("qdrant.Snapshots/ListFull"))
    }

    async fn delete_full(
        &self,
        _request: Request<DeleteFullSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        Err(unimplemented("qdrant.Snapshots/DeleteFull"))
    }
}
