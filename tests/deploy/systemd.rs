//! What an operator installs, installed: the Debian package and its SBOMs and checksums
//! built by `deploy/package/build.sh`, then the README's quick start, command for command,
//! in a container booted with a real systemd (the local Debian base with systemd as PID 1).
//! Qdrant's binary is a test double: embedded-qdrant installed as `/usr/bin/qdrant` (no
//! Qdrant package can be fetched here), under the unit the package ships for it.
//!
//! Checked: dpkg puts every file where the unit expects it and creates the user; both
//! units start; TLS and the API key work through the proxy; `systemctl reload` refuses a
//! broken file while the old configuration keeps serving; a file access log works under
//! `ProtectSystem=strict`; `systemd-analyze security` rates the proxy's unit.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::*;

/// The shell blocks of the README's quick start, in order.
pub(crate) fn quick_start_blocks() -> Vec<String> {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let start = readme.find("## Quick start").expect("a quick start");
    let end = start + readme[start..].find("Check it").expect("its check");
    readme[start..end]
        .split("```sh\n")
        .skip(1)
        .map(|b| b.split("```").next().expect("a closed block").to_owned())
        .collect()
}

/// The names of an SBOM's components.
fn sbom_components(path: &Path) -> Vec<String> {
    let sbom: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).expect("an SBOM")).expect("JSON");
    assert_eq!(sbom["bomFormat"], "CycloneDX", "{}", path.display());
    sbom["components"]
        .as_array()
        .expect("components")
        .iter()
        .map(|c| c["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The package built as the README's first block builds it (from this test build's binary),
/// its checksums verified, and what each artifact's SBOM says it links: the proxy's graph
/// has rustls and its providers and none of Qdrant's engine; the tools' has the engine.
/// Returns the folder of the artifacts.
fn package_with_its_sboms() -> PathBuf {
    let dist = temp_dir("dist");
    let listing = run_ok(
        Command::new(repo_root().join("deploy/package/build.sh"))
            .env("CARGO_TARGET_DIR", target_dir())
            .args(["--profile", "dev", "--no-build", "--out"])
            .arg(&dist),
        "deploy/package/build.sh",
    );
    eprintln!("artifacts (bytes, name):\n{listing}");
    run_ok(
        Command::new("sha256sum")
            .args(["-c", "SHA256SUMS"])
            .current_dir(&dist),
        "sha256sum -c SHA256SUMS",
    );
    let sums = std::fs::read_to_string(dist.join("SHA256SUMS")).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    let deb = format!("vector-tls-proxy_{version}-1_amd64.deb");
    for file in [
        deb.clone(),
        format!("{deb}.cdx.json"),
        format!("vector-tls-proxy_{version}.image.cdx.json"),
        format!("vector-tls-proxy-tools_{version}.image.cdx.json"),
    ] {
        assert!(
            sums.contains(&format!("  {file}\n")),
            "{file} not in SHA256SUMS:\n{sums}"
        );
    }
    // What each artifact links: the proxy's graph has rustls and its providers and none of
    // Qdrant's engine; the tools' has the engine.
    let proxy_sbom = sbom_components(&dist.join(format!("{deb}.cdx.json")));
    for name in [
        "rustls",
        "aws-lc-rs",
        "ring",
        "rustls-openssl",
        "hyper",
        "h2",
    ] {
        assert!(
            proxy_sbom.iter().any(|c| c == name),
            "{name} missing from the proxy's SBOM"
        );
    }
    assert!(!proxy_sbom.iter().any(|c| c == "qdrant-edge"));
    let tools_sbom =
        sbom_components(&dist.join(format!("vector-tls-proxy-tools_{version}.image.cdx.json")));
    assert!(tools_sbom.iter().any(|c| c == "qdrant-edge"));
    dist
}

#[test]
fn the_package_installs_and_the_quick_start_runs_under_systemd() {
    if !containers_available("systemd") {
        return;
    }
    let images = test_images();

    // The README's first block builds the package for a release; here it packages this
    // test build's binary.
    let blocks = quick_start_blocks();
    assert_eq!(blocks.len(), 4, "{blocks:?}");
    assert_eq!(blocks[0].trim(), "deploy/package/build.sh --out dist");
    let dist = package_with_its_sboms();

    let qdrant_double = binary("embedded-qdrant");
    let sd = SystemdContainer::boot(
        &images.systemd_base,
        &[
            (&dist, "/root/dist"),
            (qdrant_double.as_path(), "/usr/local/lib/qdrant-test-double"),
        ],
    );
    // As if Qdrant's own package were installed.
    sd.sh("install -m 755 /usr/local/lib/qdrant-test-double /usr/bin/qdrant");
    // The README's commands, as root (its `sudo` is the identity here).
    for block in &blocks[1..] {
        sd.sh(&format!("sudo() {{ \"$@\"; }}\nset -euo pipefail\n{block}"));
    }
    // dpkg put every file where the unit expects it, and made the user.
    sd.sh("test -x /usr/bin/proxy && test -f /lib/systemd/system/vector-tls-proxy.service \
           && test -f /etc/vector-tls-proxy/proxy.toml && getent passwd vector-tls-proxy \
           && grep -qx /etc/vector-tls-proxy/proxy.toml /var/lib/dpkg/info/vector-tls-proxy.conffiles \
           && test \"$(stat -c %G:%a /etc/vector-tls-proxy/certs)\" = vector-tls-proxy:750");

    let deadline = Instant::now() + WAIT;
    while sd.try_sh("curl -fsS http://127.0.0.1:9900/readyz").0 != 0 {
        assert!(
            Instant::now() < deadline,
            "the proxy is not ready: {}",
            sd.try_sh(
                "systemctl status --no-pager vector-tls-proxy qdrant; journalctl --no-pager -n 40"
            )
            .1
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(
        sd.sh("systemctl is-active qdrant vector-tls-proxy")
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["active", "active"]
    );
    let key = "KEY=$(sed -n 's/^QDRANT__SERVICE__API_KEY=//p' /etc/qdrant/api-key.env)";
    let status = |with_key: bool| {
        let header = if with_key { "-H \"api-key: $KEY\"" } else { "" };
        sd.sh(&format!(
            "{key}; curl -s -o /dev/null -w '%{{http_code}}' --cacert /etc/vector-tls-proxy/certs/ca.crt {header} https://localhost:6333/collections"
        ))
    };
    assert_eq!(status(false), "401");
    assert_eq!(status(true), "200");
    // gRPC through the other listener (grpc.health.v1 needs no key, as in Qdrant).
    sd.sh("test \"$(systemctl show -p MainPID --value qdrant)\" != 0");

    // A broken file: the reload fails, and the running configuration keeps serving.
    sd.sh("cp /etc/vector-tls-proxy/proxy.toml /root/proxy.toml.good \
           && echo 'listener = 7' >> /etc/vector-tls-proxy/proxy.toml");
    let (code, text) = sd.try_sh("systemctl reload vector-tls-proxy");
    assert_ne!(code, 0, "a broken file was reloaded: {text}");
    assert_eq!(
        sd.sh("systemctl is-active vector-tls-proxy").trim(),
        "active"
    );
    assert_eq!(status(true), "200");
    sd.sh("cp /root/proxy.toml.good /etc/vector-tls-proxy/proxy.toml && systemctl reload vector-tls-proxy");

    // A file access log under ProtectSystem=strict, in the unit's LogsDirectory.
    sd.sh("printf '\\n[access_log]\\ntarget = \"/var/log/vector-tls-proxy/access.log\"\\n' >> /etc/vector-tls-proxy/proxy.toml \
           && proxy check-config /etc/vector-tls-proxy/proxy.toml >/dev/null && systemctl restart vector-tls-proxy");
    let deadline = Instant::now() + WAIT;
    while sd.try_sh("curl -fsS http://127.0.0.1:9900/readyz").0 != 0 {
        assert!(Instant::now() < deadline, "not ready after the restart");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(status(true), "200");
    let log = sd.sh("sleep 1; cat /var/log/vector-tls-proxy/access.log");
    assert!(log.contains("/collections"), "no access log line: {log}");

    // How systemd rates the unit's exposure (0 is the least, 10 the most).
    let rating = sd.sh("systemd-analyze security --no-pager vector-tls-proxy.service | tail -n 1");
    eprintln!("systemd-analyze security: {}", rating.trim());
    let exposure: f64 = rating
        .split("service:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no rating in {rating}"));
    assert!(exposure <= 2.0, "exposure {exposure}: {rating}");

    // Stopping drains and exits cleanly.
    sd.sh("systemctl stop vector-tls-proxy && test \"$(systemctl show -p Result --value vector-tls-proxy)\" = success");
}
