//! The processes loadgen starts and stops around its measurements: a comparison's upstream
//! (embedded-qdrant) once and a fresh proxy per cell, and the bench's terminators and
//! database. `compare` and `bench` both stand on it. Each is started with a ready file (port 0 friendly), stopped with
//! SIGTERM and a bounded wait, and killed if it will not go.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub use crate::launch::Launched;
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

/// A CPU list such as `0`, `0-3` or `0,2,4-5`, as `--proxy-cpus`, `--loadgen-cpus` and
/// `--upstream-cpus` take it: parsed when the command line is, so a bad list is refused
/// before anything starts. Recorded as the command line wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuList {
    /// The CPUs, in the order written.
    pub cpus: Vec<usize>,
    written: String,
}

impl std::str::FromStr for CpuList {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(Self {
            cpus: parse_cpu_list(s)?,
            written: s.to_owned(),
        })
    }
}

impl serde::Serialize for CpuList {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.written)
    }
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

/// Starts `cmd` (which must take `--ready-file`) through the launcher, pinned to
/// `cpus` when given, and waits for its ready file. Blocking.
pub fn start(
    mut cmd: Command,
    what: &str,
    work_dir: &Path,
    cpus: Option<&[usize]>,
) -> Result<Launched> {
    if let Some(cpus) = cpus {
        let mut set = nix::sched::CpuSet::new();
        for c in cpus {
            set.set(*c).map_err(|e| anyhow!("CPU {c}: {e}"))?;
        }
        // Affinity must be set before exec, or threads the child starts early keep the old
        // mask. sched_setaffinity is async-signal-safe, which is all pre_exec allows.
        use std::os::unix::process::CommandExt;
        #[allow(unsafe_code)]
        // SAFETY: the closure only calls sched_setaffinity on the child's own thread, an
        // async-signal-safe system call, and touches no locks or allocations shared with the
        // parent (the CpuSet is built before the call).
        unsafe {
            cmd.pre_exec(move || {
                nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
                    .map_err(std::io::Error::from)
            });
        }
    }
    Ok(Launched::start(cmd, what, work_dir, START_LIMIT)?)
}

/// `binary run --config WORK_DIR/WHAT.toml EXTRA...`, the configuration written with only
/// what differs from the defaults (so an older build reads it too). Start it with [`start`].
pub fn proxy_command(
    config: &proxy::config::Config,
    binary: &Path,
    work_dir: &Path,
    what: &str,
    extra_args: &[String],
) -> std::io::Result<Command> {
    std::fs::create_dir_all(work_dir)?;
    let path = work_dir.join(format!("{what}.toml"));
    std::fs::write(&path, config.to_sparse_toml())?;
    let mut cmd = Command::new(binary);
    cmd.arg("run").arg("--config").arg(&path).args(extra_args);
    Ok(cmd)
}

/// SIGTERM, then a bounded wait, then SIGKILL; a non-zero exit is logged, not an error.
pub fn stop(mut process: Launched) -> Result<()> {
    let status = process.stop(STOP_LIMIT)?;
    if !status.success() {
        tracing::warn!("{} exited with {status}", process.what);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_when_the_command_line_does_and_record_as_written() {
        let list: CpuList = "0,2-3".parse().unwrap();
        assert_eq!(list.cpus, [0, 2, 3]);
        assert_eq!(serde_json::to_string(&list).unwrap(), r#""0,2-3""#);
        for bad in ["", "3-1", "x", "0,,y"] {
            assert!(bad.parse::<CpuList>().is_err(), "{bad:?} accepted");
        }
    }
}
