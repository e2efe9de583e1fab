//! What the proxy asks of the C allocator (glibc's malloc, which Rust's global allocator
//! calls on Linux).
//!
//! Every new connection allocates its buffers (the TLS record buffers, hyper's read
//! buffer, the upstream write queue) and frees them when it closes. With glibc's dynamic
//! defaults, the heap above the last live allocation is handed back to the kernel once
//! 128 KiB-256 KiB of it is free, and buffers of 128 KiB and more are separate mappings,
//! unmapped on free; the next connection's buffers then fault in fresh pages, each zeroed
//! and charged by the kernel. Measured with `loadgen bench`, a new TLS connection carrying
//! one 800 KB upsert cost ~17 page faults with the defaults and ~0.4 with the thresholds
//! below, and 1-10 % less CPU. The price is that up to [`TRIM_THRESHOLD`] of freed memory
//! per malloc arena stays resident after a burst, ready for the next one.
//!
//! An operator's own `MALLOC_TRIM_THRESHOLD_` or `MALLOC_MMAP_THRESHOLD_` (glibc's
//! environment tunables) wins: the proxy then leaves both alone.
//!
//! Why glibc's malloc and not a replacement: mimalloc cost the same per new connection
//! and more per upsert in `loadgen bench` (docs/benchmarks.md, "Allocator"); malloc and
//! free are a small share of the proxy's samples, so an allocator can win little.

/// Free memory at the top of a heap kept rather than returned to the kernel.
pub const TRIM_THRESHOLD: i32 = 8 * 1024 * 1024;
/// Allocations from this size up get a mapping of their own (returned on free): larger
/// than any per-connection buffer, so those come from the heap and are reused.
pub const MMAP_THRESHOLD: i32 = 2 * 1024 * 1024;

/// Whether the proxy set the thresholds: false where the operator set one, or where the
/// C library is not glibc.
pub fn keep_connection_buffers() -> bool {
    if std::env::var_os("MALLOC_TRIM_THRESHOLD_").is_some()
        || std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some()
    {
        return false;
    }
    set_thresholds()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn set_thresholds() -> bool {
    // SAFETY: mallopt only sets allocator parameters; it takes no pointers and is safe to
    // call at any time (glibc serialises it with the arenas' locks). Called once at start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_takes_the_thresholds() {
        // The test binary's environment is the runner's; without the tunables set, the
        // proxy's values must be accepted by this glibc.
        if std::env::var_os("MALLOC_TRIM_THRESHOLD_").is_none()
            && std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none()
        {
            assert!(keep_connection_buffers());
        }
    }
}
