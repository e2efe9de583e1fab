//! Every software provider x every certificate algorithm x TLS 1.3 and 1.2, one test per
//! cell: an HTTPS request through the real proxy reaches a real upstream and the answer
//! matches; the client verifies the chain against the generated CA and uses the same
//! provider as the proxy. (openssl-qat's cells are in `qat_engine`: they need Intel's
//! provider.)

use bytes::Bytes;
use e2e::*;
use proxy::crypto::{CertAlgorithmName, ProviderName};
use rustls::ProtocolVersion;

async fn check(provider: ProviderName, alg: CertAlgorithmName, version: ProtocolVersion) {
    let upstream = EchoUpstream::start();
    let proxy = ProxyProcess::start(&upstream.url(), provider, alg, &[]);
    let cell = format!("{provider} {alg} {version:?}");
    let cfg = client_config(&ClientOpts {
        provider,
        tls13: version == ProtocolVersion::TLSv1_3,
        tls12: version == ProtocolVersion::TLSv1_2,
        ..ClientOpts::default()
    });
    let body = format!("upsert through {cell}");
    let a = request_bounded(
        proxy.addr,
        cfg,
        "POST",
        "/collections/c/points?wait=true",
        &[
            ("x-test", "matrix"),
            ("content-type", "application/json"),
            ("x-request-id", "client-chosen-7"),
        ],
        Bytes::from(body.clone()),
    )
    .await
    .unwrap_or_else(|e| panic!("{cell}: {e}\n{}", proxy.log_text()));
    assert_eq!(a.status, 200, "{cell}");
    assert_eq!(a.tls_version, Some(version), "{cell}");
    let echo = a.json();
    assert_eq!(echo["path"], "/collections/c/points", "{echo}");
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["body_sha256"], sha256_hex(body.as_bytes()));
    assert_eq!(echo["headers"]["x-test"], "matrix");
    // A client's request id is kept as it came.
    assert_eq!(echo["headers"]["x-request-id"], "client-chosen-7");
    assert_eq!(echo["headers"]["x-forwarded-proto"], "https");
    assert_eq!(echo["headers"]["x-forwarded-for"], "127.0.0.1");
    let m = proxy.metrics();
    let tls_version = if version == ProtocolVersion::TLSv1_3 {
        "1.3"
    } else {
        "1.2"
    };
    let n = metric_value(
        &m,
        "proxy_tls_handshakes_total",
        &[
            ("provider", provider.as_str()),
            ("algorithm", alg.as_str()),
            ("tls_version", tls_version),
            ("outcome", "ok"),
            ("resumed", "false"),
        ],
    );
    assert_eq!(n, Some(1.0), "{cell}:\n{m}");
    // The start-up log names the algorithm and key size.
    let log = proxy.log_text();
    assert!(log.contains("key_bits="), "{log}");
}

/// `cells!(provider => [(test name, algorithm, TLS version), ...])`: one test per cell,
/// and the list of cells for the coverage check below.
macro_rules! cells {
    ($($provider:ident => [$(($name:ident, $alg:ident, $version:ident)),* $(,)?]),* $(,)?) => {
        $($(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                check(ProviderName::$provider, CertAlgorithmName::$alg, ProtocolVersion::$version).await;
            }
        )*)*
        const CELLS: &[(ProviderName, CertAlgorithmName, ProtocolVersion)] = &[
            $($((ProviderName::$provider, CertAlgorithmName::$alg, ProtocolVersion::$version),)*)*
        ];
    };
}

cells! {
    Ring => [
        (ring_rsa2048_tls13, Rsa2048, TLSv1_3),
        (ring_rsa2048_tls12, Rsa2048, TLSv1_2),
        (ring_rsa4096_tls13, Rsa4096, TLSv1_3),
        (ring_rsa4096_tls12, Rsa4096, TLSv1_2),
        (ring_p256_tls13, EcdsaP256, TLSv1_3),
        (ring_p256_tls12, EcdsaP256, TLSv1_2),
        (ring_p384_tls13, EcdsaP384, TLSv1_3),
        (ring_p384_tls12, EcdsaP384, TLSv1_2),
    ],
    AwsLcRs => [
        (aws_lc_rs_rsa2048_tls13, Rsa2048, TLSv1_3),
        (aws_lc_rs_rsa2048_tls12, Rsa2048, TLSv1_2),
        (aws_lc_rs_rsa4096_tls13, Rsa4096, TLSv1_3),
        (aws_lc_rs_rsa4096_tls12, Rsa4096, TLSv1_2),
        (aws_lc_rs_p256_tls13, EcdsaP256, TLSv1_3),
        (aws_lc_rs_p256_tls12, EcdsaP256, TLSv1_2),
        (aws_lc_rs_p384_tls13, EcdsaP384, TLSv1_3),
        (aws_lc_rs_p384_tls12, EcdsaP384, TLSv1_2),
    ],
    Openssl => [
        (openssl_rsa2048_tls13, Rsa2048, TLSv1_3),
        (openssl_rsa2048_tls12, Rsa2048, TLSv1_2),
        (openssl_rsa4096_tls13, Rsa4096, TLSv1_3),
        (openssl_rsa4096_tls12, Rsa4096, TLSv1_2),
        (openssl_p256_tls13, EcdsaP256, TLSv1_3),
        (openssl_p256_tls12, EcdsaP256, TLSv1_2),
        (openssl_p384_tls13, EcdsaP384, TLSv1_3),
        (openssl_p384_tls12, EcdsaP384, TLSv1_2),
    ],
}

/// The cells above are every software provider x every algorithm x both TLS versions, so
/// a provider or an algorithm added to the lists cannot go untested.
#[test]
fn the_cells_cover_every_software_provider_algorithm_and_version() {
    for provider in ProviderName::SOFTWARE {
        for alg in CertAlgorithmName::ALL {
            for version in [ProtocolVersion::TLSv1_3, ProtocolVersion::TLSv1_2] {
                assert!(
                    CELLS.contains(&(provider, alg, version)),
                    "no test for {provider} {alg} {version:?}"
                );
            }
        }
    }
    assert_eq!(
        CELLS.len(),
        ProviderName::SOFTWARE.len() * CertAlgorithmName::ALL.len() * 2
    );
}
