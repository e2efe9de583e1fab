//! Starting a `proxy run` process from typed settings and finding what it bound: the one
//! launcher of `loadgen compare`, `loadgen bench`, the examples and the end-to-end tests.
//!
//! It owns three things every caller needs, written once:
//! - [`ProxySettings`]: what a benchmark or a comparison starts a proxy with, written as the
//!   proxy's own TOML (only what is set, so that an older build reads it too: a bench of the
//!   binary before a change, for before/after figures);
//! - [`Ready`]: the ready file `proxy run --ready-file` writes once every listener is bound
//!   (port 0 friendly), written and read here;
//! - [`Launched`]: a process that announces itself through a ready file (the proxy, and
//!   embedded-qdrant, whose ready file has its own fields), started with its stderr in a log
//!   file, waited for within a limit, and stopped with SIGTERM then a bounded wait.
//!
//! Pinning a child to CPUs before exec needs `pre_exec` (unsafe); the caller sets it on the
//! `Command` it hands to [`Launched::start`], so this module stays safe code.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::UpstreamProtocol;
use crate::crypto::{KxGroupName, ProviderName};
use crate::tls::TlsVersion;

/// How often a start or a stop is checked on.
const POLL: Duration = Duration::from_millis(20);

/// What `proxy run --ready-file` writes once it serves: every listener's bound address by
/// name, and the admin port's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    /// The proxy's process id.
    pub pid: u32,
    /// The admin port, when one is configured.
    pub admin: Option<SocketAddr>,
    /// Every listener's bound address, by name (in name order).
    pub listeners: BTreeMap<String, SocketAddr>,
    /// The last in-place upgrade this process tried that failed, and why: it keeps serving.
    /// (A successful one shows as another pid: the new process rewrites the file.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_failed: Option<String>,
}

impl Ready {
    /// Writes the file atomically (a temporary file renamed), so a reader never sees half.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec(self)?)?;
        std::fs::rename(&tmp, path)
    }

    /// The listener named `name`.
    pub fn listener(&self, name: &str) -> Option<SocketAddr> {
        self.listeners.get(name).copied()
    }

    /// The first listener by name: the only one of a single-listener proxy.
    pub fn first_listener(&self) -> Option<SocketAddr> {
        self.listeners.values().next().copied()
    }
}

/// Why a process did not start or stop as it should; each names the process and, where it
/// said why, the end of its log.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The binary could not be run.
    #[error("starting {what} ({program}): {source}; build it with `cargo build --release --workspace` or pass its path")]
    Spawn {
        /// Which process.
        what: String,
        /// The program as given.
        program: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// It exited before it wrote its ready file.
    #[error("{what} exited during start-up ({status}): {log_tail}")]
    Exited {
        /// Which process.
        what: String,
        /// How it ended.
        status: ExitStatus,
        /// The last lines of its log.
        log_tail: String,
    },
    /// It wrote no ready file within the limit (it was killed).
    #[error("{what} did not become ready within {limit:?}: {log_tail}")]
    NotReady {
        /// Which process.
        what: String,
        /// The limit.
        limit: Duration,
        /// The last lines of its log.
        log_tail: String,
    },
    /// Its ready file is not what it should be.
    #[error("{what}: its ready file {}: {reason}", path.display())]
    BadReady {
        /// Which process.
        what: String,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// It did not exit within the limit after SIGTERM (it was killed).
    #[error("{what} did not stop within {limit:?} of SIGTERM; killed")]
    NotStopped {
        /// Which process.
        what: String,
        /// The limit.
        limit: Duration,
    },
    /// The log or work directory could not be written, or the child not waited for.
    #[error("{what}: {source}")]
    Io {
        /// Which process.
        what: String,
        /// What the system said.
        source: std::io::Error,
    },
}

/// A started process that wrote its ready file; killed when dropped while it still runs.
pub struct Launched {
    /// The child.
    pub child: Child,
    /// Where its stderr goes.
    pub log: PathBuf,
    /// Its ready file, as written.
    pub ready_path: PathBuf,
    /// Its ready file's content.
    pub ready: serde_json::Value,
    /// Which process, for messages.
    pub what: String,
}

impl Launched {
    /// Runs `cmd` with `--ready-file WORK_DIR/WHAT.ready.json`, stdin and stdout closed and
    /// stderr in `WORK_DIR/WHAT.log`, and waits up to `limit` for the ready file. Blocking.
    pub fn start(
        mut cmd: Command,
        what: &str,
        work_dir: &Path,
        limit: Duration,
    ) -> Result<Self, LaunchError> {
        let io = |source| LaunchError::Io {
            what: what.to_owned(),
            source,
        };
        std::fs::create_dir_all(work_dir).map_err(io)?;
        let ready_path = work_dir.join(format!("{what}.ready.json"));
        let log = work_dir.join(format!("{what}.log"));
        let _ = std::fs::remove_file(&ready_path);
        cmd.arg("--ready-file")
            .arg(&ready_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).map_err(io)?);
        let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn {
            what: what.to_owned(),
            program: format!("{:?}", cmd.get_program()),
            source,
        })?;
        let deadline = Instant::now() + limit;
        loop {
            // The writer renames a complete file into place, so a file that is there is whole.
            if let Ok(text) = std::fs::read_to_string(&ready_path) {
                let ready = serde_json::from_str(&text).map_err(|e| LaunchError::BadReady {
                    what: what.to_owned(),
                    path: ready_path.clone(),
                    reason: e.to_string(),
                })?;
                return Ok(Self {
                    child,
                    log,
                    ready_path,
                    ready,
                    what: what.to_owned(),
                });
            }
            if let Some(status) = child.try_wait().map_err(io)? {
                return Err(LaunchError::Exited {
                    what: what.to_owned(),
                    status,
                    log_tail: log_tail(&log),
                });
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(LaunchError::NotReady {
                    what: what.to_owned(),
                    limit,
                    log_tail: log_tail(&log),
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// The ready file as a proxy writes it.
    pub fn proxy_ready(&self) -> Result<Ready, LaunchError> {
        Ready::deserialize(&self.ready).map_err(|e| LaunchError::BadReady {
            what: self.what.clone(),
            path: self.ready_path.clone(),
            reason: e.to_string(),
        })
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then up to `limit` for it to exit, then SIGKILL. Returns how it exited.
    /// Blocking.
    pub fn stop(&mut self, limit: Duration) -> Result<ExitStatus, LaunchError> {
        let io = |source| LaunchError::Io {
            what: self.what.clone(),
            source,
        };
        match terminate(&mut self.child, limit).map_err(io)? {
            Some(status) => Ok(status),
            None => Err(LaunchError::NotStopped {
                what: self.what.clone(),
                limit,
            }),
        }
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// SIGTERM to `child`, then up to `limit` for it to exit; SIGKILL after that, and `None`.
/// The one stop of every process the project starts (a launched one, or a peer terminator
/// that writes no ready file). Blocking.
pub fn terminate(child: &mut Child, limit: Duration) -> std::io::Result<Option<ExitStatus>> {
    if let Some(status) = child.try_wait()? {
        return Ok(Some(status));
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(POLL);
    }
}

/// The last lines of a log, for an error message.
pub fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// What a benchmark or a comparison starts a proxy with. Unset fields are left out of the
/// file, so the proxy's defaults apply and an older build that lacks a newer key still
/// starts.
#[derive(Clone, Debug, Serialize)]
pub struct ProxySettings {
    /// The provider of every listener.
    pub provider: ProviderName,
    /// The log level (`warn` keeps a benchmark's log quiet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_level: Option<String>,
    /// Reactor threads; 0 is one per CPU (the proxy's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_threads: Option<usize>,
    /// Connection limits.
    #[serde(skip_serializing_if = "LimitSettings::is_unset")]
    pub limits: LimitSettings,
    /// The admin port: `Some("127.0.0.1:0")` for a port found through the ready file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin: Option<AdminSettings>,
    /// The listeners, in order.
    #[serde(rename = "listener")]
    pub listeners: Vec<ListenerSettings>,
}

/// The `[limits]` a launcher sets.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LimitSettings {
    /// `max_connections`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<usize>,
    /// `idle_timeout`.
    #[serde(
        skip_serializing_if = "Option::is_none",
        with = "humantime_serde::option"
    )]
    pub idle_timeout: Option<Duration>,
}

impl LimitSettings {
    fn is_unset(&self) -> bool {
        self.max_connections.is_none() && self.idle_timeout.is_none()
    }
}

/// The `[admin]` section.
#[derive(Clone, Debug, Serialize)]
pub struct AdminSettings {
    /// Where it listens (port 0: found through the ready file).
    pub listen: SocketAddr,
}

/// One `[[listener]]`.
#[derive(Clone, Debug, Serialize)]
pub struct ListenerSettings {
    /// Its name, as the ready file and the metrics carry it.
    pub name: String,
    /// Where it listens (port 0: found through the ready file).
    pub listen: SocketAddr,
    /// Certificate chain (PEM).
    pub cert: PathBuf,
    /// Private key (PEM).
    pub key: PathBuf,
    /// The upstream nodes (`http://host:port`).
    #[serde(serialize_with = "one_or_many")]
    pub upstream: Vec<String>,
    /// How requests travel upstream; the proxy's default (auto) when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_protocol: Option<UpstreamProtocol>,
    /// `[listener.tls]`.
    #[serde(skip_serializing_if = "TlsSettings::is_unset")]
    pub tls: TlsSettings,
}

/// The `[listener.tls]` a launcher sets; the proxy's production defaults where unset.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TlsSettings {
    /// Lowest version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_version: Option<TlsVersion>,
    /// Highest version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_version: Option<TlsVersion>,
    /// Key-exchange groups, in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kx_groups: Option<Vec<KxGroupName>>,
    /// Session resumption (tickets and the session cache).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumption: Option<bool>,
}

impl TlsSettings {
    fn is_unset(&self) -> bool {
        self.min_version.is_none()
            && self.max_version.is_none()
            && self.kx_groups.is_none()
            && self.resumption.is_none()
    }
}

/// One node as a plain string, which every proxy version reads; several as a list.
fn one_or_many<S: serde::Serializer>(nodes: &[String], s: S) -> Result<S::Ok, S::Error> {
    match nodes {
        [one] => s.serialize_str(one),
        many => many.serialize(s),
    }
}

impl ProxySettings {
    /// The configuration file's text.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("launch settings are plain TOML values")
    }

    /// `binary run --config WORK_DIR/WHAT.toml EXTRA...`, the file written. Start it with
    /// [`Launched::start`].
    pub fn command(
        &self,
        binary: &Path,
        work_dir: &Path,
        what: &str,
        extra_args: &[String],
    ) -> std::io::Result<Command> {
        std::fs::create_dir_all(work_dir)?;
        let path = work_dir.join(format!("{what}.toml"));
        std::fs::write(&path, self.to_toml())?;
        let mut cmd = Command::new(binary);
        cmd.arg("run").arg("--config").arg(&path).args(extra_args);
        Ok(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn listener(name: &str, upstream: Vec<String>) -> ListenerSettings {
        ListenerSettings {
            name: name.to_owned(),
            listen: "127.0.0.1:0".parse().unwrap(),
            cert: "/certs/a.crt".into(),
            key: "/certs/a.key".into(),
            upstream,
            upstream_protocol: None,
            tls: TlsSettings::default(),
        }
    }

    #[test]
    fn settings_are_written_as_the_proxy_reads_them_and_unset_ones_are_left_out() {
        let settings = ProxySettings {
            provider: ProviderName::AwsLcRs,
            log_level: Some("warn".into()),
            worker_threads: Some(1),
            limits: LimitSettings {
                max_connections: Some(20_000),
                idle_timeout: Some(Duration::from_secs(600)),
            },
            admin: Some(AdminSettings {
                listen: "127.0.0.1:0".parse().unwrap(),
            }),
            listeners: vec![
                ListenerSettings {
                    upstream_protocol: Some(UpstreamProtocol::H2c),
                    tls: TlsSettings {
                        min_version: Some(TlsVersion::Tls13),
                        max_version: None,
                        kx_groups: Some(vec![KxGroupName::X25519]),
                        resumption: Some(false),
                    },
                    ..listener("ecdsa-p256", vec!["http://127.0.0.1:6334".into()])
                },
                listener(
                    "rsa2048",
                    vec!["http://127.0.0.1:1".into(), "http://127.0.0.1:2".into()],
                ),
            ],
        };
        let text = settings.to_toml();
        // One node is a plain string (every proxy version reads it); unset keys are absent.
        assert!(
            text.contains("upstream = \"http://127.0.0.1:6334\""),
            "{text}"
        );
        assert!(!text.contains("max_version"), "{text}");
        let config: Config = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(config.provider, ProviderName::AwsLcRs);
        assert_eq!(config.worker_threads, 1);
        assert_eq!(config.limits.max_connections, 20_000);
        assert_eq!(config.limits.idle_timeout, Duration::from_secs(600));
        assert_eq!(config.listeners.len(), 2);
        let first = &config.listeners[0];
        assert_eq!(first.name.as_deref(), Some("ecdsa-p256"));
        assert_eq!(first.upstream_protocol, UpstreamProtocol::H2c);
        assert_eq!(first.tls.min_version, TlsVersion::Tls13);
        assert_eq!(first.tls.kx_groups, Some(vec![KxGroupName::X25519]));
        assert!(!first.tls.resumption);
        assert_eq!(config.listeners[1].upstream.len(), 2);
        assert_eq!(
            config.listeners[1].upstream_protocol,
            UpstreamProtocol::Auto
        );
    }

    #[test]
    fn a_ready_file_is_read_back_as_written() {
        let dir = std::env::temp_dir().join(format!("launch-ready-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ready.json");
        let ready = Ready {
            pid: 7,
            admin: Some("127.0.0.1:9901".parse().unwrap()),
            listeners: [("grpc".to_owned(), "127.0.0.1:6334".parse().unwrap())].into(),
            upgrade_failed: None,
        };
        ready.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let back: Ready = serde_json::from_str(&text).unwrap();
        assert_eq!(back, ready);
        assert_eq!(back.first_listener(), back.listener("grpc"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
