//! The processes a local comparison starts: the upstream (embedded-qdrant) once, and a
//! fresh proxy per cell. Each is started with a ready file (port 0 friendly), stopped with
//! SIGTERM and a bounded wait, and killed if it will not go.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

/// How long a process may take to become ready or to exit.
const START_LIMIT: Duration = Duration::from_secs(60);
const STOP_LIMIT: Duration = Duration::from_secs(15);

/// A binary next to this one (cargo puts workspace binaries side by side), else on PATH.
pub fn sibling_binary(name: &str) -> PathBuf {
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_owned))
    {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    PathBuf::from(name)
}

/// Parses a CPU list such as `0`, `0-3` or `0,2,4-5`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse()?, b.parse()?);
                if a > b {
                    bail!("CPU range {part:?} runs backwards");
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().with_context(|| format!("CPU {part:?}"))?),
        }
    }
    if cpus.is_empty() {
        bail!("empty CPU list {s:?}");
    }
    Ok(cpus)
}

/// Restricts the calling thread (and every thread it creates later) to `cpus`.
pub fn pin_current_thread(cpus: &[usize]) -> Result<()> {
    let mut set = nix::sched::CpuSet::new();
    for &c in cpus {
        set.set(c).map_err(|e| anyhow!("CPU {c}: {e}"))?;
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .map_err(|e| anyhow!("sched_setaffinity({cpus:?}): {e}"))
}

/// A started child with its log file.
pub struct Managed {
    pub child: Child,
    pub log: PathBuf,
    pub ready: serde_json::Value,
    pub what: String,
}

impl Managed {
    /// Spawns `cmd` (which must take `--ready-file`), pinned to `cpus` when given, and waits
    /// for its ready file.
    pub fn start(
        mut cmd: Command,
        what: &str,
        work_dir: &Path,
        cpus: Option<&[usize]>,
    ) -> Result<Self> {
        std::fs::create_dir_all(work_dir)?;
        let ready = work_dir.join(format!("{what}.ready.json"));
        let log = work_dir.join(format!("{what}.log"));
        let _ = std::fs::remove_file(&ready);
        cmd.arg("--ready-file")
            .arg(&ready)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(&log)
                    .with_context(|| format!("creating {}", log.display()))?,
            );
        if let Some(cpus) = cpus {
            let cpus = cpus.to_vec();
            // Affinity must be set before exec, or threads the child starts early keep the old
            // mask. sched_setaffinity is async-signal-safe, which is all pre_exec allows.
            use std::os::unix::process::CommandExt;
            #[allow(unsafe_code)]
            // SAFETY: the closure only calls sched_setaffinity on the child's own thread, an
            // async-signal-safe system call, and touches no locks or allocations shared with the
            // parent (the CpuSet is built before the call).
            unsafe {
                let mut set = nix::sched::CpuSet::new();
                for c in &cpus {
                    set.set(*c).map_err(|e| anyhow!("CPU {c}: {e}"))?;
                }
                cmd.pre_exec(move || {
                    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
                        .map_err(std::io::Error::from)
                });
            }
        }
        let program = format!("{:?}", cmd.get_program());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {what} ({program}); build it with `cargo build --release --workspace` or pass its path"))?;
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if let Ok(text) = std::fs::read_to_string(&ready) {
                let ready: serde_json::Value = serde_json::from_str(&text)
                    .with_context(|| format!("{what}: ready file is not JSON"))?;
                return Ok(Self {
                    child,
                    log,
                    ready,
                    what: what.to_owned(),
                });
            }
            if let Some(status) = child.try_wait()? {
                bail!("{what} exited during start-up ({status}): {}", tail(&log));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "{what} did not become ready within {START_LIMIT:?}: {}",
                    tail(&log)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then a bounded wait, then SIGKILL.
    pub fn stop(mut self) -> Result<()> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + STOP_LIMIT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    tracing::warn!("{} exited with {status}", self.what);
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("{} did not stop within {STOP_LIMIT:?}; killed", self.what);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The last lines of a log, for an error message.
pub fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}
