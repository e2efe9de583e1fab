//! SNI: several certificates on one listener, chosen by the server name the client sends,
//! the default for any other name and for clients that send none; each certificate listed
//! at start-up and in the metrics, counted under its own algorithm, and reloaded when its
//! files are replaced.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e::*;
use proxy::crypto::{generate_cert_set, CertAlgorithmName, GeneratedSet};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::ClientConfig;

/// A client trusting every CA given, without resumption.
fn client_trusting(cas: &[&Path]) -> Arc<ClientConfig> {
    proxy::tls::client::ClientTls {
        trust: proxy::tls::client::Trust::CaFiles(cas.iter().map(|c| c.to_path_buf()).collect()),
        ..Default::default()
    }
    .build()
    .expect("client")
}

/// Handshakes asking for `server_name` (an IP address sends no SNI) and returns the
/// end-entity certificate the proxy presented.
async fn presented(
    addr: std::net::SocketAddr,
    config: Arc<ClientConfig>,
    server_name: &str,
) -> Result<CertificateDer<'static>, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(server_name.to_owned()).map_err(|e| e.to_string())?;
    let tls = tokio::time::timeout(
        WAIT,
        tokio_rustls::TlsConnector::from(config).connect(name, tcp),
    )
    .await
    .map_err(|_| "handshake timed out".to_owned())?
    .map_err(|e| e.to_string())?;
    let (_, conn) = tls.get_ref();
    Ok(conn.peer_certificates().expect("server certificates")[0].clone())
}

fn der_of(cert: &Path) -> CertificateDer<'static> {
    CertificateDer::from_pem_file(cert).expect("certificate PEM")
}

fn server(set: &GeneratedSet, alg: CertAlgorithmName) -> (PathBuf, PathBuf) {
    let (_, c, k) = set.servers.iter().find(|(a, _, _)| *a == alg).unwrap();
    (c.clone(), k.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_certificate_follows_the_server_name() {
    let default_set = certs();
    let (default_cert, default_key) = server_cert(CertAlgorithmName::Rsa2048);
    let sans = [
        "vectors.example.test".to_owned(),
        "*.tenant.example.test".to_owned(),
    ];
    let tenant_set = generate_cert_set(
        &temp_dir("sni-tenant"),
        &[CertAlgorithmName::EcdsaP384],
        &sans,
    )
    .expect("certificates");
    let rotated_set = generate_cert_set(
        &temp_dir("sni-rotated"),
        &[CertAlgorithmName::EcdsaP256],
        &sans,
    )
    .expect("certificates");
    // The SNI files the proxy serves from, replaced later as a certificate manager would.
    let live = temp_dir("sni-live");
    let (sni_cert, sni_key) = (live.join("tenant.crt"), live.join("tenant.key"));
    let (c, k) = server(&tenant_set, CertAlgorithmName::EcdsaP384);
    std::fs::copy(&c, &sni_cert).unwrap();
    std::fs::copy(&k, &sni_key).unwrap();

    let upstream = EchoUpstream::start();
    let config = write_config(
        &live,
        (&default_cert, &default_key),
        &upstream.url(),
        (&sni_cert, &sni_key),
    );
    let proxy = ProxyProcess::start_raw(&args(&["--config", config.to_str().unwrap()]));
    let log = proxy.log_text();
    assert!(
        log.contains("SNI certificate ready") && log.contains("vectors.example.test"),
        "{log}"
    );

    let client = client_trusting(&[
        &default_set.ca_cert,
        &tenant_set.ca_cert,
        &rotated_set.ca_cert,
    ]);
    let addr = proxy.addr;
    let tenant = der_of(&c);
    let default = der_of(&default_cert);
    // Exact name (case does not matter), wildcard, other names, and no name at all: an IP
    // address is never sent as SNI, so the default answers.
    for (name, expected) in [
        ("vectors.example.test", &tenant),
        ("a.tenant.example.test", &tenant),
        ("localhost", &default),
        ("127.0.0.1", &default),
    ] {
        assert_eq!(
            presented(addr, client.clone(), name).await.as_ref(),
            Ok(expected),
            "{name}"
        );
    }
    // One label only: b.a.tenant.example.test is not covered, and gets the default
    // (whose names do not include it, so the client refuses it).
    let deep = presented(addr, client.clone(), "b.a.tenant.example.test").await;
    assert!(deep.is_err(), "{deep:?}");

    sni_handshakes_are_counted(&proxy.metrics());

    // The SNI certificate is rotated in place: the watch reloads it; the default stays.
    let (c2, k2) = server(&rotated_set, CertAlgorithmName::EcdsaP256);
    for (src, dest) in [(&k2, &sni_key), (&c2, &sni_cert)] {
        let tmp = dest.with_extension("new");
        std::fs::copy(src, &tmp).unwrap();
        std::fs::rename(&tmp, dest).unwrap();
    }
    let rotated = der_of(&c2);
    let deadline = Instant::now() + WAIT;
    while presented(addr, client.clone(), "vectors.example.test").await != Ok(rotated.clone()) {
        assert!(
            Instant::now() < deadline,
            "the rotated SNI certificate was never served: {}",
            proxy.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        presented(addr, client.clone(), "localhost").await,
        Ok(default)
    );
    let m = proxy.metrics();
    assert!(
        metric_value(
            &m,
            "proxy_tls_sni_certificate_expiry_timestamp_seconds",
            &[("algorithm", "ecdsa-p256")]
        )
        .is_some()
            && metric_value(
                &m,
                "proxy_tls_sni_certificate_expiry_timestamp_seconds",
                &[("algorithm", "ecdsa-p384")]
            )
            .is_none(),
        "the metrics list what is served now:\n{m}"
    );
}

/// The proxy's configuration: one listener whose default certificate is `default`, and
/// `sni` for vectors.example.test and *.tenant.example.test (one name written in capitals:
/// names match whatever their case). Watched every 200 ms.
fn write_config(
    live: &Path,
    default: (&Path, &Path),
    upstream: &str,
    sni: (&Path, &Path),
) -> PathBuf {
    let config = live.join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "provider = \"aws-lc-rs\"\ncert_watch_interval = \"200ms\"\n\
             [[listener]]\nname = \"rest\"\nlisten = \"127.0.0.1:0\"\n\
             cert = \"{}\"\nkey = \"{}\"\nupstream = \"{}\"\n\
             [[listener.sni]]\nserver_names = [\"Vectors.example.test\", \"*.tenant.example.test\"]\n\
             cert = \"{}\"\nkey = \"{}\"\n",
            default.0.display(),
            default.1.display(),
            upstream,
            sni.0.display(),
            sni.1.display(),
        ),
    )
    .unwrap();
    config
}

/// The two SNI handshakes counted under their certificate's algorithm, and its expiry
/// exported by server names.
fn sni_handshakes_are_counted(m: &str) {
    assert_eq!(
        metric_sum(
            m,
            "proxy_tls_handshakes_total",
            &[("algorithm", "ecdsa-p384"), ("outcome", "ok")]
        ),
        2.0,
        "SNI handshakes count under their certificate's algorithm:\n{m}"
    );
    assert!(
        metric_value(
            m,
            "proxy_tls_sni_certificate_expiry_timestamp_seconds",
            &[
                ("server_names", "vectors.example.test,*.tenant.example.test"),
                ("algorithm", "ecdsa-p384")
            ]
        )
        .is_some_and(|t| t > 1.7e9),
        "{m}"
    );
}

#[test]
fn bad_sni_entries_are_refused_at_start_up() {
    let (cert, key) = server_cert(CertAlgorithmName::EcdsaP256);
    let dir = temp_dir("sni-bad");
    let config = dir.join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "[[listener]]\nlisten = \"127.0.0.1:0\"\ncert = \"{c}\"\nkey = \"{k}\"\nupstream = \"http://127.0.0.1:1\"\n\
             [[listener.sni]]\nserver_names = [\"a.example\", \"bad name\"]\ncert = \"{c}\"\nkey = \"{k}\"\n\
             [[listener.sni]]\nserver_names = [\"A.example\"]\ncert = \"{c}\"\nkey = \"/nonexistent.key\"\n",
            c = cert.display(),
            k = key.display(),
        ),
    )
    .unwrap();
    let (status, text) = run_proxy_to_exit(&["check-config", config.to_str().unwrap()]);
    assert_eq!(status.code(), Some(2), "{text}");
    assert!(
        text.contains("listener[0].sni[0].server_names: \"bad name\" is not a DNS name"),
        "{text}"
    );
    assert!(
        text.contains("\"A.example\" is already served by another certificate"),
        "{text}"
    );
    assert!(
        text.contains("listener[0].sni[1].key: file not found"),
        "{text}"
    );
}
