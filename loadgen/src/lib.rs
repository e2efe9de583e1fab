//! `loadgen`: drives secure vector ingestion (UPSERT_100 over Qdrant REST or gRPC) through a
//! TLS terminator and reports what it measured, one run at a time (`run`), as a provider x
//! algorithm comparison (`compare`), and as tables and charts (`report`).
//!
//! Module map: [`vectors`] (where vectors come from), [`workload`] (request bodies, built
//! before timing), [`client`] (TLS client, connections, Qdrant set-up calls), [`driver`]
//! (closed and open loop), [`probe`] (CPU, power, proxy metrics), [`power_estimate`] (watts
//! estimated from CPU utilisation by a published model, where no meter is read), [`result`] (the JSON
//! result), [`summary`] (the human summary), [`run`] (one run, end to end), [`launch`] (a
//! process started and waited for through its ready file, and stopped), [`procs`] (the
//! processes compare and bench start and stop), [`compare`] (the provider x algorithm
//! matrix), [`cells`] (a comparison's result files read back, side-by-side parts merged),
//! [`report`] (Markdown, CSV and HTML from the JSON), [`bench`](mod@bench) (the
//! terminator benchmark: our proxy beside nginx and HAProxy); beside them [`budget`] (the
//! proxy's CPU budget: a cgroup quota or a systemd scope, read back), [`merge`] (the parts
//! of a round run side by side merged into one result) and [`terminator_flags`] (the
//! providers, algorithms and binaries that compare and bench share).

// Unsafe code is three libc calls, each allowed where it is and said why there:
// `probe::cpu::clock_ticks` (sysconf), `procs` (CPU affinity before exec) and
// `bench::terminators` (geteuid).
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod bench;
pub mod budget;
pub mod cells;
pub mod client;
pub mod compare;
pub mod driver;
pub mod launch;
pub mod merge;
pub mod power_estimate;
pub mod probe;
pub mod procs;
pub mod report;
pub mod result;
pub mod run;
pub mod summary;
pub mod terminator_flags;
pub mod vectors;
pub mod workload;
