//! Does a slow signature stall established connections? Keep-alive request latency on an
//! established connection while other clients flood new RSA-4096 handshakes, with the
//! handshake's signing step inline on the reactor against on the handshake pool.
//!
//! The proxy runs with one reactor thread (and one pool thread) so that the two placements
//! differ in what they can differ in: whether a request waits behind a signature.
//!
//! ```text
//! cargo build --release -p proxy --bins && cargo build --release -p loadgen --examples
//! target/release/examples/offload_p99 target/release/proxy openssl 5
//! ```
//! Arguments: proxy binary, provider (default openssl), seconds per placement (default 5).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use proxy::crypto::{generate_cert_set, CertAlgorithmName};

/// Concurrent handshake flooders: enough to keep a queue of signatures at the proxy.
const FLOODERS: usize = 6;
/// Pause between keep-alive probes: a steady, light stream of established-connection work.
const PROBE_GAP: Duration = Duration::from_millis(5);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let binary = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "target/release/proxy".into());
    let provider = args.get(2).cloned().unwrap_or_else(|| "openssl".into());
    let seconds: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(5);
    let dir = std::env::temp_dir().join(format!("offload-p99-{}", std::process::id()));
    let certs = generate_cert_set(&dir.join("certs"), &[CertAlgorithmName::Rsa4096], &[])?;
    let (_, cert, key) = &certs.servers[0];
    let upstream = start_upstream().await?;
    let client = client_config(&certs.ca_cert)?;

    println!("provider {provider}, RSA-4096, {FLOODERS} clients flooding new handshakes, keep-alive probe every {PROBE_GAP:?}, {seconds} s per placement");
    println!("| placement | keep-alive p50 ms | p99 ms | max ms | probes | flood handshakes/s | proxy CPU % |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for placement in ["inline", "pool"] {
        let args: Vec<String> = [
            "--resumption",
            "off",
            "--worker-threads",
            "1",
            "--handshake-threads",
            "1",
            "--handshake-offload",
            placement,
            "--provider",
            &provider,
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([
            "--upstream".into(),
            format!("http://{upstream}"),
            "--cert".into(),
            cert.display().to_string(),
            "--key".into(),
            key.display().to_string(),
        ])
        .collect();
        let proxy = start_proxy(&binary, &dir, placement, &args).await?;
        let mut probe = connect(proxy.addr, client.clone()).await?;
        get(&mut probe).await?;

        let stop = Arc::new(AtomicBool::new(false));
        let handshakes = Arc::new(AtomicU64::new(0));
        let mut flood = Vec::new();
        for _ in 0..FLOODERS {
            let (stop, handshakes, cfg, addr) =
                (stop.clone(), handshakes.clone(), client.clone(), proxy.addr);
            flood.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if one_request(addr, cfg.clone()).await.is_ok() {
                        handshakes.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        // Let the flood build its queue before measuring.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let cpu_before = proxy_cpu(proxy.admin).await?;
        let hs_before = handshakes.load(Ordering::Relaxed);
        let started = Instant::now();
        let mut samples = Vec::new();
        while started.elapsed() < Duration::from_secs(seconds) {
            let t = Instant::now();
            get(&mut probe).await?;
            samples.push(t.elapsed());
            tokio::time::sleep(PROBE_GAP).await;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let hs = handshakes.load(Ordering::Relaxed) - hs_before;
        let cpu = proxy_cpu(proxy.admin).await? - cpu_before;
        stop.store(true, Ordering::Relaxed);
        for f in flood {
            let _ = f.await;
        }
        samples.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "| {placement} | {:.2} | {:.2} | {:.2} | {} | {:.0} | {:.0} |",
            ms(quantile(&samples, 0.5)),
            ms(quantile(&samples, 0.99)),
            ms(*samples.last().unwrap_or(&Duration::ZERO)),
            samples.len(),
            hs as f64 / elapsed,
            cpu / elapsed * 100.0
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
