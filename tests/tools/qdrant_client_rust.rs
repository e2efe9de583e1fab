//! The Rust `qdrant-client` crate (gRPC) runs the same list of calls as the official
//! Python client's test (tests/interop/qdrant_client_calls.py): against embedded-qdrant
//! directly, and through the proxy at its defaults with TLS verified against the test CA.
//!
//! The crate trusts the platform's roots (rustls-native-certs), which read SSL_CERT_FILE;
//! this binary holds this one test so that setting it touches nothing else.

use std::collections::HashMap;

use e2e::*;
use proxy::crypto::{CertAlgorithmName, ProviderName};
use qdrant_client::qdrant::{
    self as pb, condition::ConditionOneOf, points_selector, r#match::MatchValue, vectors_config,
    with_payload_selector, with_vectors_selector,
};
use qdrant_client::Qdrant;

const DIM: usize = 8;

fn vector(i: u64) -> Vec<f32> {
    (0..DIM as u64)
        .map(|j| ((i * 7 + j * 3) % 11 + 1) as f32)
        .collect()
}

fn berlin() -> pb::Filter {
    pb::Filter {
        must: vec![pb::Condition {
            condition_one_of: Some(ConditionOneOf::Field(pb::FieldCondition {
                key: "city".into(),
                r#match: Some(pb::Match {
                    match_value: Some(MatchValue::Keyword("Berlin".into())),
                }),
                ..Default::default()
            })),
        }],
        ..Default::default()
    }
}

fn num(id: &Option<pb::PointId>) -> u64 {
    match id.as_ref().and_then(|p| p.point_id_options.as_ref()) {
        Some(pb::point_id::PointIdOptions::Num(n)) => *n,
        other => panic!("not a numeric id: {other:?}"),
    }
}

fn ids(list: &[u64]) -> Option<pb::PointsSelector> {
    Some(pb::PointsSelector {
        points_selector_one_of: Some(points_selector::PointsSelectorOneOf::Points(
            pb::PointsIdsList {
                ids: list.iter().map(|&n| n.into()).collect(),
            },
        )),
    })
}

fn payload(pairs: &[(&str, pb::Value)]) -> HashMap<String, pb::Value> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

/// Every call of the list, each checked against what Qdrant answers, in named steps.
async fn the_list(client: &Qdrant, name: &str) {
    collections_are_created_read_and_changed(client, name).await;
    points_are_written(client, name).await;
    points_are_counted_and_scrolled(client, name).await;
    points_are_queried_and_searched(client, name).await;
    aliases_work(client, name).await;
    points_are_deleted_and_the_collection_dropped(client, name).await;
}

/// A count of the collection's points, with a filter or not, exact or not.
fn count_request(name: &str, filter: Option<pb::Filter>, exact: bool) -> pb::CountPoints {
    pb::CountPoints {
        collection_name: name.into(),
        filter,
        exact: Some(exact),
        ..Default::default()
    }
}

/// The list, step 1: the collection made, read, listed, changed and given a payload index.
async fn collections_are_created_read_and_changed(client: &Qdrant, name: &str) {
    let version = client.health_check().await.expect("health check").version;
    assert_eq!(version.split('.').count(), 3, "version {version:?}");

    client
        .create_collection(pb::CreateCollection {
            collection_name: name.into(),
            vectors_config: Some(pb::VectorsConfig {
                config: Some(vectors_config::Config::Params(pb::VectorParams {
                    size: DIM as u64,
                    distance: pb::Distance::Cosine as i32,
                    ..Default::default()
                })),
            }),
            ..Default::default()
        })
        .await
        .expect("create_collection");
    assert!(client.collection_exists(name).await.expect("exists"));
    let info = client
        .collection_info(name)
        .await
        .expect("get")
        .result
        .unwrap();
    let config = info.config.unwrap();
    assert_eq!(config.hnsw_config.unwrap().m, Some(16));
    assert!(config
        .optimizer_config
        .unwrap()
        .flush_interval_sec
        .is_some());
    let names: Vec<String> = client
        .list_collections()
        .await
        .expect("list")
        .collections
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert!(names.contains(&name.to_owned()), "{names:?}");

    client
        .update_collection(pb::UpdateCollection {
            collection_name: name.into(),
            optimizers_config: Some(pb::OptimizersConfigDiff {
                indexing_threshold: Some(20_000),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("update_collection");
    let info = client.collection_info(name).await.unwrap().result.unwrap();
    assert_eq!(
        info.config
            .unwrap()
            .optimizer_config
            .unwrap()
            .indexing_threshold,
        Some(20_000)
    );

    client
        .create_field_index(pb::CreateFieldIndexCollection {
            collection_name: name.into(),
            wait: Some(true),
            field_name: "city".into(),
            field_type: Some(pb::FieldType::Keyword as i32),
            ..Default::default()
        })
        .await
        .expect("create_field_index");
    let schema = client
        .collection_info(name)
        .await
        .unwrap()
        .result
        .unwrap()
        .payload_schema;
    assert_eq!(
        schema.get("city").map(|s| s.data_type),
        Some(pb::PayloadSchemaType::Keyword as i32),
        "{schema:?}"
    );
}

/// The list, step 2: points upserted (waiting and not) and their payloads set, overwritten and read back.
async fn points_are_written(client: &Qdrant, name: &str) {
    let cities = ["Berlin", "Paris", "Rome"];
    let points = |range: std::ops::RangeInclusive<u64>| -> Vec<pb::PointStruct> {
        range
            .map(|i| {
                pb::PointStruct::new(
                    i,
                    vector(i),
                    [
                        ("city", cities[(i % 3) as usize].into()),
                        ("n", (i as i64).into()),
                    ],
                )
            })
            .collect()
    };
    let r = client
        .upsert_points(pb::UpsertPoints {
            collection_name: name.into(),
            wait: Some(true),
            points: points(1..=12),
            ..Default::default()
        })
        .await
        .expect("upsert wait=true");
    assert_eq!(r.result.unwrap().status, pb::UpdateStatus::Completed as i32);
    let r = client
        .upsert_points(pb::UpsertPoints {
            collection_name: name.into(),
            wait: Some(false),
            points: points(13..=14),
            ..Default::default()
        })
        .await
        .expect("upsert wait=false");
    assert_eq!(
        r.result.unwrap().status,
        pb::UpdateStatus::Acknowledged as i32
    );

    client
        .set_payload(pb::SetPayloadPoints {
            collection_name: name.into(),
            wait: Some(true),
            payload: payload(&[("color", "red".into())]),
            points_selector: ids(&[1]),
            ..Default::default()
        })
        .await
        .expect("set_payload");
    client
        .overwrite_payload(pb::SetPayloadPoints {
            collection_name: name.into(),
            wait: Some(true),
            payload: payload(&[("city", "Berlin".into()), ("only", true.into())]),
            points_selector: ids(&[2]),
            ..Default::default()
        })
        .await
        .expect("overwrite_payload");
    let got = client
        .get_points(pb::GetPoints {
            collection_name: name.into(),
            ids: vec![1.into(), 2.into()],
            with_payload: Some(pb::WithPayloadSelector {
                selector_options: Some(with_payload_selector::SelectorOptions::Enable(true)),
            }),
            with_vectors: Some(pb::WithVectorsSelector {
                selector_options: Some(with_vectors_selector::SelectorOptions::Enable(true)),
            }),
            ..Default::default()
        })
        .await
        .expect("get_points")
        .result;
    let by_id: HashMap<u64, &pb::RetrievedPoint> = got.iter().map(|p| (num(&p.id), p)).collect();
    assert_eq!(
        by_id[&1].payload.len(),
        3,
        "set_payload keeps the other keys"
    );
    assert_eq!(
        by_id[&2].payload.len(),
        2,
        "overwrite_payload replaces them"
    );
    assert!(by_id[&1].vectors.is_some(), "vectors returned");
}

/// The list, step 3: exact, approximate and filtered counts; scroll pages and a filtered scroll.
async fn points_are_counted_and_scrolled(client: &Qdrant, name: &str) {
    let n = client
        .count(count_request(name, None, true))
        .await
        .unwrap()
        .result
        .unwrap()
        .count;
    assert_eq!(n, 14, "exact count");
    let n = client
        .count(count_request(name, None, false))
        .await
        .unwrap()
        .result
        .unwrap()
        .count;
    assert!(n >= 1, "approximate count {n}");
    let n = client
        .count(count_request(name, Some(berlin()), true))
        .await
        .unwrap()
        .result
        .unwrap()
        .count;
    assert_eq!(n, 5, "count with filter");

    let page = client
        .scroll(pb::ScrollPoints {
            collection_name: name.into(),
            limit: Some(5),
            ..Default::default()
        })
        .await
        .expect("scroll");
    assert_eq!(page.result.len(), 5);
    let rest = client
        .scroll(pb::ScrollPoints {
            collection_name: name.into(),
            limit: Some(100),
            offset: page.next_page_offset.clone(),
            ..Default::default()
        })
        .await
        .expect("scroll page 2");
    assert_eq!(page.result.len() + rest.result.len(), 14);
    let mut filtered: Vec<u64> = client
        .scroll(pb::ScrollPoints {
            collection_name: name.into(),
            filter: Some(berlin()),
            limit: Some(100),
            ..Default::default()
        })
        .await
        .expect("scroll with filter")
        .result
        .iter()
        .map(|p| num(&p.id))
        .collect();
    filtered.sort();
    assert_eq!(filtered, [2, 3, 6, 9, 12]);
}

/// The list, step 4: query and search, with and without a filter.
async fn points_are_queried_and_searched(client: &Qdrant, name: &str) {
    let query = |filter: Option<pb::Filter>| pb::QueryPoints {
        collection_name: name.into(),
        query: Some(pb::Query {
            variant: Some(pb::query::Variant::Nearest(pb::VectorInput {
                variant: Some(pb::vector_input::Variant::Dense(pb::DenseVector {
                    data: vector(5),
                })),
            })),
        }),
        filter,
        limit: Some(10),
        ..Default::default()
    };
    let hits = client.query(query(None)).await.expect("query").result;
    assert_eq!(num(&hits[0].id), 5, "nearest first");
    let mut hits: Vec<u64> = client
        .query(query(Some(berlin())))
        .await
        .expect("query with filter")
        .result
        .iter()
        .map(|p| num(&p.id))
        .collect();
    hits.sort();
    assert_eq!(hits, [2, 3, 6, 9, 12]);
    let search = |filter: Option<pb::Filter>| pb::SearchPoints {
        collection_name: name.into(),
        vector: vector(5),
        filter,
        limit: 10,
        ..Default::default()
    };
    let hits = client
        .search_points(search(None))
        .await
        .expect("search")
        .result;
    assert_eq!((hits.len(), num(&hits[0].id)), (10, 5));
    let hits = client
        .search_points(search(Some(berlin())))
        .await
        .expect("search with filter")
        .result;
    assert_eq!(hits.len(), 5);
}

/// The list, step 5: an alias created, listed, counted through, renamed and deleted.
async fn aliases_work(client: &Qdrant, name: &str) {
    let alias = format!("{name}_alias");
    client
        .create_alias(pb::CreateAlias {
            collection_name: name.into(),
            alias_name: alias.clone(),
        })
        .await
        .expect("create alias");
    let listed = client.list_collection_aliases(name).await.unwrap().aliases;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(client
        .list_aliases()
        .await
        .unwrap()
        .aliases
        .iter()
        .any(|a| a.alias_name == alias));
    let n = client
        .count(pb::CountPoints {
            collection_name: alias.clone(),
            exact: Some(true),
            ..Default::default()
        })
        .await
        .expect("count through the alias")
        .result
        .unwrap()
        .count;
    assert_eq!(n, 14);
    let renamed = format!("{alias}_2");
    client
        .rename_alias(pb::RenameAlias {
            old_alias_name: alias.clone(),
            new_alias_name: renamed.clone(),
        })
        .await
        .expect("rename alias");
    client
        .delete_alias(renamed.as_str())
        .await
        .expect("delete alias");
    assert!(client
        .list_collection_aliases(name)
        .await
        .unwrap()
        .aliases
        .is_empty());
}

/// The list, step 6: deletes by ids and by filter, an unserved call, the collection dropped.
async fn points_are_deleted_and_the_collection_dropped(client: &Qdrant, name: &str) {
    client
        .delete_points(pb::DeletePoints {
            collection_name: name.into(),
            wait: Some(true),
            points: ids(&[1]),
            ..Default::default()
        })
        .await
        .expect("delete by ids");
    client
        .delete_points(pb::DeletePoints {
            collection_name: name.into(),
            wait: Some(true),
            points: Some(pb::PointsSelector {
                points_selector_one_of: Some(
                    points_selector::PointsSelectorOneOf::Filter(berlin()),
                ),
            }),
            ..Default::default()
        })
        .await
        .expect("delete by filter");
    let n = client
        .count(count_request(name, None, true))
        .await
        .unwrap()
        .result
        .unwrap()
        .count;
    assert_eq!(n, 8, "14 - point 1 - the five in Berlin");

    let err = client
        .create_snapshot(name)
        .await
        .expect_err("snapshots are not served");
    assert!(err.to_string().contains("Snapshots/Create"), "{err}");

    client
        .delete_collection(name)
        .await
        .expect("delete_collection");
    assert!(!client.collection_exists(name).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_qdrant_client_direct_and_through_the_proxy() {
    let eq = EmbeddedQdrant::start(&temp_dir("rust-client-eq"));
    let proxy = ProxyProcess::start(
        &format!("http://{}", eq.grpc),
        ProviderName::AwsLcRs,
        CertAlgorithmName::EcdsaP256,
        &["--upstream-protocol", "h2c"],
    );
    // SAFETY (of the test): this binary's only test; set before any TLS client exists.
    std::env::set_var("SSL_CERT_FILE", &certs().ca_cert);
    for (what, url) in [
        ("direct", format!("http://{}", eq.grpc)),
        ("proxy", format!("https://localhost:{}", proxy.addr.port())),
    ] {
        let client = Qdrant::from_url(&url)
            .timeout(std::time::Duration::from_secs(30))
            .build()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        the_list(&client, &format!("rust_{what}")).await;
    }
}
