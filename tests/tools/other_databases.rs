//! Vector databases other than Qdrant behind the proxy, each driven by its own client with
//! TLS verified against the proxy's CA: Milvus Lite by pymilvus and Chroma by chromadb's
//! HttpClient, each directly and through the proxy, with a body over the limit.
//!
//! The Python clients come from PyPI into virtualenvs (`tests/interop/install.sh`).

use std::process::{Command, Stdio};

use e2e::*;
use proxy::crypto::{CertAlgorithmName, ProviderName};

use super::interop::run_bounded;

/// A database server of the interop virtualenvs on a free loopback port, started as its
/// users start it, killed on drop.
struct DatabaseServer {
    addr: std::net::SocketAddr,
    child: std::process::Child,
}

impl DatabaseServer {
    /// Starts `program` (a command of the `venv` virtualenv) with `args`, in which `{port}`
    /// and `{data}` stand for the port and a fresh data directory, and waits until it
    /// listens.
    fn start(venv: &str, program: &str, args: &[&str]) -> Self {
        let addr = free_loopback_addr();
        let bin = interop_python(venv).with_file_name(program);
        let data = temp_dir(program);
        let port = addr.port().to_string();
        let args: Vec<String> = args
            .iter()
            .map(|a| {
                a.replace("{port}", &port)
                    .replace("{data}", &data.display().to_string())
            })
            .collect();
        let child = Command::new(&bin)
            .args(&args)
            .env("ANONYMIZED_TELEMETRY", "False")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        eventually(
            &format!("{program} listening on {addr}"),
            std::time::Duration::from_secs(60),
            || std::net::TcpStream::connect(addr).map_err(|e| e.to_string()),
        );
        Self { addr, child }
    }
}

impl Drop for DatabaseServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs one of tests/interop's exercise scripts with the `venv` virtualenv's Python; its
/// JSON line.
fn exercise(venv: &str, script: &str, args: &[&str]) -> serde_json::Value {
    let python = interop_python(venv);
    let path = repo_root().join("tests/interop").join(script);
    let (ok, out) = run_bounded(
        Command::new(&python)
            .arg(&path)
            .args(args)
            .env("ANONYMIZED_TELEMETRY", "False"),
        script,
    );
    assert!(ok, "{script} {args:?}:\n{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON from {script}:\n{out}"));
    serde_json::from_str(line).unwrap()
}

/// The exercise's `fields` the same through the proxy as direct; both insert times shown.
fn same_answers(
    db: &str,
    direct: &serde_json::Value,
    through: &serde_json::Value,
    fields: &[&str],
) {
    for field in fields {
        assert_eq!(
            through[field], direct[field],
            "{field}: {through} vs {direct}"
        );
    }
    eprintln!(
        "{db}: 2,000 vectors inserted in batches of 100 in {:.2} s direct, {:.2} s through the proxy",
        direct["insert_seconds"].as_f64().unwrap_or(f64::NAN),
        through["insert_seconds"].as_f64().unwrap_or(f64::NAN),
    );
}

/// tests/interop/milvus_exercise.py's JSON line.
fn milvus_exercise(uri: &str, ca: &str, mode: &str) -> serde_json::Value {
    exercise(
        "milvus",
        "milvus_exercise.py",
        &[uri, ca, "localhost", mode],
    )
}

/// Milvus behind the proxy, driven by its own client (pymilvus) with TLS verified against
/// the proxy's CA: the whole exercise passes as it does direct, Milvus's errors arrive as
/// Milvus's; and one insert over the proxy's body limit (10,000 x 1,024-d, about 41 MB,
/// over the default 32 MiB) is answered RESOURCE_EXHAUSTED, which pymilvus does not retry,
/// sent upstream once at most and counted as the client's error (UNAVAILABLE pymilvus
/// would retry for minutes, re-sending the body each time).
#[test]
fn milvus_with_pymilvus_through_the_proxy() {
    // Milvus Lite's server: Milvus's gRPC API.
    let milvus = DatabaseServer::start(
        "milvus",
        "milvus-lite",
        &[
            "server",
            "--data-dir",
            "{data}",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
        ],
    );
    let ca = certs().ca_cert.display().to_string();
    let direct = milvus_exercise(&format!("http://{}", milvus.addr), "", "exercise");
    let proxy = ProxyProcess::start(
        &format!("http://{}", milvus.addr),
        ProviderName::AwsLcRs,
        CertAlgorithmName::EcdsaP256,
        &["--upstream-protocol", "h2c"],
    );
    let uri = format!("https://localhost:{}", proxy.addr.port());
    let through = milvus_exercise(&uri, &ca, "exercise");
    // Per-method metrics name Milvus's own calls.
    let insert = [
        ("method", "milvus.proto.milvus.MilvusService/Insert"),
        ("grpc_status", "0"),
    ];
    assert!(proxy.metric("proxy_method_requests_total", &insert) >= 20.0);
    same_answers(
        "milvus",
        &direct,
        &through,
        &[
            "count",
            "top_id",
            "hits",
            "got_id",
            "got_dim",
            "count_after_delete",
            "wrong_dim",
            "missing",
            "dropped",
        ],
    );
    assert_eq!(through["count"], 2000);
    assert_eq!(through["top_id"], 42);
    assert_eq!(through["count_after_delete"], 1950);
    assert!(
        through["wrong_dim"].as_str().unwrap().contains("dim"),
        "{through}"
    );

    let before = proxy.metrics();
    let oversized = milvus_exercise(&uri, &ca, "oversized");
    let error = oversized["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("RESOURCE_EXHAUSTED") && error.contains("max_request_body"),
        "{oversized}"
    );
    assert!(
        oversized["seconds"].as_f64().unwrap() < 60.0,
        "the client retried: {oversized}"
    );
    let m = proxy.metrics();
    assert_eq!(
        metric_sum(
            &m,
            "proxy_client_errors_total",
            &[("kind", "body_too_large")]
        ) - metric_sum(
            &before,
            "proxy_client_errors_total",
            &[("kind", "body_too_large")]
        ),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric_sum(&m, "proxy_upstream_errors_total", &[]),
        0.0,
        "{m}"
    );
}

/// tests/interop/chroma_exercise.py's JSON line.
fn chroma_exercise(port: u16, ca: &str, mode: &str) -> serde_json::Value {
    exercise(
        "chroma",
        "chroma_exercise.py",
        &["localhost", &port.to_string(), ca, mode],
    )
}

/// Chroma behind the proxy, driven by its own client (chromadb.HttpClient) with TLS
/// verified against the proxy's CA, on a listener with `error_body = "text"` (the setting
/// for databases other than Qdrant): the whole exercise passes as it does direct and
/// Chroma's errors arrive as Chroma's; a client that does not trust the CA refuses the
/// certificate (with an alert the proxy counts); one add over the proxy's body limit
/// (5,000 x 1,536-d, 41 MB, which Chroma takes direct) is answered 413 with the proxy's message as the
/// client's error text, counted once as the client's error, nothing of it stored; with
/// Chroma down the client's error is the proxy's plain "upstream unavailable".
#[test]
fn chroma_with_its_client_through_the_proxy() {
    // Chroma's own server (Rust), REST over HTTP/1.1.
    let chroma = DatabaseServer::start(
        "chroma",
        "chroma",
        &[
            "run",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--path",
            "{data}",
        ],
    );
    let ca = certs().ca_cert.display().to_string();
    let direct = chroma_exercise(chroma.addr.port(), "", "exercise");
    let proxy = ProxyProcess::start(
        &format!("http://{}", chroma.addr),
        ProviderName::AwsLcRs,
        CertAlgorithmName::EcdsaP256,
        &["--error-body", "text"],
    );
    let port = proxy.addr.port();
    let through = chroma_exercise(port, &ca, "exercise");
    // Per-method metrics name Chroma's routes, never a collection's id.
    let add = [
        (
            "method",
            "POST /api/v2/tenants/{tenant}/databases/{database}/collections/{collection_id}/add",
        ),
        ("status", "201"),
    ];
    assert!(
        proxy.metric("proxy_method_requests_total", &add) >= 20.0,
        "{}",
        proxy
            .metrics()
            .lines()
            .filter(|l| l.starts_with("proxy_method_requests_total"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    same_answers(
        "chroma",
        &direct,
        &through,
        &[
            "count",
            "top_id",
            "hits",
            "got_id",
            "got_dim",
            "count_after_delete",
            "wrong_dim",
            "duplicate",
            "missing",
            "dropped",
        ],
    );
    assert_eq!(through["count"], 2000, "{through}");
    assert_eq!(through["top_id"], "42", "{through}");
    assert_eq!(through["count_after_delete"], 1950, "{through}");
    for (field, chroma_error) in [
        ("wrong_dim", "InvalidArgumentError"),
        ("missing", "NotFoundError"),
        ("duplicate", "already exists"),
    ] {
        assert!(
            through[field].as_str().unwrap().contains(chroma_error),
            "{field}: {through}"
        );
    }

    // chromadb reports a failed TLS handshake as a server it could not reach; the proxy
    // saw the client refuse its certificate (an unknown-CA alert).
    let untrusted = chroma_exercise(port, "", "no_ca");
    assert!(
        untrusted["error"]
            .as_str()
            .unwrap_or_default()
            .contains("Could not connect"),
        "{untrusted}"
    );
    proxy.wait_metric(
        "proxy_tls_handshake_failures_total",
        &[("reason", "alert_received")],
        1.0,
    );

    let before = proxy.metrics();
    let oversized = chroma_exercise(port, &ca, "oversized");
    let error = oversized["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("Exception: request body larger than the proxy's limit")
            && error.contains("limits.max_request_body_bytes"),
        "the proxy's message, as text: {oversized}"
    );
    assert_eq!(oversized["count"], 0, "{oversized}");
    let m = proxy.metrics();
    let too_large = |text: &str| {
        metric_sum(
            text,
            "proxy_client_errors_total",
            &[("kind", "body_too_large")],
        )
    };
    assert_eq!(too_large(&m) - too_large(&before), 1.0, "{m}");

    drop(chroma);
    let down = chroma_exercise(port, &ca, "heartbeat");
    let error = down["error"].as_str().unwrap_or_default();
    assert!(
        error.ends_with(": the upstream is unavailable\n"),
        "the proxy's plain message as the client's error: {down}\n{}",
        proxy.log_text()
    );
}
