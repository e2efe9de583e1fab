//! embedded-qdrant as the real upstream, plain HTTP helpers to talk to it, and vectors.

#[allow(unused_imports)]
use super::*;

/// A running `embedded-qdrant` process; killed on drop.
pub struct EmbeddedQdrant {
    process: loadgen::launch::Launched,
    /// REST address.
    pub rest: SocketAddr,
    /// gRPC address.
    pub grpc: SocketAddr,
    /// Its data folder.
    pub data: PathBuf,
    /// Where its stderr goes.
    pub log: PathBuf,
}

impl EmbeddedQdrant {
    /// Starts the server on loopback port 0 with `data` as its data folder.
    pub fn start(data: &Path) -> Self {
        Self::start_on(
            data,
            "127.0.0.1:0".parse().expect("address"),
            "127.0.0.1:0".parse().expect("address"),
        )
    }

    /// Starts the server on loopback port 0 with further flags (e.g. `--api-key`).
    pub fn start_with(data: &Path, extra: &[&str]) -> Self {
        let any: SocketAddr = "127.0.0.1:0".parse().expect("address");
        Self::spawn(data, any, any, extra)
    }

    /// Starts the server on these addresses (a restart on the ports it had).
    pub fn start_on(data: &Path, rest: SocketAddr, grpc: SocketAddr) -> Self {
        Self::spawn(data, rest, grpc, &[])
    }

    fn spawn(data: &Path, rest: SocketAddr, grpc: SocketAddr, extra: &[&str]) -> Self {
        let dir = temp_dir("eq-run");
        let log = dir.join("embedded-qdrant.log");
        let mut cmd = Command::new(binary("embedded-qdrant"));
        cmd.arg("--rest")
            .arg(rest.to_string())
            .arg("--grpc")
            .arg(grpc.to_string())
            .arg("--data")
            .arg(data)
            .args(extra);
        let process = loadgen::launch::Launched::start(cmd, "embedded-qdrant", &dir, WAIT)
            .unwrap_or_else(|e| {
                panic!("{e}\n{}", std::fs::read_to_string(&log).unwrap_or_default())
            });
        let address = |key: &str| -> SocketAddr {
            process.ready[key]
                .as_str()
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("no {key} address in {}", process.ready))
        };
        Self {
            rest: address("rest"),
            grpc: address("grpc"),
            data: data.to_owned(),
            log,
            process,
        }
    }

    /// SIGTERM, then waits (bounded) for a clean exit; returns the exit status.
    pub fn stop(mut self) -> ExitStatus {
        self.process.stop(WAIT).unwrap_or_else(|e| panic!("{e}"))
    }

    /// SIGKILL: a crash, with no chance to flush anything.
    pub fn kill(mut self) {
        let _ = self.process.child.kill();
        let _ = self.process.child.wait();
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// A plain HTTP/1.1 request with a JSON (or raw) body; returns status and parsed JSON
/// (`Value::Null` when the body is not JSON). Bounded in time.
pub fn http_json(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    let (status, body) = http_raw(addr, method, path, &[], body);
    (
        status,
        serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
    )
}

/// A plain HTTP/1.1 request on a fresh connection with extra header lines (`"Name: value"`);
/// returns status and body text. Bounded in time.
pub fn http_raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &str,
) -> (u16, String) {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect_timeout(&addr, WAIT).expect("connect");
    s.set_read_timeout(Some(WAIT)).ok();
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: test\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("read");
    let text = String::from_utf8_lossy(&out);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, body.to_owned())
}

/// Creates collection `name` of `dim`-dimensional cosine vectors over plain REST.
pub fn create_collection(rest: SocketAddr, name: &str, dim: usize) {
    let (code, v) = http_json(
        rest,
        "PUT",
        &format!("/collections/{name}"),
        &format!(r#"{{"vectors": {{"size": {dim}, "distance": "Cosine"}}}}"#),
    );
    assert_eq!(code, 200, "creating {name}: {v}");
}

/// The exact point count of collection `name`, over plain REST.
pub fn count_points(rest: SocketAddr, name: &str) -> u64 {
    let (code, v) = http_json(
        rest,
        "POST",
        &format!("/collections/{name}/points/count"),
        r#"{"exact": true}"#,
    );
    assert_eq!(code, 200, "counting {name}: {v}");
    v["result"]["count"].as_u64().expect("count")
}

/// `n` seeded pseudo-random unit vectors of `dim` dimensions (xorshift; reproducible).
pub fn unit_vectors(n: usize, dim: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut state = seed | 1;
    (0..n)
        .map(|_| {
            let mut v: Vec<f32> = (0..dim)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state % 20_001) as f32 / 10_000.0 - 1.0
                })
                .collect();
            let norm = v
                .iter()
                .map(|x| x * x)
                .sum::<f32>()
                .sqrt()
                .max(f32::MIN_POSITIVE);
            v.iter_mut().for_each(|x| *x /= norm);
            v
        })
        .collect()
}
