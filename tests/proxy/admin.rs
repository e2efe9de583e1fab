//! The admin listener under hostile clients: its connections are bounded and it checks what
//! it reads.

use std::time::{Duration, Instant};

use e2e::*;
use proxy::crypto::CertAlgorithmName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// 200 admin connections with unfinished request heads: at most admin.max_connections
/// are kept and those are closed after the header timeout; a wrong token is refused and
/// counted; /admin/tls reads only regular files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_port_bounds_connections_and_checks_what_it_reads() {
    let upstream = EchoUpstream::start();
    let dir = temp_dir("admin-hardening");
    let token = dir.join("token");
    std::fs::write(&token, "0123456789abcdef-secret").unwrap();
    let config = dir.join("proxy.toml");
    std::fs::write(
        &config,
        "[admin]\nmax_connections = 8\nheader_read_timeout = \"1s\"\n",
    )
    .unwrap();
    let proxy = ProxyProcess::in_front_of(
        &upstream.url(),
        &[
            "--config",
            config.to_str().unwrap(),
            "--admin-token-file",
            token.to_str().unwrap(),
        ],
    );
    let mut open = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(proxy.admin).await.unwrap();
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n").await;
        open.push(s);
    }
    // All 200 are closed: 192 at once (over the cap), 8 after the 1 s header timeout.
    let started = Instant::now();
    for (i, mut s) in open.into_iter().enumerate() {
        let mut buf = [0u8; 256];
        let left = Duration::from_secs(5).saturating_sub(started.elapsed());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {}
            Ok(Ok(_)) => {} // hyper's 408 before closing
            Err(_) => panic!("admin connection {i} still open after 5 s"),
        }
    }
    eprintln!(
        "200 admin connections with unfinished heads: all closed within {:?}",
        started.elapsed()
    );
    let m = proxy.metrics();
    assert!(
        metric_value(
            &m,
            "proxy_admin_refusals_total",
            &[("reason", "connections")]
        )
        .unwrap_or(0.0)
            >= 150.0,
        "{m}"
    );

    let switch = |auth: &str, body: String| {
        let auth = auth.to_owned();
        let admin = proxy.admin;
        async move {
            let mut s = TcpStream::connect(admin).await.unwrap();
            let req = format!(
                "POST /admin/tls HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            let _ = tokio::time::timeout(WAIT, s.read_to_string(&mut out)).await;
            out
        }
    };
    let (cert, _) = server_cert(CertAlgorithmName::EcdsaP256);
    let body = serde_json::json!({
        "provider": "aws-lc-rs",
        "cert": cert,
        "key": "/dev/zero",
    })
    .to_string();
    let wrong = switch("Bearer short", body.clone()).await;
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    let right = switch("Bearer 0123456789abcdef-secret", body).await;
    assert!(right.starts_with("HTTP/1.1 422"), "{right}");
    assert!(right.contains("not a regular file"), "{right}");
    assert_eq!(
        proxy.metric("proxy_admin_refusals_total", &[("reason", "token")]),
        1.0
    );
}
