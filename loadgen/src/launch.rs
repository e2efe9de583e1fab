//! Starting a process that announces itself through a ready file (the proxy, and
//! embedded-qdrant, whose ready file has its own fields), with its stderr in a log file,
//! waited for within a limit, and stopped with SIGTERM then a bounded wait: the one
//! launcher of `loadgen compare`, `loadgen bench`, the example and the end-to-end tests.
//!
//! Pinning a child to CPUs before exec needs `pre_exec` (unsafe); the caller sets it on the
//! `Command` it hands to [`Launched::start`], so this module stays safe code.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use proxy::ready::Ready;
use serde::Deserialize;

/// How often a start or a stop is checked on.
const POLL: Duration = Duration::from_millis(20);

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
