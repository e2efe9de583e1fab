//! The soak: mixed ingestion through the proxy for ten minutes (SOAK_SECONDS) against
//! embedded-qdrant, with clients that break off mid-body and the upstream killed and
//! restarted twice. Not in CI (`#[ignore]`); run it with `tests/soak.sh`.
//!
//! It reports, and then asserts: the proxy's resident memory stays flat (the median of
//! the last quarter within 10 % of the second quarter's), no acknowledged upsert is lost
//! (every acknowledged point id is in the collection afterwards), and no 5xx or failed
//! connection happens outside the upstream's restarts.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::*;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use proxy::crypto::CertAlgorithmName;
use qdrant_client::qdrant::points_client::PointsClient;
use qdrant_client::qdrant::{PointStruct, UpsertPoints};
use qdrant_client::Payload;
use tokio::io::AsyncWriteExt;

const DIM: usize = 256;
const POINTS_PER_UPSERT: u64 = 100;
const COLLECTION: &str = "soak";
/// After an upstream restart is ready, errors are still the restart's for this long
/// (pooled upstream connections to the dead process are found out).
const RESTART_GRACE: Duration = Duration::from_secs(2);

/// What every worker records.
#[derive(Default)]
struct Ledger {
    /// Acknowledged point id ranges `[start, start + 100)`.
    acked: Mutex<Vec<u64>>,
    /// (seconds since start, worker, what): every failure.
    failures: Mutex<Vec<(f64, &'static str, String)>>,
    /// Upstream restart windows, seconds since start.
    restarts: Mutex<Vec<(f64, f64)>>,
    requests: Mutex<BTreeMap<&'static str, u64>>,
}

impl Ledger {
    fn ok(&self, worker: &'static str, first_id: u64) {
        self.acked.lock().unwrap().push(first_id);
        *self.requests.lock().unwrap().entry(worker).or_default() += 1;
    }

    fn failed(&self, started: Instant, worker: &'static str, what: String) {
        self.failures
            .lock()
            .unwrap()
            .push((started.elapsed().as_secs_f64(), worker, what));
        *self.requests.lock().unwrap().entry(worker).or_default() += 1;
    }
}

fn upsert_json(first_id: u64, vectors: &[Vec<f32>]) -> Bytes {
    let points: Vec<serde_json::Value> = (0..POINTS_PER_UPSERT)
        .map(|i| {
            let id = first_id + i;
            serde_json::json!({
                "id": id,
                "vector": vectors[(id % vectors.len() as u64) as usize],
                "payload": {"n": id},
            })
        })
        .collect();
    Bytes::from(serde_json::json!({ "points": points }).to_string())
}

const UPSERT_PATH: &str = "/collections/soak/points?wait=true";

/// What the soak's workers share: the ledger, the next point id, the stop flag, when it
/// started, and the vectors they upsert.
#[derive(Clone)]
struct Load {
    ledger: Arc<Ledger>,
    next_id: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    started: Instant,
    vectors: Arc<Vec<Vec<f32>>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "ten minutes; run tests/soak.sh"]
async fn soak() {
    let seconds: u64 = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let duration = Duration::from_secs(seconds);
    let data = temp_dir("soak-data");
    let upstream = Arc::new(Mutex::new(Some(EmbeddedQdrant::start(&data))));
    let (rest, grpc) = {
        let u = upstream.lock().unwrap();
        let u = u.as_ref().unwrap();
        (u.rest, u.grpc)
    };
    let (status, body) = http_json(
        rest,
        "PUT",
        "/collections/soak",
        &format!(r#"{{"vectors":{{"size":{DIM},"distance":"Cosine"}}}}"#),
    );
    assert_eq!(status, 200, "{body}");

    let (cert, key) = server_cert(CertAlgorithmName::EcdsaP256);
    let dir = temp_dir("soak-proxy");
    let config = dir.join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[[listener]]
name = "rest"
listen = "127.0.0.1:0"
cert = "{cert}"
key = "{key}"
upstream = "http://{rest}"

[[listener]]
name = "grpc"
listen = "127.0.0.1:0"
cert = "{cert}"
key = "{key}"
upstream = "http://{grpc}"
upstream_protocol = "h2c"
"#,
            cert = cert.display(),
            key = key.display()
        ),
    )
    .unwrap();
    let proxy = ProxyProcess::start_raw(&args(&["--config", config.to_str().unwrap()]));
    let grpc_listener = proxy.listener("grpc");
    let rest_listener = proxy.listener("rest");

    let load = Load {
        ledger: Arc::new(Ledger::default()),
        next_id: Arc::new(AtomicU64::new(1)),
        stop: Arc::new(AtomicBool::new(false)),
        started: Instant::now(),
        vectors: Arc::new(unit_vectors(997, DIM, 11)),
    };
    let Load {
        ledger,
        stop,
        started,
        ..
    } = load.clone();
    let mut workers = Vec::new();

    // REST over one keep-alive HTTP/2 connection, reconnecting when it breaks.
    for _ in 0..2 {
        workers.push(rest_over_one_h2_connection(&load, rest_listener));
    }

    // REST with a new TLS connection (HTTP/1.1) per upsert.
    workers.push(rest_with_a_new_connection_per_upsert(&load, rest_listener));

    // gRPC over one channel.
    workers.push(grpc_over_one_channel(&load, grpc_listener));

    // Clients that break off mid-body: HTTP/1.1 announcing 1 MB and sending half, and
    workers.push(clients_that_break_off_mid_body(&load, rest_listener));

    // The upstream killed (SIGKILL) at a third and stopped (SIGTERM) at two thirds, each
    // restarted on the same ports and data.
    let restarter = restart_the_upstream_twice(&upstream, &data, (rest, grpc), duration, &load);

    // Resident memory, every 5 s.
    let mut rss = Vec::new();
    while started.elapsed() < duration {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let m = proxy.metrics();
        if let Some(v) = metric_value(&m, "process_resident_memory_bytes", &[]) {
            rss.push((started.elapsed().as_secs_f64(), v / 1048576.0));
        }
    }
    stop.store(true, Ordering::Relaxed);
    restarter.abort();
    for w in workers {
        let _ = tokio::time::timeout(WAIT, w).await;
    }

    check_the_outcome(&proxy, rest, &ledger, &rss, seconds);
}

fn metric_sum_all(text: &str, name: &str) -> f64 {
    metric_sum(text, name, &[])
}

/// A request body fed through a channel: the sender decides when it stops.
type ChannelBody = http_body_util::StreamBody<
    tokio_stream::wrappers::ReceiverStream<Result<hyper::body::Frame<Bytes>, std::io::Error>>,
>;

fn channel_body() -> (
    tokio::sync::mpsc::Sender<Result<hyper::body::Frame<Bytes>, std::io::Error>>,
    ChannelBody,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    (
        tx,
        http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
}

/// REST over one keep-alive HTTP/2 connection, reconnecting when it breaks.
fn rest_over_one_h2_connection(
    load: &Load,
    rest_listener: std::net::SocketAddr,
) -> tokio::task::JoinHandle<()> {
    let Load {
        ledger,
        next_id,
        stop,
        started,
        vectors,
        ..
    } = load.clone();
    tokio::spawn(async move {
        let cfg = client_config(&ClientOpts {
            alpn: vec![b"h2".to_vec()],
            ..ClientOpts::default()
        });
        let mut sender = None;
        while !stop.load(Ordering::Relaxed) {
            if sender.is_none() {
                match tls_connect(rest_listener, cfg.clone()).await {
                    Ok(tls) => match hyper::client::conn::http2::handshake(
                        TokioExecutor::new(),
                        TokioIo::new(tls),
                    )
                    .await
                    {
                        Ok((s, conn)) => {
                            tokio::spawn(conn);
                            sender = Some(s);
                        }
                        Err(e) => ledger.failed(started, "rest-h2", format!("h2 handshake: {e}")),
                    },
                    Err(e) => ledger.failed(started, "rest-h2", format!("connect: {e}")),
                }
                if sender.is_none() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            }
            let first = next_id.fetch_add(POINTS_PER_UPSERT, Ordering::Relaxed);
            let req = http::Request::put(format!(
                "https://localhost:{}{UPSERT_PATH}",
                rest_listener.port()
            ))
            .header("content-type", "application/json")
            .body(Full::new(upsert_json(first, &vectors)))
            .unwrap();
            let s = sender.as_mut().unwrap();
            let outcome = tokio::time::timeout(WAIT, async {
                let resp = s.send_request(req).await?;
                let status = resp.status();
                let body = resp.into_body().collect().await?.to_bytes();
                Ok::<_, hyper::Error>((status, body))
            })
            .await;
            match outcome {
                Ok(Ok((status, _))) if status.is_success() => ledger.ok("rest-h2", first),
                Ok(Ok((status, body))) => ledger.failed(
                    started,
                    "rest-h2",
                    format!("{status}: {}", String::from_utf8_lossy(&body)),
                ),
                Ok(Err(e)) => {
                    ledger.failed(started, "rest-h2", format!("transport: {e}"));
                    sender = None;
                }
                Err(_) => {
                    ledger.failed(started, "rest-h2", "no answer in time".into());
                    sender = None;
                }
            }
        }
    })
}

/// REST with a new TLS connection (HTTP/1.1) per upsert.
fn rest_with_a_new_connection_per_upsert(
    load: &Load,
    rest_listener: std::net::SocketAddr,
) -> tokio::task::JoinHandle<()> {
    let Load {
        ledger,
        next_id,
        stop,
        started,
        vectors,
        ..
    } = load.clone();
    tokio::spawn(async move {
        let cfg = client_config(&ClientOpts::default());
        while !stop.load(Ordering::Relaxed) {
            let first = next_id.fetch_add(POINTS_PER_UPSERT, Ordering::Relaxed);
            match request_bounded(
                rest_listener,
                cfg.clone(),
                "PUT",
                UPSERT_PATH,
                &[("content-type", "application/json")],
                upsert_json(first, &vectors),
            )
            .await
            {
                Ok(a) if a.status.is_success() => ledger.ok("rest-new-conn", first),
                Ok(a) => ledger.failed(
                    started,
                    "rest-new-conn",
                    format!("{}: {}", a.status, String::from_utf8_lossy(&a.body)),
                ),
                Err(e) => ledger.failed(started, "rest-new-conn", e),
            }
        }
    })
}

/// gRPC over one channel.
fn grpc_over_one_channel(
    load: &Load,
    grpc_listener: std::net::SocketAddr,
) -> tokio::task::JoinHandle<()> {
    let Load {
        ledger,
        next_id,
        stop,
        started,
        vectors,
        ..
    } = load.clone();
    tokio::spawn(async move {
        let channel = grpc_channel(grpc_listener);
        let mut client = PointsClient::new(channel);
        while !stop.load(Ordering::Relaxed) {
            let first = next_id.fetch_add(POINTS_PER_UPSERT, Ordering::Relaxed);
            let points: Vec<PointStruct> = (0..POINTS_PER_UPSERT)
                .map(|i| {
                    let id = first + i;
                    let mut payload = Payload::new();
                    payload.insert("n", id as i64);
                    PointStruct::new(
                        id,
                        vectors[(id % vectors.len() as u64) as usize].clone(),
                        payload,
                    )
                })
                .collect();
            let req = UpsertPoints {
                collection_name: COLLECTION.into(),
                wait: Some(true),
                points,
                ..Default::default()
            };
            match client.upsert(req).await {
                Ok(_) => ledger.ok("grpc", first),
                Err(status) => ledger.failed(
                    started,
                    "grpc",
                    format!("{:?}: {}", status.code(), status.message()),
                ),
            }
        }
    })
}

/// Clients that break off mid-body: HTTP/1.1 announcing 1 MB and sending half, and
/// HTTP/2 likewise, then dropping the connection.
fn clients_that_break_off_mid_body(
    load: &Load,
    rest_listener: std::net::SocketAddr,
) -> tokio::task::JoinHandle<()> {
    let Load { ledger, stop, .. } = load.clone();
    tokio::spawn(async move {
        let h1 = client_config(&ClientOpts::default());
        let h2 = client_config(&ClientOpts {
            alpn: vec![b"h2".to_vec()],
            ..ClientOpts::default()
        });
        let half = vec![b' '; 500_000];
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            if n.is_multiple_of(2) {
                if let Ok(mut tls) = tls_connect(rest_listener, h1.clone()).await {
                    let head = format!("PUT {UPSERT_PATH} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 1000000\r\n\r\n");
                    let _ = tls.write_all(head.as_bytes()).await;
                    let _ = tls.write_all(&half).await;
                }
            } else if let Ok(tls) = tls_connect(rest_listener, h2.clone()).await {
                if let Ok((mut sender, conn)) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                        .await
                {
                    let conn = tokio::spawn(conn);
                    let (tx, body) = channel_body();
                    let req = http::Request::put(format!(
                        "https://localhost:{}{UPSERT_PATH}",
                        rest_listener.port()
                    ))
                    .header("content-length", "1000000")
                    .body(body)
                    .unwrap();
                    let call = tokio::spawn(async move { sender.send_request(req).await });
                    let _ = tx
                        .send(Ok(hyper::body::Frame::data(Bytes::from(half.clone()))))
                        .await;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    call.abort();
                    conn.abort();
                }
            }
            *ledger
                .requests
                .lock()
                .unwrap()
                .entry("broken-off")
                .or_default() += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

/// Kills the upstream (SIGKILL) at a third of `duration` and stops it (SIGTERM) at two
/// thirds, each time restarted on the same ports and data; the ledger gets each window.
fn restart_the_upstream_twice(
    upstream: &Arc<Mutex<Option<EmbeddedQdrant>>>,
    data: &std::path::Path,
    (rest, grpc): (std::net::SocketAddr, std::net::SocketAddr),
    duration: Duration,
    load: &Load,
) -> tokio::task::JoinHandle<()> {
    let Load {
        ledger,
        stop,
        started,
        ..
    } = load.clone();
    let (upstream, data) = (upstream.clone(), data.to_path_buf());
    tokio::spawn(async move {
        for (i, at) in [duration / 3, duration * 2 / 3].into_iter().enumerate() {
            tokio::time::sleep_until(tokio::time::Instant::from_std(started + at)).await;
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let from = started.elapsed().as_secs_f64();
            let data = data.clone();
            let upstream = upstream.clone();
            tokio::task::spawn_blocking(move || {
                let old = upstream.lock().unwrap().take().unwrap();
                if i == 0 {
                    old.kill();
                } else {
                    old.stop();
                }
                let new = EmbeddedQdrant::start_on(&data, rest, grpc);
                *upstream.lock().unwrap() = Some(new);
            })
            .await
            .unwrap();
            let to = started.elapsed().as_secs_f64() + RESTART_GRACE.as_secs_f64();
            eprintln!("upstream restarted: {from:.1}-{to:.1} s");
            ledger.restarts.lock().unwrap().push((from, to));
        }
    })
}

/// Every acknowledged point is in the collection, no failure happened outside the
/// upstream's restarts, and the proxy's resident memory stayed flat (`rss`: seconds and
/// MiB); the report says what was seen either way.
fn check_the_outcome(
    proxy: &ProxyProcess,
    rest: std::net::SocketAddr,
    ledger: &Ledger,
    rss: &[(f64, f64)],
    seconds: u64,
) {
    // Every acknowledged point must be there.
    let acked: Vec<u64> = ledger.acked.lock().unwrap().clone();
    let mut missing = 0u64;
    for chunk in acked.chunks(10) {
        let ids: Vec<u64> = chunk
            .iter()
            .flat_map(|first| *first..*first + POINTS_PER_UPSERT)
            .collect();
        let (status, body) = http_json(
            rest,
            "POST",
            "/collections/soak/points",
            &serde_json::json!({"ids": ids, "with_payload": false, "with_vector": false})
                .to_string(),
        );
        assert_eq!(status, 200, "{body}");
        let found = body["result"].as_array().map_or(0, Vec::len) as u64;
        missing += ids.len() as u64 - found;
    }
    let (_, count) = http_json(
        rest,
        "POST",
        "/collections/soak/points/count",
        r#"{"exact":true}"#,
    );
    let count = count["result"]["count"].as_u64().unwrap_or(0);

    let restarts = ledger.restarts.lock().unwrap().clone();
    let in_restart = |t: f64| restarts.iter().any(|(a, b)| t >= *a && t <= *b);
    let failures = ledger.failures.lock().unwrap().clone();
    let outside: Vec<&(f64, &str, String)> = failures
        .iter()
        .filter(|(t, _, _)| !in_restart(*t))
        .collect();
    let quarter = rss.len() / 4;
    let median = |s: &[(f64, f64)]| {
        let mut v: Vec<f64> = s.iter().map(|x| x.1).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let early = median(&rss[quarter..2 * quarter]);
    let late = median(&rss[3 * quarter..]);
    let requests = ledger.requests.lock().unwrap().clone();
    let m = proxy.metrics();
    let report = serde_json::json!({
        "seconds": seconds,
        "requests": requests,
        "acknowledged_points": acked.len() as u64 * POINTS_PER_UPSERT,
        "collection_count": count,
        "acknowledged_points_missing": missing,
        "points_applied_without_acknowledgement": count.saturating_sub(acked.len() as u64 * POINTS_PER_UPSERT - missing),
        "upstream_restarts_s": restarts,
        "failures_in_restarts": failures.len() - outside.len(),
        "failures_outside_restarts": outside.iter().map(|(t, w, e)| format!("{t:.1}s {w}: {e}")).collect::<Vec<_>>(),
        "rss_mib_samples": rss.iter().map(|(t, v)| format!("{t:.0}s {v:.1}")).collect::<Vec<_>>(),
        "rss_mib_median_second_quarter": early,
        "rss_mib_median_last_quarter": late,
        "proxy_connection_closes_total": metric_value(&m, "proxy_connection_closes_total", &[("reason", "stalled")]),
        "proxy_client_errors_total_body": metric_sum_all(&m, "proxy_client_errors_total"),
        "proxy_upstream_errors_total": metric_sum_all(&m, "proxy_upstream_errors_total"),
    });
    let text = serde_json::to_string_pretty(&report).unwrap();
    eprintln!("soak report:\n{text}");
    if let Ok(out) = std::env::var("SOAK_REPORT") {
        std::fs::write(out, &text).unwrap();
    }
    assert_eq!(missing, 0, "acknowledged points lost");
    assert!(outside.is_empty(), "failures outside the upstream restarts");
    assert!(
        (late - early).abs() <= early * 0.10,
        "RSS moved from {early:.1} MiB to {late:.1} MiB"
    );
}
