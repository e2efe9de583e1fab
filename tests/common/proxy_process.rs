//! The `proxy` binary under test: started on loopback port 0, its metrics, and runs that
//! are expected to stop at start-up.

#[allow(unused_imports)]
use super::*;
use loadgen::launch::Launched;

/// A running `proxy run` process.
pub struct ProxyProcess {
    process: Launched,
    /// First listener's address (by name).
    pub addr: SocketAddr,
    /// Every listener's address by name.
    listeners: std::collections::BTreeMap<String, SocketAddr>,
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
        let mut args = listener_args(upstream, provider, &cert, &key);
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        Self::start_raw(&args)
    }

    /// The tests' default proxy: aws-lc-rs with the ECDSA P-256 certificate, in front of
    /// `upstream`, with `extra` flags.
    pub fn in_front_of(upstream: &str, extra: &[&str]) -> Self {
        Self::start(
            upstream,
            ProviderName::AwsLcRs,
            CertAlgorithmName::EcdsaP256,
            extra,
        )
    }

    /// Starts `proxy run ARGS --admin 127.0.0.1:0 --ready-file ...` through the proxy's
    /// launcher and waits for it.
    pub fn start_raw(args: &[String]) -> Self {
        Self::start_binary(&binary("proxy"), args)
    }

    /// [`Self::start_raw`] with the proxy binary at `bin` (a copy an upgrade test replaces).
    pub fn start_binary(bin: &Path, args: &[String]) -> Self {
        Self::start_binary_with_env(bin, args, &[])
    }

    /// [`Self::start_raw`] with these environment variables set for the proxy alone.
    pub fn start_with_env(args: &[String], env: &[(&str, String)]) -> Self {
        Self::start_binary_with_env(&binary("proxy"), args, env)
    }

    fn start_binary_with_env(bin: &Path, args: &[String], env: &[(&str, String)]) -> Self {
        let dir = temp_dir("proxy");
        let log = dir.join("proxy.log");
        let mut cmd = Command::new(bin);
        cmd.arg("run").args(args).env("RUST_LOG", "info");
        cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        if !args.iter().any(|a| a == "--admin") {
            cmd.args(["--admin", "127.0.0.1:0"]);
        }
        let process = Launched::start(cmd, "proxy", &dir, WAIT).unwrap_or_else(|e| {
            panic!("{e}\n{}", std::fs::read_to_string(&log).unwrap_or_default())
        });
        let ready = process.proxy_ready().expect("the proxy's ready file");
        Self {
            addr: ready.first_listener().expect("a listener address"),
            admin: ready.admin.expect("an admin address"),
            listeners: ready.listeners,
            log,
            dir,
            process,
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
        eventually(&format!("{name}{labels:?} = {want}"), WAIT, || {
            let m = self.metrics();
            ready(metric_value(&m, name, labels) == Some(want), || m)
        });
    }

    /// The sum of every series of `name` whose labels contain `labels`, scraped now.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        metric_sum(&self.metrics(), name, labels)
    }

    /// Its ready file (an upgraded process rewrites it with its own pid).
    pub fn ready_file(&self) -> &Path {
        &self.process.ready_path
    }

    /// The pid serving now, as the ready file names it: another one after an upgrade.
    pub fn serving_pid(&self) -> u32 {
        let text = std::fs::read_to_string(self.ready_file()).expect("the ready file");
        let ready: proxy::ready::Ready = serde_json::from_str(&text).expect("a ready file");
        ready.pid
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
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.process.pid() as i32),
            signal,
        )
        .unwrap_or_else(|e| panic!("send {signal}: {e}"));
    }

    /// Waits (bounded) for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        wait_bounded(&mut self.process.child, limit, "proxy")
    }

    /// Everything the proxy logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        // A process an upgrade started is no child of the test: it goes by its pid.
        if let Ok(text) = std::fs::read_to_string(self.ready_file()) {
            if let Ok(ready) = serde_json::from_str::<proxy::ready::Ready>(&text) {
                if ready.pid != self.process.pid() {
                    let pid = nix::unistd::Pid::from_raw(ready.pid as i32);
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                }
            }
        }
        // The launcher kills a proxy that still runs when it is dropped; this one is dropped
        // first so that its directory goes after it.
        let _ = self.process.child.kill();
        let _ = self.process.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The flags of a listener on 127.0.0.1:0 in front of `upstream` with `provider` and this
/// certificate and key: what every test's proxy starts from.
pub fn listener_args(
    upstream: &str,
    provider: ProviderName,
    cert: &Path,
    key: &Path,
) -> Vec<String> {
    [
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        upstream,
        "--provider",
        provider.as_str(),
        "--cert",
        &cert.display().to_string(),
        "--key",
        &key.display().to_string(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
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

/// `proxy run` on the test certificate of `alg` with `flags`, expected to stop at
/// start-up: its exit status and output.
pub fn run_proxy_with_cert_to_exit(alg: CertAlgorithmName, flags: &[&str]) -> (ExitStatus, String) {
    let (cert, key) = server_cert(alg);
    let args = startup_run_args(
        &cert.display().to_string(),
        &key.display().to_string(),
        flags,
    );
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    run_proxy_to_exit(&argv)
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
