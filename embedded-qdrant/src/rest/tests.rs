//! The handlers' shapes where the official clients' lists (tests/tools/interop.rs,
//! tests/qdrant_compat.rs) do not reach: rejections, the key, the envelope of every
//! error, routes not served. Each test runs the real router over a real store in a
//! scratch folder, called as a service (no socket: the server loop is covered end to end
//! by the binary's tests).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use axum::body::Body;
use axum::Router;
use http::{header, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::{router_with_body_limit, Rest};
use crate::store::Store;

struct Server {
    routes: Router,
    _data: tempfile::TempDir,
}

fn server(api_key: Option<&str>, body_limit: usize) -> Server {
    let data = tempfile::tempdir().unwrap();
    let rest = Rest {
        store: Arc::new(Store::open(data.path()).unwrap()),
        operation_ids: Arc::new(AtomicU64::new(0)),
        api_key: api_key.map(|k| crate::auth::ApiKey::new(k.to_owned())),
    };
    Server {
        routes: router_with_body_limit(Arc::new(rest), body_limit),
        _data: data,
    }
}

/// What a call answered: status, Content-Type and body (JSON when it parses).
struct Answer {
    status: StatusCode,
    content_type: String,
    json: Value,
    text: String,
}

impl Server {
    async fn call(&self, method: &str, path: &str, body: &str, key: Option<&str>) -> Answer {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(key) = key {
            req = req.header("api-key", key);
        }
        let req = req.body(Body::from(body.to_owned())).unwrap();
        let res = self.routes.clone().oneshot(req).await.unwrap();
        let status = res.status();
        let content_type = res
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        Answer {
            status,
            content_type,
            json: serde_json::from_str(&text).unwrap_or(Value::Null),
            text,
        }
    }

    async fn ask(&self, method: &str, path: &str, body: &str) -> Answer {
        self.call(method, path, body, None).await
    }
}

impl Answer {
    /// The error message of Qdrant's error envelope, checking the envelope's shape.
    fn error(&self) -> &str {
        assert_eq!(self.content_type, "application/json", "{}", self.text);
        assert!(self.json["time"].is_f64(), "no time: {}", self.text);
        self.json["status"]["error"]
            .as_str()
            .unwrap_or_else(|| panic!("not an error envelope: {}", self.text))
    }

    /// Checks a refusal: its status and the message of Qdrant's error envelope.
    fn refused(&self, status: StatusCode, message: impl AsRef<str>) {
        assert_eq!(self.status, status, "{}", self.text);
        assert_eq!(self.error(), message.as_ref());
    }

    /// The result of Qdrant's success envelope, checking the envelope's shape.
    fn result(&self) -> &Value {
        assert_eq!(self.status, StatusCode::OK, "{}", self.text);
        assert_eq!(self.json["status"], "ok", "{}", self.text);
        assert!(self.json["time"].is_f64(), "no time: {}", self.text);
        &self.json["result"]
    }
}

const CREATE_4D: &str = r#"{"vectors": {"size": 4, "distance": "Cosine"}}"#;
const UPSERT_2: &str = r#"{"points": [
    {"id": 1, "vector": [1, 0, 0, 0], "payload": {"k": "a"}},
    {"id": 2, "vector": [0, 1, 0, 0], "payload": {"k": "b"}}]}"#;

#[tokio::test(flavor = "multi_thread")]
async fn the_key_is_asked_of_every_route_but_the_health_checks_before_the_body_is_read() {
    let s = server(Some("s3cret"), 1024);
    for path in ["/healthz", "/livez", "/readyz"] {
        let a = s.ask("GET", path, "").await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.content_type, "text/plain");
        assert_eq!(a.text, "healthz check passed");
    }
    // Unrouted paths and bodies that would not parse are refused for the key first, as
    // Qdrant's middleware does.
    for (method, path, body) in [
        ("GET", "/", ""),
        ("GET", "/collections", ""),
        ("PUT", "/collections/c", "{not json"),
        ("GET", "/no/such/route", ""),
    ] {
        let a = s.ask(method, path, body).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{method} {path}");
        assert_eq!(a.error(), crate::auth::REFUSAL);
    }
    let a = s.call("GET", "/collections", "", Some("s3cret")).await;
    assert_eq!(a.result(), &json!({"collections": []}));
    let a = s.call("GET", "/collections", "", Some("wrong")).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread")]
async fn bodies_that_do_not_parse_or_have_wrong_types_are_format_errors() {
    let s = server(None, 1 << 20);
    for body in [
        "{not json",
        r#"{"vectors": {"size": "four", "distance": "Cosine"}}"#,
        r#"{"vectors": {"distance": "Cosine"}}"#,
        "",
    ] {
        let a = s.ask("PUT", "/collections/c", body).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{body}");
        assert!(
            a.error().starts_with("Format error in JSON body: "),
            "{}",
            a.text
        );
    }
    let a = s
        .ask(
            "PUT",
            "/collections/c",
            r#"{"vectors": {"size": 4, "distance": "Hamming"}}"#,
        )
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(a
        .error()
        .starts_with("Wrong input: unknown distance \"Hamming\""));
    // Nothing was created by any of them.
    let a = s.ask("GET", "/collections", "").await;
    assert_eq!(a.result(), &json!({"collections": []}));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_collection_is_a_404_on_every_route_that_names_one() {
    let s = server(None, 1 << 20);
    for (method, path, body) in [
        ("GET", "/collections/nope", ""),
        ("PATCH", "/collections/nope", "{}"),
        ("GET", "/collections/nope/aliases", ""),
        ("PUT", "/collections/nope/points", UPSERT_2),
        ("POST", "/collections/nope/points", r#"{"ids": [1]}"#),
        ("POST", "/collections/nope/points/count", ""),
        ("POST", "/collections/nope/points/scroll", ""),
        (
            "POST",
            "/collections/nope/points/search",
            r#"{"vector": [1, 0, 0, 0]}"#,
        ),
        ("POST", "/collections/nope/points/query", r#"{"query": 1}"#),
        (
            "POST",
            "/collections/nope/points/delete",
            r#"{"points": [1]}"#,
        ),
        ("DELETE", "/collections/nope/index/k", ""),
    ] {
        let a = s.ask(method, path, body).await;
        assert_eq!(
            a.status,
            StatusCode::NOT_FOUND,
            "{method} {path}: {}",
            a.text
        );
        assert_eq!(a.error(), "Not found: Collection `nope` doesn't exist!");
    }
    let a = s.ask("GET", "/collections/nope/exists", "").await;
    assert_eq!(a.result(), &json!({"exists": false}));
    let a = s.ask("DELETE", "/collections/nope", "").await;
    assert_eq!(a.result(), &json!(false));
}

#[tokio::test(flavor = "multi_thread")]
async fn routes_and_methods_not_served_get_qdrants_404_envelope() {
    let s = server(None, 1 << 20);
    for (method, path) in [
        ("GET", "/no/such/route"),
        ("POST", "/collections"),
        ("DELETE", "/collections/c/points"),
        ("GET", "/collections/c/points/search"),
        ("POST", "/collections/c/"),
    ] {
        let a = s.ask(method, path, "").await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{method} {path}");
        assert_eq!(
            a.error(),
            format!("Not found: {method} {path} is not served by embedded-qdrant")
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_answer_operation_ids_and_wait_decides_completed_or_acknowledged() {
    let s = server(None, 1 << 20);
    assert_eq!(
        s.ask("PUT", "/collections/c", CREATE_4D).await.result(),
        &json!(true)
    );
    let a = s.ask("PUT", "/collections/c", CREATE_4D).await;
    a.refused(
        StatusCode::CONFLICT,
        "Wrong input: Collection `c` already exists!",
    );

    let a = s
        .ask("PUT", "/collections/c/points?wait=true", UPSERT_2)
        .await;
    assert_eq!(
        a.result(),
        &json!({"operation_id": 0, "status": "completed"})
    );
    let a = s
        .ask(
            "POST",
            "/collections/c/points/payload?wait",
            r#"{"payload": {"x": 1}, "points": [1]}"#,
        )
        .await;
    assert_eq!(
        a.result(),
        &json!({"operation_id": 1, "status": "completed"})
    );
    let a = s
        .ask(
            "POST",
            "/collections/c/points/payload",
            r#"{"payload": {"x": 1}}"#,
        )
        .await;
    a.refused(
        StatusCode::BAD_REQUEST,
        "Wrong input: either points or filter is required",
    );
    let a = s
        .ask(
            "PUT",
            "/collections/c/points/payload?wait=true",
            r#"{"payload": {"y": 2}, "points": [1]}"#,
        )
        .await;
    assert_eq!(a.result()["status"], "completed");
    // PUT replaced the payload; POST had added to it.
    let a = s
        .ask(
            "POST",
            "/collections/c/points",
            r#"{"ids": [1], "with_payload": true}"#,
        )
        .await;
    assert_eq!(a.result()[0]["payload"], json!({"y": 2}));

    let a = s.ask("POST", "/collections/c/points/count", "").await;
    assert_eq!(a.result(), &json!({"count": 2}));
    let a = s
        .ask(
            "POST",
            "/collections/c/points/delete?wait=true",
            r#"{"points": [2]}"#,
        )
        .await;
    assert_eq!(a.result()["operation_id"], 3);
    let a = s
        .ask("POST", "/collections/c/points/count", r#"{"exact": true}"#)
        .await;
    assert_eq!(a.result(), &json!({"count": 1}));
    let a = s.ask("POST", "/collections/c/points/scroll", "").await;
    assert_eq!(a.result()["points"].as_array().unwrap().len(), 1);
    assert_eq!(a.result()["next_page_offset"], Value::Null);
}

#[tokio::test(flavor = "multi_thread")]
async fn searches_check_the_vector_and_queries_by_id_need_the_point() {
    let s = server(None, 1 << 20);
    s.ask("PUT", "/collections/c", CREATE_4D).await.result();
    s.ask("PUT", "/collections/c/points?wait=true", UPSERT_2)
        .await
        .result();

    let a = s
        .ask(
            "POST",
            "/collections/c/points/search",
            r#"{"vector": [1, 0, 0], "limit": 1}"#,
        )
        .await;
    a.refused(
        StatusCode::BAD_REQUEST,
        "Wrong input: Vector dimension error: expected dim: 4, got 3",
    );
    // search answers a bare list; query the same points under "points".
    let a = s
        .ask(
            "POST",
            "/collections/c/points/search",
            r#"{"vector": [1, 0, 0, 0], "limit": 1}"#,
        )
        .await;
    assert_eq!(a.result()[0]["id"], 1);
    let a = s
        .ask(
            "POST",
            "/collections/c/points/query",
            r#"{"query": {"nearest": 2}, "limit": 1}"#,
        )
        .await;
    assert_eq!(a.result()["points"][0]["id"], 2);
    let a = s
        .ask("POST", "/collections/c/points/query", r#"{"query": 7}"#)
        .await;
    a.refused(StatusCode::NOT_FOUND, "Not found: No point with id 7");
}

#[tokio::test(flavor = "multi_thread")]
async fn collection_updates_refuse_what_the_engine_cannot_apply_by_name() {
    let s = server(None, 1 << 20);
    s.ask("PUT", "/collections/c", CREATE_4D).await.result();
    let a = s
        .ask(
            "PATCH",
            "/collections/c",
            r#"{"params": {"replication_factor": 2}}"#,
        )
        .await;
    a.refused(
        StatusCode::BAD_REQUEST,
        "Wrong input: updating params is not supported by embedded-qdrant",
    );
    let a = s
        .ask(
            "PATCH",
            "/collections/c",
            r#"{"hnsw_config": {"m": 32}, "params": null}"#,
        )
        .await;
    assert_eq!(a.result(), &json!(true));
    let a = s.ask("GET", "/collections/c", "").await;
    assert_eq!(a.result()["config"]["hnsw_config"]["m"], 32);
    let a = s.ask("DELETE", "/collections/c/index/a%5B", "").await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.text);
    assert!(a.error().ends_with("is not a payload key"), "{}", a.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn aliases_are_changed_together_and_listed_per_collection() {
    let s = server(None, 1 << 20);
    s.ask("PUT", "/collections/c", CREATE_4D).await.result();
    let a = s
        .ask(
            "POST",
            "/collections/aliases",
            r#"{"actions": [{"create_alias": {"collection_name": "c", "alias_name": "live"}}]}"#,
        )
        .await;
    assert_eq!(a.result(), &json!(true));
    let listed = json!({"aliases": [{"alias_name": "live", "collection_name": "c"}]});
    assert_eq!(s.ask("GET", "/aliases", "").await.result(), &listed);
    assert_eq!(
        s.ask("GET", "/collections/c/aliases", "").await.result(),
        &listed
    );
    // A collection is reached by its alias.
    let a = s.ask("GET", "/collections/live/exists", "").await;
    assert_eq!(a.result(), &json!({"exists": true}));
    let a = s
        .ask(
            "POST",
            "/collections/aliases",
            r#"{"actions": [{"delete_alias": {"alias_name": "gone"}}]}"#,
        )
        .await;
    a.refused(
        StatusCode::NOT_FOUND,
        "Not found: Alias `gone` doesn't exist!",
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_over_the_limit_is_a_413_in_the_envelope_and_nothing_is_written() {
    let s = server(None, 1024);
    s.ask("PUT", "/collections/c", CREATE_4D).await.result();
    let points: Vec<Value> = (0..100)
        .map(|i| json!({"id": i, "vector": [1, 0, 0, 0]}))
        .collect();
    let body = json!({"points": points}).to_string();
    assert!(body.len() > 1024);
    let a = s.ask("PUT", "/collections/c/points?wait=true", &body).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", a.text);
    assert!(
        a.error().starts_with("cannot read the request body"),
        "{}",
        a.text
    );
    let a = s.ask("POST", "/collections/c/points/count", "").await;
    assert_eq!(a.result(), &json!({"count": 0}));
}

#[tokio::test(flavor = "multi_thread")]
async fn server_info_is_outside_the_envelope() {
    let s = server(None, 1024);
    let a = s.ask("GET", "/", "").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json["title"], crate::SERVER_TITLE);
    assert_eq!(a.json["version"], crate::QDRANT_API_VERSION);
}
