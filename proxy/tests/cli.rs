//! The `proxy` command line on its own: `gen-certs` writes a usable certificate set.
//! (Forwarding, TLS and lifecycle are tested end to end in the workspace's tests/ folder.)

use std::process::Command;

#[test]
fn gen_certs_writes_ca_servers_and_client() {
    let out = std::env::temp_dir().join(format!("proxy-cli-gen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let status = Command::new(env!("CARGO_BIN_EXE_proxy"))
        .args(["gen-certs", "--out"])
        .arg(&out)
        .args([
            "--san",
            "qdrant.example",
            "--algorithms",
            "ecdsa-p256,rsa2048",
        ])
        .output()
        .expect("run proxy gen-certs");
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    for f in [
        "ca.crt",
        "ca.key",
        "ecdsa-p256.crt",
        "ecdsa-p256.key",
        "rsa2048.crt",
        "rsa2048.key",
        "client.crt",
        "client.key",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    assert!(
        !out.join("rsa4096.crt").exists(),
        "only the asked-for algorithms"
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(out.join("rsa2048.key"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o077, 0, "private keys are owner-only");
    std::fs::remove_dir_all(&out).unwrap();
}
