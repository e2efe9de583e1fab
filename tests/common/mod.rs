//! Shared helpers for the end-to-end tests: the real `proxy` binary started on loopback,
//! real upstream servers (an HTTP/1.1 + h2c echo server and a tonic gRPC server), and a TLS
//! client built on the same provider registry as the proxy.
//!
//! Every wait here is bounded, and every process is killed when its handle drops.

#![allow(dead_code)]

use std::convert::Infallible;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use proxy::crypto::{
    generate_cert_set, CertAlgorithmName, GeneratedSet, KxGroupName, Provider, ProviderName,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::ClientConfig;
use sha2::{Digest, Sha256};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// How long any single wait in these tests may take before it is a failure.
pub const WAIT: Duration = Duration::from_secs(30);

/// Waits for `child` to exit; after `limit` kills it and fails the test naming `what`.
pub fn wait_bounded(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A fresh, unique temporary directory.
///
/// Folders live under `$TMPDIR/proxy-e2e/<pid>/`; the first call in a test process removes
/// the folders of test processes that are no longer running, so repeated runs (CI on a warm
/// machine) do not pile up upstream data and logs. A failed run's files stay until then.
pub fn temp_dir(tag: &str) -> PathBuf {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    let root = ROOT.get_or_init(|| {
        let base = std::env::temp_dir().join("proxy-e2e");
        for entry in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            let pid = entry.file_name().to_string_lossy().parse::<u32>().ok();
            if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        base.join(std::process::id().to_string())
    });
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = root.join(format!("{tag}-{n}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// One certificate set per test binary (RSA-4096 generation takes a moment).
pub fn certs() -> &'static GeneratedSet {
    static SET: OnceLock<GeneratedSet> = OnceLock::new();
    SET.get_or_init(|| {
        generate_cert_set(&temp_dir("certs"), &CertAlgorithmName::ALL, &[])
            .expect("generate certificates")
    })
}

/// The cert and key paths for `alg`.
pub fn server_cert(alg: CertAlgorithmName) -> (PathBuf, PathBuf) {
    let (_, c, k) = certs()
        .servers
        .iter()
        .find(|(a, _, _)| *a == alg)
        .expect("algorithm generated");
    (c.clone(), k.clone())
}

/// The path of a workspace binary, built by `cargo test --workspace` (its package has
/// integration tests, so cargo builds the binary before any test runs).
pub fn binary(name: &str) -> PathBuf {
    // E2E_PROXY_BIN runs the suite against another build of the proxy (an older one, to
    // show what a test catches).
    if name == "proxy" {
        if let Some(path) = std::env::var_os("E2E_PROXY_BIN") {
            return PathBuf::from(path);
        }
    }
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test>-<hash> -> target/<profile>/<name>
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} not found: run the tests with `cargo test --workspace` so the binary is built",
        path.display()
    );
    path
}

/// A running `proxy run` process.
pub struct ProxyProcess {
    child: Child,
    /// First listener's address.
    pub addr: SocketAddr,
    /// Every listener's address by name.
    listeners: std::collections::HashMap<String, SocketAddr>,
    /// Admin address.
    pub admin: SocketAddr,
    /// Where its stderr goes.
    pub log: PathBuf,
    dir: PathBuf,
}

impl ProxyProcess {
    /// Starts `proxy run` with a listener on 127.0.0.1:0 and an admin port on 127.0.0.1:0,
    /// plus `extra` flags, and waits until it is listening.
    pub fn start(
        upstream: &str,
        provider: ProviderName,
        alg: CertAlgorithmName,
        extra: &[&str],
    ) -> Self {
        let (cert, key) = server_cert(alg);
        let mut args: Vec<String> = vec![
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--upstream".into(),
            upstream.into(),
            "--provider".into(),
            provider.as_str().into(),
            "--cert".into(),
            cert.display().to_string(),
            "--key".into(),
            key.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        Self::start_raw(&args)
    }

    /// Starts `proxy run ARGS --admin 127.0.0.1:0 --ready-file ...` and waits for it.
    pub fn start_raw(args: &[String]) -> Self {
        let dir = temp_dir("proxy");
        let ready = dir.join("ready.json");
        let log = dir.join("proxy.log");
        let mut cmd = Command::new(binary("proxy"));
        cmd.arg("run")
            .args(args)
            .arg("--ready-file")
            .arg(&ready)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .env("RUST_LOG", "info");
        if !args.iter().any(|a| a == "--admin") {
            cmd.args(["--admin", "127.0.0.1:0"]);
        }
        let mut child = cmd.spawn().expect("spawn proxy");
        let v = wait_ready(&mut child, &ready, &log, "proxy");
        let addr = v["listeners"]
            .as_object()
            .and_then(|m| m.values().next())
            .and_then(|a| a.as_str())
            .expect("a listener address")
            .parse()
            .expect("socket address");
        let admin = v["admin"]
            .as_str()
            .expect("admin address")
            .parse()
            .expect("admin addr");
        let listeners = v["listeners"]
            .as_object()
            .expect("listeners")
            .iter()
            .map(|(name, a)| {
                let a = a
                    .as_str()
                    .expect("address")
                    .parse()
                    .expect("socket address");
                (name.clone(), a)
            })
            .collect();
        Self {
            child,
            addr,
            listeners,
            admin,
            log,
            dir,
        }
    }

    /// The address of the listener named `name`.
    pub fn listener(&self, name: &str) -> SocketAddr {
        *self
            .listeners
            .get(name)
            .unwrap_or_else(|| panic!("no listener {name:?}: {:?}", self.listeners))
    }

    /// The listener's URL authority, for request URIs.
    pub fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.addr.port())
    }

    /// Scrapes /metrics.
    pub fn metrics(&self) -> String {
        let (status, body) = plain_get(self.admin, "/metrics");
        assert_eq!(status, 200, "metrics: {body}");
        body
    }

    /// Scrapes /metrics until `name{labels}` equals `want` (bounded by [`WAIT`]): for values
    /// that settle asynchronously, such as a connection the client just closed.
    pub fn wait_metric(&self, name: &str, labels: &[(&str, &str)], want: f64) {
        let deadline = Instant::now() + WAIT;
        loop {
            let m = self.metrics();
            if metric_value(&m, name, labels) == Some(want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{name}{labels:?} never reached {want}:\n{m}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
    }

    /// Sends SIGHUP (reload the certificates).
    pub fn hangup(&self) {
        self.signal(nix::sys::signal::Signal::SIGHUP);
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal)
            .unwrap_or_else(|e| panic!("send {signal}: {e}"));
    }

    /// Waits (bounded) for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        wait_bounded(&mut self.child, limit, "proxy")
    }

    /// Everything the proxy logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits (bounded) for a started server's ready file and returns its JSON; panics with
/// the server's log if it exits first.
fn wait_ready(child: &mut Child, ready: &Path, log: &Path, what: &str) -> serde_json::Value {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(text) = std::fs::read_to_string(ready) {
            return serde_json::from_str(&text).expect("ready file is JSON");
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{what} exited during start-up ({status}):\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not become ready in {WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `run` arguments for a proxy expected to stop at start-up: loopback port 0 for the
/// listener and admin port, an upstream nobody listens on, the given cert and key, then
/// `extra` (which may repeat a flag; the last one wins).
pub fn startup_run_args(cert: &str, key: &str, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "run",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--upstream",
        "http://127.0.0.1:1",
        "--cert",
        cert,
        "--key",
        key,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    v.extend(extra.iter().map(|s| (*s).to_owned()));
    v
}

/// Runs the proxy binary to completion with `args` (bounded), returning its exit status
/// and stderr.
pub fn run_proxy_to_exit(args: &[&str]) -> (ExitStatus, String) {
    let mut child = Command::new(binary("proxy"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn proxy");
    let status = wait_bounded(&mut child, WAIT, "proxy");
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .ok();
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .ok();
    (status, format!("{out}{err}"))
}

/// The values of the samples of `name` whose labels contain every `labels` pair.
fn metric_samples<'a>(
    text: &'a str,
    name: &'a str,
    labels: &'a [(&str, &str)],
) -> impl Iterator<Item = f64> + 'a {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(move |l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(move |l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The value of the first sample of `name` whose labels contain every `labels` pair.
pub fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    metric_samples(text, name, labels).next()
}

/// The sum of every sample of `name` whose labels contain every `labels` pair (0 if none).
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_samples(text, name, labels).sum()
}

/// A plain HTTP/1.1 GET (for the admin port), bounded in time.
pub fn plain_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect_timeout(&addr, WAIT).expect("connect admin");
    s.set_read_timeout(Some(WAIT)).ok();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

// ---------------------------------------------------------------------------------------
// embedded-qdrant

/// A running `embedded-qdrant` process; killed on drop.
pub struct EmbeddedQdrant {
    child: Child,
    /// REST address.
    pub rest: SocketAddr,
    /// gRPC address.
    pub grpc: SocketAddr,
    /// Its data folder.
    pub data: PathBuf,
    /// Where its stderr goes.
    pub log: PathBuf,
}

impl EmbeddedQdrant {
    /// Starts the server on loopback port 0 with `data` as its data folder.
    pub fn start(data: &Path) -> Self {
        Self::start_on(
            data,
            "127.0.0.1:0".parse().expect("address"),
            "127.0.0.1:0".parse().expect("address"),
        )
    }

    /// Starts the server on these addresses (a restart on the ports it had).
    pub fn start_on(data: &Path, rest: SocketAddr, grpc: SocketAddr) -> Self {
        let dir = temp_dir("eq-run");
        let ready = dir.join("ready.json");
        let log = dir.join("embedded-qdrant.log");
        let mut child = Command::new(binary("embedded-qdrant"))
            .arg("--rest")
            .arg(rest.to_string())
            .arg("--grpc")
            .arg(grpc.to_string())
            .arg("--data")
            .arg(data)
            .arg("--ready-file")
            .arg(&ready)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn embedded-qdrant");
        let v = wait_ready(&mut child, &ready, &log, "embedded-qdrant");
        Self {
            child,
            rest: v["rest"].as_str().expect("rest").parse().expect("addr"),
            grpc: v["grpc"].as_str().expect("grpc").parse().expect("addr"),
            data: data.to_owned(),
            log,
        }
    }

    /// SIGTERM, then waits (bounded) for a clean exit; returns the exit status.
    pub fn stop(mut self) -> ExitStatus {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("SIGTERM");
        wait_bounded(&mut self.child, WAIT, "embedded-qdrant")
    }

    /// SIGKILL: a crash, with no chance to flush anything.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for EmbeddedQdrant {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.1 request with a JSON (or raw) body; returns status and parsed JSON
/// (`Value::Null` when the body is not JSON). Bounded in time.
pub fn http_json(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    let (status, body) = http_raw(addr, method, path, &[], body);
    (
        status,
        serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
    )
}

/// A plain HTTP/1.1 request on a fresh connection with extra header lines (`"Name: value"`);
/// returns status and body text. Bounded in time.
pub fn http_raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &str,
) -> (u16, String) {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect_timeout(&addr, WAIT).expect("connect");
    s.set_read_timeout(Some(WAIT)).ok();
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: test\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("read");
    let text = String::from_utf8_lossy(&out);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, body.to_owned())
}

/// `n` seeded pseudo-random unit vectors of `dim` dimensions (xorshift; reproducible).
pub fn unit_vectors(n: usize, dim: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut state = seed | 1;
    (0..n)
        .map(|_| {
            let mut v: Vec<f32> = (0..dim)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state % 20_001) as f32 / 10_000.0 - 1.0
                })
                .collect();
            let norm = v
                .iter()
                .map(|x| x * x)
                .sum::<f32>()
                .sqrt()
                .max(f32::MIN_POSITIVE);
            v.iter_mut().for_each(|x| *x /= norm);
            v
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Upstreams

/// Runs `serve(listener)` on its own thread and runtime until the returned guard drops, so
/// upstreams work from sync and async tests alike.
fn spawn_server<F, Fut>(serve: F) -> (SocketAddr, ServerGuard)
where
    F: FnOnce(tokio::net::TcpListener) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind upstream");
    std_listener.set_nonblocking(true).expect("nonblocking");
    let addr = std_listener.local_addr().expect("addr");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).expect("tokio listener");
            tokio::select! {
                _ = serve(listener) => {}
                _ = stop_rx => {}
            }
        });
    });
    (addr, ServerGuard(Some(stop_tx)))
}

/// Stops a server started by `spawn_server` when dropped.
pub struct ServerGuard(Option<tokio::sync::oneshot::Sender<()>>);

impl Drop for ServerGuard {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// Serves `handler` over HTTP/1.1 and h2c (hyper chooses per connection) on loopback until
/// the guard drops.
fn spawn_http_server<H, Fut>(handler: H) -> (SocketAddr, ServerGuard)
where
    H: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    spawn_server(move |listener| async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let handler = handler.clone();
            tokio::task::spawn_local(async move {
                let svc = service_fn(move |req| {
                    let fut = handler(req);
                    async move { Ok::<_, Infallible>(fut.await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    })
}

/// A real HTTP server (HTTP/1.1 and h2c, chosen per connection by hyper) that echoes what
/// it received. Paths:
/// - `/slow/<ms>`: answers after that many milliseconds;
/// - `/status/<code>`: answers with that status;
/// - anything else: 200 with a JSON summary of the request (method, path, selected
///   headers, body length and SHA-256).
pub struct EchoUpstream {
    pub addr: SocketAddr,
    _guard: ServerGuard,
}

impl EchoUpstream {
    pub fn start() -> Self {
        let (addr, guard) = spawn_http_server(|req| async move {
            match echo(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            }
        });
        Self {
            addr,
            _guard: guard,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

async fn echo(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_owned();
    if let Some(ms) = path.strip_prefix("/slow/") {
        let ms: u64 = ms.parse().unwrap_or(1000);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(code) = path.strip_prefix("/status/") {
        let mut r = Response::new(Full::new(Bytes::from_static(b"as requested")));
        *r.status_mut() = StatusCode::from_u16(code.parse().unwrap_or(500))
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return Ok(r);
    }
    let header = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let summary_headers = serde_json::json!({
        "host": header("host"),
        "x-forwarded-for": header("x-forwarded-for"),
        "x-forwarded-proto": header("x-forwarded-proto"),
        "forwarded": header("forwarded"),
        "x-real-ip": header("x-real-ip"),
        "authorization": header("authorization"),
        "connection": header("connection"),
        "x-test": header("x-test"),
    });
    let method = req.method().to_string();
    let version = format!("{:?}", req.version());
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let summary = serde_json::json!({
        "method": method,
        "path": path,
        "version": version,
        "headers": summary_headers,
        "body_len": body.len(),
        "body_sha256": sha256_hex(&body),
    });
    Ok(Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(summary.to_string())))
        .expect("response"))
}

pub fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A tonic gRPC server (grpc.health.v1: unary Check, server-streaming Watch) on h2c.
pub struct GrpcUpstream {
    pub addr: SocketAddr,
    _guard: ServerGuard,
}

/// The service name the gRPC upstream reports as SERVING.
pub const GRPC_SERVICE: &str = "vectors.Ingest";

impl GrpcUpstream {
    pub fn start() -> Self {
        let (addr, guard) = spawn_server(|listener| async move {
            let (reporter, service) = tonic_health::server::health_reporter();
            reporter
                .set_service_status(GRPC_SERVICE, tonic_health::ServingStatus::Serving)
                .await;
            // Keep the reporter alive: dropping it ends Watch streams.
            let _keep = reporter;
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        Self {
            addr,
            _guard: guard,
        }
    }
}

// ---------------------------------------------------------------------------------------
// TLS client

/// Options for a test client.
#[derive(Clone, Debug)]
pub struct ClientOpts {
    pub provider: ProviderName,
    pub tls13: bool,
    pub tls12: bool,
    pub alpn: Vec<Vec<u8>>,
    pub resumption: bool,
    pub client_cert: bool,
}

impl Default for ClientOpts {
    fn default() -> Self {
        Self {
            provider: ProviderName::AwsLcRs,
            tls13: true,
            tls12: true,
            alpn: vec![b"http/1.1".to_vec()],
            resumption: false,
            client_cert: false,
        }
    }
}

/// A rustls client config that trusts the generated CA.
pub fn client_config(opts: &ClientOpts) -> Arc<ClientConfig> {
    let provider = Provider::new(opts.provider, &[KxGroupName::X25519]).expect("client provider");
    let mut versions = Vec::new();
    if opts.tls13 {
        versions.push(&rustls::version::TLS13);
    }
    if opts.tls12 {
        versions.push(&rustls::version::TLS12);
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&certs().ca_cert).expect("ca file") {
        roots.add(cert.expect("ca cert")).expect("add ca");
    }
    let builder = ClientConfig::builder_with_provider(provider.crypto().clone())
        .with_protocol_versions(&versions)
        .expect("versions")
        .with_root_certificates(roots);
    let mut config = if opts.client_cert {
        let (cert, key) = &certs().client;
        let chain = CertificateDer::pem_file_iter(cert)
            .expect("client cert")
            .collect::<Result<Vec<_>, _>>()
            .expect("client cert pem");
        let key = PrivateKeyDer::from_pem_file(key).expect("client key");
        builder
            .with_client_auth_cert(chain, key)
            .expect("client auth")
    } else {
        builder.with_no_client_auth()
    };
    config.alpn_protocols = opts.alpn.clone();
    if !opts.resumption {
        config.resumption = rustls::client::Resumption::disabled();
    }
    Arc::new(config)
}

/// Opens a TLS connection to `addr`, verifying the name "localhost".
pub async fn tls_connect(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").expect("server name"), tcp)
        .await
}

/// A response as the test sees it.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
    pub tls_version: Option<rustls::ProtocolVersion>,
    pub resumed: bool,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// One request on a new TLS connection: HTTP/2 when the connection negotiated h2,
/// HTTP/1.1 otherwise.
pub async fn request(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<Answer, Box<dyn std::error::Error + Send + Sync>> {
    let tls = tls_connect(addr, config).await?;
    let (_, conn) = tls.get_ref();
    let tls_version = conn.protocol_version();
    let resumed = matches!(conn.handshake_kind(), Some(rustls::HandshakeKind::Resumed));
    let h2 = conn.alpn_protocol() == Some(b"h2");
    let mut builder = Request::builder()
        .method(method)
        .uri(format!("https://localhost:{}{path}", addr.port()));
    if !h2 {
        builder = builder.header("host", format!("localhost:{}", addr.port()));
    }
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let req = builder.body(Full::new(body))?;
    let io = TokioIo::new(tls);
    let resp = if h2 {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
        tokio::spawn(conn);
        sender.send_request(req).await?
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(conn);
        sender.send_request(req).await?
    };
    let (parts, body) = resp.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok(Answer {
        status: parts.status,
        headers: parts.headers,
        body,
        tls_version,
        resumed,
    })
}

/// `request` with a time bound.
pub async fn request_bounded(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<Answer, String> {
    match tokio::time::timeout(WAIT, request(addr, config, method, path, headers, body)).await {
        Ok(Ok(a)) => Ok(a),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {WAIT:?}")),
    }
}

// ---------------------------------------------------------------------------------------
// loadgen

/// A finished `loadgen` process.
pub struct LoadgenRun {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// The `--out` JSON, when the run wrote one.
    pub result: Option<serde_json::Value>,
}

/// Runs `loadgen ARGS` to completion (killed after 5 minutes: every run in these tests is
/// bounded far below that). `out` is passed as `--out` when given and read back.
pub fn run_loadgen(args: &[String], out: Option<&Path>) -> LoadgenRun {
    let dir = temp_dir("loadgen");
    let stdout_path = dir.join("stdout");
    let stderr_path = dir.join("stderr");
    let mut cmd = Command::new(binary("loadgen"));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr_path).expect("stderr file"));
    if let Some(out) = out {
        cmd.arg("--out").arg(out);
    }
    let mut child = cmd.spawn().expect("spawn loadgen");
    let status = wait_bounded(&mut child, Duration::from_secs(300), "loadgen");
    let result = out
        .and_then(|p| std::fs::read(p).ok())
        .map(|b| serde_json::from_slice(&b).expect("result JSON parses"));
    LoadgenRun {
        status,
        stdout: std::fs::read_to_string(stdout_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(stderr_path).unwrap_or_default(),
        result,
    }
}

/// Sets `flag` to `value` in an argument list: replaces an earlier occurrence, or adds it
/// before a `--` separator (so it stays the command's flag, not one of what follows).
pub fn set_flag(a: &mut Vec<String>, flag: &str, value: &str) {
    let sep = a.iter().position(|x| x == "--").unwrap_or(a.len());
    match a[..sep].iter().position(|x| x == flag) {
        Some(i) => a[i + 1] = value.to_owned(),
        None => {
            a.insert(sep, value.to_owned());
            a.insert(sep, flag.to_owned());
        }
    }
}

/// Owned argument list from string slices.
pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// A stand-in for OpenVINO Model Server's OpenAI-compatible embeddings endpoint
/// (`POST /v3/embeddings`), since OVMS cannot run here: deterministic `dim`-d unit vectors
/// derived from each input text, in the OpenAI answer shape. Counts the calls it served.
pub struct FakeOvms {
    pub addr: SocketAddr,
    pub calls: Arc<std::sync::atomic::AtomicU64>,
    _guard: ServerGuard,
}

impl FakeOvms {
    pub fn start(dim: usize) -> Self {
        let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = calls.clone();
        let (addr, guard) = spawn_http_server(move |req| {
            let counter = counter.clone();
            async move { fake_embeddings(req, dim, &counter).await }
        });
        Self {
            addr,
            calls,
            _guard: guard,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(std::sync::atomic::Ordering::Relaxed)
    }
}

async fn fake_embeddings(
    req: Request<Incoming>,
    dim: usize,
    calls: &std::sync::atomic::AtomicU64,
) -> Response<Full<Bytes>> {
    let bad = |code: u16, msg: &str| {
        Response::builder()
            .status(code)
            .body(Full::new(Bytes::from(
                serde_json::json!({"error": msg}).to_string(),
            )))
            .expect("response")
    };
    if req.method() != http::Method::POST || req.uri().path() != "/v3/embeddings" {
        return bad(404, "not found");
    }
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return bad(400, "body is not JSON");
    };
    let (Some(model), Some(input)) = (v["model"].as_str(), v["input"].as_array()) else {
        return bad(400, "model and input are required");
    };
    calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let data: Vec<serde_json::Value> = input
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let seed = Sha256::digest(text.as_str().unwrap_or("").as_bytes());
            let seed = u64::from_le_bytes(seed[..8].try_into().expect("8 bytes"));
            let v = unit_vectors(1, dim, seed).remove(0);
            serde_json::json!({"object": "embedding", "index": i, "embedding": v})
        })
        .collect();
    let answer = serde_json::json!({
        "object": "list",
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": 0, "total_tokens": 0},
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(answer.to_string())))
        .expect("response")
}

/// Serves one fixed body to every request, after `delay`: a recorded answer standing in for
/// hardware that cannot exist here (a BMC's Redfish API, a power sensor's exporter), or a
/// deliberately slow Qdrant-shaped upstream.
pub struct StaticAnswer {
    pub addr: SocketAddr,
    _guard: ServerGuard,
}

impl StaticAnswer {
    pub fn start(body: Vec<u8>) -> Self {
        Self::serve(body, "application/json", Duration::ZERO)
    }

    /// Reads each request's body, waits `delay`, then answers.
    pub fn start_delayed(body: Vec<u8>, delay: Duration) -> Self {
        Self::serve(body, "application/json", delay)
    }

    /// The same answer as Prometheus text exposition (a stand-in exporter).
    pub fn start_metrics(text: &str) -> Self {
        Self::serve(
            text.as_bytes().to_vec(),
            "text/plain; version=0.0.4",
            Duration::ZERO,
        )
    }

    fn serve(body: Vec<u8>, content_type: &'static str, delay: Duration) -> Self {
        let body = Bytes::from(body);
        let (addr, guard) = spawn_http_server(move |req: Request<Incoming>| {
            let body = body.clone();
            async move {
                let _ = req.into_body().collect().await;
                tokio::time::sleep(delay).await;
                Response::builder()
                    .header("content-type", content_type)
                    .body(Full::new(body))
                    .expect("response")
            }
        });
        Self {
            addr,
            _guard: guard,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// A loopback address with a port that was free a moment ago, for servers that cannot
/// report a port they chose themselves.
pub fn free_loopback_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
}

/// A real Prometheus server (Debian's `prometheus` package; `.ci/run` installs it) on
/// loopback, scraping the given targets every second into a temporary TSDB.
pub struct PrometheusServer {
    child: Child,
    pub addr: SocketAddr,
    log: PathBuf,
    /// The `Authorization` header line its queries need, when it asks for basic auth.
    authorization: Option<String>,
}

impl PrometheusServer {
    /// `targets` are `(job, host:port)` pairs scraped at `/metrics`.
    pub fn start(targets: &[(&str, SocketAddr)]) -> Self {
        Self::start_with_rules(targets, &[])
    }

    /// As [`Self::start`], also evaluating these rule files every second.
    pub fn start_with_rules(targets: &[(&str, SocketAddr)], rule_files: &[PathBuf]) -> Self {
        Self::start_full(targets, rule_files, None)
    }

    /// As [`Self::start`], requiring HTTP basic auth: `(user, password, bcrypt hash of it)`.
    pub fn start_with_basic_auth(targets: &[(&str, SocketAddr)], auth: (&str, &str, &str)) -> Self {
        Self::start_full(targets, &[], Some(auth))
    }

    fn start_full(
        targets: &[(&str, SocketAddr)],
        rule_files: &[PathBuf],
        basic_auth: Option<(&str, &str, &str)>,
    ) -> Self {
        let dir = temp_dir("prometheus");
        let mut config = String::from(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n",
        );
        if !rule_files.is_empty() {
            config.push_str("rule_files:\n");
        }
        for f in rule_files {
            config.push_str(&format!("  - '{}'\n", f.display()));
        }
        config.push_str("scrape_configs:\n");
        for (job, addr) in targets {
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: ['{addr}']\n"
            ));
        }
        std::fs::write(dir.join("prometheus.yml"), config).expect("write config");
        // Prometheus cannot report a port it chose, so take a free one and hand it over.
        let addr = free_loopback_addr();
        let log = dir.join("prometheus.log");
        let mut cmd = Command::new("prometheus");
        let authorization = basic_auth.map(|(user, password, hash)| {
            let web = dir.join("web.yml");
            std::fs::write(&web, format!("basic_auth_users:\n  {user}: '{hash}'\n"))
                .expect("write web config");
            cmd.arg(format!("--web.config.file={}", web.display()));
            use base64::Engine;
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            format!("Authorization: Basic {token}")
        });
        let child = cmd
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start `prometheus` ({e}): install Debian's prometheus package")
            });
        let mut server = Self {
            child,
            addr,
            log,
            authorization,
        };
        let deadline = Instant::now() + WAIT;
        while std::net::TcpStream::connect(addr).is_err() || server.get("/-/ready").0 != 200 {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("prometheus exited with {status}: {}", server.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready within {WAIT:?}: {}",
                server.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A GET with the credentials the server asks for.
    pub fn get(&self, path: &str) -> (u16, String) {
        let headers: Vec<&str> = self.authorization.iter().map(String::as_str).collect();
        http_raw(self.addr, "GET", path, &headers, "")
    }

    /// Evaluates an instant query; returns the HTTP status and the answer's JSON.
    pub fn query(&self, query: &str) -> (u16, serde_json::Value) {
        let encoded: String = query
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        let (status, body) = self.get(&format!("/api/v1/query?query={encoded}"));
        (
            status,
            serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
        )
    }

    /// Waits (bounded) until `query` returns at least one series, i.e. a scrape landed;
    /// returns the series.
    pub fn wait_for_series(&self, query: &str) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + WAIT;
        loop {
            let (status, v) = self.query(query);
            if let Some(series) = v["data"]["result"].as_array().filter(|r| !r.is_empty()) {
                return series.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no series for {query} within {WAIT:?}: {status} {v}\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real node_exporter (Debian's `prometheus-node-exporter`; `.ci/run` installs it) on
/// loopback, exporting this machine's CPU counters only.
pub struct NodeExporter {
    child: Child,
    pub addr: SocketAddr,
}

impl NodeExporter {
    pub fn start() -> Self {
        let addr = free_loopback_addr();
        let mut child = Command::new("prometheus-node-exporter")
            .arg(format!("--web.listen-address={addr}"))
            .args(["--collector.disable-defaults", "--collector.cpu"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start prometheus-node-exporter ({e}): install Debian's prometheus-node-exporter package")
            });
        let deadline = Instant::now() + WAIT;
        while std::net::TcpStream::connect(addr).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("prometheus-node-exporter exited with {status}");
            }
            assert!(Instant::now() < deadline, "node_exporter not listening");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, addr }
    }
}

impl Drop for NodeExporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
