//! The request buffer budget: a bound on the request bytes the proxy can hold across all
//! its connections, kept by the flow-control windows it advertises rather than by refusing
//! data it already has.
//!
//! What can hold request bytes, and how each is bounded:
//! - an HTTP/1.1 connection: hyper's read buffer (hyper reads the body only as fast as the
//!   upstream takes it), promised `max_header_bytes` and granted up to [`H1_READ_MAX`] from
//!   what the budget has left ([`ReadGrant`]): each read becomes one body chunk, and each
//!   chunk one write upstream, so larger reads cost less per MB;
//! - an HTTP/2 connection: its connection receive window (data the client may send before
//!   the proxy consumes it) and the frame it is reading (h2 buffers a frame whole before it
//!   looks at it, whatever its type, so a frame is not bounded by the window); every
//!   connection is promised the protocol's minimum window of 64 KiB and its default frame
//!   of 16 KiB, and may get up to 16 MiB more, granted here from what the budget has left,
//!   shared between a larger window and larger frames ([`WindowGrant`]);
//! - a request on its way upstream: hyper's client write queue (capped at
//!   [`crate::config::UPSTREAM_WRITE_BUFFER`]) plus the frame or read chunk in hand
//!   (`Limits::upstream_request_floor`).
//!
//! The floors of every possible connection and upstream request are set aside at start-up
//! (the configuration is refused if they do not fit), so the sum of all grants never
//! exceeds the budget: 1,000 clients pushing bodies at a stalled upstream slow down
//! instead of growing the proxy.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus::IntGauge;

use crate::config::{Limits, CONNECTION_BUFFER_FLOOR as H2_MIN_WINDOW};

/// A grant takes at most this share of what is left, so the first connections do not
/// take it all and later ones still get more than the floor.
const GRANT_SHARE: u64 = 8;

/// The most an HTTP/1.1 connection's read buffer grows to when the budget allows it.
/// Measured with `loadgen bench` (HTTP/1.1 763 KB uploads, 3 interleaved rounds, ring and
/// aws-lc-rs): 256 KiB reads instead of 64 KiB made a quarter of the upstream writes
/// (4 per upload instead of 13) and cut the proxy's CPU per MB by 6-16 %.
pub const H1_READ_MAX: u64 = 256 * 1024;

/// The shared budget.
#[derive(Debug)]
pub struct BufferBudget {
    /// Bytes not set aside for floors, still free for grants above them.
    flexible: AtomicU64,
    max_extra_window: u64,
    /// What a frame may take beyond the default (`limits.h2_max_frame_size`).
    max_frame_extra: u64,
    /// What an HTTP/1.1 read buffer may take beyond `max_header_bytes`.
    max_read_extra: u64,
    /// The promised HTTP/1.1 read buffer.
    header_bytes: usize,
    reserved: IntGauge,
}

impl BufferBudget {
    /// A budget for these limits; `reserved` shows what is set aside or granted.
    pub fn new(l: &Limits, max_connection_window: u32, reserved: IntGauge) -> Arc<Self> {
        let total = l.request_buffer_budget();
        let floors = l.request_buffer_floors().min(total);
        reserved.set(floors as i64);
        Arc::new(Self {
            flexible: AtomicU64::new(total - floors),
            max_extra_window: u64::from(max_connection_window).saturating_sub(H2_MIN_WINDOW),
            max_frame_extra: u64::from(l.h2_max_frame_size).saturating_sub(H2_DEFAULT_FRAME),
            // A read is a chunk in hand on its way upstream, which the upstream request's
            // floor counts at `upstream_chunk_floor`: no read may exceed it.
            max_read_extra: H1_READ_MAX
                .min(l.upstream_chunk_floor())
                .saturating_sub(l.max_header_bytes as u64),
            header_bytes: l.max_header_bytes,
            reserved,
        })
    }

    /// Takes a share of what is left, at most `cap`, until the grant is dropped.
    fn take(self: &Arc<Self>, cap: u64) -> Reservation {
        let mut extra = 0;
        let _ = self
            .flexible
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |free| {
                extra = (free / GRANT_SHARE).min(cap);
                Some(free - extra)
            });
        self.reserved.add(extra as i64);
        Reservation {
            budget: self.clone(),
            extra,
        }
    }

    /// The receive window for a new HTTP/2 connection: the floor plus a share of what is
    /// left, returned to the budget when the grant is dropped.
    pub fn grant_h2_window(self: &Arc<Self>) -> WindowGrant {
        WindowGrant(self.take(self.max_extra_window))
    }

    /// The read buffer of a new HTTP/1.1 connection: `max_header_bytes` plus a share of
    /// what is left, returned to the budget when the grant is dropped.
    pub fn grant_h1_read(self: &Arc<Self>) -> ReadGrant {
        ReadGrant(self.take(self.max_read_extra))
    }
}

/// Budget bytes held beyond a floor, given back when dropped.
#[derive(Debug)]
struct Reservation {
    budget: Arc<BufferBudget>,
    extra: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.flexible.fetch_add(self.extra, Ordering::AcqRel);
        self.budget.reserved.sub(self.extra as i64);
    }
}

/// One HTTP/1.1 connection's share of the budget.
#[derive(Debug)]
pub struct ReadGrant(Reservation);

impl ReadGrant {
    /// hyper's `max_buf_size` for the connection. Request heads stay limited to
    /// `max_header_bytes` by hyper's `max_header_size`; the rest is for body reads.
    pub fn max_buf_size(&self) -> usize {
        self.0.budget.header_bytes + self.0.extra as usize
    }
}

/// The protocol's default (and smallest) SETTINGS_MAX_FRAME_SIZE.
const H2_DEFAULT_FRAME: u64 = 16 * 1024;

/// A grant puts at most this share of its extra bytes into a larger frame, the rest into
/// the window: a frame larger than the window could never be sent whole.
const FRAME_SHARE: u64 = 4;

/// One HTTP/2 connection's share of the budget.
#[derive(Debug)]
pub struct WindowGrant(Reservation);

impl WindowGrant {
    /// What the frame size takes beyond the default: out of the grant, not on top of it.
    fn frame_extra(&self) -> u64 {
        (self.0.extra / FRAME_SHARE).min(self.0.budget.max_frame_extra)
    }

    /// The connection receive window to advertise.
    pub fn connection_window(&self) -> u32 {
        (H2_MIN_WINDOW + self.0.extra - self.frame_extra()) as u32
    }

    /// The SETTINGS_MAX_FRAME_SIZE to advertise: the window and the frame together stay
    /// within the floor and the grant.
    pub fn max_frame_size(&self) -> u32 {
        (H2_DEFAULT_FRAME + self.frame_extra()) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(budget: u64, connections: usize, upstream: usize) -> Limits {
        Limits {
            request_buffer_budget: Some(budget),
            max_connections: connections,
            max_upstream_requests: upstream,
            ..Limits::default()
        }
    }

    fn fits(l: &Limits) -> bool {
        l.request_buffer_floors() <= l.request_buffer_budget()
    }

    #[test]
    fn defaults_fit_and_the_derived_budget_grows_with_the_limits() {
        assert!(fits(&Limits::default()));
        // The default limits' floors (10,000 x 64 KiB, 512 x (400 KiB + a 1 MiB frame))
        // exceed 1 GiB, so the derived budget is theirs plus an eighth of a GiB.
        let d = Limits::default();
        assert_eq!(
            d.request_buffer_budget(),
            d.request_buffer_floors() + (1 << 27)
        );
        let small_frames = Limits {
            h2_max_frame_size: 16 * 1024,
            ..Limits::default()
        };
        assert_eq!(small_frames.request_buffer_budget(), 1 << 30);
        // Raising the connection limit alone grows the derived budget with it.
        let many = Limits {
            max_connections: 50_000,
            ..Limits::default()
        };
        assert!(fits(&many));
        assert!(many.request_buffer_budget() > 3 << 30);
        assert!(!fits(&limits(64 << 20, 10_000, 1024)));
    }

    #[test]
    fn grants_never_exceed_the_budget_and_return_when_dropped() {
        const BUDGET: u64 = 512 << 20;
        let l = limits(BUDGET, 1000, 64);
        assert!(fits(&l));
        let gauge = IntGauge::new("reserved", "test").unwrap();
        let budget = BufferBudget::new(&l, 16 << 20, gauge.clone());
        let grants: Vec<WindowGrant> = (0..1000).map(|_| budget.grant_h2_window()).collect();
        // What a connection can hold: its window, and a frame beyond the default one.
        let held = |g: &WindowGrant| {
            u64::from(g.connection_window()) + u64::from(g.max_frame_size()) - H2_DEFAULT_FRAME
        };
        let total: u64 = grants.iter().map(held).sum();
        assert!(total <= BUDGET, "grants {total} exceed the budget");
        assert_eq!(held(&grants[0]), 16 << 20, "the first gets the most");
        assert_eq!(grants[0].max_frame_size(), l.h2_max_frame_size);
        assert!(grants[0].connection_window() >= grants[0].max_frame_size());
        assert!(grants.iter().all(|g| {
            u64::from(g.connection_window()) >= H2_MIN_WINDOW
                && (H2_DEFAULT_FRAME as u32..=l.h2_max_frame_size).contains(&g.max_frame_size())
        }));
        // Once the budget is spent, connections get the protocol's floors.
        let last = grants.last().unwrap();
        assert_eq!(u64::from(last.max_frame_size()), H2_DEFAULT_FRAME);
        assert!(gauge.get() as u64 <= BUDGET);
        drop(grants);
        assert_eq!(gauge.get() as u64, l.request_buffer_floors());
    }

    #[test]
    fn read_grants_stay_within_the_budget_and_within_the_upstream_chunk_floor() {
        const BUDGET: u64 = 512 << 20;
        let l = limits(BUDGET, 1000, 64);
        let gauge = IntGauge::new("reserved", "test").unwrap();
        let budget = BufferBudget::new(&l, 16 << 20, gauge.clone());
        let grants: Vec<ReadGrant> = (0..5000).map(|_| budget.grant_h1_read()).collect();
        assert_eq!(
            grants[0].max_buf_size() as u64,
            H1_READ_MAX,
            "the first gets the most"
        );
        assert!(grants
            .iter()
            .all(|g| (l.max_header_bytes..=H1_READ_MAX as usize).contains(&g.max_buf_size())));
        // Once the budget is spent, connections get what they were promised.
        assert_eq!(grants.last().unwrap().max_buf_size(), l.max_header_bytes);
        let extra: u64 = grants
            .iter()
            .map(|g| (g.max_buf_size() - l.max_header_bytes) as u64)
            .sum();
        assert!(l.request_buffer_floors() + extra <= BUDGET);
        assert_eq!(gauge.get() as u64, l.request_buffer_floors() + extra);
        drop(grants);
        assert_eq!(gauge.get() as u64, l.request_buffer_floors());

        // A read is a chunk in hand upstream: with 16 KiB frames the floor counts 64 KiB
        // chunks, so reads stay at `max_header_bytes`.
        let small_chunks = Limits {
            h2_max_frame_size: 16 * 1024,
            ..l
        };
        let budget = BufferBudget::new(&small_chunks, 16 << 20, gauge);
        assert_eq!(
            budget.grant_h1_read().max_buf_size(),
            small_chunks.max_header_bytes
        );
    }
}
