//! The official Python qdrant-client against a listener's rate limit: its uploader honours
//! the proxy's answer (REST 429 with Retry-After, gRPC RESOURCE_EXHAUSTED with retry-after)
//! and slows down instead of failing. The limits themselves are tested in the proxy's
//! binary (proxy/rate_limits.rs).

use std::process::Command;

use e2e::*;

use super::interop::run_bounded;

/// The official Python client's uploader through a listener with a rate limit per API key
/// (2 upserts/s, burst 4), over REST and over gRPC: every answer over the limit (429 with
/// Retry-After, RESOURCE_EXHAUSTED with retry-after) makes it wait and go on, so 300 points
/// in batches of 10 (30 upserts) all arrive, slower than the limit lets through and
/// without an error; the proxy counted the refusals, and another key's requests pass.
#[test]
fn the_official_client_slows_down_at_a_rate_limit_and_loses_nothing() {
    let python = interop_python("qdrant-client");
    let eq = EmbeddedQdrant::start(&temp_dir("interop-rate-limit"));
    let limit = "name = \"upserts\", requests_per_second = 2, burst = 4";
    let rest = ProxyProcess::in_front_of(&format!("http://{}", eq.rest), &["--rate-limit", limit]);
    let grpc = ProxyProcess::in_front_of(
        &format!("http://{}", eq.grpc),
        &["--upstream-protocol", "h2c", "--rate-limit", limit],
    );
    let script = repo_root().join("tests/interop/rate_limited_upload.py");
    let ca = certs().ca_cert.display().to_string();
    for (proxy, grpc_flag) in [(&rest, None), (&grpc, Some("--grpc"))] {
        let (ok, out) = run_bounded(
            Command::new(&python)
                .arg(&script)
                .args([
                    "--host",
                    "localhost",
                    "--port",
                    &proxy.addr.port().to_string(),
                ])
                .args([
                    "--ca",
                    &ca,
                    "--api-key",
                    "tenant-a",
                    "--points",
                    "300",
                    "--batch",
                    "10",
                ])
                .args(grpc_flag),
            "rate_limited_upload.py",
        );
        assert!(ok, "{out}");
        let seen: serde_json::Value =
            serde_json::from_str(out.lines().rfind(|l| l.starts_with('{')).unwrap()).unwrap();
        eprintln!(
            "qdrant-client {} through a rate limit of 2/s: {seen}",
            if grpc_flag.is_some() { "gRPC" } else { "REST" }
        );
        assert_eq!(
            seen["error"],
            serde_json::Value::Null,
            "{seen}\n{}",
            proxy.log_text()
        );
        assert_eq!(seen["count"], 300, "{seen}");
        assert!(
            seen["waits"].as_u64().unwrap() >= 1,
            "the client never met the limit: {seen}"
        );
        // 30 upserts after a burst of 4 at 2/s: at least 13 s.
        assert!(seen["seconds"].as_f64().unwrap() >= 12.0, "{seen}");
        let refused = proxy.metric(
            "proxy_rate_limited_total",
            &[("limit", "upserts"), ("key_class", "api_key")],
        );
        assert!(refused >= 1.0, "{}", proxy.metrics());
    }
}
