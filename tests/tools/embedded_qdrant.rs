//! embedded-qdrant against the official Rust client over gRPC and plain HTTP over REST:
//! the ingestion flow, persistence across a restart, and bad input answered with Qdrant's
//! errors while the server keeps serving.

use std::process::{Command, Stdio};

use e2e::*;
use proxy::crypto::CertAlgorithmName;
use qdrant_client::qdrant::{
    CountPointsBuilder, CreateCollectionBuilder, Distance, GetPointsBuilder, PointStruct,
    QueryPointsBuilder, UpsertPointsBuilder, VectorParamsBuilder,
};
use qdrant_client::{Payload, Qdrant};
use serde_json::json;

const DIM: usize = 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_client_over_grpc() {
    let data = temp_dir("eq-grpc");
    let server = EmbeddedQdrant::start(&data);
    let client = Qdrant::from_url(&format!("http://{}", server.grpc))
        .skip_compatibility_check()
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .unwrap();
    client
        .create_collection(
            CreateCollectionBuilder::new("vectors")
                .vectors_config(VectorParamsBuilder::new(DIM as u64, Distance::Cosine)),
        )
        .await
        .unwrap();
    let vectors = unit_vectors(1000, DIM, 7);
    for batch in 0..10u64 {
        let points: Vec<PointStruct> = (0..100u64)
            .map(|i| {
                let id = batch * 100 + i;
                let mut payload = Payload::new();
                payload.insert("doc", format!("chunk-{id}"));
                payload.insert("n", id as i64);
                PointStruct::new(id, vectors[id as usize].clone(), payload)
            })
            .collect();
        let r = client
            .upsert_points(UpsertPointsBuilder::new("vectors", points).wait(true))
            .await
            .unwrap();
        assert!(r.result.is_some());
    }
    let count = client
        .count(CountPointsBuilder::new("vectors").exact(true))
        .await
        .unwrap();
    assert_eq!(count.result.unwrap().count, 1000);

    let hits = client
        .query(
            QueryPointsBuilder::new("vectors")
                .query(vectors[42].clone())
                .limit(3),
        )
        .await
        .unwrap();
    let top = hits.result[0].id.clone().unwrap();
    assert_eq!(top, 42u64.into(), "{:?}", hits.result);
    assert!((hits.result[0].score - 1.0).abs() < 1e-4);

    let got = client
        .get_points(GetPointsBuilder::new("vectors", vec![42u64.into()]).with_payload(true))
        .await
        .unwrap();
    let payload = &got.result[0].payload;
    assert_eq!(
        payload["doc"].as_str().map(String::as_str),
        Some("chunk-42"),
        "{payload:?}"
    );

    // A wrong dimension is INVALID_ARGUMENT, an unknown collection NOT_FOUND, an
    // unimplemented method UNIMPLEMENTED with its name; the server keeps serving.
    let err = client
        .upsert_points(
            UpsertPointsBuilder::new(
                "vectors",
                vec![PointStruct::new(5000u64, vec![0.5f32; 3], Payload::new())],
            )
            .wait(true),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("dimension"), "{err}");
    let err = client
        .count(CountPointsBuilder::new("nope"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("doesn't exist"), "{err}");
    // A call it does not serve names itself (snapshots are not kept).
    let err = client.create_snapshot("vectors").await.unwrap_err();
    assert!(
        err.to_string()
            .contains("qdrant.Snapshots/Create is not implemented"),
        "{err}"
    );

    client.delete_collection("vectors").await.unwrap();
    assert!(!client.collection_exists("vectors").await.unwrap());
    drop(client);
    assert!(server.stop().success());
    std::fs::remove_dir_all(&data).ok();
}

fn upsert_body(ids: std::ops::Range<usize>, vectors: &[Vec<f32>]) -> String {
    let points: Vec<_> = ids
        .map(|i| json!({"id": i, "vector": vectors[i], "payload": {"doc": format!("chunk-{i}")}}))
        .collect();
    json!({ "points": points }).to_string()
}

#[test]
fn rest_flow_restart_and_bad_input() {
    let data = temp_dir("eq-rest");
    let server = EmbeddedQdrant::start(&data);
    let rest = server.rest;
    let (s, v) = http_json(
        rest,
        "PUT",
        "/collections/docs",
        r#"{"vectors":{"size":1024,"distance":"Cosine"}}"#,
    );
    assert_eq!((s, &v["result"]), (200, &json!(true)), "{v}");
    let vectors = unit_vectors(1000, DIM, 11);
    for batch in 0..10 {
        let (s, v) = http_json(
            rest,
            "PUT",
            "/collections/docs/points?wait=true",
            &upsert_body(batch * 100..batch * 100 + 100, &vectors),
        );
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["result"]["status"], "completed");
    }
    let (_, v) = http_json(
        rest,
        "POST",
        "/collections/docs/points/count",
        r#"{"exact":true}"#,
    );
    assert_eq!(v["result"]["count"], 1000, "{v}");
    let (_, v) = http_json(
        rest,
        "POST",
        "/collections/docs/points/search",
        &json!({"vector": vectors[42], "limit": 1, "with_payload": true}).to_string(),
    );
    assert_eq!(v["result"][0]["id"], 42, "{v}");
    assert_eq!(v["result"][0]["payload"]["doc"], "chunk-42");
    let (_, v) = http_json(
        rest,
        "POST",
        "/collections/docs/points/query",
        &json!({"query": vectors[7], "limit": 1}).to_string(),
    );
    assert_eq!(v["result"]["points"][0]["id"], 7, "{v}");
    let (_, v) = http_json(
        rest,
        "POST",
        "/collections/docs/points",
        r#"{"ids":[42,999],"with_payload":true}"#,
    );
    assert_eq!(v["result"].as_array().map(Vec::len), Some(2), "{v}");
    let (_, v) = http_json(
        rest,
        "POST",
        "/collections/docs/points/scroll",
        r#"{"limit":10}"#,
    );
    assert_eq!(
        v["result"]["points"].as_array().map(Vec::len),
        Some(10),
        "{v}"
    );
    assert_eq!(v["result"]["next_page_offset"], 10, "{v}");
    let (_, v) = http_json(rest, "GET", "/collections/docs", "");
    assert_eq!(v["result"]["points_count"], 1000, "{v}");
    assert_eq!(
        v["result"]["config"]["params"]["vectors"]["size"], 1024,
        "{v}"
    );

    bad_input_gets_qdrants_errors_and_changes_nothing(rest);

    // wait=false acknowledges; the data is there after a clean restart.
    let (s, v) = http_json(
        rest,
        "PUT",
        "/collections/docs/points?wait=false",
        &upsert_body(0..1, &vectors).replace("\"id\":0", "\"id\":1000"),
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["result"]["status"], "acknowledged");
    assert!(server.stop().success());
    let server = EmbeddedQdrant::start(&data);
    let (_, v) = http_json(server.rest, "POST", "/collections/docs/points/count", "{}");
    assert_eq!(
        v["result"]["count"], 1001,
        "restart keeps every acknowledged point: {v}"
    );
    let (s, v) = http_json(server.rest, "DELETE", "/collections/docs", "");
    assert_eq!((s, &v["result"]), (200, &json!(true)));
    let (_, v) = http_json(server.rest, "GET", "/collections/docs/exists", "");
    assert_eq!(v["result"]["exists"], false);
    drop(server);
    std::fs::remove_dir_all(&data).ok();
}

/// Bad input against the `docs` collection: each gets Qdrant's error shape and status (a
/// wrong dimension, a missing collection, broken JSON, a collection made twice, a bad name
/// or distance), and the server keeps serving.
fn bad_input_gets_qdrants_errors_and_changes_nothing(rest: std::net::SocketAddr) {
    let (s, v) = http_json(
        rest,
        "PUT",
        "/collections/docs/points?wait=true",
        r#"{"points":[{"id":5000,"vector":[1,2,3]}]}"#,
    );
    assert_eq!(s, 400, "{v}");
    assert!(
        v["status"]["error"].as_str().unwrap().contains("dimension"),
        "{v}"
    );
    let (s, v) = http_json(rest, "POST", "/collections/missing/points/count", "{}");
    assert_eq!(s, 404, "{v}");
    let (s, v) = http_json(rest, "PUT", "/collections/docs/points", "{not json");
    assert_eq!(s, 400, "{v}");
    assert!(
        v["status"]["error"].as_str().unwrap().contains("JSON"),
        "{v}"
    );
    let (s, _) = http_json(
        rest,
        "PUT",
        "/collections/docs",
        r#"{"vectors":{"size":1024,"distance":"Cosine"}}"#,
    );
    assert_eq!(s, 409);
    let (s, _) = http_json(
        rest,
        "PUT",
        "/collections/..",
        r#"{"vectors":{"size":4,"distance":"Cosine"}}"#,
    );
    assert_eq!(s, 400);
    let (s, _) = http_json(
        rest,
        "PUT",
        "/collections/x",
        r#"{"vectors":{"size":4,"distance":"Hamming"}}"#,
    );
    assert_eq!(s, 400);
    // ...and the server keeps serving.
    let (s, v) = http_json(rest, "GET", "/collections", "");
    assert_eq!(s, 200);
    assert_eq!(v["result"]["collections"][0]["name"], "docs", "{v}");
}

/// `--tls-cert/--tls-key` that do not form a pair, or a missing file, stop the server at
/// start with an error that names the flag; nothing is served.
#[test]
fn in_process_tls_refuses_a_mismatched_or_missing_key() {
    let (p256_cert, _) = server_cert(CertAlgorithmName::EcdsaP256);
    let (_, rsa_key) = server_cert(CertAlgorithmName::Rsa2048);
    let missing = temp_dir("eq-tls-missing").join("absent.key");
    for (key, expect) in [(&rsa_key, "do not form a pair"), (&missing, "--tls-key")] {
        let out = Command::new(binary("embedded-qdrant"))
            .args(["--rest", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data"])
            .arg(temp_dir("eq-tls-bad"))
            .arg("--tls-cert")
            .arg(&p256_cert)
            .arg("--tls-key")
            .arg(key)
            .stdin(Stdio::null())
            .output()
            .expect("run embedded-qdrant");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(expect), "{expect:?} not in: {stderr}");
    }
}
