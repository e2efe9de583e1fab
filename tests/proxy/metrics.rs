//! The admin port's /metrics as Prometheus itself sees it: the exposition passes
//! `promtool check metrics` (format and naming lint), and a real Prometheus server (Debian's
//! package, installed by `.ci/run`) scrapes it, evaluates the recording rules shipped in
//! deploy/prometheus over the proxy's real labels, and answers every query of the Grafana
//! dashboard in deploy/grafana. The shipped config and alert rules pass promtool's checks
//! and its rule unit tests.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use bytes::Bytes;
use e2e::*;
use tokio::io::AsyncWriteExt;

/// The scrape job's name in deploy/prometheus/prometheus.yml, which the rules select on.
const JOB: &str = "vector-tls-proxy";

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(path)
}

/// Runs promtool with `args` in `dir`, feeding `stdin`.
fn promtool(args: &[&str], dir: &Path, stdin: &[u8]) -> Output {
    let mut child = Command::new(system_tool("promtool"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start promtool ({e}): install Debian's prometheus package")
        });
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn shipped_prometheus_config_and_rules_pass_promtool() {
    let dir = deploy("prometheus");
    let config = promtool(&["check", "config", "prometheus.yml"], &dir, b"");
    assert!(config.status.success(), "{}", text(&config));
    // The rule unit tests show each alert firing when it should and silent when it should not.
    let tests = promtool(
        &["test", "rules", "vector-tls-proxy.rules.test.yml"],
        &dir,
        b"",
    );
    assert!(tests.status.success(), "{}", text(&tests));
    assert!(text(&tests).contains("SUCCESS"), "{}", text(&tests));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_reads_the_admin_port() {
    let upstream = EchoUpstream::start();
    // A rate limit that refuses nothing: its series exist (at zero) for the dashboard's panel.
    let proxy = ProxyProcess::in_front_of(
        &upstream.url(),
        &["--rate-limit", "requests_per_second = 1000"],
    );
    // Traffic that fills every family with a sample: three good requests on new
    // connections (handshakes, requests, bytes) and a plaintext client (a handshake error).
    let cfg = client_config(&ClientOpts::default());
    for i in 0..3 {
        let a = request_bounded(
            proxy.addr,
            cfg.clone(),
            "GET",
            &format!("/r{i}"),
            &[],
            Bytes::new(),
        )
        .await
        .expect("request");
        assert_eq!(a.status, 200);
    }
    let mut garbage = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    drop(garbage);
    proxy.wait_metric("proxy_tls_handshakes_total", &[("outcome", "ok")], 3.0);
    proxy.wait_metric("proxy_tls_handshakes_total", &[("outcome", "error")], 1.0);

    // 1. promtool's own parser and lint accept the exposition.
    let exposition = proxy.metrics();
    let checked = promtool(&["check", "metrics"], Path::new("."), exposition.as_bytes());
    assert!(
        checked.status.success() && text(&checked).is_empty(),
        "promtool: {}\n{exposition}",
        text(&checked)
    );

    // 2. A real Prometheus scrapes the admin port and sees what the proxy counted.
    let prometheus = PrometheusServer::start_with_rules(
        &[(JOB, proxy.admin)],
        &[deploy("prometheus/vector-tls-proxy.rules.yml")],
    );
    let up = prometheus.wait_for_series(&format!("up{{job=\"{JOB}\"}}"));
    assert_eq!(up[0]["value"][1], "1", "{up:?}");
    let ok = prometheus.wait_for_series("sum(proxy_tls_handshakes_total{outcome=\"ok\"})");
    assert_eq!(ok[0]["value"][1], "3", "{ok:?}");
    let info = prometheus.wait_for_series("proxy_listener_info");
    assert_eq!(info[0]["metric"]["provider"], "aws-lc-rs", "{info:?}");
    assert_eq!(info[0]["metric"]["algorithm"], "ecdsa-p256", "{info:?}");
    let errors = prometheus.wait_for_series("sum(proxy_tls_handshakes_total{outcome=\"error\"})");
    assert_eq!(errors[0]["value"][1], "1", "{errors:?}");
    // Histograms arrive as histograms: a quantile over the handshake durations evaluates.
    let p50 = prometheus.wait_for_series(
        "histogram_quantile(0.5, sum by (le) (proxy_tls_handshake_duration_seconds_bucket))",
    );
    let seconds: f64 = p50[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert!(seconds > 0.0 && seconds < 10.0, "{p50:?}");

    // 3. The shipped recording rules select on the labels the proxy really exports.
    let full = prometheus.wait_for_series("proxy:tls_full_handshakes:rate5m");
    assert_eq!(full[0]["metric"]["provider"], "aws-lc-rs", "{full:?}");
    assert_eq!(full[0]["metric"]["algorithm"], "ecdsa-p256", "{full:?}");
    let per_request = prometheus.wait_for_series("proxy:cpu_seconds_per_request:rate5m");
    assert_eq!(per_request[0]["metric"]["job"], JOB, "{per_request:?}");

    // 4. Every query of the Grafana dashboard parses and, but for the QAT panel (empty with
    // a software provider, as its description says), returns the proxy's series.
    let dashboard: serde_json::Value =
        serde_json::from_slice(&std::fs::read(deploy("grafana/vector-tls-proxy.json")).unwrap())
            .unwrap();
    let mut queries = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        let qat_only = panel["title"].as_str().unwrap().contains("QAT");
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "1m")
                .replace("$job", JOB);
            queries += 1;
            if qat_only {
                let (status, v) = prometheus.query(&expr);
                assert_eq!(status, 200, "{expr}: {v}");
                assert_eq!(v["data"]["result"], serde_json::json!([]), "{expr}");
            } else {
                prometheus.wait_for_series(&expr);
            }
        }
    }
    assert!(queries >= 15, "{queries} dashboard queries");
}

/// Per-method metrics: REST paths counted by Qdrant's route patterns (an unknown path as
/// `other`), within `max_methods`; the collection label only when asked, within
/// `max_collections`; `enabled = false` turns the families off for the listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_are_counted_by_route_within_their_bounds() {
    let upstream = EchoUpstream::start();
    let (cert, key) = server_cert(proxy::crypto::CertAlgorithmName::EcdsaP256);
    let dir = temp_dir("method-metrics");
    let config = dir.join("proxy.toml");
    let listener = |name: &str, table: &str| {
        format!(
            "[[listener]]\nname = \"{name}\"\nlisten = \"127.0.0.1:0\"\nupstream = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n[listener.method_metrics]\n{table}\n",
            upstream.url(),
            cert.display(),
            key.display()
        )
    };
    std::fs::write(
        &config,
        listener(
            "named",
            "collection_label = true\nmax_collections = 2\nmax_methods = 3",
        ) + &listener("quiet", "enabled = false"),
    )
    .unwrap();
    let proxy = ProxyProcess::start_raw(&["--config".to_owned(), config.display().to_string()]);
    let cfg = client_config(&ClientOpts::default());
    let named = proxy.listener("named");
    for (method, path) in [
        ("PUT", "/collections/a/points"),
        ("PUT", "/collections/b/points"),
        ("PUT", "/collections/c/points"),
        ("POST", "/collections/a/points/search"),
        ("GET", "/no/such/route"),
        ("POST", "/collections/a/points/query"),
    ] {
        let a = request_bounded(
            named,
            cfg.clone(),
            method,
            path,
            &[],
            Bytes::from_static(b"{}"),
        )
        .await
        .unwrap();
        assert_eq!(a.status, 200);
    }
    request_bounded(
        proxy.listener("quiet"),
        cfg,
        "PUT",
        "/collections/a/points",
        &[],
        Bytes::new(),
    )
    .await
    .unwrap();
    let m = proxy.metrics();
    let count = |labels: &[(&str, &str)]| metric_sum(&m, "proxy_method_requests_total", labels);
    let upsert = ("method", "PUT /collections/{collection_name}/points");
    assert_eq!(count(&[upsert, ("collection", "a")]), 1.0, "{m}");
    assert_eq!(count(&[upsert, ("collection", "b")]), 1.0, "{m}");
    assert_eq!(
        count(&[upsert, ("collection", "other")]),
        1.0,
        "the third collection: {m}"
    );
    assert_eq!(
        count(&[(
            "method",
            "POST /collections/{collection_name}/points/search"
        )]),
        1.0
    );
    // max_methods = 3: upsert, search, other; the query route is counted as other.
    assert_eq!(count(&[("method", "other")]), 2.0, "{m}");
    assert!(!m.contains("/no/such/route"), "a raw path reached a label");
    assert_eq!(count(&[("listener", "quiet")]), 0.0, "{m}");
}
