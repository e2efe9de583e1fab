//! Start-up errors name what to fix and exit non-zero; SIGTERM drains in-flight requests
//! and exits 0.

use std::time::Duration;

use bytes::Bytes;
use e2e::*;
use proxy::crypto::{CertAlgorithmName, ProviderName};

fn expect_failure(args: &[String], code: i32, needles: &[&str]) {
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, out) = run_proxy_to_exit(&argv);
    assert_eq!(status.code(), Some(code), "{args:?}\n{out}");
    for n in needles {
        assert!(out.contains(n), "expected {n:?} in:\n{out}");
    }
}

#[test]
fn startup_errors_name_the_problem() {
    let (cert, key) = server_cert(CertAlgorithmName::Rsa2048);
    let (_, other_key) = server_cert(CertAlgorithmName::EcdsaP256);
    let (cert, key, other_key) = (
        cert.display().to_string(),
        key.display().to_string(),
        other_key.display().to_string(),
    );

    // Missing key file.
    expect_failure(
        &startup_run_args(&cert, "/nonexistent/server.key", &[]),
        2,
        &["listener[0].key", "/nonexistent/server.key"],
    );
    // A key that does not belong to the certificate, for every software provider.
    for p in ProviderName::SOFTWARE {
        expect_failure(
            &startup_run_args(&cert, &other_key, &["--provider", p.as_str()]),
            1,
            &["does not match", "ecdsa-p256.key", "rsa2048.crt"],
        );
    }
    // Unknown provider.
    expect_failure(
        &startup_run_args(&cert, &key, &["--provider", "boringssl"]),
        2,
        &["boringssl"],
    );
    // The QAT provider asked for where it is not installed: a clear refusal naming what was
    // looked for, never a silent fallback.
    expect_failure(
        &startup_run_args(&cert, &key, &["--provider", "openssl-qat"]),
        1,
        &[
            r#"cannot load OpenSSL provider "qatprovider""#,
            "qatprovider.so",
        ],
    );
    // Port in use.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let mut args = startup_run_args(&cert, &key, &[]);
    args[2] = port.clone();
    expect_failure(&args, 1, &[&format!("cannot listen on {port}"), "in use"]);
    // Bad TOML.
    let dir = temp_dir("badtoml");
    let file = dir.join("proxy.toml");
    std::fs::write(&file, "[[listener]\nlisten = \"127.0.0.1:0\"\n").unwrap();
    let f = file.display().to_string();
    expect_failure(
        &["run".to_owned(), "--config".to_owned(), f.clone()],
        2,
        &[&f, "not valid"],
    );
    // check-config lists every problem of a bad but well-formed file.
    std::fs::write(
        &file,
        format!(
            "[limits]\nmax_connections = 0\n[[listener]]\nlisten = \"nowhere\"\ncert = \"{cert}\"\nkey = \"/nonexistent.key\"\nupstream = \"ftp://x:1\"\n"
        ),
    )
    .unwrap();
    expect_failure(
        &["check-config".to_owned(), f.clone()],
        2,
        &[
            "limits.max_connections",
            "listener[0].listen",
            "listener[0].key: file not found",
            "listener[0].upstream",
        ],
    );
    // ...and prints the resolved configuration of a good one.
    std::fs::write(
        &file,
        format!("provider = \"ring\"\n[[listener]]\nlisten = \"127.0.0.1:0\"\ncert = \"{cert}\"\nkey = \"{key}\"\nupstream = \"http://127.0.0.1:6333\"\n"),
    )
    .unwrap();
    let (status, out) = run_proxy_to_exit(&["check-config", &f]);
    assert!(status.success(), "{out}");
    assert!(out.contains("provider = \"ring\""), "{out}");
    assert!(out.contains("max_request_body_bytes = 33554432"), "{out}");
    // ...with the groups the provider really offers: ring has no ML-KEM.
    assert!(
        out.contains("provider ring (ring 0.17) offers key exchange x25519, secp256r1, secp384r1"),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_and_exits_zero() {
    let upstream = EchoUpstream::start();
    let mut proxy = ProxyProcess::in_front_of(&upstream.url(), &["--shutdown-grace", "10s"]);
    let addr = proxy.addr;
    let in_flight = tokio::spawn(async move {
        let cfg = client_config(&ClientOpts::default());
        request_bounded(addr, cfg, "GET", "/slow/1500", &[], Bytes::new()).await
    });
    // Let the request reach the upstream, then ask the proxy to stop.
    tokio::time::sleep(Duration::from_millis(400)).await;
    proxy.terminate();
    let answer = in_flight
        .await
        .unwrap()
        .expect("in-flight request completes");
    assert_eq!(answer.status, 200);
    let status = tokio::task::spawn_blocking(move || {
        let s = proxy.wait_exit(Duration::from_secs(15));
        (s, proxy.log_text())
    })
    .await
    .unwrap();
    assert_eq!(status.0.code(), Some(0), "{}", status.1);
    assert!(status.1.contains("draining"), "{}", status.1);
    // The listener is closed after exit: new connections are refused.
    assert!(std::net::TcpStream::connect(addr).is_err());
}

/// `--accept-grace`: on SIGTERM the proxy reports not ready at once but keeps accepting
/// and serving new connections for the grace (a load balancer or Kubernetes removes the
/// endpoint only after it sees readiness fail), then drains and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_keeps_accepting_for_the_accept_grace_while_not_ready() {
    let upstream = EchoUpstream::start();
    let mut proxy = ProxyProcess::in_front_of(
        &upstream.url(),
        &["--accept-grace", "3s", "--shutdown-grace", "5s"],
    );
    let (addr, admin) = (proxy.addr, proxy.admin);
    assert_eq!(plain_get(admin, "/readyz").0, 200);
    proxy.terminate();
    eventually_async("readiness failing after SIGTERM", WAIT, || async {
        let status = plain_get(admin, "/readyz").0;
        ready(status == 503, || format!("/readyz {status}"))
    })
    .await;
    let not_ready_at = std::time::Instant::now();
    // Within the grace: a new connection and its request are served.
    let answer = get(addr, "/")
        .await
        .expect("served during the accept grace");
    assert_eq!(answer.status, 200);
    assert!(
        not_ready_at.elapsed() < Duration::from_secs(3),
        "the check took too long"
    );
    let status = tokio::task::spawn_blocking(move || {
        let s = proxy.wait_exit(Duration::from_secs(20));
        (s, proxy.log_text())
    })
    .await
    .unwrap();
    assert_eq!(status.0.code(), Some(0), "{}", status.1);
    assert!(
        not_ready_at.elapsed() >= Duration::from_millis(2500),
        "exited before the accept grace was over"
    );
    assert!(status.1.contains("still accepting"), "{}", status.1);
    assert!(std::net::TcpStream::connect(addr).is_err());
}

/// `--log-format json`: every line the proxy writes is one JSON object, with the level,
/// the message and the event's fields beside it (what log shippers index).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line() {
    let upstream = EchoUpstream::start();
    let proxy = ProxyProcess::in_front_of(&upstream.url(), &["--log-format", "json"]);
    let a = get(proxy.addr, "/").await.unwrap();
    assert_eq!(a.status, 200);
    let log = proxy.log_text();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let ready = lines
        .iter()
        .find(|v| v["message"] == "listener ready")
        .unwrap_or_else(|| panic!("no listener-ready line: {log}"));
    assert_eq!(ready["level"], "INFO", "{ready}");
    assert_eq!(ready["provider"], "aws-lc-rs", "{ready}");
    assert!(ready["timestamp"].is_string(), "{ready}");
}
