//! CPU budgets: a fixed share of the machine for one process, the proxy that `compare`
//! starts, so that its throughput is bounded by what its own work costs, as in the study
//! (a proxy given N cores of a larger host, with more clients than those cores can serve).
//!
//! A budget of fractional or whole cores is a CFS quota on a cgroup of the proxy's own, by
//! the first mechanism that works here:
//! - cgroup v2: `cpu.max` in a child of loadgen's own cgroup, where the unified hierarchy
//!   has the cpu controller and loadgen may write it;
//! - cgroup v1: `cpu.cfs_quota_us` and `cpu.cfs_period_us` in a child group of the cpu
//!   hierarchy, likewise;
//! - a transient systemd scope (`systemd-run --scope -p CPUQuota=`), where systemd runs
//!   and the cgroup tree is not writable by this user: systemd starts the process in a
//!   scope that has the quota (`--user` for a non-root user, whose manager has the cpu
//!   controller delegated).
//!
//! Pinning to whole cores is `--proxy-cpus` (affinity), beside a budget or instead of it.
//! [`read_quota`] reads any process's quota back from its cgroup files, whoever set it
//! (this module, systemd's `CPUQuota=`, `docker --cpus`), taking the tightest along its
//! cgroup's ancestors: results record what the process really had, not what was asked.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

/// The CFS period of every budget: the one systemd (`CPUQuotaPeriodSec=`) and Kubernetes
/// use by default, so a budget here means what an operator's `CPUQuota=` or CPU limit means.
pub const PERIOD_US: u64 = 100_000;

/// A CPU budget as the command line gives it: cores (`0.25`, `1`, `1.5`) or `none`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BudgetChoice {
    /// This many cores' worth of CPU time per period.
    Cores(f64),
    /// No quota: the process may use every core it is allowed.
    Unbudgeted,
}

impl std::str::FromStr for BudgetChoice {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        if s.eq_ignore_ascii_case("none") {
            return Ok(Self::Unbudgeted);
        }
        let cores: f64 = s
            .parse()
            .map_err(|_| anyhow!("{s:?} is neither a number of cores (0.25, 1, 1.5) nor none"))?;
        // The kernel's smallest quota is 1 ms per period.
        if !(cores.is_finite() && cores * PERIOD_US as f64 >= 1000.0) {
            bail!("a CPU budget of {s} cores is below the kernel's smallest (0.01 cores)");
        }
        Ok(Self::Cores(cores))
    }
}

impl std::fmt::Display for BudgetChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cores(c) => write!(f, "{c}"),
            Self::Unbudgeted => f.write_str("none"),
        }
    }
}

impl Serialize for BudgetChoice {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A process's CPU quota as its cgroup files give it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CpuQuota {
    /// Quota over period: the cores' worth of CPU the process may use.
    pub cores: f64,
    /// CPU time per period, in microseconds.
    pub quota_us: u64,
    /// The period, in microseconds.
    pub period_us: u64,
    /// The file that sets it (`.../cpu.max`, or `.../cpu.cfs_quota_us`).
    pub file: PathBuf,
    /// How it was set, as the file and its group show: `cgroup v2 cpu.max`, `cgroup v1
    /// cpu.cfs_quota_us`, with `(systemd scope UNIT)` where the group is a scope.
    pub mechanism: String,
}

/// Where the cgroup hierarchies are mounted: `proc_root`'s `self/mountinfo` (tests give a
/// recorded one whose mount points lead into a folder of their own).
#[derive(Clone, Debug)]
pub struct Cgroups {
    proc_root: PathBuf,
}

/// One mounted hierarchy that carries the cpu controller.
#[derive(Clone, Debug, PartialEq)]
struct CpuHierarchy {
    /// Where it is mounted.
    mount_point: PathBuf,
    /// The mount's root inside the hierarchy (`/` unless a container sees a sub-tree).
    root: String,
    /// cgroup2 (`cpu.max`) rather than v1 (`cpu.cfs_quota_us`).
    unified: bool,
}

impl Default for Cgroups {
    fn default() -> Self {
        Self::at(Path::new("/proc"))
    }
}

impl Cgroups {
    /// The hierarchies `proc_root` describes.
    pub fn at(proc_root: &Path) -> Self {
        Self {
            proc_root: proc_root.to_owned(),
        }
    }

    /// The hierarchy that carries the cpu controller: v1's `cpu` mount, else the unified
    /// one when its root lists `cpu` among its controllers.
    fn cpu_hierarchy(&self) -> Result<CpuHierarchy> {
        let path = self.proc_root.join("self/mountinfo");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let mut unified = None;
        for line in text.lines() {
            // id parent major:minor root mount-point options [optional...] - type source super-options
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let left: Vec<&str> = left.split(' ').collect();
            let right: Vec<&str> = right.split(' ').collect();
            if left.len() < 5 || right.len() < 3 {
                continue;
            }
            let hierarchy = CpuHierarchy {
                mount_point: PathBuf::from(unescape_mount_path(left[4])),
                root: left[3].to_owned(),
                unified: right[0] == "cgroup2",
            };
            match right[0] {
                "cgroup" if right[2].split(',').any(|o| o == "cpu") => return Ok(hierarchy),
                "cgroup2" => unified = Some(hierarchy),
                _ => {}
            }
        }
        let Some(unified) = unified else {
            bail!(
                "no cgroup hierarchy is mounted ({} lists neither a v1 cpu nor a cgroup2 mount)",
                path.display()
            );
        };
        let controllers = std::fs::read_to_string(unified.mount_point.join("cgroup.controllers"))
            .unwrap_or_default();
        if !controllers.split_whitespace().any(|c| c == "cpu") {
            bail!(
                "the cgroup2 hierarchy at {} has no cpu controller (its cgroup.controllers: {:?}), and no cgroup v1 cpu hierarchy is mounted",
                unified.mount_point.display(),
                controllers.trim()
            );
        }
        Ok(unified)
    }

    /// The folder of `pid`'s group in `h` (`pid` "self" for loadgen's own).
    fn group_of(&self, h: &CpuHierarchy, pid: &str) -> Result<PathBuf> {
        let path = self.proc_root.join(pid).join("cgroup");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let relative = text
            .lines()
            .find_map(|line| {
                let mut parts = line.splitn(3, ':');
                let (id, controllers, group) = (parts.next()?, parts.next()?, parts.next()?);
                let matches = if h.unified {
                    id == "0" && controllers.is_empty()
                } else {
                    controllers.split(',').any(|c| c == "cpu")
                };
                matches.then(|| group.to_owned())
            })
            .ok_or_else(|| anyhow!("{} names no group in the cpu hierarchy", path.display()))?;
        // Inside a container the mount's root is the container's own group.
        let inside = relative
            .strip_prefix(h.root.trim_end_matches('/'))
            .unwrap_or(&relative);
        Ok(h.mount_point.join(inside.trim_start_matches('/')))
    }
}

/// How a budget is put on the process before it starts, decided once.
#[derive(Debug)]
pub enum Prepared {
    /// A group of its own with the quota written; the process joins it once started.
    Group {
        /// The group's folder.
        dir: PathBuf,
        /// Written to join the group.
        procs: PathBuf,
    },
    /// systemd starts the process in a transient scope that has the quota.
    SystemdScope {
        /// The scope's unit name.
        unit: String,
        /// `--user` for a non-root user's manager.
        user: bool,
        /// The budget, as systemd's percentage of one core.
        percent: f64,
    },
}

impl Prepared {
    /// Decides how to give a process `cores` of CPU, and makes its group (named `name`,
    /// unique to this loadgen). Fails naming every mechanism tried and why it could not be
    /// used: nothing runs unbudgeted that was asked to run under a budget.
    pub fn new(cgroups: &Cgroups, cores: f64, name: &str) -> Result<Self> {
        let group_error = match make_group(cgroups, cores, name) {
            Ok(p) => return Ok(p),
            Err(e) => e,
        };
        let systemd = Path::new("/run/systemd/system").is_dir();
        let systemd_run = which("systemd-run");
        match (systemd, systemd_run) {
            (true, Some(_)) => Ok(Self::SystemdScope {
                unit: format!("{name}.scope"),
                user: !is_root(),
                percent: cores * 100.0,
            }),
            (systemd, systemd_run) => bail!(
                "no way to give the proxy a CPU budget here: {group_error:#}; and no systemd scope \
                 ({}). Run loadgen as root, give this user a writable cgroup (systemd's Delegate=), \
                 or pass --proxy-cpu-budget none to run unbudgeted (the report then says so)",
                if !systemd {
                    "systemd is not running: /run/systemd/system is absent"
                } else if systemd_run.is_none() {
                    "systemd-run is not on PATH"
                } else {
                    "unavailable"
                }
            ),
        }
    }

    /// The command to spawn for `cmd`: itself, or systemd-run starting it in the scope.
    pub fn command(&self, cmd: Command) -> Command {
        match self {
            Self::Group { .. } => cmd,
            Self::SystemdScope {
                unit,
                user,
                percent,
            } => {
                let mut wrapped = Command::new("systemd-run");
                if *user {
                    wrapped.arg("--user");
                }
                wrapped
                    .args(["--scope", "--quiet", "--collect", "--unit", unit])
                    .arg(format!("--property=CPUQuota={percent}%"))
                    .arg(format!(
                        "--property=CPUQuotaPeriodSec={}ms",
                        PERIOD_US / 1000
                    ))
                    .arg("--")
                    .arg(cmd.get_program())
                    .args(cmd.get_args());
                for (k, v) in cmd.get_envs() {
                    match v {
                        Some(v) => wrapped.env(k, v),
                        None => wrapped.env_remove(k),
                    };
                }
                if let Some(dir) = cmd.get_current_dir() {
                    wrapped.current_dir(dir);
                }
                wrapped
            }
        }
    }

    /// Moves the started process (every thread of it) into its group, where it has one,
    /// then reads its quota back from its cgroup files and checks it is the one asked for.
    pub fn attach(&self, cgroups: &Cgroups, pid: u32, cores: f64) -> Result<CpuQuota> {
        if let Self::Group { procs, .. } = self {
            std::fs::write(procs, pid.to_string()).with_context(|| {
                format!("moving the proxy (pid {pid}) into {}", procs.display())
            })?;
        }
        let quota = read_quota(cgroups, pid)?.ok_or_else(|| {
            anyhow!("the proxy (pid {pid}) has no CPU quota after it was given one")
        })?;
        if (quota.cores - cores).abs() > 0.005 {
            bail!(
                "the proxy's CPU quota reads back as {:.3} cores ({}), not the {cores} asked for",
                quota.cores,
                quota.file.display()
            );
        }
        Ok(quota)
    }

    /// Removes the group once its process has exited (a scope goes by itself: --collect).
    pub fn remove(self) {
        if let Self::Group { dir, .. } = self {
            // The kernel frees the group only once the exited process is reaped; a few
            // tries cover the moment between the two.
            for _ in 0..50 {
                if std::fs::remove_dir(&dir).is_ok() || !dir.exists() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            tracing::warn!("could not remove the budget's cgroup {}", dir.display());
        }
    }
}

/// A budget put on a process that already runs, for a while (`loadgen run
/// --proxy-cpu-budget` on the watched proxy): a group of its own made and the process moved
/// in; when dropped, the process goes back to the group it came from and the budget's group
/// is removed. A running process cannot join a systemd scope, so this needs a writable
/// cgroup tree.
pub struct Lent {
    prepared: Option<Prepared>,
    pid: u32,
    home: PathBuf,
    /// The quota as read back from the process's cgroup files.
    pub quota: CpuQuota,
}

impl Lent {
    /// Gives `pid` `cores` of CPU, read back and checked.
    pub fn new(cgroups: &Cgroups, pid: u32, cores: f64) -> Result<Self> {
        let h = cgroups.cpu_hierarchy()?;
        let home = cgroups.group_of(&h, &pid.to_string())?.join("cgroup.procs");
        let name = format!("vtp-loadgen-{}-run", std::process::id());
        let prepared = match make_group(cgroups, cores, &name) {
            Ok(p) => p,
            Err(e) => bail!(
                "cannot give pid {pid} a CPU budget: {e:#} (a running process cannot join a \
                 systemd scope: run loadgen as root, or give the proxy its budget where it is \
                 started, e.g. systemd's CPUQuota=)"
            ),
        };
        match prepared.attach(cgroups, pid, cores) {
            Ok(quota) => Ok(Self {
                prepared: Some(prepared),
                pid,
                home,
                quota,
            }),
            Err(e) => {
                let _ = std::fs::write(&home, pid.to_string());
                prepared.remove();
                Err(e)
            }
        }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(&self.home, self.pid.to_string()) {
            tracing::warn!(pid = self.pid, error = %e, "cannot move the proxy back to its own cgroup");
        }
        if let Some(prepared) = self.prepared.take() {
            prepared.remove();
        }
    }
}

/// A child of loadgen's own group in the cpu hierarchy, with the quota written.
fn make_group(cgroups: &Cgroups, cores: f64, name: &str) -> Result<Prepared> {
    let h = cgroups.cpu_hierarchy()?;
    let parent = cgroups.group_of(&h, "self")?;
    let parent = if parent.is_dir() {
        parent
    } else {
        h.mount_point.clone()
    };
    let dir = parent.join(name);
    let quota_us = (cores * PERIOD_US as f64).round() as u64;
    if h.unified {
        // Children get the cpu controller only where the parent hands it down.
        let control = parent.join("cgroup.subtree_control");
        let handed = std::fs::read_to_string(&control).unwrap_or_default();
        if !handed.split_whitespace().any(|c| c == "cpu") {
            std::fs::write(&control, "+cpu").with_context(|| {
                format!(
                    "enabling the cpu controller for children of {}",
                    parent.display()
                )
            })?;
        }
    }
    std::fs::create_dir(&dir).with_context(|| format!("creating the cgroup {}", dir.display()))?;
    let written = if h.unified {
        std::fs::write(dir.join("cpu.max"), format!("{quota_us} {PERIOD_US}"))
    } else {
        std::fs::write(dir.join("cpu.cfs_period_us"), PERIOD_US.to_string())
            .and_then(|()| std::fs::write(dir.join("cpu.cfs_quota_us"), quota_us.to_string()))
    };
    if let Err(e) = written {
        let _ = std::fs::remove_dir(&dir);
        return Err(e).with_context(|| format!("writing the quota of {}", dir.display()));
    }
    Ok(Prepared::Group {
        procs: dir.join("cgroup.procs"),
        dir,
    })
}

/// `pid`'s CPU quota from its cgroup files, the tightest along its group's ancestors (a
/// parent's quota binds its children too); `None` where no group on the way has one.
pub fn read_quota(cgroups: &Cgroups, pid: u32) -> Result<Option<CpuQuota>> {
    let h = cgroups.cpu_hierarchy()?;
    let group = cgroups.group_of(&h, &pid.to_string())?;
    let mut tightest: Option<CpuQuota> = None;
    for dir in group.ancestors() {
        if !dir.starts_with(&h.mount_point) {
            break;
        }
        let found = if h.unified {
            read_cpu_max(dir)
        } else {
            read_cfs(dir)
        };
        if let Some(q) = found {
            if tightest.as_ref().is_none_or(|t| q.cores < t.cores) {
                tightest = Some(q);
            }
        }
    }
    Ok(tightest)
}

fn scope_note(dir: &Path) -> String {
    dir.file_name()
        .and_then(|n| n.to_str())
        .filter(|n| n.ends_with(".scope"))
        .map(|n| format!(" (systemd scope {n})"))
        .unwrap_or_default()
}

fn read_cpu_max(dir: &Path) -> Option<CpuQuota> {
    let file = dir.join("cpu.max");
    let text = std::fs::read_to_string(&file).ok()?;
    let mut parts = text.split_whitespace();
    let quota = parts.next()?;
    let period: u64 = parts.next()?.parse().ok()?;
    let quota_us: u64 = quota.parse().ok()?; // "max" is no quota
    Some(CpuQuota {
        cores: quota_us as f64 / period as f64,
        quota_us,
        period_us: period,
        mechanism: format!("cgroup v2 cpu.max{}", scope_note(dir)),
        file,
    })
}

fn read_cfs(dir: &Path) -> Option<CpuQuota> {
    let file = dir.join("cpu.cfs_quota_us");
    let quota: i64 = std::fs::read_to_string(&file).ok()?.trim().parse().ok()?;
    let period: u64 = std::fs::read_to_string(dir.join("cpu.cfs_period_us"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    // -1 is no quota.
    let quota_us = u64::try_from(quota).ok()?;
    Some(CpuQuota {
        cores: quota_us as f64 / period as f64,
        quota_us,
        period_us: period,
        mechanism: format!("cgroup v1 cpu.cfs_quota_us{}", scope_note(dir)),
        file,
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mount_path(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Whether this process runs as root: its /proc entry belongs to its effective user.
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recorded /proc whose mountinfo mounts a cgroup tree inside `root`, and the tree.
    fn fake(root: &Path, unified: bool) -> (Cgroups, PathBuf) {
        let proc_root = root.join("proc");
        let tree = root.join("cgroup");
        std::fs::create_dir_all(proc_root.join("self")).unwrap();
        std::fs::create_dir_all(proc_root.join("42")).unwrap();
        std::fs::create_dir_all(tree.join("user/loadgen")).unwrap();
        let mountinfo = if unified {
            std::fs::write(
                tree.join("cgroup.controllers"),
                "cpuset cpu io memory pids\n",
            )
            .unwrap();
            format!(
                "30 23 0:26 / {} rw,nosuid - cgroup2 cgroup2 rw\n",
                tree.display()
            )
        } else {
            format!(
                "30 23 0:26 / {} rw,nosuid shared:9 - cgroup cgroup rw,cpu,cpuacct\n",
                tree.display()
            )
        };
        std::fs::write(
            proc_root.join("self/mountinfo"),
            format!("22 1 8:1 / / rw - ext4 /dev/vda rw\n{mountinfo}"),
        )
        .unwrap();
        let line = if unified {
            "0::/user/loadgen\n"
        } else {
            "4:cpu,cpuacct:/user/loadgen\n1:name=systemd:/\n"
        };
        std::fs::write(proc_root.join("self/cgroup"), line).unwrap();
        (Cgroups::at(&proc_root), tree)
    }

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("budget-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn budgets_parse_as_cores_or_none_and_refuse_what_the_kernel_cannot_do() {
        assert_eq!(
            "0.25".parse::<BudgetChoice>().unwrap(),
            BudgetChoice::Cores(0.25)
        );
        assert_eq!(
            "none".parse::<BudgetChoice>().unwrap(),
            BudgetChoice::Unbudgeted
        );
        assert!("0.001".parse::<BudgetChoice>().is_err());
        assert!("x".parse::<BudgetChoice>().is_err());
    }

    /// cgroup v1: the group is made under loadgen's own, the quota written as the kernel
    /// reads it, the process moved in, and the quota read back from the files.
    #[test]
    fn a_v1_budget_is_written_joined_and_read_back() {
        let root = temp("v1");
        let (cgroups, tree) = fake(&root, false);
        let prepared = Prepared::new(&cgroups, 0.25, "proxy-budget").unwrap();
        let dir = tree.join("user/loadgen/proxy-budget");
        assert_eq!(
            std::fs::read_to_string(dir.join("cpu.cfs_quota_us")).unwrap(),
            "25000"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("cpu.cfs_period_us")).unwrap(),
            "100000"
        );
        std::fs::write(
            root.join("proc/42/cgroup"),
            "4:cpu,cpuacct:/user/loadgen/proxy-budget\n",
        )
        .unwrap();
        let quota = prepared.attach(&cgroups, 42, 0.25).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("cgroup.procs")).unwrap(),
            "42"
        );
        assert_eq!((quota.quota_us, quota.period_us), (25_000, 100_000));
        assert_eq!(quota.mechanism, "cgroup v1 cpu.cfs_quota_us");
        assert_eq!(quota.file, dir.join("cpu.cfs_quota_us"));
        // What it reads back must be what was asked for.
        assert!(prepared.attach(&cgroups, 42, 0.5).is_err());
        let _ = std::fs::remove_dir_all(&root);
    }

    /// cgroup v2: cpu handed down to children, `cpu.max` written; a tighter parent's quota
    /// is the one that binds.
    #[test]
    fn a_v2_budget_hands_down_the_controller_and_the_tightest_ancestor_binds() {
        let root = temp("v2");
        let (cgroups, tree) = fake(&root, true);
        Prepared::new(&cgroups, 1.5, "proxy-budget").unwrap();
        let dir = tree.join("user/loadgen/proxy-budget");
        assert_eq!(
            std::fs::read_to_string(dir.join("cpu.max")).unwrap(),
            "150000 100000"
        );
        assert_eq!(
            std::fs::read_to_string(tree.join("user/loadgen/cgroup.subtree_control")).unwrap(),
            "+cpu"
        );
        std::fs::write(
            root.join("proc/42/cgroup"),
            "0::/user/loadgen/proxy-budget\n",
        )
        .unwrap();
        let quota = read_quota(&cgroups, 42).unwrap().unwrap();
        assert_eq!(quota.cores, 1.5);
        assert_eq!(quota.mechanism, "cgroup v2 cpu.max");
        std::fs::write(tree.join("user/cpu.max"), "50000 100000\n").unwrap();
        std::fs::write(tree.join("user/loadgen/cpu.max"), "max 100000\n").unwrap();
        let quota = read_quota(&cgroups, 42).unwrap().unwrap();
        assert_eq!(quota.cores, 0.5, "{quota:?}");
        let _ = std::fs::remove_dir_all(&root);
    }

    /// Without a cpu controller anywhere the error names what is missing.
    #[test]
    fn without_a_cpu_controller_the_budget_is_refused_naming_what_is_missing() {
        let root = temp("none");
        let (cgroups, tree) = fake(&root, true);
        std::fs::write(tree.join("cgroup.controllers"), "memory pids\n").unwrap();
        let err = format!(
            "{:#}",
            Prepared::new(&cgroups, 0.5, "proxy-budget").unwrap_err()
        );
        if !Path::new("/run/systemd/system").is_dir() {
            assert!(err.contains("has no cpu controller"), "{err}");
            assert!(err.contains("--proxy-cpu-budget none"), "{err}");
        }
        assert!(read_quota(&cgroups, 42).is_err());
        let _ = std::fs::remove_dir_all(&root);
    }
}
