//! RAPL package energy from the Linux powercap tree (`/sys/class/powercap/intel-rapl:N`;
//! AMD processors appear under the same name).
//!
//! `energy_uj` is a counter that wraps at `max_energy_range_uj` (a few minutes at full
//! load on a big package), so it is sampled through the run and each delta is corrected;
//! sub-zones (`intel-rapl:N:M`: core, uncore, dram) are inside the package figure and are
//! not added again.

use std::path::{Path, PathBuf};

/// Default root of the powercap tree.
pub const POWERCAP_ROOT: &str = "/sys/class/powercap";

struct Domain {
    name: String,
    energy_file: PathBuf,
    max_range_uj: u64,
    last_uj: u64,
}

/// An open set of package domains and the energy accumulated since [`Rapl::open`].
pub struct Rapl {
    domains: Vec<Domain>,
    accumulated_uj: u128,
    wraps: u64,
}

impl Rapl {
    /// Finds the package domains under `root` and takes the first reading. The error is the
    /// reason, worded for the report.
    pub fn open(root: &Path) -> Result<Self, String> {
        let entries = std::fs::read_dir(root).map_err(|e| {
            format!("no RAPL powercap tree at {} ({e}); the kernel exposes none on this machine (VM, or intel_rapl driver not loaded)", root.display())
        })?;
        let mut dirs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("intel-rapl:") && n.matches(':').count() == 1)
            })
            .collect();
        dirs.sort();
        if dirs.is_empty() {
            return Err(format!("no RAPL package domain under {}", root.display()));
        }
        let mut domains = Vec::new();
        for dir in dirs {
            let name = std::fs::read_to_string(dir.join("name"))
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| dir.display().to_string());
            if !name.starts_with("package") {
                continue;
            }
            let energy_file = dir.join("energy_uj");
            let last_uj = read_counter(&energy_file)?;
            let max_range_uj = read_counter(&dir.join("max_energy_range_uj"))?;
            domains.push(Domain {
                name,
                energy_file,
                max_range_uj,
                last_uj,
            });
        }
        if domains.is_empty() {
            return Err(format!(
                "no domain named package-N under {}",
                root.display()
            ));
        }
        Ok(Self {
            domains,
            accumulated_uj: 0,
            wraps: 0,
        })
    }

    /// The RAPL domains read (package-0, dram, ...).
    pub fn domain_names(&self) -> Vec<String> {
        self.domains.iter().map(|d| d.name.clone()).collect()
    }

    /// Reads every domain and adds the energy since the previous reading. Call at least
    /// once per wrap period; once a second is plenty.
    pub fn sample(&mut self) -> Result<(), String> {
        for d in &mut self.domains {
            let now = read_counter(&d.energy_file)?;
            let delta = if now >= d.last_uj {
                now - d.last_uj
            } else {
                self.wraps += 1;
                // The counter passed max_energy_range_uj and restarted from zero.
                d.max_range_uj.saturating_sub(d.last_uj) + now
            };
            self.accumulated_uj += u128::from(delta);
            d.last_uj = now;
        }
        Ok(())
    }

    /// Energy since open, in joules.
    pub fn joules(&self) -> f64 {
        self.accumulated_uj as f64 / 1e6
    }

    /// How often a counter wrapped around during the run (each accounted for).
    pub fn wraps(&self) -> u64 {
        self.wraps
    }
}

fn read_counter(path: &Path) -> Result<u64, String> {
    let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::PermissionDenied => format!(
            "{} is readable by root only (since Linux 5.10, CVE-2020-8694); run loadgen as root or grant read access",
            path.display()
        ),
        _ => format!("reading {}: {e}", path.display()),
    })?;
    text.trim()
        .parse()
        .map_err(|_| format!("{}: not a counter: {:?}", path.display(), text.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_tree_is_a_reason() {
        let err = Rapl::open(Path::new("/nonexistent/powercap"))
            .err()
            .unwrap();
        assert!(err.contains("no RAPL powercap tree"), "{err}");
    }
}
