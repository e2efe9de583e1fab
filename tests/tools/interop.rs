//! Clients and checkers this project did not write, against the proxy and embedded-qdrant
//! at their defaults: the official Python qdrant-client (REST and gRPC, directly and
//! through the proxy with TLS verified), `openssl s_client` with P-256-only and P-384-only
//! key shares, a rustls client offering the post-quantum hybrid, Python's `ssl` with
//! VERIFY_X509_STRICT and pyca/cryptography's verifier on the generated certificates, and
//! sslyze's check against Mozilla's intermediate profile. Milvus and Chroma with their own
//! clients are in `other_databases`.
//!
//! The Python clients come from PyPI into virtualenvs (`tests/interop/install.sh`, which
//! `.ci/run` runs first and these tests run again, idempotently).

use std::process::{Command, Stdio};

use e2e::*;
use proxy::crypto::{CertAlgorithmName, KxGroupName, ProviderName};

/// Runs a command with a bounded wait; returns (success, stdout + stderr).
pub(crate) fn run_bounded(cmd: &mut Command, what: &str) -> (bool, String) {
    let out_path = temp_dir("interop-out").join("out.txt");
    let out = std::fs::File::create(&out_path).expect("output file");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("clone"))
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let status = wait_bounded(&mut child, std::time::Duration::from_secs(240), what);
    (
        status.success(),
        std::fs::read_to_string(&out_path).unwrap_or_default(),
    )
}

/// The official client's whole ingestion API (tests/interop/qdrant_client_calls.py) over
/// REST and gRPC, against embedded-qdrant directly, through the proxy at its defaults, and
/// against embedded-qdrant terminating TLS itself (`--tls-cert/--tls-key`, as Qdrant's
/// `service.enable_tls`), each TLS server's certificate verified against the test CA.
#[test]
fn official_python_client_direct_and_through_the_proxy() {
    let python = interop_python("qdrant-client");
    let eq = EmbeddedQdrant::start(&temp_dir("interop-eq"));
    let alg = CertAlgorithmName::EcdsaP256;
    let (cert, key) = server_cert(alg);
    let eq_tls = EmbeddedQdrant::start_with(
        &temp_dir("interop-eq-tls"),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let rest = ProxyProcess::start(
        &format!("http://{}", eq.rest),
        ProviderName::AwsLcRs,
        alg,
        &[],
    );
    let grpc = ProxyProcess::start(
        &format!("http://{}", eq.grpc),
        ProviderName::AwsLcRs,
        alg,
        &["--upstream-protocol", "h2c"],
    );
    let script = repo_root().join("tests/interop/qdrant_client_calls.py");
    let ca = certs().ca_cert.display().to_string();
    let mut failures = Vec::new();
    for (path, host, rest_port, grpc_port, tls) in [
        ("direct", "127.0.0.1", eq.rest.port(), eq.grpc.port(), false),
        (
            "proxy",
            "localhost",
            rest.addr.port(),
            grpc.addr.port(),
            true,
        ),
        (
            "in-process TLS",
            "localhost",
            eq_tls.rest.port(),
            eq_tls.grpc.port(),
            true,
        ),
    ] {
        for prefer_grpc in [false, true] {
            let mut cmd = Command::new(&python);
            cmd.arg(&script)
                .args(["--host", host])
                .args(["--rest-port", &rest_port.to_string()])
                .args(["--grpc-port", &grpc_port.to_string()]);
            if prefer_grpc {
                cmd.arg("--prefer-grpc");
            }
            if tls {
                cmd.args(["--ca", &ca]);
            }
            let what = format!(
                "qdrant-client {path} {}",
                if prefer_grpc { "gRPC" } else { "REST" }
            );
            let (ok, out) = run_bounded(&mut cmd, &what);
            println!("--- {what}\n{out}");
            // The script's own count: every call answered as Qdrant answers it.
            let summary = out.lines().last().unwrap_or_default().to_owned();
            if !ok || !summary.ends_with(" 0 failed") || summary.starts_with("0 passed") {
                failures.push(format!("{what}: {summary}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{failures:?}\nproxy logs:\n{}\n{}",
        rest.log_text(),
        grpc.log_text()
    );
    // Per-method metrics at their defaults: the client's calls by REST route and gRPC
    // method, with bytes and latency, and never a raw path or collection name.
    let upsert_route = [("method", "PUT /collections/{collection_name}/points")];
    let upsert_call = [("method", "qdrant.Points/Upsert")];
    for (proxy, method, ok) in [
        (&rest, &upsert_route, ("status", "200")),
        (&grpc, &upsert_call, ("grpc_status", "0")),
    ] {
        let m = proxy.metrics();
        let labels = [method[0], ok];
        assert!(
            metric_sum(&m, "proxy_method_requests_total", &labels) >= 2.0,
            "{m}"
        );
        for family in [
            "proxy_method_request_bytes_total",
            "proxy_method_response_bytes_total",
        ] {
            assert!(metric_sum(&m, family, method) > 0.0, "{family}: {m}");
        }
        assert!(
            metric_sum(&m, "proxy_method_request_duration_seconds_count", method) >= 2.0,
            "{m}"
        );
        assert!(
            !m.contains("interop_"),
            "a collection name reached a label: {m}"
        );
    }
    let m = grpc.metrics();
    assert!(
        metric_sum(
            &m,
            "proxy_method_requests_total",
            &[("method", "qdrant.Collections/Get"), ("grpc_status", "5")]
        ) >= 1.0,
        "the missing collection's NOT_FOUND, by method: {m}"
    );
}

/// What the system OpenSSL is, for the groups its provider can offer.
fn openssl_has_mlkem() -> bool {
    openssl::version::number() >= 0x3050_0000
}

fn offers_mlkem(p: ProviderName) -> bool {
    match p {
        ProviderName::AwsLcRs => true,
        ProviderName::Ring => false,
        _ => openssl_has_mlkem(),
    }
}

/// At the defaults every provider accepts a client that offers only P-256 or only P-384
/// (as nginx does), over TLS 1.3 and 1.2, and the start-up line lists what it offers.
/// TLS 1.2 is tried with the RSA certificate: there a client's groups also restrict the
/// curve of an ECDSA certificate (RFC 8422 5.1), so a P-384-only client refuses a P-256
/// certificate whatever the server offers.
#[test]
fn openssl_clients_with_one_nist_group_are_served_by_every_provider() {
    let upstream = EchoUpstream::start();
    let ca = certs().ca_cert.display().to_string();
    for provider in ProviderName::SOFTWARE {
        let ecdsa =
            ProxyProcess::start(&upstream.url(), provider, CertAlgorithmName::EcdsaP256, &[]);
        let rsa = ProxyProcess::start(&upstream.url(), provider, CertAlgorithmName::Rsa2048, &[]);
        let mut want = vec!["x25519", "secp256r1", "secp384r1"];
        if offers_mlkem(provider) {
            want.insert(0, "x25519mlkem768");
        }
        let line = format!("kx_groups={}", want.join(","));
        let log = ecdsa.log_text();
        assert!(
            log.contains(&line),
            "{provider}: start-up line lacks {line}:\n{log}"
        );
        let cases = [
            (&ecdsa, "-tls1_3", "ecdsa-p256"),
            (&rsa, "-tls1_3", "rsa2048"),
            (&rsa, "-tls1_2", "rsa2048"),
        ];
        for (proxy, version, alg) in cases {
            for (group, curve) in [("P-256", "prime256v1"), ("P-384", "secp384r1")] {
                let (ok, out) = run_bounded(
                    Command::new(system_tool("openssl"))
                        .arg("s_client")
                        .args(["-connect", &proxy.addr.to_string()])
                        .args(["-servername", "localhost", "-verify_hostname", "localhost"])
                        .args(["-CAfile", &ca, "-verify_return_error", "-brief"])
                        .args([version, "-groups", group]),
                    "openssl s_client",
                );
                let what = format!("{provider} {alg} {version} -groups {group}");
                assert!(ok, "{what}: handshake failed:\n{out}");
                assert!(out.contains("Verification: OK"), "{what}:\n{out}");
                assert!(
                    out.contains(&format!("Server Temp Key: ECDH, {curve}")),
                    "{what}: the group in use is not {curve}:\n{out}"
                );
            }
        }
    }
}

/// A rustls client that offers X25519MLKEM768 first negotiates it with every provider that
/// implements it, and X25519 with the others.
#[tokio::test]
async fn post_quantum_key_exchange_is_negotiated_where_the_provider_has_it() {
    let upstream = EchoUpstream::start();
    let config = proxy::tls::client::ClientTls {
        provider: ProviderName::AwsLcRs,
        kx_groups: vec![KxGroupName::X25519Mlkem768, KxGroupName::X25519],
        ..proxy::tls::client::ClientTls::trusting(&certs().ca_cert)
    }
    .build()
    .expect("client config");
    for provider in ProviderName::SOFTWARE {
        let proxy =
            ProxyProcess::start(&upstream.url(), provider, CertAlgorithmName::EcdsaP256, &[]);
        let tls = tls_connect(proxy.addr, config.clone())
            .await
            .unwrap_or_else(|e| panic!("{provider}: handshake: {e}"));
        let group = tls
            .get_ref()
            .1
            .negotiated_key_exchange_group()
            .map(|g| g.name());
        let want = if offers_mlkem(provider) {
            rustls::NamedGroup::X25519MLKEM768
        } else {
            rustls::NamedGroup::X25519
        };
        assert_eq!(group, Some(want), "{provider}");
    }
}

/// Python's `ssl` with VERIFY_X509_STRICT (Python 3.13's default) completes a verified
/// handshake with every algorithm's certificate, and pyca/cryptography's RFC 5280
/// verifier accepts every generated chain, the client certificate's included.
#[test]
fn strict_x509_verifiers_accept_the_generated_certificates() {
    let upstream = EchoUpstream::start();
    let ca = certs().ca_cert.display().to_string();
    for alg in CertAlgorithmName::ALL {
        let proxy = ProxyProcess::start(&upstream.url(), ProviderName::AwsLcRs, alg, &[]);
        let script = format!(
            "import socket, ssl\n\
             ctx = ssl.create_default_context(cafile={ca:?})\n\
             ctx.verify_flags |= ssl.VERIFY_X509_STRICT\n\
             with socket.create_connection(('127.0.0.1', {port})) as s:\n\
             \x20   with ctx.wrap_socket(s, server_hostname='localhost') as t:\n\
             \x20       print('verified', t.version(), t.cipher()[0])\n",
            port = proxy.addr.port()
        );
        let (ok, out) = run_bounded(Command::new("python3").args(["-c", &script]), "python ssl");
        assert!(
            ok && out.contains("verified TLSv1.3"),
            "{alg}: strict ssl:\n{out}"
        );
    }
    // pyca/cryptography (the verifier that rejected certificates without an AKI) comes
    // with sslyze.
    let mut script = String::from(
        "import sys\n\
         from cryptography import x509\n\
         from cryptography.x509.verification import PolicyBuilder, Store\n\
         from cryptography.x509 import DNSName\n\
         load = lambda p: x509.load_pem_x509_certificate(open(p, 'rb').read())\n",
    );
    script += &format!("store = Store([load({ca:?})])\n");
    script += "server = PolicyBuilder().store(store).build_server_verifier(DNSName('localhost'))\n";
    for (alg, cert, _) in &certs().servers {
        script += &format!(
            "server.verify(load({:?}), []); print('server ok', {:?})\n",
            cert.display().to_string(),
            alg.as_str()
        );
    }
    script += &format!(
        "PolicyBuilder().store(store).build_client_verifier().verify(load({:?}), []); print('client ok')\n",
        certs().client.0.display().to_string()
    );
    let (ok, out) = run_bounded(
        Command::new(interop_python("sslyze")).args(["-c", &script]),
        "pyca/cryptography verifier",
    );
    assert!(ok, "pyca/cryptography rejected a generated chain:\n{out}");
    assert_eq!(out.matches("server ok").count(), 4, "{out}");
    assert!(out.contains("client ok"), "{out}");
}

/// sslyze finds every provider x algorithm compliant with Mozilla's intermediate profile
/// (protocols, suites, groups, certificate type, signature and lifetime, chain validation
/// against the test CA, the vulnerability checks) at the proxy's defaults.
#[test]
fn sslyze_finds_every_provider_and_algorithm_mozilla_intermediate_compliant() {
    let python = interop_python("sslyze");
    let upstream = EchoUpstream::start();
    let ca = certs().ca_cert.display().to_string();
    for provider in ProviderName::SOFTWARE {
        let proxies: Vec<ProxyProcess> = CertAlgorithmName::ALL
            .iter()
            .map(|&alg| ProxyProcess::start(&upstream.url(), provider, alg, &[]))
            .collect();
        let targets: Vec<String> = proxies
            .iter()
            .map(|p| format!("localhost:{}{{127.0.0.1}}", p.addr.port()))
            .collect();
        let (ok, out) = run_bounded(
            Command::new(&python)
                .args(["-m", "sslyze", "--mozilla_config=intermediate"])
                .args(["--certinfo_ca_file", &ca])
                .args(&targets),
            "sslyze",
        );
        let compliant = out.matches("OK - Compliant.").count();
        assert!(
            ok && compliant == targets.len(),
            "{provider}: {compliant} of {} compliant:\n{out}",
            targets.len()
        );
    }
}

/// One HTTP/2 connection (h2load, nghttp2's load client) carries 100,000 gRPC calls that
/// the upstream answers before reading their bodies (an unknown method: UNIMPLEMENTED at
/// once), with no connection error and no failed call; the proxy never resets them (it
/// drains what the client still sends), so h2's limit on locally caused resets is never
/// approached.
#[test]
fn a_long_lived_h2_connection_survives_100k_early_answers() {
    let h2load = system_tool("h2load");
    let eq = EmbeddedQdrant::start(&temp_dir("interop-early"));
    let proxy = ProxyProcess::start(
        &format!("http://{}", eq.grpc),
        ProviderName::AwsLcRs,
        CertAlgorithmName::EcdsaP256,
        &["--upstream-protocol", "h2c", "--worker-threads", "1"],
    );
    // A 64 KiB gRPC message (5-byte frame header), ten calls at a time: DATA that the
    // client has sent keeps arriving after the answer. Before the proxy drained abandoned
    // bodies, this connection died after about 6,000 calls (h2: "locally-reset streams
    // reached limit (1024)"), and with 416 KB calls one at a time after about 2,000.
    let payload = 64 * 1024 - 5;
    let mut body = vec![0u8];
    body.extend_from_slice(&(payload as u32).to_be_bytes());
    body.resize(5 + payload, 0x5a);
    let body_file = temp_dir("interop-early-body").join("call.bin");
    std::fs::write(&body_file, &body).expect("body file");
    let calls = 100_000;
    let (ok, out) = run_bounded(
        Command::new(h2load)
            .args(["-n", &calls.to_string(), "-c", "1", "-m", "10", "-t", "1"])
            .arg("-d")
            .arg(&body_file)
            .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
            .arg(format!(
                "https://127.0.0.1:{}/qdrant.Points/NoSuchMethod",
                proxy.addr.port()
            )),
        "h2load",
    );
    let requests = out
        .lines()
        .find(|l| l.starts_with("requests:"))
        .unwrap_or_default()
        .to_owned();
    let log = proxy.log_text();
    assert!(
        ok && requests.contains(&format!("{calls} succeeded, 0 failed, 0 errored")),
        "h2load: {requests}\n{out}\nproxy log:\n{}",
        log.lines().rev().take(30).collect::<Vec<_>>().join("\n")
    );
    // One connection carried them all: one handshake.
    let handshakes = metric_sum(&proxy.metrics(), "proxy_tls_handshakes_total", &[]);
    assert_eq!(handshakes, 1.0, "handshakes: the connection was replaced");
    assert!(
        !log.contains("reached limit"),
        "h2 hit its reset limit:\n{log}"
    );
}

/// Handshakes that fail are counted by why, with clients that fail them for real: bytes
/// that are no TLS (an HTTP request on the TLS port), `openssl s_client` offering only a
/// non-AEAD suite (none in common), and `openssl s_client` not trusting the certificate
/// (its alert); and completed ones by what they negotiated.
#[test]
fn handshake_failures_are_counted_by_reason_and_handshakes_by_what_they_negotiated() {
    use std::io::{Read, Write};
    let upstream = EchoUpstream::start();
    let proxy = ProxyProcess::in_front_of(&upstream.url(), &[]);
    let addr = proxy.addr.to_string();
    let mut plain = std::net::TcpStream::connect(proxy.addr).expect("connect");
    plain
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    plain
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let _ = plain.read_to_end(&mut Vec::new());
    let s_client = |args: &[&str]| {
        run_bounded(
            Command::new(system_tool("openssl"))
                .arg("s_client")
                .args(["-connect", &addr, "-servername", "localhost", "-brief"])
                .args(args),
            "openssl s_client",
        )
    };
    let (ok, out) = s_client(&["-tls1_2", "-cipher", "AES128-SHA"]);
    assert!(!ok, "a suite the proxy does not offer was accepted:\n{out}");
    // No -CAfile: the client cannot verify the test CA and says so with an alert.
    let (ok, out) = s_client(&["-verify_return_error"]);
    assert!(!ok, "an untrusted certificate was accepted:\n{out}");
    let ca = certs().ca_cert.display().to_string();
    let (ok, out) = s_client(&["-CAfile", &ca, "-tls1_3", "-groups", "P-384"]);
    assert!(ok, "{out}");

    let failures = "proxy_tls_handshake_failures_total";
    for reason in ["not_tls", "incompatible", "alert_received"] {
        proxy.wait_metric(failures, &[("reason", reason)], 1.0);
    }
    proxy.wait_metric(
        "proxy_tls_negotiated_total",
        &[
            ("tls_version", "1.3"),
            ("cipher_suite", "TLS13_AES_128_GCM_SHA256"),
            ("kx_group", "secp384r1"),
        ],
        1.0,
    );
    let m = proxy.metrics();
    assert_eq!(metric_sum(&m, failures, &[]), 3.0, "{m}");
    assert_eq!(
        metric_sum(&m, "proxy_tls_handshakes_total", &[("outcome", "error")]),
        3.0,
        "{m}"
    );
}
