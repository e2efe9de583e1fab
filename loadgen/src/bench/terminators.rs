//! The terminators under test, each started from its own private configuration on loopback
//! ports with the same certificates and the same sink: our proxy (one process per provider,
//! one listener per certificate algorithm), nginx and HAProxy (Debian's packages, one
//! frontend per algorithm), each in one of two set-ups ([`Setup`]): one worker, or its own
//! default worker count. Each one's CPU and memory are read from /proc over its whole
//! process tree (nginx's master and workers alike). Also the database of the in-process TLS
//! rows ([`Database`]): embedded-qdrant, in plaintext behind them or terminating TLS itself.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use proxy::config::{Config, ListenerConfig};
use proxy::crypto::{CertAlgorithmName, KxGroupName, ProviderName};
use proxy::tls::TlsVersion;

use crate::launch::{log_tail, terminate};
use crate::probe::cpu;
use crate::procs::{self, Launched};

/// TLS 1.3 suites in the order every terminator prefers, ours included (servers choose):
/// the comparison is of terminators, not of ciphers.
const SUITES: &str = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";
/// How long a peer may take to open its ports.
const PEER_START_LIMIT: Duration = Duration::from_secs(20);
/// Open connections each terminator must accept: the 10,000 idle ones and headroom.
pub const MAX_CONNECTIONS: usize = 15_000;

/// How many workers a terminator runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Setup {
    /// One worker each: the proxy's `worker_threads` as `--proxy-worker-threads` says (1 by
    /// default), nginx `worker_processes 1`, HAProxy `nbthread 1`. Every column is then one
    /// worker's cost per unit of work.
    OneWorker,
    /// Each at its own default, as users run them: the proxy a worker per CPU, nginx
    /// `worker_processes auto`, HAProxy its default threads (one per CPU it may run on).
    Defaults,
}

impl Setup {
    /// What a column label carries after the terminator's name.
    pub fn suffix(self) -> &'static str {
        match self {
            Self::OneWorker => "",
            Self::Defaults => " (defaults)",
        }
    }
}

/// One started terminator.
pub struct Terminator {
    /// Column name: `proxy ring`, `nginx`, ...
    pub label: String,
    /// Our provider, for the in-memory handshake baseline; None for peers.
    pub provider: Option<ProviderName>,
    /// Listening address per certificate algorithm.
    pub addrs: BTreeMap<CertAlgorithmName, SocketAddr>,
    /// The most connections it was configured to hold open.
    pub max_connections: usize,
    process: Process,
}

enum Process {
    Ours(Launched),
    Peer(PeerChild),
}

/// A peer's process; killed if still running when dropped (an error path).
struct PeerChild {
    child: Child,
    log: PathBuf,
}

impl PeerChild {
    /// SIGTERM (a fast shutdown for nginx and HAProxy alike), a bounded wait, SIGKILL.
    fn stop(&mut self) {
        let _ = terminate(&mut self.child, Duration::from_secs(10));
    }
}

impl Drop for PeerChild {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Terminator {
    /// The root process id: the proxy, nginx's master, HAProxy.
    pub fn pid(&self) -> u32 {
        match &self.process {
            Process::Ours(m) => m.pid(),
            Process::Peer(p) => p.child.id(),
        }
    }

    /// A CPU window on the whole process tree (user and system), opened now.
    pub fn cpu_window(&self) -> Result<cpu::CpuWindow> {
        cpu::CpuWindow::open(Path::new("/proc"), self.pid()).with_context(|| self.label.clone())
    }

    /// Resident memory of the whole process tree, in KiB.
    pub fn rss_kib(&self) -> Result<u64> {
        let proc_root = Path::new("/proc");
        cpu::process_tree(proc_root, self.pid())
            .into_iter()
            .map(|pid| cpu::resident_kib(proc_root, pid))
            .sum::<Result<u64>>()
            .with_context(|| self.label.clone())
    }

    /// Still running?
    pub fn alive(&mut self) -> bool {
        match &mut self.process {
            Process::Ours(m) => matches!(m.child.try_wait(), Ok(None)),
            Process::Peer(p) => matches!(p.child.try_wait(), Ok(None)),
        }
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        match &self.process {
            Process::Ours(m) => log_tail(&m.log),
            Process::Peer(p) => log_tail(&p.log),
        }
    }

    /// Stops it (SIGTERM, bounded wait, SIGKILL).
    pub fn stop(self) {
        match self.process {
            Process::Ours(m) => {
                let _ = procs::stop(m);
            }
            Process::Peer(mut p) => p.stop(),
        }
    }
}

/// Certificates per algorithm, as `gen-certs` writes them.
pub struct Certs {
    /// The folder: `ALG.crt` and `ALG.key` per algorithm.
    pub dir: PathBuf,
    /// The CA that signed them, for the clients.
    pub ca: PathBuf,
    /// The algorithms there is a certificate of.
    pub algorithms: Vec<CertAlgorithmName>,
}

impl Certs {
    /// `ALG.crt`: the certificate of `alg`.
    pub fn cert(&self, alg: CertAlgorithmName) -> PathBuf {
        self.dir.join(format!("{}.crt", alg.as_str()))
    }
    /// `ALG.key`: its key.
    pub fn key(&self, alg: CertAlgorithmName) -> PathBuf {
        self.dir.join(format!("{}.key", alg.as_str()))
    }
}

/// Our proxy with `provider`: one listener per algorithm, HTTP mode, resumption off,
/// X25519, forwarding to `sink` (gRPC over h2c, the rest over HTTP/1.1); `worker_threads`
/// 0 is the proxy's default (one per CPU). `label` names the column, its files under
/// `work` and its log. A non-empty `launcher` runs the proxy under it (`valgrind
/// --tool=callgrind ...`): the proxy's command line follows it.
#[allow(clippy::too_many_arguments)]
pub fn start_proxy(
    binary: &Path,
    provider: ProviderName,
    label: &str,
    certs: &Certs,
    sinks: &[SocketAddr],
    work: &Path,
    worker_threads: usize,
    extra_args: &[String],
    launcher: &[String],
) -> Result<Terminator> {
    let loopback_port_0: SocketAddr = ([127, 0, 0, 1], 0).into();
    let mut config = Config::empty();
    config.provider = provider;
    config.log_level = "warn".to_owned();
    config.worker_threads = worker_threads;
    config.limits.max_connections = MAX_CONNECTIONS;
    config.limits.idle_timeout = Duration::from_secs(600);
    config.admin.listen = loopback_port_0.to_string();
    for alg in &certs.algorithms {
        // gRPC over h2c, the rest over HTTP/1.1: the proxy's own default (auto).
        let mut listener = ListenerConfig::new(
            loopback_port_0.to_string(),
            certs.cert(*alg),
            certs.key(*alg),
            sinks.iter().map(|s| format!("http://{s}")).collect(),
        );
        listener.name = Some(alg.as_str().to_owned());
        listener.tls.min_version = TlsVersion::Tls13;
        listener.tls.kx_groups = Some(vec![KxGroupName::X25519]);
        listener.tls.resumption = false;
        config.listeners.push(listener);
    }
    let what = file_stem(label);
    let cmd = procs::proxy_command(&config, binary, work, &what, extra_args)
        .with_context(|| format!("writing {what}'s configuration under {}", work.display()))?;
    let cmd = match launcher.split_first() {
        Some((program, args)) => {
            let mut wrapped = Command::new(program);
            wrapped
                .args(args)
                .arg(cmd.get_program())
                .args(cmd.get_args());
            wrapped
        }
        None => cmd,
    };
    let managed = procs::start(cmd, &what, work, None)?;
    let ready = managed.proxy_ready()?;
    let mut addrs = BTreeMap::new();
    for alg in &certs.algorithms {
        let addr = ready
            .listener(alg.as_str())
            .ok_or_else(|| anyhow!("{what}: no listener {} in its ready file", alg.as_str()))?;
        addrs.insert(*alg, addr);
    }
    Ok(Terminator {
        label: label.to_owned(),
        provider: Some(provider),
        addrs,
        max_connections: MAX_CONNECTIONS,
        process: Process::Ours(managed),
    })
}

/// A peer terminator from Debian's packages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// nginx.
    Nginx,
    /// HAProxy.
    Haproxy,
}

impl Peer {
    /// Its name, as columns and `--peers` write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Nginx => "nginx",
            Self::Haproxy => "haproxy",
        }
    }

    fn binary(self) -> Option<PathBuf> {
        installed(self.as_str())
    }

    /// The Debian package that brings it.
    fn package(self) -> &'static str {
        match self {
            Self::Nginx => "nginx",
            Self::Haproxy => "haproxy",
        }
    }
}

/// The peer's binary, installed with apt-get when missing and running as root; an error
/// that says what to install otherwise.
pub fn ensure_installed(peer: Peer) -> Result<PathBuf> {
    if let Some(path) = peer.binary() {
        return Ok(path);
    }
    install_package(peer.as_str(), peer.package())?;
    // The packages start their system services on the default ports; ours use private
    // configurations, so the services are only in the way.
    let _ = Command::new("systemctl")
        .args(["stop", peer.as_str()])
        .stderr(Stdio::null())
        .status();
    peer.binary()
        .ok_or_else(|| anyhow!("{} still not found after apt-get", peer.as_str()))
}

/// A load tool's binary (`ab`, `h2load`) from its Debian package, installed with apt-get
/// when missing and running as root, as the peers are; an error that says what to install
/// otherwise.
pub fn ensure_tool(binary: &str, package: &str) -> Result<PathBuf> {
    if let Some(path) = installed(binary) {
        return Ok(path);
    }
    install_package(binary, package)?;
    installed(binary)
        .ok_or_else(|| anyhow!("{binary} still not found after apt-get install {package}"))
}

/// Where Debian's packages put the program `name`, if one of them has.
fn installed(name: &str) -> Option<PathBuf> {
    [format!("/usr/sbin/{name}"), format!("/usr/bin/{name}")]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// `apt-get install package` (for `what`), as root only.
fn install_package(what: &str, package: &str) -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        bail!("{what} is not installed: apt-get install {package}");
    }
    eprintln!("installing {package} with apt-get");
    let run = |args: &[&str]| -> Result<()> {
        let status = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status()
            .context("running apt-get")?;
        if !status.success() {
            bail!("apt-get {} failed ({status})", args.join(" "));
        }
        Ok(())
    };
    run(&["update", "-qq"])?;
    run(&["install", "-y", "-qq", "--no-install-recommends", package])
}

/// This process's hard open-file limit: what a peer may raise its own limit to (it cannot
/// go beyond it without CAP_SYS_RESOURCE, and HAProxy refuses to start if told to try).
fn nofile_hard_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(4096, |(_, hard)| hard)
}

/// A column label as a file name: `proxy ring (defaults)` -> `proxy-ring-defaults`.
fn file_stem(label: &str) -> String {
    label
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '-')
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts a peer in `setup` (one worker: nginx `worker_processes 1`, HAProxy `nbthread 1`;
/// or its defaults), the same TLS policy as our listeners (TLS 1.3, X25519, no session
/// cache, no tickets), one frontend per algorithm, REST to the sink over HTTP/1.1
/// keep-alive and gRPC over h2c. `label` names the column and its folder under `work`.
pub fn start_peer(
    peer: Peer,
    setup: Setup,
    label: &str,
    binary: &Path,
    certs: &Certs,
    sinks: &[SocketAddr],
    work: &Path,
) -> Result<Terminator> {
    let dir = work.join(file_stem(label));
    std::fs::create_dir_all(&dir)?;
    let mut addrs = BTreeMap::new();
    for alg in &certs.algorithms {
        addrs.insert(*alg, SocketAddr::from(([127, 0, 0, 1], free_port()?)));
    }
    let log = dir.join("stderr.log");
    let mut cmd = Command::new(binary);
    match peer {
        Peer::Nginx => {
            let conf = dir.join("nginx.conf");
            std::fs::write(&conf, nginx_config(setup, certs, sinks, &addrs, &dir))?;
            cmd.arg("-p")
                .arg(&dir)
                .arg("-c")
                .arg(&conf)
                .arg("-g")
                .arg("daemon off;");
        }
        Peer::Haproxy => {
            for alg in &certs.algorithms {
                let mut pem = std::fs::read(certs.cert(*alg))?;
                pem.extend(std::fs::read(certs.key(*alg))?);
                std::fs::write(dir.join(format!("{}.pem", alg.as_str())), pem)?;
            }
            let conf = dir.join("haproxy.cfg");
            std::fs::write(&conf, haproxy_config(setup, sinks, &addrs, &dir))?;
            cmd.arg("-db").arg("-f").arg(&conf);
        }
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let deadline = Instant::now() + PEER_START_LIMIT;
    for addr in addrs.values() {
        loop {
            if std::net::TcpStream::connect(addr).is_ok() {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                bail!(
                    "{} exited during start-up ({status}): {}",
                    peer.as_str(),
                    log_tail(&log)
                );
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("{} did not open {addr}: {}", peer.as_str(), log_tail(&log));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(Terminator {
        label: label.to_owned(),
        provider: None,
        addrs,
        max_connections: match peer {
            Peer::Nginx => MAX_CONNECTIONS,
            Peer::Haproxy => haproxy_max_connections(),
        },
        process: Process::Peer(PeerChild { child, log }),
    })
}

fn nginx_config(
    setup: Setup,
    certs: &Certs,
    sinks: &[SocketAddr],
    addrs: &BTreeMap<CertAlgorithmName, SocketAddr>,
    dir: &Path,
) -> String {
    let d = dir.display();
    let mut servers = String::new();
    for (alg, addr) in addrs {
        servers.push_str(&format!(
            "  server {{\n    listen {addr} ssl http2;\n    ssl_certificate {};\n    ssl_certificate_key {};\n\
             \x20   location / {{ proxy_pass http://sink; }}\n    location /qdrant. {{ grpc_pass grpc://sink_grpc; }}\n  }}\n",
            certs.cert(*alg).display(),
            certs.key(*alg).display(),
        ));
    }
    // Several nodes: least connections, nginx's nearest to our least requests.
    let balance = if sinks.len() > 1 { "least_conn; " } else { "" };
    let servers_of = |s: &[SocketAddr]| {
        s.iter()
            .map(|a| format!("server {a}; "))
            .collect::<String>()
    };
    let sink = format!("{balance}{}", servers_of(sinks));
    let workers = match setup {
        Setup::OneWorker => "1",
        Setup::Defaults => "auto",
    };
    format!(
        "worker_processes {workers};\nworker_rlimit_nofile {nofile};\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections {conns}; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         \x20 client_max_body_size 64m;\n  proxy_request_buffering off;\n  proxy_http_version 1.1;\n\
         \x20 proxy_set_header Connection \"\";\n  keepalive_requests 1000000;\n  keepalive_timeout 600s;\n\
         \x20 ssl_protocols TLSv1.3;\n  ssl_ecdh_curve X25519;\n  ssl_prefer_server_ciphers on;\n\
         \x20 ssl_conf_command Ciphersuites {SUITES};\n  ssl_session_cache off;\n  ssl_session_tickets off;\n\
         \x20 upstream sink {{ {sink}keepalive 64; }}\n  upstream sink_grpc {{ {sink}keepalive 64; }}\n\
         {servers}}}\n",
        nofile = nofile_hard_limit(),
        conns = MAX_CONNECTIONS + 100,
    )
}

/// HAProxy reserves two descriptors per connection (client and server side) and refuses
/// to start when `maxconn` needs more than it may open, so its limit follows the hard
/// open-file limit.
fn haproxy_max_connections() -> usize {
    (MAX_CONNECTIONS + 100).min((nofile_hard_limit() as usize).saturating_sub(300) / 2)
}

fn haproxy_config(
    setup: Setup,
    sinks: &[SocketAddr],
    addrs: &BTreeMap<CertAlgorithmName, SocketAddr>,
    dir: &Path,
) -> String {
    let mut frontends = String::new();
    for (alg, addr) in addrs {
        frontends.push_str(&format!(
            "frontend fe_{name}\n  bind {addr} ssl crt {d}/{name}.pem alpn h2,http/1.1 ssl-min-ver TLSv1.3 curves X25519 no-tls-tickets\n\
             \x20 use_backend grpc if {{ req.hdr(content-type) -m beg application/grpc }}\n  default_backend rest\n",
            name = alg.as_str(),
            d = dir.display(),
        ));
    }
    let balance = if sinks.len() > 1 {
        "  balance leastconn\n"
    } else {
        ""
    };
    let servers = |proto: &str| -> String {
        sinks
            .iter()
            .enumerate()
            .map(|(i, s)| format!("  server s{} {s}{proto}\n", i + 1))
            .collect()
    };
    let (rest, grpc) = (servers(""), servers(" proto h2"));
    // Without `nbthread`, HAProxy starts a thread per CPU it may run on: its default.
    let threads = match setup {
        Setup::OneWorker => "  nbthread 1\n",
        Setup::Defaults => "",
    };
    format!(
        "global\n{threads}  ulimit-n {nofile}\n  maxconn {conns}\n  tune.ssl.cachesize 0\n\
         \x20 ssl-default-bind-ciphersuites {SUITES}\n\
         defaults\n  mode http\n  maxconn {conns}\n  timeout connect 5s\n  timeout client 600s\n  timeout server 60s\n\
         \x20 timeout http-keep-alive 600s\n  http-reuse always\n\
         {frontends}backend rest\n{balance}{rest}backend grpc\n{balance}{grpc}",
        conns = haproxy_max_connections(),
        nofile = nofile_hard_limit(),
    )
}

/// embedded-qdrant (Qdrant's own engine) as a database behind the terminators, or
/// terminating TLS itself as Qdrant does with `service.enable_tls` (rustls with ring, in
/// process): the upstream of the in-process TLS rows. Its data folder is its own, removed
/// when it stops.
pub struct Database {
    launched: Launched,
    /// Its REST port (HTTP/1.1 and h2).
    pub rest: SocketAddr,
    /// Its gRPC port (h2).
    pub grpc: SocketAddr,
    data: PathBuf,
}

impl Database {
    /// Starts `binary` on loopback ports with a fresh data folder under `work`, in
    /// plaintext or, given a certificate and key, serving both ports over TLS. `name` names
    /// its log and folder.
    pub fn start(
        binary: &Path,
        work: &Path,
        name: &str,
        tls: Option<(&Path, &Path)>,
    ) -> Result<Self> {
        let data = work.join(format!("{name}-data"));
        let _ = std::fs::remove_dir_all(&data);
        let mut cmd = Command::new(binary);
        cmd.args([
            "--rest",
            "127.0.0.1:0",
            "--grpc",
            "127.0.0.1:0",
            "--log-level",
            "warn",
            "--data",
        ])
        .arg(&data);
        if let Some((cert, key)) = tls {
            cmd.arg("--tls-cert").arg(cert).arg("--tls-key").arg(key);
        }
        let launched = procs::start(cmd, name, work, None)
            .with_context(|| format!("starting {} (--upstream-bin)", binary.display()))?;
        let port = |key: &str| -> Result<SocketAddr> {
            launched.ready[key]
                .as_str()
                .and_then(|a| a.parse().ok())
                .ok_or_else(|| anyhow!("{name}: no {key} address in its ready file"))
        };
        Ok(Self {
            rest: port("rest")?,
            grpc: port("grpc")?,
            launched,
            data,
        })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.launched.pid()
    }

    /// A CPU window on it, opened now.
    pub fn cpu_window(&self) -> Result<cpu::CpuWindow> {
        cpu::CpuWindow::open(Path::new("/proc"), self.pid())
            .with_context(|| self.launched.what.clone())
    }

    /// Still running?
    pub fn alive(&mut self) -> bool {
        matches!(self.launched.child.try_wait(), Ok(None))
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        log_tail(&self.launched.log)
    }

    /// Stops it and removes its data.
    pub fn stop(self) {
        let _ = procs::stop(self.launched);
        let _ = std::fs::remove_dir_all(&self.data);
    }
}
