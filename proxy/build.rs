//! Records the versions of the TLS libraries this build links, from the workspace's
//! Cargo.lock, for `proxy_build_info` (crates do not expose their own versions at run
//! time). A build without that file (a packaged crate) says `unknown`.

use std::path::Path;

fn main() {
    let lock =
        Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default()).join("../Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock.display());
    let text = std::fs::read_to_string(&lock).unwrap_or_default();
    for (krate, var) in [
        ("rustls", "PROXY_DEP_RUSTLS"),
        ("ring", "PROXY_DEP_RING"),
        ("aws-lc-rs", "PROXY_DEP_AWS_LC_RS"),
        ("rustls-openssl", "PROXY_DEP_RUSTLS_OPENSSL"),
    ] {
        println!(
            "cargo:rustc-env={var}={}",
            locked_version(&text, krate).unwrap_or("unknown")
        );
    }
}

/// The version Cargo.lock pins for `krate` (the highest, if it lists several).
fn locked_version<'a>(lock: &'a str, krate: &str) -> Option<&'a str> {
    let name_line = format!("name = \"{krate}\"");
    let mut lines = lock.lines();
    let mut best: Option<&str> = None;
    while let Some(line) = lines.next() {
        if line.trim() == name_line {
            let version = lines
                .next()
                .and_then(|v| v.trim().strip_prefix("version = \""))
                .and_then(|v| v.strip_suffix('"'));
            if let Some(v) = version {
                let newer = best.is_none_or(|b| numeric(v) > numeric(b));
                if newer {
                    best = Some(v);
                }
            }
        }
    }
    best
}

fn numeric(v: &str) -> Vec<u64> {
    v.split(['.', '-', '+'])
        .map(|p| p.parse().unwrap_or(0))
        .collect()
}
