//! Run-time TLS switching through `POST /admin/tls`: authorised by the bearer token, atomic
//! (new connections get the new provider and certificate, an established connection keeps
//! working), and a bad request changes nothing. SIGHUP reloads rotated certificate files the
//! same way, and a reload of bad files keeps the certificate in use.

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

/// An HTTP/1.1 keep-alive client on an established TLS connection.
async fn keep_alive(
    tls: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("HTTP/1.1 handshake");
    tokio::spawn(conn);
    sender
}

/// A GET on the kept-alive connection, which must answer 200.
async fn get_ok(sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>, what: &str) {
    let req = http::Request::builder()
        .uri("/")
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = sender
        .send_request(req)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(resp.status(), 200, "{what}");
    let _ = resp.into_body().collect().await;
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
    let mut sender = keep_alive(tls).await;
    get_ok(&mut sender, "first request").await;

    // Refusals change nothing.
    let admin = proxy.admin;
    let good = switch_body(
        "aws-lc-rs",
        CertAlgorithmName::EcdsaP384,
        CertAlgorithmName::EcdsaP384,
    );
    refused_switches_change_nothing(&proxy, &config, &good).await;

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
    // A TLS 1.3 client is done once it has sent its Finished; the proxy counts the
    // handshake only when it has read it. A request answered on the connection is what
    // shows the proxy counted it (dropping the connection at once raced the scrape below).
    let mut fresh = keep_alive(tls).await;
    get_ok(&mut fresh, "a request on the new connection").await;
    drop(fresh);
    // ...while the established one keeps serving.
    get_ok(&mut sender, "old connection still works").await;

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

/// Switches refused for a missing or wrong token (401), a malformed body (400), a key that
/// does not match its certificate (422) and an unknown listener (404): none changes what
/// new connections handshake with.
async fn refused_switches_change_nothing(
    proxy: &ProxyProcess,
    config: &std::sync::Arc<rustls::ClientConfig>,
    good: &str,
) {
    let admin = proxy.admin;
    let mismatched = switch_body(
        "aws-lc-rs",
        CertAlgorithmName::EcdsaP384,
        CertAlgorithmName::EcdsaP256,
    );
    let (status, body) = tokio::task::spawn_blocking({
        let good = good.to_owned();
        move || post_admin(admin, None, &good)
    })
    .await
    .unwrap();
    assert_eq!(status, 401, "{body}");
    let (status, _) = tokio::task::spawn_blocking({
        let good = good.to_owned();
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

/// The certificate's notAfter in seconds since the epoch, as OpenSSL's own tool reads it.
fn not_after(cert: &std::path::Path) -> f64 {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "date -u -d \"$(openssl x509 -noout -enddate -in '{}' | cut -d= -f2)\" +%s",
            cert.display()
        ))
        .output()
        .expect("openssl and date");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("notAfter of {}: {out:?}", cert.display()))
}

/// A proxy (aws-lc-rs) serving the certificate and key at these paths, so that tests can
/// replace them underneath it.
fn proxy_on_files(
    upstream: &EchoUpstream,
    cert: &std::path::Path,
    key: &std::path::Path,
    extra: &[&str],
) -> ProxyProcess {
    let mut flags = listener_args(&upstream.url(), ProviderName::AwsLcRs, cert, key);
    flags.extend(args(extra));
    ProxyProcess::start_raw(&flags)
}

/// Replaces `dest` the way certificate managers do: write beside it, then rename over it.
fn install_file(src: &std::path::Path, dest: &std::path::Path) {
    let tmp = dest.with_extension("new");
    std::fs::copy(src, &tmp).unwrap();
    std::fs::rename(&tmp, dest).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_a_rotated_certificate_and_keeps_the_old_one_when_the_new_files_are_bad() {
    let upstream = EchoUpstream::start();
    let dir = temp_dir("sighup");
    let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
    let (rsa_cert, rsa_key) = server_cert(CertAlgorithmName::Rsa2048);
    let (ec_cert, ec_key) = server_cert(CertAlgorithmName::EcdsaP256);
    install_file(&rsa_cert, &cert);
    install_file(&rsa_key, &key);
    // SIGHUP alone here; the file watch is tested below.
    let proxy = proxy_on_files(&upstream, &cert, &key, &["--cert-watch-interval", "0s"]);
    let expiry = |text: &str| {
        metric_value(text, "proxy_tls_certificate_expiry_timestamp_seconds", &[])
            .unwrap_or_else(|| panic!("no expiry metric: {text}"))
    };
    assert_eq!(expiry(&proxy.metrics()), not_after(&rsa_cert));
    let config = client_config(&ClientOpts {
        alpn: vec![b"http/1.1".to_vec()],
        ..Default::default()
    });
    let peer = |tls: &tokio_rustls::client::TlsStream<tokio::net::TcpStream>| {
        tls.get_ref().1.peer_certificates().unwrap()[0].clone()
    };

    // An established keep-alive connection on the RSA certificate.
    let tls = tls_connect(proxy.addr, config.clone()).await.unwrap();
    assert_eq!(peer(&tls), first_cert(&rsa_cert));
    let mut sender = keep_alive(tls).await;

    // Rotation: new files in place, then SIGHUP.
    install_file(&ec_cert, &cert);
    install_file(&ec_key, &key);
    proxy.hangup();
    proxy.wait_metric("proxy_tls_reloads_total", &[("outcome", "ok")], 1.0);
    let tls = tls_connect(proxy.addr, config.clone()).await.unwrap();
    assert_eq!(
        peer(&tls),
        first_cert(&ec_cert),
        "new connections get the new certificate"
    );
    drop(tls);
    get_ok(&mut sender, "old connection still serves").await;
    let text = proxy.metrics();
    assert_eq!(expiry(&text), not_after(&ec_cert));
    assert_eq!(
        metric_value(&text, "proxy_listener_info", &[("algorithm", "ecdsa-p256")]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric_value(&text, "proxy_listener_info", &[("algorithm", "rsa2048")]),
        None,
        "{text}"
    );

    // A botched rotation (a key that is not the certificate's): the reload fails, is
    // counted and logged, and the proxy keeps serving the certificate it had.
    install_file(&rsa_key, &key);
    proxy.hangup();
    proxy.wait_metric("proxy_tls_reloads_total", &[("outcome", "error")], 1.0);
    let tls = tls_connect(proxy.addr, config.clone()).await.unwrap();
    assert_eq!(peer(&tls), first_cert(&ec_cert));
    let log = std::fs::read_to_string(&proxy.log).unwrap();
    assert!(
        log.contains("certificate reload failed") && log.contains("server.key"),
        "{log}"
    );
    get_ok(&mut sender, "old connection still serves").await;
}

/// Points `link` at `target` atomically, as Kubernetes rotates a mounted Secret: a new
/// symlink beside it, renamed over it.
fn swap_symlink(target: &str, link: &std::path::Path) {
    let tmp = link.with_file_name("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)
        .unwrap_or_else(|e| panic!("symlink {} -> {target}: {e}", tmp.display()));
    std::fs::rename(&tmp, link).unwrap();
}

/// No signal: a Secret volume's `..data` symlink swapped to a new certificate is in use
/// within two seconds; a swap to a mismatched pair is refused (counted, logged, the old
/// certificate kept), and the next good swap is taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_certificate_files_are_reloaded_without_a_signal() {
    let upstream = EchoUpstream::start();
    let dir = temp_dir("cert-watch");
    let (rsa_cert, rsa_key) = server_cert(CertAlgorithmName::Rsa2048);
    let (ec_cert, ec_key) = server_cert(CertAlgorithmName::EcdsaP256);
    // The layout kubelet writes: tls.crt -> ..data/tls.crt, ..data -> ..<timestamp>.
    let version = |name: &str, cert: &std::path::Path, key: &std::path::Path| {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(cert, d.join("tls.crt")).unwrap();
        std::fs::copy(key, d.join("tls.key")).unwrap();
    };
    version("..v1", &rsa_cert, &rsa_key);
    swap_symlink("..v1", &dir.join("..data"));
    std::os::unix::fs::symlink("..data/tls.crt", dir.join("tls.crt")).unwrap();
    std::os::unix::fs::symlink("..data/tls.key", dir.join("tls.key")).unwrap();
    let proxy = proxy_on_files(&upstream, &dir.join("tls.crt"), &dir.join("tls.key"), &[]);
    let config = client_config(&ClientOpts {
        alpn: vec![b"http/1.1".to_vec()],
        ..Default::default()
    });
    let served = || async {
        let tls = tls_connect(proxy.addr, config.clone()).await.unwrap();
        tls.get_ref().1.peer_certificates().unwrap()[0].clone()
    };
    assert_eq!(served().await, first_cert(&rsa_cert));

    let swapped = std::time::Instant::now();
    version("..v2", &ec_cert, &ec_key);
    swap_symlink("..v2", &dir.join("..data"));
    proxy.wait_metric("proxy_tls_reloads_total", &[("outcome", "ok")], 1.0);
    // The default 1 s watch: the change is seen at the next tick and reloaded at once. The
    // bound allows a slow reload on a loaded machine; a watch that missed the change or
    // polled far more slowly would exceed it.
    assert!(
        swapped.elapsed() < std::time::Duration::from_secs(3),
        "reloaded {:?} after the swap",
        swapped.elapsed()
    );
    assert_eq!(served().await, first_cert(&ec_cert));

    // A mismatched pair: refused, counted and logged; the EC certificate stays.
    version("..v3", &ec_cert, &rsa_key);
    swap_symlink("..v3", &dir.join("..data"));
    proxy.wait_metric("proxy_tls_reloads_total", &[("outcome", "error")], 1.0);
    assert_eq!(served().await, first_cert(&ec_cert));
    let log = std::fs::read_to_string(&proxy.log).unwrap();
    assert!(
        log.contains("certificate reload failed") && log.contains("file change"),
        "{log}"
    );

    // The next good rotation is taken.
    version("..v4", &rsa_cert, &rsa_key);
    swap_symlink("..v4", &dir.join("..data"));
    proxy.wait_metric("proxy_tls_reloads_total", &[("outcome", "ok")], 2.0);
    assert_eq!(served().await, first_cert(&rsa_cert));
    assert_eq!(
        metric_value(
            &proxy.metrics(),
            "proxy_tls_reloads_total",
            &[("outcome", "error")]
        ),
        Some(1.0)
    );
}
