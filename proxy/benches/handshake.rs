//! What one full TLS 1.3 handshake costs the proxy, per provider x certificate algorithm:
//! the server configuration is built exactly as a listener's is (`tls::listener_tls`,
//! resumption off, X25519), the client is a fixed aws-lc-rs client, and the two exchange
//! bytes in memory. Only the time spent inside the server's calls is counted, so the figure
//! is the proxy's CPU per handshake without sockets, the client or the scheduler in it:
//! the in-process counterpart of loadgen's "proxy CPU per handshake".
//!
//! ```text
//! cargo bench -p proxy --bench handshake            # all 12 cells, about a minute
//! cargo bench -p proxy --bench handshake -- rsa4096 # a filter
//! ```
//! (openssl-qat needs a QAT device and is measured through loadgen compare.)

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use proxy::config::{TlsPolicy, TlsVersion};
use proxy::crypto::{generate_cert_set, CertAlgorithmName, ProviderName};
use proxy::tls::client::ClientTls;
use proxy::tls::measure::server_side_handshake;

fn handshakes(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("proxy-bench-certs-{}", std::process::id()));
    let set = generate_cert_set(&dir, &CertAlgorithmName::ALL, &[]).expect("certificates");
    let client = ClientTls {
        versions: vec![TlsVersion::Tls13],
        ..ClientTls::trusting(&set.ca_cert)
    }
    .build()
    .expect("client");
    let policy = TlsPolicy {
        resumption: false,
        ..TlsPolicy::default()
    };
    let mut group = c.benchmark_group("server_full_handshake");
    // Two shared cores: fewer, longer samples are steadier than criterion's defaults.
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let mut wire = (Vec::with_capacity(4096), Vec::with_capacity(16 * 1024));
    for (alg, cert, key) in &set.servers {
        for provider in ProviderName::SOFTWARE {
            let (_, _, server) = proxy::tls::listener_tls(provider, cert, key, &policy, &[])
                .unwrap_or_else(|e| panic!("{provider:?} {alg:?}: {e}"));
            let alg = alg.as_str();
            group.bench_function(format!("{}/{alg}", provider.as_str()), |b| {
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| {
                            server_side_handshake(&server, &client, &mut wire)
                                .expect("handshake")
                                .0
                        })
                        .sum()
                })
            });
        }
    }
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, handshakes);
criterion_main!(benches);
