//! CPU time: system-wide from /proc/stat, per process from /proc/PID/stat, and processes
//! found by name for `--watch-process`.

use std::path::Path;

use anyhow::{anyhow, Context, Result};

/// Jiffies per second: the unit of /proc/stat and /proc/PID/stat.
pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf takes an integer and returns one; no pointers, no preconditions.
    #[allow(unsafe_code)]
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// The aggregate `cpu` line of /proc/stat.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemTimes {
    /// Ticks spent on anything but idle and iowait.
    pub busy: u64,
    /// All ticks.
    pub total: u64,
}

/// Reads `PROC_ROOT/stat`.
pub fn read_system(proc_root: &Path) -> Result<SystemTimes> {
    let text = std::fs::read_to_string(proc_root.join("stat")).context("reading /proc/stat")?;
    parse_system(&text)
}

/// Parses the aggregate `cpu` line of /proc/stat's text.
pub fn parse_system(text: &str) -> Result<SystemTimes> {
    let line = text
        .lines()
        .find(|l| l.starts_with("cpu "))
        .ok_or_else(|| anyhow!("/proc/stat has no aggregate cpu line"))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal guest guest_nice; guest time is
    // already inside user/nice, so it is not added again.
    let sum: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Ok(SystemTimes {
        busy: sum - idle,
        total: sum,
    })
}

/// Utilisation between two readings, 0..=100 (all cores together).
pub fn utilisation(before: SystemTimes, after: SystemTimes) -> Option<f64> {
    let total = after.total.checked_sub(before.total)?;
    let busy = after.busy.checked_sub(before.busy)?;
    (total > 0).then(|| 100.0 * busy as f64 / total as f64)
}

/// User + system CPU seconds of one process.
pub fn process_cpu_seconds(proc_root: &Path, pid: u32) -> Result<f64> {
    process_cpu_split(proc_root, pid).map(|c| c.user + c.system)
}

/// CPU seconds of a process (or a sum of processes), in user space and in the kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuSplit {
    /// utime: the process's own code and its libraries.
    pub user: f64,
    /// stime: system calls, and what the kernel does on the process's behalf meanwhile (on
    /// loopback that includes delivering each write to the receiving socket).
    pub system: f64,
}

impl CpuSplit {
    /// Both together.
    pub fn total(&self) -> f64 {
        self.user + self.system
    }
}

impl std::ops::Add for CpuSplit {
    type Output = Self;
    fn add(self, o: Self) -> Self {
        Self {
            user: self.user + o.user,
            system: self.system + o.system,
        }
    }
}

impl std::ops::Sub for CpuSplit {
    type Output = Self;
    fn sub(self, o: Self) -> Self {
        Self {
            user: self.user - o.user,
            system: self.system - o.system,
        }
    }
}

impl std::iter::Sum for CpuSplit {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Self::default(), |a, b| a + b)
    }
}

/// User and system CPU seconds of one process.
pub fn process_cpu_split(proc_root: &Path, pid: u32) -> Result<CpuSplit> {
    let path = proc_root.join(pid.to_string()).join("stat");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let (utime, stime) = parse_process_stat(&text)?;
    Ok(CpuSplit {
        user: utime as f64 / clock_ticks(),
        system: stime as f64 / clock_ticks(),
    })
}

/// User and system CPU seconds of `root` and all its descendants (nginx's master and
/// its workers, say), read now.
pub fn tree_cpu_split(proc_root: &Path, root: u32) -> Result<CpuSplit> {
    process_tree(proc_root, root)
        .into_iter()
        .map(|pid| process_cpu_split(proc_root, pid))
        .sum()
}

/// A process tree's CPU over a window of work: opened just before the work, closed just
/// after it. The bench's per-row CPU figures are such windows, as a run's per-process CPU
/// is the probes' window over its measured phase.
pub struct CpuWindow {
    proc_root: std::path::PathBuf,
    root: u32,
    before: CpuSplit,
}

impl CpuWindow {
    /// Takes the before reading of `root`'s tree.
    pub fn open(proc_root: &Path, root: u32) -> Result<Self> {
        Ok(Self {
            proc_root: proc_root.to_owned(),
            root,
            before: tree_cpu_split(proc_root, root)?,
        })
    }

    /// CPU seconds the tree used since [`CpuWindow::open`].
    pub fn close(self) -> Result<CpuSplit> {
        Ok(tree_cpu_split(&self.proc_root, self.root)? - self.before)
    }
}

/// utime and stime (fields 14 and 15) of a /proc/PID/stat line. The command name may hold
/// spaces and parentheses, so fields are counted after its last ')'.
pub fn parse_process_stat(text: &str) -> Result<(u64, u64)> {
    let after = text
        .rfind(')')
        .map(|i| &text[i + 1..])
        .ok_or_else(|| anyhow!("malformed /proc/PID/stat"))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) is index 11 and stime (15) index 12.
    let utime = fields.get(11).and_then(|f| f.parse().ok());
    let stime = fields.get(12).and_then(|f| f.parse().ok());
    match (utime, stime) {
        (Some(u), Some(s)) => Ok((u, s)),
        _ => Err(anyhow!("malformed /proc/PID/stat")),
    }
}

/// Resident memory of one process (`VmRSS`), in KiB.
pub fn resident_kib(proc_root: &Path, pid: u32) -> Result<u64> {
    let path = proc_root.join(pid.to_string()).join("status");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow!("no VmRSS in {}", path.display()))
}

/// The parent pid (field 4) of a /proc/PID/stat line, counted after the command name.
fn parse_parent_pid(text: &str) -> Option<u32> {
    let after = &text[text.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// `root` and all its descendants (nginx's master and its workers, say), from the parent
/// links in /proc; processes that exit meanwhile are skipped.
pub fn process_tree(proc_root: &Path, root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir(proc_root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            Some((pid, parse_parent_pid(&stat)?))
        })
        .collect();
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    tree
}

/// `Cpus_allowed_list` of a process (e.g. `0-1`), to show in the result that pinning held.
pub fn cpus_allowed(proc_root: &Path, pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_owned())
}

/// Pids whose command name (/proc/PID/comm) or executable file name equals `name`.
pub fn find_processes(proc_root: &Path, name: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let own = std::process::id();
    let mut pids: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != own)
        .filter(|pid| {
            let dir = proc_root.join(pid.to_string());
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            let exe = std::fs::read_link(dir.join("exe"))
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_default();
            // comm is cut to 15 bytes by the kernel.
            comm.trim_end() == name
                || (name.len() > 15 && comm.trim_end() == &name[..15])
                || exe == name
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// CPU model, cores, kernel.
/// This host's name (for results merged across hosts), `unknown` if unreadable.
pub fn host_name(proc_root: &Path) -> String {
    std::fs::read_to_string(proc_root.join("sys/kernel/hostname"))
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// (CPU model, logical CPUs, kernel release) of this host, "unknown" where unreadable.
pub fn machine_facts(proc_root: &Path) -> (String, usize, String) {
    let cpuinfo = std::fs::read_to_string(proc_root.join("cpuinfo")).unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let kernel = std::fs::read_to_string(proc_root.join("sys/kernel/osrelease"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned());
    (model, cores, kernel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_in_its_own_tree_with_its_children_and_has_a_resident_size() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let tree = process_tree(Path::new("/proc"), std::process::id());
        assert_eq!(tree[0], std::process::id());
        assert!(tree.contains(&child.id()), "{tree:?}");
        let _ = child.kill();
        let _ = child.wait();
        assert!(resident_kib(Path::new("/proc"), std::process::id()).unwrap() > 0);
        // The command name may hold spaces and parentheses.
        assert_eq!(parse_parent_pid("12 (a) b) S 7 12 12"), Some(7));
    }

    #[test]
    fn parses_proc_stat_and_process_stat() {
        let a = parse_system("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3\n").unwrap();
        let b = parse_system("cpu  200 0 100 1600 100 0 0 0 0 0\n").unwrap();
        assert_eq!(a.total, 1000);
        assert_eq!(a.busy, 150);
        let u = utilisation(a, b).unwrap();
        assert!((u - 15.0).abs() < 1e-9, "{u}");
        let line = "1234 (my (odd) proc) S 1 2 3 4 5 6 7 8 9 10 250 125 0 0 20 0 4 0 100 0 0";
        assert_eq!(parse_process_stat(line).unwrap(), (250, 125));
        assert!(parse_process_stat("garbage").is_err());
    }

    #[test]
    fn finds_itself_by_reading_real_proc() {
        let secs = process_cpu_seconds(Path::new("/proc"), std::process::id()).unwrap();
        assert!(secs >= 0.0);
        assert!(read_system(Path::new("/proc")).unwrap().total > 0);
    }
}
