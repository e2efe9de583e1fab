//! The openssl-qat provider path as far as it goes without QAT_Engine: real OpenSSL
//! providers stand in for the QAT one where what is tested is the proxy's judgement of a
//! provider. OpenSSL's `default` provider signs but never pauses an asynchronous job,
//! exactly what a QAT provider that is loaded but not offloading does, so the start-up
//! proof must refuse it (or fall back when asked); the `legacy` module, a real
//! non-default provider that cannot sign, must fail the proof; missing modules and wrong
//! names are refused with messages naming what was looked for. Telemetry is read from
//! recorded file trees in tests/fixtures/qat. The real provider (QAT_Engine in software
//! mode) is exercised by tests/proxy/qat_engine.rs.

use std::path::PathBuf;

use bytes::Bytes;
use e2e::*;
use proxy::crypto::{CertAlgorithmName, ProviderName};

/// OpenSSL's module directory (where legacy.so, and on QAT hosts qatprovider.so, live).
fn modules_dir() -> PathBuf {
    let out = std::process::Command::new(system_tool("openssl"))
        .args(["version", "-m"])
        .output()
        .expect(
            "the openssl command (Debian package openssl) is needed to find the module directory",
        );
    let text = String::from_utf8_lossy(&out.stdout);
    let dir = text
        .split('"')
        .nth(1)
        .expect("`openssl version -m` prints MODULESDIR: \"...\"");
    let dir = PathBuf::from(dir);
    assert!(
        dir.join("legacy.so").is_file(),
        "no legacy.so in {}",
        dir.display()
    );
    dir
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/qat")
}

#[test]
fn a_provider_that_signs_without_offloading_fails_the_start_up_proof() {
    let modules = modules_dir().display().to_string();
    for alg in [CertAlgorithmName::Rsa2048, CertAlgorithmName::EcdsaP384] {
        let (cert, key) = server_cert(alg);
        let args = startup_run_args(
            &cert.display().to_string(),
            &key.display().to_string(),
            &[
                "--provider",
                "openssl-qat",
                "--qat-provider-name",
                "default",
                "--qat-module-path",
                &modules,
            ],
        );
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let (status, out) = run_proxy_to_exit(&argv);
        assert_eq!(status.code(), Some(1), "{out}");
        assert!(out.contains("start-up proof failed"), "{out}");
        assert!(
            out.contains(
                "without pausing its asynchronous job, so it is loaded but not offloading"
            ),
            "{out}"
        );
        // A provider's failure is never reported as a key problem.
        assert!(!out.contains("does not match"), "{out}");
    }
}

fn start_failure(extra: &[&str]) -> (i32, String) {
    let mut flags = vec!["--provider", "openssl-qat"];
    flags.extend_from_slice(extra);
    let (status, out) = run_proxy_with_cert_to_exit(CertAlgorithmName::Rsa2048, &flags);
    (status.code().unwrap_or(-1), out)
}

#[test]
fn a_provider_that_cannot_sign_fails_the_start_up_proof() {
    let modules = modules_dir().display().to_string();
    let (code, out) = start_failure(&[
        "--qat-provider-name",
        "legacy",
        "--qat-module-path",
        &modules,
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("start-up proof failed"), "{out}");
    assert!(
        out.contains(r#"fetched from OpenSSL provider "default", not "legacy""#),
        "{out}"
    );

    // check-config runs the same proof.
    let (cert, key) = server_cert(CertAlgorithmName::EcdsaP256);
    let dir = temp_dir("qat-check");
    let file = dir.join("proxy.toml");
    let write = |name: &str| {
        let text = format!(
            "provider = \"openssl-qat\"\n[qat]\nprovider_name = \"{name}\"\nmodule_path = \"{modules}\"\n\
             [[listener]]\nlisten = \"127.0.0.1:0\"\ncert = \"{}\"\nkey = \"{}\"\nupstream = \"http://127.0.0.1:6333\"\n",
            cert.display(),
            key.display()
        );
        std::fs::write(&file, text).unwrap();
    };
    let f = file.display().to_string();
    write("legacy");
    let (status, out) = run_proxy_to_exit(&["check-config", &f]);
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(out.contains("start-up proof failed"), "{out}");
    write("default");
    let (status, out) = run_proxy_to_exit(&["check-config", &f]);
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(out.contains("loaded but not offloading"), "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn missing_module_and_wrong_names_are_refused_clearly() {
    let modules = modules_dir();
    let dir = modules.display().to_string();
    // The QAT provider is not installed here: the default name is looked for and not found.
    let (code, out) = start_failure(&["--qat-module-path", &dir]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(r#"cannot load OpenSSL provider "qatprovider""#),
        "{out}"
    );
    assert!(out.contains("qatprovider.so"), "{out}");
    // A name that exists nowhere.
    let (code, out) = start_failure(&["--qat-provider-name", "no_such_provider"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("no_such_provider"), "{out}");
    // A module file that is not the named provider.
    let legacy = modules.join("legacy.so").display().to_string();
    let (code, out) = start_failure(&["--qat-module-path", &legacy]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(r#"is a module named "legacy""#), "{out}");
    // A module path that does not exist.
    let (code, out) = start_failure(&["--qat-module-path", "/nonexistent/ossl-modules"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("/nonexistent/ossl-modules: no such file or directory"),
        "{out}"
    );
    // Heuristic polling is refused before anything is loaded; external polling needs the
    // module's own poll call (QAT_Engine's qat_sw_poll), which a module that is not
    // QAT_Engine's lacks: nothing would ever complete its jobs.
    let (code, out) = start_failure(&["--qat-polling", "heuristic"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("qat.polling = \"heuristic\"") && out.contains("use \"external\""),
        "{out}"
    );
    let (code, out) = start_failure(&[
        "--qat-polling",
        "external",
        "--qat-provider-name",
        "legacy",
        "--qat-module-path",
        &dir,
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("exports no qat_sw_poll"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn software_fallback_only_when_configured_and_then_visible() {
    let upstream = EchoUpstream::start();
    // No QAT provider at all.
    let proxy = ProxyProcess::start(
        &upstream.url(),
        ProviderName::OpensslQat,
        CertAlgorithmName::EcdsaP256,
        &[
            "--qat-fallback",
            "software",
            "--qat-telemetry-root",
            "/nonexistent-sysfs",
        ],
    );
    let a = get(proxy.addr, "/").await.unwrap();
    assert_eq!(a.status, 200);
    let m = proxy.metrics();
    assert_eq!(
        metric_value(&m, "proxy_qat_offload_active", &[]),
        Some(0.0),
        "{m}"
    );
    assert_eq!(
        metric_value(&m, "proxy_qat_telemetry_available", &[]),
        Some(0.0),
        "{m}"
    );
    // The handshakes are labelled with what really signed them.
    assert_eq!(
        metric_value(
            &m,
            "proxy_tls_handshakes_total",
            &[("provider", "openssl"), ("outcome", "ok")]
        ),
        Some(1.0),
        "{m}"
    );
    let log = proxy.log_text();
    assert!(log.contains("QAT offload is off"), "{log}");
}

/// A provider that loads but does not offload, with `qat.fallback = "software"`: the proxy
/// serves in software OpenSSL, says so, labels the handshakes with what signed them, and
/// still reports the device telemetry it finds (here a recorded in-kernel debugfs tree).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_does_not_offload_falls_back_when_asked() {
    let upstream = EchoUpstream::start();
    let modules = modules_dir().display().to_string();
    let telemetry = fixtures().join("in-kernel/sys").display().to_string();
    let proxy = ProxyProcess::start(
        &upstream.url(),
        ProviderName::OpensslQat,
        CertAlgorithmName::Rsa2048,
        &[
            "--qat-provider-name",
            "default",
            "--qat-module-path",
            &modules,
            "--qat-fallback",
            "software",
            "--qat-telemetry-root",
            &telemetry,
        ],
    );
    for (tls13, tls12) in [(true, false), (false, true)] {
        let cfg = client_config(&ClientOpts {
            tls13,
            tls12,
            ..ClientOpts::default()
        });
        let a = request_bounded(proxy.addr, cfg, "GET", "/qat", &[], Bytes::new())
            .await
            .unwrap();
        assert_eq!(a.status, 200);
    }
    let log = proxy.log_text();
    assert!(log.contains("loaded but not offloading"), "{log}");
    assert!(
        log.contains("QAT offload is off for this listener"),
        "{log}"
    );
    let m = proxy.metrics();
    assert_eq!(
        metric_value(&m, "proxy_qat_offload_active", &[]),
        Some(0.0),
        "{m}"
    );
    assert_eq!(
        metric_sum(
            &m,
            "proxy_tls_handshakes_total",
            &[("provider", "openssl"), ("outcome", "ok")]
        ),
        2.0,
        "{m}"
    );
    assert_eq!(
        metric_value(&m, "proxy_qat_telemetry_available", &[]),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric_value(
            &m,
            "proxy_qat_pke_utilization_peak_ratio",
            &[("device", "qat_4xxx_0000:6b:00.0")]
        ),
        Some(0.46),
        "{m}"
    );
    assert_eq!(
        metric_value(
            &m,
            "proxy_qat_pcie_bandwidth_bytes_per_second",
            &[("direction", "in")]
        ),
        Some(150_000_000.0),
        "{m}"
    );
}
