//! The system tools the suite runs, each with the Debian package that installs it.
//!
//! `tests/run` installs every package of [`SYSTEM_TOOLS`] before it builds anything (the
//! architecture test checks that its list and this table agree). A test that runs one of
//! these tools asks [`system_tool`] for it first, so that under a plain `cargo test` on a
//! machine without the package the test fails at once with the line that installs it,
//! instead of with an `Os { code: 2 }` panic somewhere in its middle.

use std::path::PathBuf;

/// `(command, Debian package)` for every system tool a test runs.
pub const SYSTEM_TOOLS: &[(&str, &str)] = &[
    ("ab", "apache2-utils"),
    ("curl", "curl"),
    ("debootstrap", "debootstrap"),
    ("docker-compose", "docker-compose"),
    ("h2load", "nghttp2-client"),
    ("haproxy", "haproxy"),
    ("nginx", "nginx"),
    ("openssl", "openssl"),
    ("prometheus", "prometheus"),
    ("psql", "postgresql-15"),
    ("prometheus-node-exporter", "prometheus-node-exporter"),
    ("promtool", "prometheus"),
    ("ss", "iproute2"),
    ("valgrind", "valgrind"),
];

/// The path of `command`, searched on `PATH` and in the sbin folders (where Debian puts
/// nginx and HAProxy, outside a non-root `PATH`). Fails the calling test naming the
/// package to install when it is missing.
pub fn system_tool(command: &str) -> PathBuf {
    let package = SYSTEM_TOOLS
        .iter()
        .find(|(c, _)| *c == command)
        .map(|(_, p)| *p)
        .unwrap_or_else(|| {
            panic!("{command} is not in tests/common/prerequisites.rs: add it and its package")
        });
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin"].map(PathBuf::from))
        .map(|dir| dir.join(command))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{command} is not installed: `apt-get install {package}` \
                 (tests/run installs every package the suite needs)"
            )
        })
}

/// PostgreSQL's server programs (initdb, pg_ctl, postgres): Debian keeps them per major
/// version under /usr/lib/postgresql, off `PATH`; the newest installed is taken. Fails the
/// calling test naming the package to install when there is none.
pub fn postgres_bindir() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "PostgreSQL's server is not installed: `apt-get install postgresql-15` \
             (tests/run installs every package the suite needs)"
        )
    })
}
