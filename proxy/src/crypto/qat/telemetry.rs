//! QAT device telemetry: the in-kernel driver's debugfs files
//! (`/sys/kernel/debug/qat_<dev>_<bdf>/telemetry/device_data`, switched on through
//! `control`) and the out-of-tree driver's sysfs files
//! (`/sys/bus/pci/devices/<bdf>/telemetry/device_data`).
//!
//! `device_data` is one counter per line: a name, then its value (with 2-4 samples
//! configured the driver appends min, max and average; the first value is the current one).
//! Units as the driver documents them: `util_*` in percent, latencies in nanoseconds,
//! `bw_in`/`bw_out` in Mbit/s.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Which driver reported the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The in-kernel driver (qat_4xxx and later), via debugfs.
    InKernel,
    /// Intel's out-of-tree driver, via sysfs.
    OutOfTree,
}

/// One device's counters at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceTelemetry {
    /// `qat_4xxx_0000:6b:00.0` (in-kernel) or the PCI address (out-of-tree).
    pub device: String,
    /// Which driver.
    pub source: Source,
    /// Every counter by name.
    pub counters: BTreeMap<String, f64>,
}

impl DeviceTelemetry {
    fn slice_values<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = f64> + 'a {
        self.counters.iter().filter_map(move |(k, v)| {
            let rest = k.strip_prefix(prefix)?;
            // util_pke0, util_pke1, ...: the prefix must be followed by the slice number only.
            (!rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit())).then_some(*v)
        })
    }

    /// Mean utilisation of the public-key engines, percent.
    pub fn pke_utilization(&self) -> Option<f64> {
        mean(self.slice_values("util_pke"))
    }

    /// Utilisation of the busiest public-key engine, percent.
    pub fn pke_utilization_peak(&self) -> Option<f64> {
        self.slice_values("util_pke").reduce(f64::max)
    }

    /// Mean utilisation over every slice the device reports (pke, ucs, cph, ath, cpr, ...),
    /// percent.
    pub fn device_utilization(&self) -> Option<f64> {
        mean(
            self.counters
                .iter()
                .filter(|(k, _)| {
                    k.strip_prefix("util_")
                        .is_some_and(|r| r.ends_with(|c: char| c.is_ascii_digit()))
                })
                .map(|(_, v)| *v),
        )
    }

    /// Average get-to-put latency, seconds.
    pub fn gp_latency_seconds(&self) -> Option<f64> {
        self.counters.get("gp_lat_acc_avg").map(|ns| ns / 1e9)
    }

    /// Average PCIe read latency, seconds.
    pub fn read_latency_seconds(&self) -> Option<f64> {
        self.counters.get("rd_lat_acc_avg").map(|ns| ns / 1e9)
    }

    /// PCIe bandwidth into the device (`bw_in`), bytes per second.
    pub fn bandwidth_in_bytes_per_second(&self) -> Option<f64> {
        self.counters.get("bw_in").map(|mbps| mbps * 1e6 / 8.0)
    }

    /// PCIe bandwidth out of the device (`bw_out`), bytes per second.
    pub fn bandwidth_out_bytes_per_second(&self) -> Option<f64> {
        self.counters.get("bw_out").map(|mbps| mbps * 1e6 / 8.0)
    }
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0u32), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / f64::from(n))
}

/// Parses a `device_data` file.
pub fn parse_device_data(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let name = parts.next()?;
            let value = parts.next()?.parse::<f64>().ok()?;
            Some((name.to_owned(), value))
        })
        .collect()
}

/// Reads every QAT device's telemetry under `root` (normally `/sys`). With `enable`, turns
/// in-kernel telemetry on where it is off. Errors with the reason when nothing can be read,
/// so callers can report "n/a (reason)" instead of a number.
pub fn read_all(root: &Path, enable: bool) -> Result<Vec<DeviceTelemetry>, String> {
    let mut devices = Vec::new();
    let mut notes = Vec::new();
    let debugfs = root.join("kernel/debug");
    match std::fs::read_dir(&debugfs) {
        Ok(entries) => {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !name.starts_with("qat_") {
                    continue;
                }
                let dir = entry.path().join("telemetry");
                if !dir.is_dir() {
                    notes.push(format!(
                        "{name}: no telemetry (device generation without it)"
                    ));
                    continue;
                }
                match read_in_kernel(&dir, enable) {
                    Ok(counters) => devices.push(DeviceTelemetry {
                        device: name,
                        source: Source::InKernel,
                        counters,
                    }),
                    Err(e) => notes.push(format!("{name}: {e}")),
                }
            }
        }
        Err(e) => notes.push(format!("{}: {e}", debugfs.display())),
    }
    let pci = root.join("bus/pci/devices");
    if let Ok(entries) = std::fs::read_dir(&pci) {
        for entry in entries.flatten() {
            let data = entry.path().join("telemetry/device_data");
            if let Ok(text) = std::fs::read_to_string(&data) {
                devices.push(DeviceTelemetry {
                    device: entry.file_name().to_string_lossy().into_owned(),
                    source: Source::OutOfTree,
                    counters: parse_device_data(&text),
                });
            }
        }
    }
    if devices.is_empty() {
        let mut reason = format!(
            "no QAT telemetry found under {} (in-kernel driver: debugfs qat_*/telemetry, needs root) \
             or {}/*/telemetry (out-of-tree driver)",
            debugfs.display(),
            pci.display()
        );
        if !notes.is_empty() {
            reason.push_str(": ");
            reason.push_str(&notes.join("; "));
        }
        return Err(reason);
    }
    devices.sort_by(|a, b| a.device.cmp(&b.device));
    Ok(devices)
}

fn read_in_kernel(dir: &Path, enable: bool) -> Result<BTreeMap<String, f64>, String> {
    let control: PathBuf = dir.join("control");
    let state = std::fs::read_to_string(&control)
        .map_err(|e| format!("cannot read {}: {e}", control.display()))?;
    if state.trim() == "0" {
        if !enable {
            return Err(format!(
                "telemetry is off (write 1 to {} or set qat.enable_telemetry)",
                control.display()
            ));
        }
        std::fs::write(&control, "1")
            .map_err(|e| format!("cannot enable telemetry via {}: {e}", control.display()))?;
    }
    let data = dir.join("device_data");
    let text = std::fs::read_to_string(&data)
        .map_err(|e| format!("cannot read {}: {e}", data.display()))?;
    Ok(parse_device_data(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qat")
    }

    #[test]
    fn in_kernel_debugfs_tree() {
        let devices = read_all(&fixtures().join("in-kernel/sys"), false).unwrap();
        assert_eq!(devices.len(), 1);
        let d = &devices[0];
        assert_eq!(d.device, "qat_4xxx_0000:6b:00.0");
        assert_eq!(d.source, Source::InKernel);
        // util_pke0..5 in the recording: 40, 42, 38, 41, 39, 46.
        assert_eq!(d.pke_utilization_peak(), Some(46.0));
        let avg = d.pke_utilization().unwrap();
        assert!((avg - 41.0).abs() < 1e-9, "{avg}");
        assert_eq!(d.gp_latency_seconds(), Some(3.2e-6));
        assert_eq!(d.bandwidth_in_bytes_per_second(), Some(1_200.0 * 125_000.0));
        assert_eq!(d.bandwidth_out_bytes_per_second(), Some(800.0 * 125_000.0));
        assert!(d.device_utilization().unwrap() > 0.0);
    }

    #[test]
    fn out_of_tree_sysfs_tree() {
        let devices = read_all(&fixtures().join("out-of-tree/sys"), false).unwrap();
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].source, Source::OutOfTree);
        assert_eq!(devices[0].device, "0000:6b:00.0");
        assert_eq!(devices[0].pke_utilization_peak(), Some(88.0));
    }

    #[test]
    fn disabled_telemetry_and_absent_hardware_give_reasons() {
        let err = read_all(&fixtures().join("disabled/sys"), false).unwrap_err();
        assert!(err.contains("telemetry is off"), "{err}");
        let err = read_all(Path::new("/nonexistent-sysfs"), false).unwrap_err();
        assert!(err.contains("no QAT telemetry found"), "{err}");
    }

    #[test]
    fn multi_sample_lines_use_the_current_value() {
        let c = parse_device_data("sample_cnt 3\nutil_pke0 10 5 20 12\nbad line\n");
        assert_eq!(c["util_pke0"], 10.0);
        assert_eq!(c.len(), 2);
    }
}
