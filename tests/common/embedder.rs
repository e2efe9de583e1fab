//! The real embedding model the pipeline tests run as their first stage:
//! sentence-transformers/all-MiniLM-L6-v2 executed by OpenVINO on CPU, behind OVMS's
//! embeddings API (tests/embedder/server.py), installed into the cache by
//! tests/embedder/install.sh (which `.ci/run` runs first and this runs again, idempotently).

#[allow(unused_imports)]
use super::*;

/// The model's name as clients send it, and its dimension.
pub const REAL_MODEL: &str = "sentence-transformers/all-MiniLM-L6-v2";
pub const REAL_MODEL_DIM: usize = 384;

/// Where the installer put the virtualenv and the converted model.
pub struct EmbedderInstall {
    pub python: PathBuf,
    pub model_dir: PathBuf,
    pub home: PathBuf,
}

/// Installs (once per test binary) and returns the embedder's install.
pub fn embedder_install() -> EmbedderInstall {
    let dir = installed("tests/embedder/install.sh", "EMBEDDER_DIR", "embedder");
    EmbedderInstall {
        python: dir.join("venv/bin/python"),
        model_dir: dir.join("all-MiniLM-L6-v2-ov"),
        home: dir.join("home"),
    }
}

/// The virtualenv of an interop client (`qdrant-client` or `sslyze`).
pub fn interop_python(which: &str) -> PathBuf {
    installed("tests/interop/install.sh", "INTEROP_CLIENTS", "interop")
        .join(which)
        .join("bin/python")
}

/// A running tests/embedder/server.py on a loopback port; killed on drop.
pub struct RealEmbedder {
    pub addr: SocketAddr,
    child: Child,
}

impl RealEmbedder {
    /// Starts the server with at most `max_batch` texts per call, and waits until the model
    /// is compiled and its port answers.
    pub fn start(max_batch: usize) -> Self {
        let install = embedder_install();
        let log = temp_dir("embedder").join("server.log");
        let mut child = Command::new(&install.python)
            .arg(repo_root().join("tests/embedder/server.py"))
            .arg("--model-dir")
            .arg(&install.model_dir)
            .args(["--model-name", REAL_MODEL])
            .args(["--max-batch", &max_batch.to_string()])
            .env("HOME", &install.home)
            .env("HF_HUB_OFFLINE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("server log"))
            .spawn()
            .expect("start tests/embedder/server.py");
        // The first line names the port, once the model is compiled.
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_default();
        let Some(addr) = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.parse().ok())
        else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the embedding server did not start: {line:?}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        };
        Self { addr, child }
    }

    /// Its base URL (loadgen's --embeddings-url).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its process id (for --watch-pid embedder=PID).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Embeds `texts` with a direct call: (status, JSON answer).
    pub fn call(&self, model: &str, texts: &[&str]) -> (u16, serde_json::Value) {
        let body = serde_json::json!({ "model": model, "input": texts }).to_string();
        http_json(self.addr, "POST", "/v3/embeddings", &body)
    }

    /// The model's vectors for `texts`, in order.
    pub fn embed(&self, texts: &[&str]) -> Vec<Vec<f32>> {
        let (status, answer) = self.call(REAL_MODEL, texts);
        assert_eq!(status, 200, "{answer}");
        answer["data"]
            .as_array()
            .expect("data[]")
            .iter()
            .map(|d| {
                d["embedding"]
                    .as_array()
                    .expect("embedding")
                    .iter()
                    .map(|x| x.as_f64().expect("number") as f32)
                    .collect()
            })
            .collect()
    }
}

impl Drop for RealEmbedder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Cosine similarity.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (na * nb)
}
