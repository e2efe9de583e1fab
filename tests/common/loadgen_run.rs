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

/// What `loadgen run` is pointed at in these tests: embedded-qdrant behind two proxies, REST
/// (aws-lc-rs, P-256, HTTP/1.1 to the upstream) and gRPC (ring, RSA-2048, h2c).
pub struct LoadgenStack {
    pub qdrant: EmbeddedQdrant,
    pub rest: ProxyProcess,
    pub grpc: ProxyProcess,
}

impl LoadgenStack {
    /// The stack at its defaults.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// The stack with further embedded-qdrant flags (e.g. `--api-key`).
    pub fn start_with(qdrant_flags: &[&str]) -> Self {
        let data = temp_dir("lg-data");
        let qdrant = EmbeddedQdrant::start_with(&data, qdrant_flags);
        let rest = ProxyProcess::start(
            &format!("http://{}", qdrant.rest),
            ProviderName::AwsLcRs,
            CertAlgorithmName::EcdsaP256,
            &[],
        );
        let grpc = ProxyProcess::start(
            &format!("http://{}", qdrant.grpc),
            ProviderName::Ring,
            CertAlgorithmName::Rsa2048,
            &["--upstream-protocol", "h2c"],
        );
        Self { qdrant, rest, grpc }
    }
}

/// The number at `path` in a result's JSON; panics naming the path when it is missing.
pub fn num(v: &serde_json::Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("{} missing in {v:#}", path.join(".")))
}
