//! A simple client loop for the worst case the proxy exists for: a new TLS connection (a
//! full handshake, no resumption) for every small request. For each software provider x
//! certificate algorithm it starts the real proxy binary, drives it for a fixed time and
//! prints requests/s and the proxy's CPU-seconds per request (from its own
//! `process_cpu_seconds_total`). Until `loadgen` exists this is how the proxy is measured.
//!
//! ```text
//! cargo build --release -p proxy --bins --examples
//! target/release/examples/conn_per_request target/release/proxy 3 2
//! ```
//! Arguments: proxy binary, seconds per cell (default 3), client concurrency (default 2).

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use proxy::crypto::{generate_cert_set, CertAlgorithmName, ProviderName};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let binary = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "target/release/proxy".into());
    let seconds: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let concurrency: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(2);
    let dir = std::env::temp_dir().join(format!("conn-per-request-{}", std::process::id()));
    let certs = generate_cert_set(&dir.join("certs"), &CertAlgorithmName::ALL, &[])?;
    let upstream = start_upstream().await?;
    let client = client_config(&certs.ca_cert)?;

    println!("new TLS 1.3 connection per request, X25519, no resumption, {concurrency} clients, {seconds} s per cell");
    println!("| provider | algorithm | requests/s | proxy CPU ms/request | proxy CPU % | errors |");
    println!("|---|---|---:|---:|---:|---:|");
    for provider in [
        ProviderName::Ring,
        ProviderName::AwsLcRs,
        ProviderName::Openssl,
    ] {
        for (alg, cert, key) in &certs.servers {
            let args: Vec<String> = vec![
                "--resumption".into(),
                "off".into(),
                "--upstream".into(),
                format!("http://{upstream}"),
                "--provider".into(),
                provider.as_str().into(),
                "--cert".into(),
                cert.display().to_string(),
                "--key".into(),
                key.display().to_string(),
            ];
            let proxy = start_proxy(&binary, &dir, &format!("{provider}-{alg}"), &args).await?;
            // Warm-up, excluded.
            drive(
                proxy.addr,
                client.clone(),
                concurrency,
                Duration::from_millis(500),
            )
            .await;
            let cpu_before = proxy_cpu(proxy.admin).await?;
            let started = Instant::now();
            let (ok, errors) = drive(
                proxy.addr,
                client.clone(),
                concurrency,
                Duration::from_secs(seconds),
            )
            .await;
            let elapsed = started.elapsed().as_secs_f64();
            let cpu = proxy_cpu(proxy.admin).await? - cpu_before;
            println!(
                "| {provider} | {alg} | {:.0} | {:.3} | {:.0} | {errors} |",
                ok as f64 / elapsed,
                cpu * 1000.0 / ok.max(1) as f64,
                cpu / elapsed * 100.0,
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

async fn drive(
    addr: SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
    workers: usize,
    d: Duration,
) -> (u64, u64) {
    let ok = Arc::new(AtomicU64::new(0));
    let err = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + d;
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (cfg, ok, err) = (cfg.clone(), ok.clone(), err.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                match one_request(addr, cfg.clone()).await {
                    Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(_) => err.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    (ok.load(Ordering::Relaxed), err.load(Ordering::Relaxed))
}
