//! openssl-qat against the real QAT_Engine provider (see `qat_engine` for how the tests
//! find it): the provider's own settings, as the proxy writes them or a user's
//! `OPENSSL_CONF` sets them, and a provider that loads but does not offload.

use std::time::Duration;

use bytes::Bytes;
use e2e::*;
use proxy::crypto::{CertAlgorithmName, ProviderName};

use super::qat_engine::{installed_provider, modules, CONCURRENT};

/// QAT_Engine as released switches qat_sw off on a non-Intel CPU but still registers its
/// algorithms. The start-up proof names what happens: RSA signing fails inside the
/// provider (not "key does not match certificate"), and P-256 signs without ever pausing
/// its job (loaded but not offloading).
#[test]
#[ignore = "needs an installed QAT_Engine provider: QAT_PROVIDER_DIR (deploy/QAT.md)"]
fn a_provider_that_is_loaded_but_not_offloading_is_named_as_such() {
    // On an Intel CPU the released build offloads: there is nothing of this kind to test.
    let Some(stock) = installed_provider("QAT_PROVIDER_STOCK_DIR") else {
        return;
    };
    let start = |alg: CertAlgorithmName, extra: &[&str]| {
        let mut flags = vec!["--provider", "openssl-qat", "--qat-module-path", &stock];
        flags.extend_from_slice(extra);
        run_proxy_with_cert_to_exit(alg, &flags)
    };
    let (status, out) = start(CertAlgorithmName::Rsa2048, &[]);
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(out.contains("failed inside the provider"), "{out}");
    assert!(!out.contains("does not match"), "{out}");
    let (status, out) = start(CertAlgorithmName::EcdsaP256, &[]);
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(out.contains("loaded but not offloading"), "{out}");
}

/// The provider reads its settings from the OpenSSL configuration section the proxy writes
/// (the debug build logs what it read): external polling off by default, on with
/// `--qat-polling external`.
#[test]
#[ignore = "needs an installed QAT_Engine provider: QAT_PROVIDER_DIR (deploy/QAT.md)"]
fn the_provider_reads_the_settings_the_proxy_writes() {
    let Some(debug) = modules("QAT_PROVIDER_DEBUG_DIR") else {
        return;
    };
    for (flag, external) in [("internal", "OFF"), ("external", "ON")] {
        let mut proxy = ProxyProcess::start(
            "http://127.0.0.1:1",
            ProviderName::OpensslQat,
            CertAlgorithmName::Rsa2048,
            &["--qat-module-path", &debug, "--qat-polling", flag],
        );
        let log = proxy.log_text();
        assert!(
            log.contains(&format!("- External polling: {external}")),
            "{log}"
        );
        assert!(log.contains("- Heuristic polling: OFF"), "{log}");
        proxy.terminate();
        proxy.wait_exit(Duration::from_secs(10));
    }
}

/// An `OPENSSL_CONF` that activates the provider with external polling on (as a user's own
/// file may) wins over `qat.polling`: the proxy reads the provider's own setting, polls it
/// through the module's `qat_sw_poll`, proves at start-up that it offloads, and serves. (The
/// proxy once left such a provider unpolled: the proof timed out and the proxy refused to
/// start.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an installed QAT_Engine provider: QAT_PROVIDER_DIR (deploy/QAT.md)"]
async fn an_openssl_conf_with_external_polling_is_polled_by_the_proxy() {
    let Some(modules) = modules("QAT_PROVIDER_DIR") else {
        return;
    };
    let upstream = EchoUpstream::start();
    let (cert, key) = server_cert(CertAlgorithmName::EcdsaP384);
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let dir = temp_dir("qat-settings");
    let toml = dir.join("proxy.toml");
    std::fs::write(
        &toml,
        format!(
            "provider = \"openssl-qat\"\n[qat]\nmodule_path = \"{modules}/qatprovider.so\"\n\
             [[listener]]\nlisten = \"127.0.0.1:0\"\ncert = \"{cert}\"\nkey = \"{key}\"\n\
             upstream = \"{upstream}\"\n",
            upstream = upstream.url()
        ),
    )
    .unwrap();
    // check-config shows the section it would load; turn external polling on in it.
    let (status, out) = run_proxy_to_exit(&["check-config", &toml.display().to_string()]);
    assert!(status.success(), "{out}");
    let section: String = out
        .lines()
        .skip_while(|l| !l.contains("The OpenSSL configuration the proxy loads"))
        .skip(1)
        .filter_map(|l| l.strip_prefix("#   "))
        .map(|l| match l {
            "enable_external_polling = 0" => "enable_external_polling = 1\n".to_owned(),
            other => format!("{other}\n"),
        })
        .collect();
    assert!(section.contains("enable_external_polling = 1"), "{out}");
    let cnf = dir.join("openssl.cnf");
    std::fs::write(&cnf, &section).unwrap();

    let proxy = ProxyProcess::start_with_env(
        &["--config".to_owned(), toml.display().to_string()],
        &[("OPENSSL_CONF", cnf.display().to_string())],
    );
    let log = proxy.log_text();
    assert!(log.contains("from OPENSSL_CONF="), "{log}");
    assert!(log.contains("polling=External"), "{log}");
    // The start-up proof's eight signatures completed: the proxy's polls computed them.
    let m = proxy.metrics();
    assert_eq!(
        metric_sum(
            &m,
            "proxy_qat_signatures_total",
            &[("outcome", "offloaded")]
        ),
        8.0,
        "{m}"
    );
    // Handshakes at once batch and complete the same way.
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENT {
        let addr = proxy.addr;
        tasks.push(tokio::spawn(async move {
            let cfg = client_config(&ClientOpts::default());
            request_bounded(addr, cfg, "GET", "/p384", &[], Bytes::new()).await
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap().status, 200);
    }
    let m = proxy.metrics();
    assert!(
        metric_sum(
            &m,
            "proxy_qat_signatures_total",
            &[("outcome", "offloaded")]
        ) > 8.0,
        "no handshake signature offloaded with {CONCURRENT} at once:\n{m}"
    );
    assert_eq!(
        metric_sum(&m, "proxy_qat_signatures_total", &[("outcome", "failed")]),
        0.0,
        "{m}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
