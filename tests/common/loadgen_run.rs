//! The `loadgen` binary under test.

#[allow(unused_imports)]
use super::*;

/// A finished `loadgen` process.
pub struct LoadgenRun {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// The `--out` JSON, when the run wrote one.
    pub result: Option<serde_json::Value>,
}

/// Runs `loadgen ARGS` to completion (killed after 5 minutes: every run in these tests is
/// bounded far below that). `out` is passed as `--out` when given and read back.
pub fn run_loadgen(args: &[String], out: Option<&Path>) -> LoadgenRun {
    let dir = temp_dir("loadgen");
    let stdout_path = dir.join("stdout");
    let stderr_path = dir.join("stderr");
    let mut cmd = Command::new(binary("loadgen"));
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr_path).expect("stderr file"));
    if let Some(out) = out {
        cmd.arg("--out").arg(out);
    }
    let mut child = cmd.spawn().expect("spawn loadgen");
    let status = wait_bounded(&mut child, Duration::from_secs(300), "loadgen");
    let result = out
        .and_then(|p| std::fs::read(p).ok())
        .map(|b| serde_json::from_slice(&b).expect("result JSON parses"));
    LoadgenRun {
        status,
        stdout: std::fs::read_to_string(stdout_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(stderr_path).unwrap_or_default(),
        result,
    }
}

/// Sets `flag` to `value` in an argument list: replaces an earlier occurrence, or adds it
/// before a `--` separator (so it stays the command's flag, not one of what follows).
pub fn set_flag(a: &mut Vec<String>, flag: &str, value: &str) {
    let sep = a.iter().position(|x| x == "--").unwrap_or(a.len());
    match a[..sep].iter().position(|x| x == flag) {
        Some(i) => a[i + 1] = value.to_owned(),
        None => {
            a.insert(sep, value.to_owned());
            a.insert(sep, flag.to_owned());
        }
    }
}

/// Owned argument list from string slices.
pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// The flags the `loadgen run` tests share: small vectors so they stay quick, the test CA.
pub fn base_args(target: &str, collection: &str) -> Vec<String> {
    let ca = certs().ca_cert.display().to_string();
    args(&[
        "run",
        "--target",
        target,
        "--ca",
        &ca,
        "--collection",
        collection,
        "--dim",
        "64",
        "--points-per-request",
        "20",
        "--concurrency",
        "2",
        "--warmup",
        "0s",
        "--quiet",
        "--power",
        "none",
    ])
}
