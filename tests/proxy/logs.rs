//! The access log, written by the real proxy: every field of a JSON line checked against
//! the exchange that made it (HTTP/1.1, h2, a local error), the common log format,
//! sampling, a file replaced under the proxy (logrotate), and lines flushed at shutdown.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::*;
use proxy::crypto::{CertAlgorithmName, ProviderName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Waits (bounded) until `path` holds `n` lines; the writer flushes when its queue empties.
fn wait_lines(path: &Path, n: usize) -> Vec<String> {
    eventually(&format!("{n} lines in {}", path.display()), WAIT, || {
        let l = lines(path);
        if l.len() >= n {
            Ok(l)
        } else {
            Err(format!("{} lines", l.len()))
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_lines_describe_each_exchange() {
    let upstream = EchoUpstream::start();
    let log = temp_dir("access-json").join("access.log");
    let proxy = ProxyProcess::start(
        &upstream.url(),
        ProviderName::Ring,
        CertAlgorithmName::EcdsaP256,
        &[
            "--access-log",
            log.to_str().unwrap(),
            "--max-request-body",
            "100000",
        ],
    );
    let body = Bytes::from(vec![b'x'; 12_345]);
    let h1 = request_bounded(
        proxy.addr,
        client_config(&ClientOpts::default()),
        "PUT",
        "/collections/c/points?wait=true",
        &[("content-type", "application/json")],
        body.clone(),
    )
    .await
    .expect("HTTP/1.1 upsert");
    assert_eq!(h1.status, 200);
    let h2 = request_bounded(
        proxy.addr,
        client_config(&ClientOpts {
            alpn: vec![b"h2".to_vec()],
            ..ClientOpts::default()
        }),
        "POST",
        "/status/404",
        &[],
        Bytes::from_static(b"{}"),
    )
    .await
    .expect("h2 request");
    assert_eq!(h2.status, 404);
    let too_big = request_bounded(
        proxy.addr,
        client_config(&ClientOpts::default()),
        "PUT",
        "/big",
        &[],
        Bytes::from(vec![b'y'; 200_000]),
    )
    .await
    .expect("413 answer");
    assert_eq!(too_big.status, 413);

    let got = wait_lines(&log, 3);
    let v: Vec<serde_json::Value> = got
        .iter()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let upstream_addr = upstream.addr.to_string();
    // The upsert: every field as the exchange was.
    assert_eq!(v[0]["method"], "PUT");
    assert_eq!(v[0]["path"], "/collections/c/points?wait=true");
    assert_eq!(v[0]["protocol"], "http1");
    assert_eq!(v[0]["status"], 200);
    assert_eq!(v[0]["bytes_in"], 12_345);
    assert_eq!(v[0]["bytes_out"], h1.body.len());
    assert_eq!(v[0]["upstream"], upstream_addr.as_str());
    assert_eq!(v[0]["tls_version"], "1.3");
    assert_eq!(v[0]["provider"], "ring");
    assert_eq!(v[0]["resumed"], false);
    assert_eq!(v[0]["listener"], "listener0");
    assert!(v[0]["peer"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert!(v[0]["duration_ms"].as_f64().unwrap() > 0.0);
    assert!(v[0]["time"].as_str().unwrap().ends_with('Z'));
    // h2, the upstream's own 404.
    assert_eq!(v[1]["protocol"], "h2");
    assert_eq!(v[1]["status"], 404);
    assert_eq!(v[1]["bytes_in"], 2);
    assert_eq!(v[1]["bytes_out"], h2.body.len());
    // The proxy's own answer: no upstream, nothing of the body read.
    assert_eq!(v[2]["status"], 413);
    assert_eq!(v[2]["upstream"], serde_json::Value::Null);
    assert_eq!(v[2]["bytes_out"], too_big.body.len());
    // Every request has an x-request-id: the upstream got the one the log names.
    let id = v[0]["request_id"].as_str().expect("a request id");
    assert!(
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
    assert_eq!(
        h1.json()["headers"]["x-request-id"],
        id,
        "the upstream's copy"
    );
    assert_ne!(v[1]["request_id"], v[0]["request_id"], "one id per request");
    let m = proxy.metrics();
    assert_eq!(
        metric_value(&m, "proxy_access_log_lines_total", &[]),
        Some(3.0)
    );
    // The upstream's own time to its answer, for the two requests it answered.
    assert_eq!(
        metric_sum(
            &m,
            "proxy_upstream_response_duration_seconds_count",
            &[("upstream_protocol", "http1")]
        ),
        2.0,
        "{m}"
    );
    assert_eq!(
        metric_value(&m, "proxy_access_log_dropped_total", &[]),
        Some(0.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn common_format_sampling_rotation_and_shutdown_flush() {
    let upstream = EchoUpstream::start();
    let dir = temp_dir("access-clf");
    let log = dir.join("access.log");
    let mut proxy = ProxyProcess::start(
        &upstream.url(),
        ProviderName::AwsLcRs,
        CertAlgorithmName::EcdsaP256,
        &[
            "--access-log",
            log.to_str().unwrap(),
            "--access-log-format",
            "common",
            "--access-log-sample",
            "0.5",
        ],
    );
    for i in 0..10 {
        let a = get(proxy.addr, &format!("/n/{i}")).await.expect("get");
        assert_eq!(a.status, 200);
    }
    let got = wait_lines(&log, 5);
    assert_eq!(got.len(), 5, "every other request: {got:#?}");
    let re_line = |l: &str| {
        l.starts_with("127.0.0.1 - - [")
            && l.contains("] \"GET /n/")
            && l.contains(" HTTP/1.1\" 200 ")
            && l.contains(" provider=aws-lc-rs resumed=false listener=listener0")
    };
    assert!(got.iter().all(|l| re_line(l)), "{got:#?}");

    // logrotate moves the file away; the proxy notices and starts a new one.
    let rotated = dir.join("access.log.1");
    std::fs::rename(&log, &rotated).expect("rotate");
    // The writer looks once a second; the new file appears when it has reopened.
    eventually("the access log reopened", WAIT, || {
        ready(log.exists(), || "no new file".to_owned())
    });
    for i in 10..14 {
        get(proxy.addr, &format!("/n/{i}")).await.expect("get");
    }
    let fresh = wait_lines(&log, 2);
    assert_eq!(fresh.len(), 2, "{fresh:#?}");
    assert_eq!(lines(&rotated).len(), 5, "the old file keeps its lines");

    // Lines of the last requests are written before the process exits.
    for i in 14..16 {
        get(proxy.addr, &format!("/n/{i}")).await.expect("get");
    }
    proxy.terminate();
    assert!(proxy.wait_exit(WAIT).success());
    assert_eq!(lines(&log).len(), 3, "{:#?}", lines(&log));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scanner_cannot_flood_the_log() {
    let upstream = EchoUpstream::start();
    let (cert, key) = server_cert(CertAlgorithmName::EcdsaP256);
    let dir = temp_dir("readable-key");
    let open_key = dir.join("key.pem");
    std::fs::copy(&key, &open_key).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&open_key, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let proxy = ProxyProcess::start_raw(&args(&[
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &upstream.url(),
        "--cert",
        cert.to_str().unwrap(),
        "--key",
        open_key.to_str().unwrap(),
    ]));
    assert!(
        proxy.log_text().contains("readable by every user"),
        "{}",
        proxy.log_text()
    );
    let started = Instant::now();
    for _ in 0..500 {
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        let _ = s.write_all(b"\x16\x03\x01\x00\x05hello-not-tls").await;
        let mut buf = [0u8; 64];
        let _ = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await;
    }
    let seconds = started.elapsed().as_secs() + 1;
    let m = proxy.metrics();
    let failed = metric_sum(&m, "proxy_tls_handshakes_total", &[("outcome", "error")]);
    assert_eq!(failed, 500.0, "{m}");
    let lines = proxy
        .log_text()
        .lines()
        .filter(|l| l.contains("TLS handshake failed"))
        .count() as u64;
    eprintln!(
        "500 bad handshakes in {seconds} s: {lines} log lines, {} suppressed",
        metric_value(&m, "proxy_log_lines_suppressed_total", &[]).unwrap_or(0.0)
    );
    assert!(
        lines <= 20 * (seconds + 1),
        "{lines} log lines for 500 bad handshakes in {seconds} s"
    );
    assert!(
        metric_value(&m, "proxy_log_lines_suppressed_total", &[]).unwrap_or(0.0) >= 1.0,
        "{m}"
    );
}
