//! Metrics per API method: requests by status, latency and bytes each way, by gRPC method
//! (`qdrant.Points/Upsert`, `milvus.proto.milvus.MilvusService/Insert`, any service) and by
//! REST route of Qdrant's API (`routes.rs`), optionally by collection too. Every label value
//! comes from a bounded set: at most `max_methods` methods and `max_collections` collections
//! per listener are named, the rest are counted as `other`, whatever clients send.
//!
//! A method's handles are resolved once, when it is first seen, and kept: a request looks
//! its method up under a read lock and clones an `Arc`, with no allocation.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use http::Method;
use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec};

use super::{Metrics, Registrar, REQUEST_BUCKETS};

/// The label of a method or collection beyond the bounds, or not one of the table's.
pub const OTHER: &str = "other";
/// The longest gRPC method name taken as a label.
const MAX_GRPC_METHOD_LEN: usize = 128;

/// How a listener counts per method (`[listener.method_metrics]`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MethodMetricsConfig {
    /// Count per method at all.
    pub enabled: bool,
    /// Add the collection a REST route names as a label (gRPC calls carry it inside the
    /// message, which the proxy does not parse: their label is empty).
    pub collection_label: bool,
    /// Distinct methods named per listener; the rest are `other`.
    pub max_methods: usize,
    /// Distinct collections named per listener; the rest are `other`.
    pub max_collections: usize,
}

impl Default for MethodMetricsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            collection_label: false,
            max_methods: 100,
            max_collections: 20,
        }
    }
}

/// The families, registered once.
#[derive(Clone)]
pub(super) struct MethodVecs {
    requests: IntCounterVec,
    seconds: HistogramVec,
    request_bytes: IntCounterVec,
    response_bytes: IntCounterVec,
}

impl MethodVecs {
    pub(super) fn register(r: &Registrar<'_>) -> Self {
        let labels = &["listener", "method", "collection"];
        Self {
            requests: r.counter_vec(
                "proxy_method_requests_total",
                "Requests by API method (a gRPC method, or a route of Qdrant's REST API such as `PUT /collections/{collection_name}/points`; other: beyond max_methods or no known route), collection (empty unless collection_label is on), HTTP status and grpc-status.",
                &["listener", "method", "collection", "status", "grpc_status"],
            ),
            seconds: r.histogram_vec(
                "proxy_method_request_duration_seconds",
                "Time from a request's head to its response's head, by API method.",
                REQUEST_BUCKETS.to_vec(),
                labels,
            ),
            request_bytes: r.counter_vec(
                "proxy_method_request_bytes_total",
                "Request body bytes by API method.",
                labels,
            ),
            response_bytes: r.counter_vec(
                "proxy_method_response_bytes_total",
                "Response body bytes by API method.",
                labels,
            ),
        }
    }
}

/// One method's (and collection's) handles.
#[derive(Debug)]
pub struct MethodHandles {
    listener: Arc<str>,
    /// The method's label.
    pub method: Arc<str>,
    collection: Arc<str>,
    requests: IntCounterVec,
    /// Head-to-head time.
    pub seconds: Histogram,
    /// Request body bytes.
    pub request_bytes: IntCounter,
    /// Response body bytes.
    pub response_bytes: IntCounter,
}

impl MethodHandles {
    /// One request answered with `status` (and, for gRPC, `grpc_status`; empty otherwise).
    pub fn count(&self, status: http::StatusCode, grpc_status: &str) {
        self.requests
            .with_label_values(&[
                &self.listener,
                &self.method,
                &self.collection,
                status.as_str(),
                grpc_status,
            ])
            .inc();
    }
}

/// A method's handles, and its handles per collection.
struct Known {
    handles: Arc<MethodHandles>,
    by_collection: HashMap<Box<str>, Arc<MethodHandles>>,
}

/// One listener's per-method metrics.
pub struct MethodMetrics {
    listener: Arc<str>,
    vecs: MethodVecs,
    config: MethodMetricsConfig,
    known: RwLock<HashMap<Box<str>, Known>>,
    collections: RwLock<HashSet<Box<str>>>,
}

impl MethodMetrics {
    /// The handles of the request's method (and collection): `path` is a gRPC method's path
    /// for gRPC calls, else a REST path.
    pub fn resolve(&self, method: &Method, path: &str, grpc: bool) -> Arc<MethodHandles> {
        let (label, collection) = if grpc {
            (grpc_method(path), None)
        } else {
            match super::routes::route(method, path) {
                Some((label, collection)) => (label, collection),
                None => (OTHER, None),
            }
        };
        let collection = collection
            .filter(|_| self.config.collection_label)
            .map(|c| self.collection_label(c));
        if let Some(found) = self.lookup(label, collection) {
            return found;
        }
        let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
        let label = if known.contains_key(label) || known.len() < self.config.max_methods {
            label
        } else {
            OTHER
        };
        let entry = known.entry(label.into()).or_insert_with(|| Known {
            handles: self.handles(label, ""),
            by_collection: HashMap::new(),
        });
        match collection {
            None => entry.handles.clone(),
            Some(c) => entry
                .by_collection
                .entry(c.into())
                .or_insert_with(|| self.handles(label, c))
                .clone(),
        }
    }

    fn lookup(&self, label: &str, collection: Option<&str>) -> Option<Arc<MethodHandles>> {
        let known = self.known.read().unwrap_or_else(|e| e.into_inner());
        let entry = known.get(label)?;
        match collection {
            None => Some(entry.handles.clone()),
            Some(c) => entry.by_collection.get(c).cloned(),
        }
    }

    /// `name` if it is one of the collections named so far or there is room for it, else
    /// [`OTHER`].
    fn collection_label<'a>(&self, name: &'a str) -> &'a str {
        if self
            .collections
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(name)
        {
            return name;
        }
        let mut named = self.collections.write().unwrap_or_else(|e| e.into_inner());
        if named.len() < self.config.max_collections && is_label_safe(name) {
            named.insert(name.into());
            return name;
        }
        if named.contains(name) {
            name
        } else {
            OTHER
        }
    }

    fn handles(&self, method: &str, collection: &str) -> Arc<MethodHandles> {
        let labels = [&*self.listener, method, collection];
        Arc::new(MethodHandles {
            listener: self.listener.clone(),
            method: Arc::from(method),
            collection: Arc::from(collection),
            requests: self.vecs.requests.clone(),
            seconds: self.vecs.seconds.with_label_values(&labels),
            request_bytes: self.vecs.request_bytes.with_label_values(&labels),
            response_bytes: self.vecs.response_bytes.with_label_values(&labels),
        })
    }
}

/// A gRPC path's method (`/qdrant.Points/Upsert` -> `qdrant.Points/Upsert`), or [`OTHER`]
/// for a path that is not `/package.Service/Method` in label-safe characters.
fn grpc_method(path: &str) -> &str {
    let method = path.strip_prefix('/').unwrap_or(path);
    let well_formed = method.len() <= MAX_GRPC_METHOD_LEN
        && method.split('/').count() == 2
        && is_label_safe(method);
    if well_formed {
        method
    } else {
        OTHER
    }
}

fn is_label_safe(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_GRPC_METHOD_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'))
}

impl Metrics {
    /// Listener `listener`'s per-method metrics, or `None` when `config` turns them off. A
    /// reload that keeps the settings keeps the methods named so far, so that the bounds
    /// hold across reloads too.
    pub fn methods(
        &self,
        listener: &str,
        config: &MethodMetricsConfig,
    ) -> Option<Arc<MethodMetrics>> {
        if !config.enabled {
            return None;
        }
        let mut running = self
            .methods_by_listener
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        running.retain(|_, m| m.strong_count() > 0);
        if let Some(m) = running.get(listener).and_then(std::sync::Weak::upgrade) {
            if m.config == *config {
                return Some(m);
            }
        }
        let m = Arc::new(MethodMetrics {
            listener: Arc::from(listener),
            vecs: self.methods.clone(),
            config: config.clone(),
            known: RwLock::new(HashMap::new()),
            collections: RwLock::new(HashSet::new()),
        });
        running.insert(listener.to_owned(), Arc::downgrade(&m));
        Some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(config: MethodMetricsConfig) -> Arc<MethodMetrics> {
        Metrics::new().methods("l", &config).unwrap()
    }

    #[test]
    fn methods_are_named_within_their_bounds() {
        let m = metrics(MethodMetricsConfig {
            max_methods: 3,
            ..MethodMetricsConfig::default()
        });
        let upsert = m.resolve(&Method::POST, "/qdrant.Points/Upsert", true);
        assert_eq!(&*upsert.method, "qdrant.Points/Upsert");
        assert!(Arc::ptr_eq(
            &upsert,
            &m.resolve(&Method::POST, "/qdrant.Points/Upsert", true)
        ));
        let rest = m.resolve(&Method::PUT, "/collections/vectors/points", false);
        assert_eq!(&*rest.method, "PUT /collections/{collection_name}/points");
        assert_eq!(&*rest.collection, "");
        assert_eq!(
            &*m.resolve(&Method::GET, "/no/such/route", false).method,
            OTHER
        );
        // The bound: three named (other is one of them), the rest are other.
        assert_eq!(
            &*m.resolve(&Method::POST, "/qdrant.Points/Search", true)
                .method,
            OTHER
        );
        assert_eq!(&*m.resolve(&Method::POST, "/x.Y/Z\n", true).method, OTHER);
        assert_eq!(&*m.resolve(&Method::POST, "/a/b/c", true).method, OTHER);
    }

    #[test]
    fn collections_are_labels_only_when_asked_and_bounded() {
        let m = metrics(MethodMetricsConfig {
            collection_label: true,
            max_collections: 2,
            ..MethodMetricsConfig::default()
        });
        let path = |c: &str| format!("/collections/{c}/points");
        assert_eq!(&*m.resolve(&Method::PUT, &path("a"), false).collection, "a");
        assert_eq!(&*m.resolve(&Method::PUT, &path("b"), false).collection, "b");
        assert_eq!(
            &*m.resolve(&Method::PUT, &path("c"), false).collection,
            OTHER
        );
        assert_eq!(&*m.resolve(&Method::PUT, &path("a"), false).collection, "a");
        assert_eq!(
            &*m.resolve(&Method::POST, "/qdrant.Points/Upsert", true)
                .collection,
            ""
        );
    }
}
