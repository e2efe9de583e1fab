//! Real Prometheus and node_exporter servers (Debian's packages) on loopback.

#[allow(unused_imports)]
use super::*;

/// A real Prometheus server (Debian's `prometheus` package; `.ci/run` installs it) on
/// loopback, scraping the given targets every second into a temporary TSDB.
pub struct PrometheusServer {
    child: Child,
    pub addr: SocketAddr,
    log: PathBuf,
    /// The `Authorization` header line its queries need, when it asks for basic auth.
    authorization: Option<String>,
}

impl PrometheusServer {
    /// `targets` are `(job, host:port)` pairs scraped at `/metrics`.
    pub fn start(targets: &[(&str, SocketAddr)]) -> Self {
        Self::start_with_rules(targets, &[])
    }

    /// As [`Self::start`], also evaluating these rule files every second.
    pub fn start_with_rules(targets: &[(&str, SocketAddr)], rule_files: &[PathBuf]) -> Self {
        Self::start_full(targets, rule_files, None)
    }

    /// As [`Self::start`], requiring HTTP basic auth: `(user, password, bcrypt hash of it)`.
    pub fn start_with_basic_auth(targets: &[(&str, SocketAddr)], auth: (&str, &str, &str)) -> Self {
        Self::start_full(targets, &[], Some(auth))
    }

    fn start_full(
        targets: &[(&str, SocketAddr)],
        rule_files: &[PathBuf],
        basic_auth: Option<(&str, &str, &str)>,
    ) -> Self {
        let dir = temp_dir("prometheus");
        let mut config = String::from(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n",
        );
        if !rule_files.is_empty() {
            config.push_str("rule_files:\n");
        }
        for f in rule_files {
            config.push_str(&format!("  - '{}'\n", f.display()));
        }
        config.push_str("scrape_configs:\n");
        for (job, addr) in targets {
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: ['{addr}']\n"
            ));
        }
        std::fs::write(dir.join("prometheus.yml"), config).expect("write config");
        // Prometheus cannot report a port it chose, so take a free one and hand it over.
        let addr = free_loopback_addr();
        let log = dir.join("prometheus.log");
        let mut cmd = Command::new(system_tool("prometheus"));
        let authorization = basic_auth.map(|(user, password, hash)| {
            let web = dir.join("web.yml");
            std::fs::write(&web, format!("basic_auth_users:\n  {user}: '{hash}'\n"))
                .expect("write web config");
            cmd.arg(format!("--web.config.file={}", web.display()));
            use base64::Engine;
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            format!("Authorization: Basic {token}")
        });
        let child = cmd
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start `prometheus` ({e}): install Debian's prometheus package")
            });
        let mut server = Self {
            child,
            addr,
            log,
            authorization,
        };
        let deadline = Instant::now() + WAIT;
        while std::net::TcpStream::connect(addr).is_err() || server.get("/-/ready").0 != 200 {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("prometheus exited with {status}: {}", server.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready within {WAIT:?}: {}",
                server.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A GET with the credentials the server asks for.
    pub fn get(&self, path: &str) -> (u16, String) {
        let headers: Vec<&str> = self.authorization.iter().map(String::as_str).collect();
        http_raw(self.addr, "GET", path, &headers, "")
    }

    /// Evaluates an instant query; returns the HTTP status and the answer's JSON.
    pub fn query(&self, query: &str) -> (u16, serde_json::Value) {
        let encoded: String = query
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        let (status, body) = self.get(&format!("/api/v1/query?query={encoded}"));
        (
            status,
            serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
        )
    }

    /// Waits (bounded) until `query` returns at least one series, i.e. a scrape landed;
    /// returns the series.
    pub fn wait_for_series(&self, query: &str) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + WAIT;
        loop {
            let (status, v) = self.query(query);
            if let Some(series) = v["data"]["result"].as_array().filter(|r| !r.is_empty()) {
                return series.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no series for {query} within {WAIT:?}: {status} {v}\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real node_exporter (Debian's `prometheus-node-exporter`; `.ci/run` installs it) on
/// loopback, exporting this machine's CPU counters only.
pub struct NodeExporter {
    child: Child,
    pub addr: SocketAddr,
}

impl NodeExporter {
    pub fn start() -> Self {
        let addr = free_loopback_addr();
        let mut child = Command::new(system_tool("prometheus-node-exporter"))
            .arg(format!("--web.listen-address={addr}"))
            .args(["--collector.disable-defaults", "--collector.cpu"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start prometheus-node-exporter ({e}): install Debian's prometheus-node-exporter package")
            });
        let deadline = Instant::now() + WAIT;
        while std::net::TcpStream::connect(addr).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("prometheus-node-exporter exited with {status}");
            }
            assert!(Instant::now() < deadline, "node_exporter not listening");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, addr }
    }
}

impl Drop for NodeExporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
