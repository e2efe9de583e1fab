//! Every provider x every certificate algorithm x TLS 1.3 and 1.2: an HTTPS request through
//! the real proxy reaches a real upstream and the answer matches; the client verifies the
//! chain against the generated CA and uses the same provider as the proxy.

use bytes::Bytes;
use e2e::*;
use proxy::crypto::{CertAlgorithmName, ProviderName};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_provider_every_algorithm_both_tls_versions() {
    let upstream = EchoUpstream::start();
    for provider in ProviderName::SOFTWARE {
        for alg in CertAlgorithmName::ALL {
            let proxy = ProxyProcess::start(&upstream.url(), provider, alg, &[]);
            for (tls13, tls12, want) in [
                (true, false, rustls::ProtocolVersion::TLSv1_3),
                (false, true, rustls::ProtocolVersion::TLSv1_2),
            ] {
                let cfg = client_config(&ClientOpts {
                    provider,
                    tls13,
                    tls12,
                    ..ClientOpts::default()
                });
                let body = format!("upsert through {provider} with {alg} over {want:?}");
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
                .unwrap_or_else(|e| panic!("{provider} {alg} {want:?}: {e}\n{}", proxy.log_text()));
                assert_eq!(a.status, 200, "{provider} {alg} {want:?}");
                assert_eq!(a.tls_version, Some(want), "{provider} {alg}");
                let echo = a.json();
                assert_eq!(echo["path"], "/collections/c/points", "{echo}");
                assert_eq!(echo["method"], "POST");
                assert_eq!(echo["body_sha256"], sha256_hex(body.as_bytes()));
                assert_eq!(echo["headers"]["x-test"], "matrix");
                // A client's request id is kept as it came.
                assert_eq!(echo["headers"]["x-request-id"], "client-chosen-7");
                assert_eq!(echo["headers"]["x-forwarded-proto"], "https");
                assert_eq!(echo["headers"]["x-forwarded-for"], "127.0.0.1");
            }
            let m = proxy.metrics();
            for version in ["1.3", "1.2"] {
                let n = metric_value(
                    &m,
                    "proxy_tls_handshakes_total",
                    &[
                        ("provider", provider.as_str()),
                        ("algorithm", alg.as_str()),
                        ("tls_version", version),
                        ("outcome", "ok"),
                        ("resumed", "false"),
                    ],
                );
                assert_eq!(n, Some(1.0), "{provider} {alg} TLS {version}:\n{m}");
            }
            // The start-up log names the algorithm and key size.
            let log = proxy.log_text();
            assert!(log.contains("key_bits="), "{log}");
        }
    }
}
