//! Rate limits for log lines that remote peers cause (failed handshakes, broken
//! connections, refused admin tokens): a scanner opening thousands of bad connections a
//! second must not flood the journal or spend the proxy's CPU on formatting. Lines beyond
//! the budget are counted (`proxy_log_lines_suppressed_total`) and the next line that
//! passes says how many were dropped before it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, OnceLock};
use std::time::Instant;

use prometheus::IntCounter;

/// Lines per second that remote peers may cause, all kinds together.
const PEER_LINES_PER_SECOND: u64 = 20;

/// The budget for peer-caused lines.
pub static PEER: LogBudget = LogBudget::new(PEER_LINES_PER_SECOND);

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// A fixed-window budget of log lines per second.
#[derive(Debug)]
pub struct LogBudget {
    per_second: u64,
    /// The current window's second (since [`EPOCH`]) in the high 32 bits and the lines
    /// logged in it in the low 32, so one atomic update decides.
    window: AtomicU64,
    suppressed: AtomicU64,
    counter: OnceLock<IntCounter>,
}

impl LogBudget {
    /// A budget of `per_second` lines.
    pub const fn new(per_second: u64) -> Self {
        Self {
            per_second,
            window: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
            counter: OnceLock::new(),
        }
    }

    /// Counts suppressed lines in this metric from now on.
    pub fn count_in(&self, counter: IntCounter) {
        let _ = self.counter.set(counter);
    }

    /// `Some(lines dropped since the last one logged)` if this line may be logged.
    pub fn allow(&self) -> Option<u64> {
        let now = EPOCH.elapsed().as_secs();
        let mut allowed = false;
        let _ = self
            .window
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                let (second, lines) = (w >> 32, w & 0xffff_ffff);
                let (second, lines) = if second == now {
                    (second, lines)
                } else {
                    (now, 0)
                };
                allowed = lines < self.per_second;
                Some((second << 32) | (lines + u64::from(allowed)))
            });
        if allowed {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            if let Some(c) = self.counter.get() {
                c.inc();
            }
            None
        }
    }
}

/// `tracing::warn!` for a line a remote peer caused, within `PEER`'s budget.
#[macro_export]
macro_rules! peer_warn {
    ($($arg:tt)+) => {
        if let Some(dropped) = $crate::ratelog::PEER.allow() {
            if dropped > 0 {
                tracing::warn!(similar_lines_dropped = dropped, $($arg)+);
            } else {
                tracing::warn!($($arg)+);
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_cut_to_the_budget_and_the_next_window_reports_the_drops() {
        let budget = LogBudget::new(5);
        let passed = (0..100).filter(|_| budget.allow().is_some()).count();
        // The burst may straddle a second boundary: at most two windows' worth.
        assert!((5..=10).contains(&passed), "{passed} lines passed");
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let dropped = budget.allow().expect("a new second has room");
        assert_eq!(dropped as usize, 100 - passed);
    }
}
