//! Run-time TLS switching through `POST /admin/tls`: authorised by the bearer token, atomic
//! (new connections get the new provider and certificate, an established connection keeps
//! working), and a bad request changes nothing.

use std::net::SocketAddr;

use bytes::Bytes;
use e2e::*;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use proxy::crypto::{CertAlgorithmName, ProviderName};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

const TOKEN: &str = "test-token-0123456789abcdef";

/// POST /admin/tls over plain HTTP/1.1; returns status and body.
fn post_admin(admin: SocketAddr, token: Option<&str>, body: &str) -> (u16, String) {
    let auth = token.map(|t| format!("Authorization: Bearer {t}"));
    let headers: Vec<&str> = auth.iter().map(String::as_str).collect();
    http_raw(admin, "POST", "/admin/tls", &headers, body)
}

fn first_cert(path: &std::path::Path) -> CertificateDer<'static> {
    CertificateDer::pem_file_iter(path)
        .expect("cert file")
        .next()
        .expect("one cert")
        .expect("pem")
}

fn switch_body(provider: &str, alg: CertAlgorithmName, key_alg: CertAlgorithmName) -> String {
    let (cert, _) = server_cert(alg);
    let (_, key) = server_cert(key_alg);
    serde_json::json!({"provider": provider, "cert": cert, "key": key}).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switch_is_atomic_authorised_and_keeps_established_connections() {
    let upstream = EchoUpstream::start();
    let dir = temp_dir("switch");
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let proxy = ProxyProcess::start(
        &upstream.url(),
        ProviderName::Ring,
        CertAlgorithmName::Rsa2048,
        &["--admin-token-file", token_file.to_str().unwrap()],
    );
    let config = client_config(&ClientOpts {
        alpn: vec![b"http/1.1".to_vec()],
        ..Default::default()
    });

    // An established keep-alive connection, handshaken with RSA-2048.
    let tls = tls_connect(proxy.addr, config.clone())
        .await
        .expect("connect");
    let peer = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    assert_eq!(peer, first_cert(&server_cert(CertAlgorithmName::Rsa2048).0));
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("h1");
    tokio::spawn(conn);
    let get = || {
        http::Request::builder()
            .uri("/before")
            .header("host", "localhost")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let resp = sender.send_request(get()).await.expect("first request");
    assert_eq!(resp.status(), 200);
    let _ = resp.into_body().collect().await;

    // Refusals change nothing.
    let admin = proxy.admin;
    let good = switch_body(
        "aws-lc-rs",
        CertAlgorithmName::EcdsaP384,
        CertAlgorithmName::EcdsaP384,
    );
    let mismatched = switch_body(
        "aws-lc-rs",
        CertAlgorithmName::EcdsaP384,
        CertAlgorithmName::EcdsaP256,
    );
    let (status, body) = tokio::task::spawn_blocking({
        let good = good.clone();
        move || post_admin(admin, None, &good)
    })
    .await
    .unwrap();
    assert_eq!(status, 401, "{body}");
    let (status, _) = tokio::task::spawn_blocking({
        let good = good.clone();
        move || post_admin(admin, Some("wrong-token-0123456789abcdef"), &good)
    })
    .await
    .unwrap();
    assert_eq!(status, 401);
    let (status, body) =
        tokio::task::spawn_blocking(move || post_admin(admin, Some(TOKEN), "{\"provider\":1}"))
            .await
            .unwrap();
    assert_eq!(status, 400, "{body}");
    let (status, body) =
        tokio::task::spawn_blocking(move || post_admin(admin, Some(TOKEN), &mismatched))
            .await
            .unwrap();
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("ecdsa-p256.key") || body.contains("match"),
        "{body}"
    );
    let unknown = serde_json::json!({
        "listener": "nope",
        "provider": "ring",
        "cert": server_cert(CertAlgorithmName::EcdsaP256).0,
        "key": server_cert(CertAlgorithmName::EcdsaP256).1,
    })
    .to_string();
    let (status, body) =
        tokio::task::spawn_blocking(move || post_admin(admin, Some(TOKEN), &unknown))
            .await
            .unwrap();
    assert_eq!(status, 404, "{body}");
    let tls = tls_connect(proxy.addr, config.clone())
        .await
        .expect("still rsa");
    assert_eq!(
        tls.get_ref().1.peer_certificates().unwrap()[0],
        first_cert(&server_cert(CertAlgorithmName::Rsa2048).0),
        "refused switches changed nothing"
    );
    drop(tls);

    // The switch.
    let (status, body) = tokio::task::spawn_blocking(move || post_admin(admin, Some(TOKEN), &good))
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["switched"][0]["provider"], "aws-lc-rs");
    assert_eq!(v["switched"][0]["algorithm"], "ecdsa-p384");

    // New connections handshake with the new certificate...
    let answer = request_bounded(
        proxy.addr,
        config.clone(),
        "GET",
        "/after",
        &[],
        Bytes::new(),
    )
    .await
    .expect("new connection after the switch");
    assert_eq!(answer.status, 200);
    let tls = tls_connect(proxy.addr, config.clone()).await.expect("new");
    assert_eq!(
        tls.get_ref().1.peer_certificates().unwrap()[0],
        first_cert(&server_cert(CertAlgorithmName::EcdsaP384).0)
    );
    drop(tls);
    // ...while the established one keeps serving.
    let resp = sender
        .send_request(get())
        .await
        .expect("old connection still works");
    assert_eq!(resp.status(), 200);

    let text = proxy.metrics();
    assert_eq!(
        metric_value(
            &text,
            "proxy_listener_info",
            &[("provider", "aws-lc-rs"), ("algorithm", "ecdsa-p384")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric_value(&text, "proxy_listener_info", &[("provider", "ring")]),
        None,
        "the old listener info is retired: {text}"
    );
    let after = metric_value(
        &text,
        "proxy_tls_handshakes_total",
        &[
            ("provider", "aws-lc-rs"),
            ("algorithm", "ecdsa-p384"),
            ("outcome", "ok"),
        ],
    )
    .unwrap_or(0.0);
    assert!(after >= 2.0, "{text}");
}

#[test]
fn without_a_token_file_the_switch_is_off() {
    let upstream = EchoUpstream::start();
    let proxy = ProxyProcess::start(
        &upstream.url(),
        ProviderName::Ring,
        CertAlgorithmName::EcdsaP256,
        &[],
    );
    let body = switch_body(
        "aws-lc-rs",
        CertAlgorithmName::EcdsaP256,
        CertAlgorithmName::EcdsaP256,
    );
    let (status, text) = post_admin(proxy.admin, Some(TOKEN), &body);
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("token_file"), "{text}");
}

#[test]
fn a_short_token_is_refused_at_start_up() {
    let dir = temp_dir("switch-short");
    let token_file = dir.join("token");
    std::fs::write(&token_file, "short").unwrap();
    let (cert, key) = server_cert(CertAlgorithmName::EcdsaP256);
    let args = startup_run_args(
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
        &["--admin-token-file", token_file.to_str().unwrap()],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, log) = run_proxy_to_exit(&args);
    assert!(!status.success());
    assert!(log.contains("at least 16 characters"), "{log}");
}
