//! The request bodies of the REST API, in Qdrant's JSON spelling, and how each becomes
//! the engine's own type. Parsing only: the handlers in `collections` and `points` decide
//! what a body asks of the store.

use qdrant_edge::{
    CreateIndex, Filter, NamedQuery, PointId, PointInsertOperations, QueryEnum, SearchRequest,
    SetPayloadOp, VectorInternal, WithPayloadInterface, WithVector,
};
use serde::Deserialize;
use serde_json::Value;

use crate::store::AliasChange;

/// `PUT /collections/{name}`.
#[derive(Deserialize)]
pub(crate) struct CreateBody {
    pub vectors: VectorsBody,
}

/// The single dense vector of a collection.
#[derive(Deserialize)]
pub(crate) struct VectorsBody {
    pub size: usize,
    pub distance: String,
}

/// `PUT /collections/{name}/points`: `{"points": [...]}` or the batch form.
#[derive(Deserialize)]
pub(crate) struct UpsertBody {
    #[serde(flatten)]
    pub op: PointInsertOperations,
}

/// A vector in a search body: a bare array, or `{"name": ..., "vector": [...]}`.
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum VectorInput {
    Plain(Vec<f32>),
    Named { name: String, vector: Vec<f32> },
}

/// What search and query bodies share.
#[derive(Deserialize)]
pub(crate) struct NearestOptions {
    #[serde(default = "default_limit")]
    limit: usize,
    #[serde(default)]
    offset: usize,
    filter: Option<Filter>,
    with_payload: Option<WithPayloadInterface>,
    #[serde(alias = "with_vectors")]
    with_vector: Option<WithVector>,
    score_threshold: Option<f32>,
}

impl NearestOptions {
    /// The engine's search for `vector` (in the named vector `using`, if given).
    pub fn request(self, vector: Vec<f32>, using: Option<String>) -> SearchRequest {
        SearchRequest {
            query: QueryEnum::Nearest(NamedQuery {
                query: VectorInternal::Dense(vector),
                using,
            }),
            filter: self.filter,
            params: None,
            limit: self.limit,
            offset: self.offset,
            with_payload: self.with_payload,
            with_vector: self.with_vector,
            score_threshold: self.score_threshold,
        }
    }
}

fn default_limit() -> usize {
    10
}

fn default_true() -> bool {
    true
}

/// `POST /collections/{name}/points/search`.
#[derive(Deserialize)]
pub(crate) struct SearchBody {
    pub vector: VectorInput,
    #[serde(flatten)]
    pub options: NearestOptions,
}

/// `query` of `POST /points/query`: a vector or a point id, bare or as `{"nearest": ...}`
/// (the official clients send the latter).
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum QueryInput {
    Vector(Vec<f32>),
    Id(PointId),
    Nearest { nearest: NearestInput },
}

/// The inside of `{"nearest": ...}`.
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum NearestInput {
    Vector(Vec<f32>),
    Id(PointId),
}

/// What a query looks for: the vector given, or the vector of a stored point.
pub(crate) enum QueryTarget {
    Vector(Vec<f32>),
    Point(PointId),
}

impl From<QueryInput> for QueryTarget {
    fn from(q: QueryInput) -> Self {
        match q {
            QueryInput::Vector(v)
            | QueryInput::Nearest {
                nearest: NearestInput::Vector(v),
            } => Self::Vector(v),
            QueryInput::Id(id)
            | QueryInput::Nearest {
                nearest: NearestInput::Id(id),
            } => Self::Point(id),
        }
    }
}

/// `POST /collections/{name}/points/query`.
#[derive(Deserialize)]
pub(crate) struct QueryBody {
    pub query: QueryInput,
    pub using: Option<String>,
    #[serde(flatten)]
    pub options: NearestOptions,
}

/// `POST /collections/{name}/points/count`; an empty body counts everything, exactly.
#[derive(Deserialize)]
pub(crate) struct CountBody {
    pub filter: Option<Filter>,
    #[serde(default = "default_true")]
    pub exact: bool,
}

impl Default for CountBody {
    fn default() -> Self {
        Self {
            filter: None,
            exact: true,
        }
    }
}

/// `POST /collections/{name}/points`: points by id.
#[derive(Deserialize)]
pub(crate) struct RetrieveBody {
    pub ids: Vec<PointId>,
    #[serde(default = "default_true")]
    pub with_payload: bool,
    #[serde(default, alias = "with_vectors")]
    pub with_vector: bool,
}

/// `POST /collections/{name}/points/scroll`; an empty body scrolls from the start.
#[derive(Deserialize, Default)]
pub(crate) struct ScrollBody {
    pub offset: Option<PointId>,
    pub limit: Option<usize>,
    pub filter: Option<Filter>,
    pub with_payload: Option<WithPayloadInterface>,
    #[serde(alias = "with_vectors")]
    pub with_vector: Option<WithVector>,
}

/// Which points a deletion or a payload change applies to: a list of ids or a filter.
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum PointsSelector {
    Ids { points: Vec<PointId> },
    Filter { filter: Filter },
}

/// `PATCH /collections/{name}`: what the engine applies, and every other field of
/// Qdrant's body, refused by name when set.
#[derive(Deserialize)]
pub(crate) struct UpdateCollectionBody {
    pub optimizers_config: Option<serde_json::Map<String, Value>>,
    pub hnsw_config: Option<serde_json::Map<String, Value>>,
    #[serde(flatten)]
    pub other: serde_json::Map<String, Value>,
}

/// `POST /collections/aliases`.
#[derive(Deserialize)]
pub(crate) struct AliasesBody {
    pub actions: Vec<AliasAction>,
}

/// One action of `POST /collections/aliases`, in Qdrant's spelling.
#[derive(Deserialize)]
pub(crate) enum AliasAction {
    #[serde(rename = "create_alias")]
    Create {
        collection_name: String,
        alias_name: String,
    },
    #[serde(rename = "delete_alias")]
    Delete { alias_name: String },
    #[serde(rename = "rename_alias")]
    Rename {
        old_alias_name: String,
        new_alias_name: String,
    },
}

impl From<AliasAction> for AliasChange {
    fn from(a: AliasAction) -> Self {
        match a {
            AliasAction::Create {
                collection_name,
                alias_name,
            } => AliasChange::Create {
                collection: collection_name,
                alias: alias_name,
            },
            AliasAction::Delete { alias_name } => AliasChange::Delete { alias: alias_name },
            AliasAction::Rename {
                old_alias_name,
                new_alias_name,
            } => AliasChange::Rename {
                old: old_alias_name,
                new: new_alias_name,
            },
        }
    }
}

/// `POST /collections/{name}/points/payload/delete`.
#[derive(Deserialize)]
pub(crate) struct DeletePayloadBody {
    pub keys: Vec<String>,
    #[serde(flatten)]
    pub selector: PointsSelector,
}

/// `POST|PUT /collections/{name}/points/payload`: Qdrant's own type.
pub(crate) type SetPayloadBody = SetPayloadOp;

/// `PUT /collections/{name}/index`: Qdrant's own type.
pub(crate) type CreateIndexBody = CreateIndex;
