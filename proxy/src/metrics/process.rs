//! Process metrics with sub-second CPU resolution.
//!
//! The prometheus crate's process collector reports CPU time as an integer number of
//! seconds, which makes "proxy CPU-seconds per request" useless over a short benchmark
//! cell. These read `getrusage` (microseconds) and `/proc/self` at scrape time instead.

use std::sync::Mutex;

use nix::sys::resource::{getrusage, UsageWho};
use prometheus::{Counter, IntGauge, Opts, Registry};

/// The standard process metrics, refreshed on every scrape.
#[derive(Clone)]
pub struct ProcessMetrics {
    cpu_seconds: Counter,
    resident_bytes: IntGauge,
    open_fds: IntGauge,
    threads: IntGauge,
    // Set once at start-up; kept so the registry's handle has an owner beside it.
    _start_time: IntGauge,
    // Serialises refreshes so two concurrent scrapes cannot add the same CPU delta twice.
    refresh: std::sync::Arc<Mutex<()>>,
}

impl ProcessMetrics {
    /// Registers the metrics in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let cpu_seconds = Counter::with_opts(Opts::new(
            "process_cpu_seconds_total",
            "User and system CPU time spent by the proxy process, in seconds (microsecond resolution).",
        ))
        .expect("static metric definition");
        let resident_bytes = IntGauge::with_opts(Opts::new(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
        ))
        .expect("static metric definition");
        let open_fds = IntGauge::with_opts(Opts::new(
            "process_open_fds",
            "Number of open file descriptors.",
        ))
        .expect("static metric definition");
        let threads = IntGauge::with_opts(Opts::new("process_threads", "Number of OS threads."))
            .expect("static metric definition");
        let start_time = IntGauge::with_opts(Opts::new(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch, in seconds.",
        ))
        .expect("static metric definition");
        start_time.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64),
        );
        for m in [
            Box::new(cpu_seconds.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(resident_bytes.clone()),
            Box::new(open_fds.clone()),
            Box::new(threads.clone()),
            Box::new(start_time.clone()),
        ] {
            registry.register(m).expect("metric names are unique");
        }
        Self {
            cpu_seconds,
            resident_bytes,
            open_fds,
            threads,
            _start_time: start_time,
            refresh: Default::default(),
        }
    }

    /// Reads the current values. Cheap: one syscall and two small /proc reads.
    pub fn refresh(&self) {
        let _guard = self.refresh.lock().unwrap_or_else(|p| p.into_inner());
        if let Ok(usage) = getrusage(UsageWho::RUSAGE_SELF) {
            let secs = |tv: nix::sys::time::TimeVal| {
                tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1_000_000.0
            };
            let total = secs(usage.user_time()) + secs(usage.system_time());
            let delta = total - self.cpu_seconds.get();
            if delta > 0.0 {
                self.cpu_seconds.inc_by(delta);
            }
        }
        if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
            for line in status.lines() {
                if let Some(v) = line.strip_prefix("VmRSS:") {
                    if let Some(kb) = v
                        .split_whitespace()
                        .next()
                        .and_then(|n| n.parse::<i64>().ok())
                    {
                        self.resident_bytes.set(kb * 1024);
                    }
                } else if let Some(v) = line.strip_prefix("Threads:") {
                    if let Ok(n) = v.trim().parse::<i64>() {
                        self.threads.set(n);
                    }
                }
            }
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds.set(dir.count() as i64);
        }
    }
}
