//! The `embedded-qdrant` command line on its own: a data folder that cannot be created is a
//! clear error and a non-zero exit. (The APIs are tested end to end in the workspace's
//! tests/ folder against this binary.)

use std::process::Command;

#[test]
fn unusable_data_folder_is_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_embedded-qdrant"))
        .args([
            "--rest",
            "127.0.0.1:0",
            "--grpc",
            "127.0.0.1:0",
            "--data",
            "/proc/forbidden",
        ])
        .output()
        .expect("run embedded-qdrant");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/proc/forbidden"), "{err}");
}
