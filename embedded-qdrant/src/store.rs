//! Collections on Qdrant's own engine: one `EdgeShard` per collection in its own folder,
//! writes serialised through one writer thread per collection (the engine's WAL and
//! segment flush need a single writer), reads concurrent on the blocking pool.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, RwLock};

use qdrant_edge::{
    CountRequest, Distance, EdgeConfig, EdgeConfigBuilder, EdgeOptimizersConfig, EdgeShard,
    EdgeVectorParamsBuilder, HnswIndexConfig, OperationError, PointId, Record, ScoredPoint,
    ScrollRequest, SearchRequest, ShardInfo, UpdateOperation,
};
use tokio::sync::oneshot;

/// What went wrong, classified the way Qdrant answers it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// 404 / NOT_FOUND.
    #[error("Not found: Collection `{0}` doesn't exist!")]
    NoCollection(String),
    /// 404 / NOT_FOUND.
    #[error("Not found: Alias `{0}` doesn't exist!")]
    NoAlias(String),
    /// 409 / ALREADY_EXISTS.
    #[error("Wrong input: Collection `{0}` already exists!")]
    Exists(String),
    /// 400 / INVALID_ARGUMENT.
    #[error("Wrong input: {0}")]
    BadRequest(String),
    /// 500 / INTERNAL.
    #[error("Service internal error: {0}")]
    Internal(String),
}

impl From<OperationError> for StoreError {
    fn from(e: OperationError) -> Self {
        match e {
            OperationError::WrongVectorDimension { .. }
            | OperationError::VectorNameNotExists { .. }
            | OperationError::ValidationError { .. }
            | OperationError::TypeError { .. }
            | OperationError::WrongSparse
            | OperationError::WrongMulti => StoreError::BadRequest(e.to_string()),
            OperationError::PointIdError { .. } => StoreError::BadRequest(e.to_string()),
            other => StoreError::Internal(other.to_string()),
        }
    }
}

/// Vector parameters of a collection (one unnamed dense vector, as the benchmark uses).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VectorParams {
    /// Dimensions.
    pub size: usize,
    /// Similarity.
    pub distance: Distance,
}

struct WriteJob {
    op: UpdateOperation,
    durable: bool,
    done: Option<oneshot::Sender<Result<(), StoreError>>>,
}

/// One collection.
pub struct Collection {
    /// Its name.
    pub name: String,
    /// Its vectors.
    pub params: VectorParams,
    shard: Arc<EdgeShard>,
    writer: std::sync::Mutex<Option<mpsc::Sender<WriteJob>>>,
    writer_thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    dir: PathBuf,
}

impl Collection {
    fn open(name: &str, dir: PathBuf, shard: EdgeShard, params: VectorParams) -> Arc<Self> {
        let shard = Arc::new(shard);
        let (tx, rx) = mpsc::channel::<WriteJob>();
        let writer_shard = shard.clone();
        let thread_name = format!("writer-{name}");
        let handle = std::thread::Builder::new()
            .name(thread_name.chars().take(15).collect())
            .spawn(move || {
                for job in rx {
                    let mut result = writer_shard.update(job.op).map_err(StoreError::from);
                    if result.is_ok() && job.durable {
                        // WAL and segments on disk before `wait=true` is answered.
                        result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            writer_shard.flush()
                        }))
                        .map_err(|_| StoreError::Internal("flush failed".to_owned()));
                    }
                    match job.done {
                        Some(done) => {
                            let _ = done.send(result);
                        }
                        None => {
                            if let Err(e) = result {
                                tracing::warn!(error = %e, "asynchronous update failed");
                            }
                        }
                    }
                }
            })
            .expect("spawning a writer thread");
        Arc::new(Self {
            name: name.to_owned(),
            params,
            shard,
            writer: std::sync::Mutex::new(Some(tx)),
            writer_thread: std::sync::Mutex::new(Some(handle)),
            dir,
        })
    }

    /// Applies an update: with `wait`, after it is applied and flushed to disk; without, as
    /// soon as it is queued (Qdrant's `wait=false` acknowledges on acceptance).
    pub async fn update(&self, op: UpdateOperation, wait: bool) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        let job = WriteJob {
            op,
            durable: wait,
            done: wait.then_some(tx),
        };
        let sent = self
            .writer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|w| w.send(job).is_ok())
            .unwrap_or(false);
        if !sent {
            return Err(StoreError::NoCollection(self.name.clone()));
        }
        if wait {
            rx.await
                .map_err(|_| StoreError::Internal("writer stopped".to_owned()))?
        } else {
            Ok(())
        }
    }

    /// Waits until every queued write is applied and flushed.
    pub async fn flush(&self) -> Result<(), StoreError> {
        // An empty batch of deletions is a no-op write that still flushes.
        let op = UpdateOperation::PointOperation(qdrant_edge::PointOperations::DeletePoints {
            ids: Vec::new(),
        });
        self.update(op, true).await
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&EdgeShard) -> Result<T, OperationError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let shard = self.shard.clone();
        tokio::task::spawn_blocking(move || f(&shard))
            .await
            .map_err(|e| StoreError::Internal(format!("read task failed: {e}")))?
            .map_err(StoreError::from)
    }

    /// Exact point count.
    pub async fn count(&self) -> Result<usize, StoreError> {
        self.read(|s| {
            s.count(CountRequest {
                filter: None,
                exact: true,
            })
        })
        .await
    }

    /// Count with a filter.
    pub async fn count_filtered(&self, req: CountRequest) -> Result<usize, StoreError> {
        self.read(move |s| s.count(req)).await
    }

    /// Nearest-neighbour search.
    pub async fn search(&self, req: SearchRequest) -> Result<Vec<ScoredPoint>, StoreError> {
        self.read(move |s| s.search(req)).await
    }

    /// Points by id.
    pub async fn retrieve(
        &self,
        ids: Vec<PointId>,
        with_payload: bool,
        with_vector: bool,
    ) -> Result<Vec<Record>, StoreError> {
        self.read(move |s| {
            s.retrieve(
                &ids,
                Some(qdrant_edge::WithPayloadInterface::Bool(with_payload)),
                Some(qdrant_edge::WithVector::Bool(with_vector)),
            )
        })
        .await
    }

    /// A page of points in id order, and where the next page starts.
    pub async fn scroll(
        &self,
        req: ScrollRequest,
    ) -> Result<(Vec<Record>, Option<PointId>), StoreError> {
        self.read(move |s| s.scroll(req)).await
    }

    /// What the engine reports of the shard: counts and the payload indexes.
    pub async fn info(&self) -> Result<ShardInfo, StoreError> {
        self.read(|s| Ok(s.info())).await
    }

    /// The shard's configuration as the engine applies it (HNSW, optimizers, WAL).
    pub fn config(&self) -> EdgeConfig {
        self.shard.config().clone()
    }

    /// Qdrant's collection update: the given fields of `hnsw_config` and
    /// `optimizers_config` (each a JSON object in REST form, as a diff: absent or null
    /// fields keep their value) laid over the current settings; the engine persists them.
    /// A field the engine does not apply is refused by name, nothing changed.
    pub async fn update_config(
        &self,
        hnsw_diff: Option<serde_json::Map<String, serde_json::Value>>,
        optimizers_diff: Option<serde_json::Map<String, serde_json::Value>>,
    ) -> Result<(), StoreError> {
        let current = self.config();
        let hnsw = hnsw_diff
            .map(|diff| overlay::<HnswIndexConfig>(&current.hnsw_config, diff, "hnsw_config", &[]))
            .transpose()?;
        let optimizers = optimizers_diff
            .map(|diff| {
                overlay::<EdgeOptimizersConfig>(
                    &current.optimizers,
                    diff,
                    "optimizers_config",
                    // The engine flushes on `wait=true` and has no optimizer threads of
                    // its own; memmap_threshold is deprecated in Qdrant.
                    &[
                        "flush_interval_sec",
                        "max_optimization_threads",
                        "memmap_threshold",
                    ],
                )
            })
            .transpose()?;
        self.read(move |s| {
            if let Some(h) = hnsw {
                s.set_hnsw_config(h)?;
            }
            if let Some(o) = optimizers {
                s.set_optimizers_config(o)?;
            }
            Ok(())
        })
        .await
    }

    fn stop_writer(&self) {
        self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = self
            .writer_thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = h.join();
        }
    }
}

/// Every collection, persisted under one data folder.
pub struct Store {
    root: PathBuf,
    collections: RwLock<HashMap<String, Arc<Collection>>>,
    /// Alias name -> collection name, as Qdrant keeps them: any call that takes a
    /// collection name takes an alias too. Persisted in `aliases.json` beside the
    /// collections.
    aliases: RwLock<BTreeMap<String, String>>,
    aliases_file: PathBuf,
}

const PARAMS_FILE: &str = "embedded-qdrant.json";

/// One change of Qdrant's `POST /collections/aliases` (and `UpdateAliases` over gRPC).
#[derive(Clone, Debug, PartialEq)]
pub enum AliasChange {
    /// Points `alias` at `collection` (replacing where it pointed before).
    Create {
        /// The collection.
        collection: String,
        /// The alias.
        alias: String,
    },
    /// Removes an alias.
    Delete {
        /// The alias.
        alias: String,
    },
    /// Renames an alias, keeping its collection.
    Rename {
        /// Its name now.
        old: String,
        /// Its new name.
        new: String,
    },
}

impl Store {
    /// Opens (or creates) the data folder and loads every collection in it.
    pub fn open(root: &Path) -> anyhow::Result<Self> {
        let dir = root.join("collections");
        std::fs::create_dir_all(&dir)
            .map_err(|e| anyhow::anyhow!("cannot create data folder {}: {e}", dir.display()))?;
        let mut collections = HashMap::new();
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(text) = std::fs::read_to_string(path.join(PARAMS_FILE)) else {
                tracing::warn!(path = %path.display(), "skipping a folder without {PARAMS_FILE}");
                continue;
            };
            let params = parse_params(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.join(PARAMS_FILE).display()))?;
            let shard = EdgeShard::load(&path.join("shard"), None)
                .map_err(|e| anyhow::anyhow!("cannot load collection {name:?}: {e}"))?;
            tracing::info!(collection = %name, "loaded");
            collections.insert(name.clone(), Collection::open(&name, path, shard, params));
        }
        let aliases_file = root.join("aliases.json");
        let aliases: BTreeMap<String, String> = match std::fs::read_to_string(&aliases_file) {
            Ok(text) => serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", aliases_file.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => anyhow::bail!("cannot read {}: {e}", aliases_file.display()),
        };
        Ok(Self {
            root: dir,
            collections: RwLock::new(collections),
            aliases: RwLock::new(aliases),
            aliases_file,
        })
    }

    /// The collection named `name` or aliased by it, or 404.
    pub fn get(&self, name: &str) -> Result<Arc<Collection>, StoreError> {
        let collections = self.collections.read().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = collections.get(name) {
            return Ok(c.clone());
        }
        let aliases = self.aliases.read().unwrap_or_else(|p| p.into_inner());
        aliases
            .get(name)
            .and_then(|target| collections.get(target))
            .cloned()
            .ok_or_else(|| StoreError::NoCollection(name.to_owned()))
    }

    /// Every alias and its collection, or those of one collection, sorted by alias.
    pub fn aliases(&self, of: Option<&str>) -> Vec<(String, String)> {
        self.aliases
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, c)| of.is_none_or(|name| name == c.as_str()))
            .map(|(a, c)| (a.clone(), c.clone()))
            .collect()
    }

    /// Applies alias changes all or nothing, in order, as Qdrant does, and persists them.
    pub fn change_aliases(&self, changes: &[AliasChange]) -> Result<(), StoreError> {
        let collections = self.collections.read().unwrap_or_else(|p| p.into_inner());
        let mut aliases = self.aliases.write().unwrap_or_else(|p| p.into_inner());
        let mut next = aliases.clone();
        for change in changes {
            match change {
                AliasChange::Create { collection, alias } => {
                    if !collections.contains_key(collection) {
                        return Err(StoreError::NoCollection(collection.clone()));
                    }
                    if collections.contains_key(alias) {
                        return Err(StoreError::BadRequest(format!(
                            "Alias `{alias}` is the name of a collection"
                        )));
                    }
                    validate_name(alias)?;
                    next.insert(alias.clone(), collection.clone());
                }
                AliasChange::Delete { alias } => {
                    next.remove(alias)
                        .ok_or_else(|| StoreError::NoAlias(alias.clone()))?;
                }
                AliasChange::Rename { old, new } => {
                    let target = next
                        .remove(old)
                        .ok_or_else(|| StoreError::NoAlias(old.clone()))?;
                    validate_name(new)?;
                    next.insert(new.clone(), target);
                }
            }
        }
        write_json_atomically(&self.aliases_file, &next)?;
        *aliases = next;
        Ok(())
    }

    /// Every collection name, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .collections
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        v.sort();
        v
    }

    /// Creates a collection; 409 if it exists.
    pub fn create(&self, name: &str, params: VectorParams) -> Result<(), StoreError> {
        validate_name(name)?;
        if params.size == 0 || params.size > 65_536 {
            return Err(StoreError::BadRequest(format!(
                "vector size must be between 1 and 65536, got {}",
                params.size
            )));
        }
        let mut map = self.collections.write().unwrap_or_else(|p| p.into_inner());
        if map.contains_key(name) {
            return Err(StoreError::Exists(name.to_owned()));
        }
        let dir = self.root.join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("shard"))
            .map_err(|e| StoreError::Internal(format!("cannot create {}: {e}", dir.display())))?;
        let config = EdgeConfigBuilder::new()
            .vector(
                "",
                EdgeVectorParamsBuilder::new(params.size, params.distance).build(),
            )
            .build();
        let shard = EdgeShard::new(&dir.join("shard"), config)?;
        std::fs::write(dir.join(PARAMS_FILE), render_params(params)).map_err(|e| {
            StoreError::Internal(format!("cannot write collection parameters: {e}"))
        })?;
        map.insert(name.to_owned(), Collection::open(name, dir, shard, params));
        Ok(())
    }

    /// Deletes a collection, its aliases and its files; false if it did not exist.
    pub fn delete(&self, name: &str) -> bool {
        let removed = self
            .collections
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
        match removed {
            Some(c) => {
                let mut aliases = self.aliases.write().unwrap_or_else(|p| p.into_inner());
                if aliases.values().any(|target| target == name) {
                    aliases.retain(|_, target| target != name);
                    if let Err(e) = write_json_atomically(&self.aliases_file, &*aliases) {
                        tracing::warn!(error = %e, "cannot persist the aliases of a deleted collection");
                    }
                }
                drop(aliases);
                c.stop_writer();
                let dir = c.dir.clone();
                drop(c);
                let _ = std::fs::remove_dir_all(&dir);
                true
            }
            None => false,
        }
    }

    /// Flushes every collection (shutdown).
    pub async fn flush_all(&self) {
        let all: Vec<Arc<Collection>> = self
            .collections
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for c in all {
            if let Err(e) = c.flush().await {
                tracing::warn!(collection = %c.name, error = %e, "flush at shutdown failed");
            }
            c.stop_writer();
        }
    }
}

/// `current` with the non-null fields of `diff` laid over it, read back as `T`; a field in
/// `unapplied` is refused with its name.
fn overlay<T: serde::Serialize + serde::de::DeserializeOwned>(
    current: &T,
    diff: serde_json::Map<String, serde_json::Value>,
    what: &str,
    unapplied: &[&str],
) -> Result<T, StoreError> {
    let mut merged = match serde_json::to_value(current) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    for (key, value) in diff {
        if value.is_null() {
            continue;
        }
        if unapplied.contains(&key.as_str()) {
            return Err(StoreError::BadRequest(format!(
                "{what}.{key} is not applied by embedded-qdrant"
            )));
        }
        merged.insert(key, value);
    }
    serde_json::from_value(serde_json::Value::Object(merged))
        .map_err(|e| StoreError::BadRequest(format!("{what}: {e}")))
}

/// Writes `value` as JSON to a temporary file and renames it over `path`, so a crash
/// leaves the old file or the new one, never half of one.
fn write_json_atomically(path: &Path, value: &impl serde::Serialize) -> Result<(), StoreError> {
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string(value)
        .map_err(|e| StoreError::Internal(format!("cannot encode {}: {e}", path.display())))?;
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| StoreError::Internal(format!("cannot write {}: {e}", path.display())))
}

fn validate_name(name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        && name != "."
        && name != "..";
    if ok {
        Ok(())
    } else {
        Err(StoreError::BadRequest(format!(
            "collection name {name:?} must be 1-255 characters of letters, digits, '_', '-' and '.'"
        )))
    }
}

/// Qdrant's distance names.
pub fn parse_distance(s: &str) -> Option<Distance> {
    match s.to_ascii_lowercase().as_str() {
        "cosine" => Some(Distance::Cosine),
        "euclid" => Some(Distance::Euclid),
        "dot" => Some(Distance::Dot),
        "manhattan" => Some(Distance::Manhattan),
        _ => None,
    }
}

/// The name Qdrant's REST API uses for a distance.
pub fn distance_name(d: Distance) -> &'static str {
    match d {
        Distance::Cosine => "Cosine",
        Distance::Euclid => "Euclid",
        Distance::Dot => "Dot",
        Distance::Manhattan => "Manhattan",
    }
}

fn render_params(p: VectorParams) -> String {
    serde_json::json!({"size": p.size, "distance": distance_name(p.distance)}).to_string()
}

fn parse_params(text: &str) -> Result<VectorParams, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let size = v["size"].as_u64().ok_or("size missing")? as usize;
    let distance = v["distance"]
        .as_str()
        .and_then(parse_distance)
        .ok_or("distance missing or unknown")?;
    Ok(VectorParams { size, distance })
}
