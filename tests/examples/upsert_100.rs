//! UPSERT_100 (100 points x 1024 dims, `wait=true`) straight against embedded-qdrant over
//! REST and over gRPC, on keep-alive connections: requests/s and the server's CPU-seconds
//! per upsert (from /proc/<pid>/stat). Until `loadgen` exists, this is the upstream's
//! baseline.
//!
//! ```text
//! cargo build -p embedded-qdrant && cargo run -p e2e --example upsert_100 -- 10
//! ```
//! Argument: seconds per protocol (default 10).

use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::{binary, temp_dir, unit_vectors, EmbeddedQdrant};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use qdrant_client::qdrant::{
    CreateCollectionBuilder, Distance, PointStruct, UpsertPointsBuilder, VectorParamsBuilder,
};
use qdrant_client::{Payload, Qdrant};

const DIM: usize = 1024;
const POINTS: usize = 100;

fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let _ = binary("embedded-qdrant");
    let data = temp_dir("upsert-100");
    let server = EmbeddedQdrant::start(&data);
    let pid = server.pid();
    let vectors = unit_vectors(POINTS, DIM, 3);
    let client = Qdrant::from_url(&format!("http://{}", server.grpc))
        .skip_compatibility_check()
        .build()?;
    for c in ["rest", "grpc"] {
        client
            .create_collection(
                CreateCollectionBuilder::new(c)
                    .vectors_config(VectorParamsBuilder::new(DIM as u64, Distance::Cosine)),
            )
            .await?;
    }
    println!("UPSERT_100: {POINTS} points x {DIM} dims per request, wait=true, one keep-alive connection, {seconds} s per protocol");
    println!("| protocol | request body | upserts/s | points/s | server CPU s/upsert | p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|---:|---:|---:|");

    // REST: the JSON body is built once; ids are patched by a prefix per request.
    let tcp = tokio::net::TcpStream::connect(server.rest).await?;
    tcp.set_nodelay(true)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let mut next_id = 0u64;
    let rest_body = |base: u64| -> Bytes {
        let points: Vec<_> = (0..POINTS)
            .map(|i| serde_json::json!({"id": base + i as u64, "vector": vectors[i], "payload": {"doc": i}}))
            .collect();
        Bytes::from(serde_json::json!({ "points": points }).to_string())
    };
    let bodies: Vec<Bytes> = (0..64).map(|k| rest_body(k * POINTS as u64)).collect();
    let body_len = bodies[0].len();
    let (mut lat, cpu0, t0) = (Vec::new(), cpu_seconds(pid), Instant::now());
    while t0.elapsed() < Duration::from_secs(seconds) {
        // Each body's ids repeat after 64 requests: the collection's count is not the point
        // here, the server's work per upsert is.
        let body = bodies[(next_id as usize) % bodies.len()].clone();
        next_id += 1;
        let req = http::Request::put("/collections/rest/points?wait=true")
            .header("host", "bench")
            .header("content-type", "application/json")
            .body(Full::new(body))?;
        let t = Instant::now();
        sender.ready().await?;
        let resp = sender.send_request(req).await?;
        anyhow::ensure!(resp.status() == 200, "status {}", resp.status());
        resp.into_body().collect().await?;
        lat.push(t.elapsed());
    }
    report(
        "REST (JSON)",
        body_len,
        &mut lat,
        t0.elapsed(),
        cpu_seconds(pid) - cpu0,
    );

    let points_for = |base: u64| -> Vec<PointStruct> {
        (0..POINTS)
            .map(|i| {
                let mut p = Payload::new();
                p.insert("doc", i as i64);
                PointStruct::new(base + i as u64, vectors[i].clone(), p)
            })
            .collect()
    };
    let batches: Vec<Vec<PointStruct>> = (0..64).map(|k| points_for(k * POINTS as u64)).collect();
    let grpc_len = {
        use prost::Message;
        qdrant_client::qdrant::UpsertPoints {
            collection_name: "grpc".into(),
            points: batches[0].clone(),
            wait: Some(true),
            ..Default::default()
        }
        .encoded_len()
    };
    let (mut lat, cpu0, t0) = (Vec::new(), cpu_seconds(pid), Instant::now());
    let mut k = 0usize;
    while t0.elapsed() < Duration::from_secs(seconds) {
        let batch = batches[k % batches.len()].clone();
        k += 1;
        let t = Instant::now();
        client
            .upsert_points(UpsertPointsBuilder::new("grpc", batch).wait(true))
            .await?;
        lat.push(t.elapsed());
    }
    report(
        "gRPC (protobuf)",
        grpc_len,
        &mut lat,
        t0.elapsed(),
        cpu_seconds(pid) - cpu0,
    );
    drop(client);
    server.stop();
    std::fs::remove_dir_all(&data).ok();
    Ok(())
}

fn report(name: &str, body: usize, lat: &mut [Duration], elapsed: Duration, cpu: f64) {
    lat.sort();
    let n = lat.len().max(1);
    let q = |p: f64| lat[((n as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0;
    println!(
        "| {name} | {:.0} KB | {:.1} | {:.0} | {:.4} | {:.1} | {:.1} |",
        body as f64 / 1000.0,
        n as f64 / elapsed.as_secs_f64(),
        (n * POINTS) as f64 / elapsed.as_secs_f64(),
        cpu / n as f64,
        q(0.5),
        q(0.99)
    );
}
