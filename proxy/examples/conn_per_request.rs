//! A simple client loop for the worst case the proxy exists for: a new TLS connection (a
//! full handshake, no resumption) for every small request. For each software provider x
//! certificate algorithm it starts the real proxy binary, drives it for a fixed time and
//! prints requests/s and the proxy's CPU-seconds per request (from its own
//! `process_cpu_seconds_total`). Until `loadgen` exists this is how the proxy is measured.
//!
//! ```text
//! cargo build --release -p proxy
//! cargo run --release -p proxy --example conn_per_request -- target/release/proxy 3 2
//! ```
//! Arguments: proxy binary, seconds per cell (default 3), client concurrency (default 2).

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use proxy::crypto::{generate_cert_set, CertAlgorithmName, KxGroupName, Provider, ProviderName};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

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

    println!("new TLS 1.3 connection per request, X25519, no resumption, {concurrency} clients, {seconds} s per cell");
    println!("| provider | algorithm | requests/s | proxy CPU ms/request | proxy CPU % | errors |");
    println!("|---|---|---:|---:|---:|---:|");
    for provider in [
        ProviderName::Ring,
        ProviderName::AwsLcRs,
        ProviderName::Openssl,
    ] {
        for (alg, cert, key) in &certs.servers {
            let ready = dir.join(format!("ready-{provider}-{alg}.json"));
            let _ = std::fs::remove_file(&ready);
            let mut child = Command::new(&binary)
                .args([
                    "run",
                    "--listen",
                    "127.0.0.1:0",
                    "--admin",
                    "127.0.0.1:0",
                    "--resumption",
                    "off",
                ])
                .args([
                    "--upstream",
                    &format!("http://{upstream}"),
                    "--provider",
                    provider.as_str(),
                ])
                .arg("--cert")
                .arg(cert)
                .arg("--key")
                .arg(key)
                .arg("--ready-file")
                .arg(&ready)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            let deadline = Instant::now() + Duration::from_secs(20);
            let doc: serde_json::Value = loop {
                if let Ok(t) = std::fs::read_to_string(&ready) {
                    break serde_json::from_str(&t)?;
                }
                anyhow::ensure!(Instant::now() < deadline, "proxy did not start");
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let addr: SocketAddr = doc["listeners"]["listener0"]
                .as_str()
                .unwrap_or_default()
                .parse()?;
            let admin: SocketAddr = doc["admin"].as_str().unwrap_or_default().parse()?;
            let client = client_config(&certs.ca_cert)?;

            // Warm-up, excluded.
            drive(
                addr,
                client.clone(),
                concurrency,
                Duration::from_millis(500),
            )
            .await;
            let cpu_before = proxy_cpu(admin).await?;
            let started = Instant::now();
            let (ok, errors) = drive(addr, client, concurrency, Duration::from_secs(seconds)).await;
            let elapsed = started.elapsed().as_secs_f64();
            let cpu = proxy_cpu(admin).await? - cpu_before;
            let _ = child.kill();
            let _ = child.wait();
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

fn client_config(ca: &std::path::Path) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let provider = Provider::new(ProviderName::AwsLcRs, &[KxGroupName::X25519])?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca)? {
        roots.add(c?)?;
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider.crypto().clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.resumption = rustls::client::Resumption::disabled();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
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

async fn one_request(addr: SocketAddr, cfg: Arc<rustls::ClientConfig>) -> anyhow::Result<()> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    let req = http::Request::get("/")
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    anyhow::ensure!(resp.status() == 200, "status {}", resp.status());
    resp.into_body().collect().await?;
    Ok(())
}

async fn proxy_cpu(admin: SocketAddr) -> anyhow::Result<f64> {
    let tcp = tokio::net::TcpStream::connect(admin).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let req = http::Request::get("/metrics")
        .header("host", "admin")
        .body(Empty::<Bytes>::new())?;
    let body = sender
        .send_request(req)
        .await?
        .into_body()
        .collect()
        .await?
        .to_bytes();
    let text = String::from_utf8_lossy(&body);
    text.lines()
        .find_map(|l| l.strip_prefix("process_cpu_seconds_total "))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no process_cpu_seconds_total"))
}

async fn start_upstream() -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                        Bytes::from_static(b"ok"),
                    )))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    Ok(addr)
}
