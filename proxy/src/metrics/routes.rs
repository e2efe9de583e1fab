//! The REST routes of Qdrant and Chroma as patterns (`PUT /collections/{collection_name}/points`,
//! `POST /api/v2/tenants/{tenant}/databases/{database}/collections/{collection_id}/add`), so
//! that per-method metrics name a route and never a raw path: the label set is this table plus
//! `other`, whatever clients send. Taken from Qdrant's OpenAPI specification (1.x) and the
//! paths chromadb's HttpClient (1.5) calls; a route they lack is counted as `other`.

use std::sync::OnceLock;

use http::Method;

/// `(method, pattern)`; `{...}` stands for one path segment. More specific patterns come
/// before the ones they would also match (`/collections/aliases` before
/// `/collections/{collection_name}`).
const ROUTES: &[(&str, &str)] = &[
    ("GET", "/"),
    ("GET", "/healthz"),
    ("GET", "/livez"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/telemetry"),
    ("GET", "/locks"),
    ("POST", "/locks"),
    ("GET", "/issues"),
    ("DELETE", "/issues"),
    ("GET", "/cluster"),
    ("GET", "/cluster/telemetry"),
    ("POST", "/cluster/recover"),
    ("DELETE", "/cluster/peer/{peer_id}"),
    ("GET", "/collections"),
    ("GET", "/collections/aliases"),
    ("POST", "/collections/aliases"),
    ("GET", "/collections/{collection_name}"),
    ("PUT", "/collections/{collection_name}"),
    ("PATCH", "/collections/{collection_name}"),
    ("DELETE", "/collections/{collection_name}"),
    ("GET", "/collections/{collection_name}/exists"),
    ("GET", "/collections/{collection_name}/aliases"),
    ("PUT", "/collections/{collection_name}/index"),
    (
        "DELETE",
        "/collections/{collection_name}/index/{field_name}",
    ),
    ("GET", "/collections/{collection_name}/cluster"),
    ("POST", "/collections/{collection_name}/cluster"),
    ("PUT", "/collections/{collection_name}/shards"),
    ("POST", "/collections/{collection_name}/shards/delete"),
    ("GET", "/collections/{collection_name}/snapshots"),
    ("POST", "/collections/{collection_name}/snapshots"),
    ("PUT", "/collections/{collection_name}/snapshots/recover"),
    ("POST", "/collections/{collection_name}/snapshots/upload"),
    (
        "GET",
        "/collections/{collection_name}/snapshots/{snapshot_name}",
    ),
    (
        "DELETE",
        "/collections/{collection_name}/snapshots/{snapshot_name}",
    ),
    (
        "GET",
        "/collections/{collection_name}/shards/{shard_id}/snapshots",
    ),
    (
        "POST",
        "/collections/{collection_name}/shards/{shard_id}/snapshots",
    ),
    (
        "PUT",
        "/collections/{collection_name}/shards/{shard_id}/snapshots/recover",
    ),
    (
        "POST",
        "/collections/{collection_name}/shards/{shard_id}/snapshots/upload",
    ),
    (
        "GET",
        "/collections/{collection_name}/shards/{shard_id}/snapshots/{snapshot_name}",
    ),
    (
        "DELETE",
        "/collections/{collection_name}/shards/{shard_id}/snapshots/{snapshot_name}",
    ),
    ("GET", "/snapshots"),
    ("POST", "/snapshots"),
    ("GET", "/snapshots/{snapshot_name}"),
    ("DELETE", "/snapshots/{snapshot_name}"),
    ("PUT", "/collections/{collection_name}/points"),
    ("POST", "/collections/{collection_name}/points"),
    ("POST", "/collections/{collection_name}/points/delete"),
    ("PUT", "/collections/{collection_name}/points/vectors"),
    (
        "POST",
        "/collections/{collection_name}/points/vectors/delete",
    ),
    ("POST", "/collections/{collection_name}/points/payload"),
    ("PUT", "/collections/{collection_name}/points/payload"),
    (
        "POST",
        "/collections/{collection_name}/points/payload/delete",
    ),
    (
        "POST",
        "/collections/{collection_name}/points/payload/clear",
    ),
    ("POST", "/collections/{collection_name}/points/batch"),
    ("POST", "/collections/{collection_name}/points/scroll"),
    ("POST", "/collections/{collection_name}/points/search"),
    ("POST", "/collections/{collection_name}/points/search/batch"),
    (
        "POST",
        "/collections/{collection_name}/points/search/groups",
    ),
    (
        "POST",
        "/collections/{collection_name}/points/search/matrix/pairs",
    ),
    (
        "POST",
        "/collections/{collection_name}/points/search/matrix/offsets",
    ),
    ("POST", "/collections/{collection_name}/points/recommend"),
    (
        "POST",
        "/collections/{collection_name}/points/recommend/batch",
    ),
    (
        "POST",
        "/collections/{collection_name}/points/recommend/groups",
    ),
    ("POST", "/collections/{collection_name}/points/discover"),
    (
        "POST",
        "/collections/{collection_name}/points/discover/batch",
    ),
    ("POST", "/collections/{collection_name}/points/count"),
    ("POST", "/collections/{collection_name}/points/query"),
    ("POST", "/collections/{collection_name}/points/query/batch"),
    ("POST", "/collections/{collection_name}/points/query/groups"),
    ("POST", "/collections/{collection_name}/facet"),
    ("GET", "/collections/{collection_name}/points/{id}"),
    // Chroma's API v2.
    ("GET", "/api/v2/heartbeat"),
    ("GET", "/api/v2/version"),
    ("GET", "/api/v2/healthcheck"),
    ("GET", "/api/v2/pre-flight-checks"),
    ("GET", "/api/v2/auth/identity"),
    ("POST", "/api/v2/reset"),
    ("POST", "/api/v2/tenants"),
    ("GET", "/api/v2/tenants/{tenant}"),
    ("GET", "/api/v2/tenants/{tenant}/databases"),
    ("POST", "/api/v2/tenants/{tenant}/databases"),
    ("GET", "/api/v2/tenants/{tenant}/databases/{database}"),
    ("DELETE", "/api/v2/tenants/{tenant}/databases/{database}"),
    (
        "GET",
        "/api/v2/tenants/{tenant}/databases/{database}/collections",
    ),
    (
        "POST",
        "/api/v2/tenants/{tenant}/databases/{database}/collections",
    ),
    (
        "GET",
        "/api/v2/tenants/{tenant}/databases/{database}/collections_count",
    ),
    (
        "GET",
        "/api/v2/tenants/{tenant}/databases/{database}/collections/by-id/{collection_id}",
    ),
    (
        "GET",
        "/api/v2/tenants/{tenant}/databases/{database}/collections/{collection_id}",
    ),
    (
        "PUT",
        "/api/v2/tenants/{tenant}/databases/{database}/collections/{collection_id}",
    ),
    (
        "DELETE",
        "/api/v2/tenants/{tenant}/databases/{database}/collections/{collection_id}",
    ),
    (
        "POST",
        "/api/v2/tenants/{tenant}/databases/{database}/collections/{collection_id}/add",
    ),
    (
        "POST",
        "/api/v2/tenants/{tenant}/databases/{database}/collections/{collection_id}/update",
    ),
    (
        "POST",
        "/api/v2/tenants/{tenant}/databases/{database}/collections/{collection_id}/upsert",
    ),
    (
        "POST",
        "/api/v2/tenants/{tenant}/databases/{database}/collections/{collection_id}/get",
    ),
    (
        "POST",
        "/api/v2/tenants/{tenant}/databases/{database}/collections/{collection_id}/query",
    ),
    (
        "POST",
        "/api/v2/tenants/{tenant}/databases/{database}/collections/{collection_id}/search",
    ),
    (
        "POST",
        "/api/v2/tenants/{tenant}/databases/{database}/collections/{collection_id}/delete",
    ),
    (
        "GET",
        "/api/v2/tenants/{tenant}/databases/{database}/collections/{collection_id}/count",
    ),
    (
        "POST",
        "/api/v2/tenants/{tenant}/databases/{database}/collections/{collection_id}/fork",
    ),
];

/// A route: its method, its segments (`None` for a `{...}` placeholder), its label, and
/// which segment names the collection.
struct Route {
    method: Method,
    segments: Vec<Option<&'static str>>,
    label: String,
    collection_at: Option<usize>,
}

fn routes() -> &'static [Route] {
    static ROUTES_PARSED: OnceLock<Vec<Route>> = OnceLock::new();
    ROUTES_PARSED.get_or_init(|| {
        ROUTES
            .iter()
            .map(|(method, pattern)| {
                let segments: Vec<Option<&'static str>> = pattern
                    .split('/')
                    .filter(|s| !s.is_empty())
                    .map(|s| (!s.starts_with('{')).then_some(s))
                    .collect();
                Route {
                    method: method.parse().expect("a method"),
                    collection_at: pattern
                        .split('/')
                        .filter(|s| !s.is_empty())
                        .position(|s| s == "{collection_name}" || s == "{collection_id}"),
                    segments,
                    label: format!("{method} {pattern}"),
                }
            })
            .collect()
    })
}

/// The route `method path` takes, as its label (`PUT /collections/{collection_name}/points`)
/// and the collection it names, if any; `None` for a path that is no route of the table.
pub fn route<'p>(method: &Method, path: &'p str) -> Option<(&'static str, Option<&'p str>)> {
    let trimmed = path.trim_end_matches('/');
    let count = trimmed.split('/').filter(|s| !s.is_empty()).count();
    routes().iter().find_map(|r| {
        if r.method != method || r.segments.len() != count {
            return None;
        }
        let mut collection = None;
        for (i, (want, got)) in r
            .segments
            .iter()
            .zip(trimmed.split('/').filter(|s| !s.is_empty()))
            .enumerate()
        {
            match want {
                Some(fixed) if *fixed != got => return None,
                Some(_) => {}
                None if r.collection_at == Some(i) => collection = Some(got),
                None => {}
            }
        }
        Some((r.label.as_str(), collection))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_become_route_patterns() {
        let put = Method::PUT;
        let post = Method::POST;
        assert_eq!(
            route(&put, "/collections/vectors/points"),
            Some(("PUT /collections/{collection_name}/points", Some("vectors")))
        );
        assert_eq!(
            route(&post, "/collections/vectors/points/search/batch"),
            Some((
                "POST /collections/{collection_name}/points/search/batch",
                Some("vectors")
            ))
        );
        assert_eq!(
            route(&Method::GET, "/collections/aliases"),
            Some(("GET /collections/aliases", None))
        );
        assert_eq!(
            route(&Method::GET, "/collections/c/points/42"),
            Some(("GET /collections/{collection_name}/points/{id}", Some("c")))
        );
        assert_eq!(route(&Method::GET, "/"), Some(("GET /", None)));
        assert_eq!(route(&Method::GET, "/readyz/"), Some(("GET /readyz", None)));
        assert_eq!(
            route(&post, "/api/v2/tenants/t/databases/d/collections/5f1c/add"),
            Some((
                "POST /api/v2/tenants/{tenant}/databases/{database}/collections/{collection_id}/add",
                Some("5f1c")
            ))
        );
        assert_eq!(route(&post, "/collections/c/nothing"), None);
        assert_eq!(route(&Method::GET, "/etc/passwd"), None);
    }

    #[test]
    fn every_pattern_is_reachable() {
        for r in routes() {
            let path: String = r
                .segments
                .iter()
                .map(|s| format!("/{}", s.unwrap_or("x")))
                .collect();
            let path = if path.is_empty() {
                "/".to_owned()
            } else {
                path
            };
            let (label, _) = route(&r.method, &path).unwrap();
            assert_eq!(label, r.label, "{path} is taken by an earlier pattern");
        }
    }
}
