//! Shared helpers for the end-to-end tests: the real `proxy` binary started on loopback,
//! real upstream servers (an HTTP/1.1 + h2c echo server and a tonic gRPC server), and a TLS
//! client built on the same provider registry as the proxy.
//!
//! Every wait here is bounded, and every process is killed when its handle drops.

#![allow(dead_code)]

mod client;
mod containers;
mod embedder;
mod loadgen_run;
mod prerequisites;
mod prometheus_server;
mod proxy_process;
mod qdrant;
mod upstreams;

pub use client::*;
pub use containers::*;
pub use embedder::*;
pub use loadgen_run::*;
pub use prerequisites::*;
pub use prometheus_server::*;
pub use proxy_process::*;
pub use qdrant::*;
pub use upstreams::*;

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
use proxy::crypto::{generate_cert_set, CertAlgorithmName, GeneratedSet, ProviderName};
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use sha2::{Digest, Sha256};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// The workspace root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_owned()
}

/// Runs one of the tests' installers (`script`, relative to the workspace) once per test
/// binary and returns the folder it installed into: `$env` when set, else
/// `~/.cache/vector-tls-proxy/<default>`. The installers are idempotent and quick when
/// everything is there (`.ci/run` runs them first); PyPI is reachable from these machines.
pub fn installed(script: &'static str, env: &str, default: &str) -> PathBuf {
    static DONE: std::sync::Mutex<Vec<(&'static str, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    // Held while installing: a second test waits for the first install instead of racing it.
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, dir)) = done.iter().find(|(s, _)| *s == script) {
        return dir.clone();
    }
    let dir = std::env::var_os(env).map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                .join(".cache/vector-tls-proxy")
                .join(default)
        },
        PathBuf::from,
    );
    let status = Command::new(repo_root().join(script))
        .env(env, &dir)
        .status()
        .unwrap_or_else(|e| panic!("{script}: {e}"));
    assert!(status.success(), "{script} failed");
    done.push((script, dir.clone()));
    dir
}

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

/// The folder cargo built this test run into (`CARGO_TARGET_DIR`, else `target/`): scripts
/// that package or copy the project's binaries are pointed at it, not at a default of their own.
pub fn target_dir() -> PathBuf {
    // target/<profile>/deps/<test>-<hash> -> target
    let exe = std::env::current_exe().expect("current exe");
    exe.ancestors()
        .nth(3)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// Lower-case hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Polls `probe` every 100 ms until it gives a value, for at most `limit`, and returns that
/// value; past the limit the test fails naming `what` was awaited and what the last probe
/// saw (its `Err`). The suite's one bounded wait for a condition in another process.
pub fn eventually<T>(
    what: &str,
    limit: Duration,
    mut probe: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        let seen = match probe() {
            Ok(value) => return value,
            Err(seen) => seen,
        };
        assert!(
            Instant::now() < deadline,
            "not within {limit:?}: {what}; last seen: {seen}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// [`eventually`] for a probe that must not block the runtime it runs on.
pub async fn eventually_async<T, F>(what: &str, limit: Duration, mut probe: impl FnMut() -> F) -> T
where
    F: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + limit;
    loop {
        let seen = match probe().await {
            Ok(value) => return value,
            Err(seen) => seen,
        };
        assert!(
            Instant::now() < deadline,
            "not within {limit:?}: {what}; last seen: {seen}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `Ok(())` when `done`, else what was seen, for [`eventually`]'s probes.
pub fn ready(done: bool, seen: impl FnOnce() -> String) -> Result<(), String> {
    if done {
        Ok(())
    } else {
        Err(seen())
    }
}

/// Raises this process's open-file limit to its hard limit, for tests that hold a thousand
/// connections.
pub fn raise_open_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// A loopback address with a port that was free a moment ago, for servers that cannot
/// report a port they chose themselves.
pub fn free_loopback_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
}
