//! The admin port's /metrics as Prometheus itself sees it: the exposition passes
//! `promtool check metrics` (format and naming lint), and a real Prometheus server (Debian's
//! package, installed by `.ci/run`) scrapes it and answers queries with the proxy's counts.

use std::io::Write;
use std::process::{Command, Stdio};

use bytes::Bytes;
use e2e::*;
use proxy::crypto::{CertAlgorithmName, ProviderName};
use tokio::io::AsyncWriteExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_reads_the_admin_port() {
    let upstream = EchoUpstream::start();
    let proxy = ProxyProcess::start(
        &upstream.url(),
        ProviderName::AwsLcRs,
        CertAlgorithmName::EcdsaP256,
        &[],
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
    let text = proxy.metrics();
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start promtool ({e}): install Debian's prometheus package")
        });
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let checked = promtool.wait_with_output().unwrap();
    assert!(
        checked.status.success() && checked.stdout.is_empty() && checked.stderr.is_empty(),
        "promtool: {}{}\n{text}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    // 2. A real Prometheus scrapes the admin port and sees what the proxy counted.
    let prometheus = PrometheusServer::start(&[("proxy", proxy.admin)]);
    let up = prometheus.wait_for_series("up{job=\"proxy\"}");
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
}
