//! The PROXY protocol end to end with the load balancer users put in front: HAProxy in TCP
//! mode, sending v1 (`send-proxy`) and v2 (`send-proxy-v2`) headers to a listener that
//! trusts it. curl connects to HAProxy from 127.0.0.2, HAProxy to the proxy from 127.0.0.1,
//! so the client's own address (not the balancer's) must reach X-Forwarded-For, the access
//! log and the request. Connections from a source that is not trusted, and a trusted one
//! that sends no header, are refused before the handshake and counted.

use std::process::{Child, Command, Stdio};

use e2e::*;
use proxy::crypto::{CertAlgorithmName, ProviderName};

/// HAProxy relaying two frontends to `backend`, with v1 and v2 headers; killed on drop.
struct Haproxy {
    child: Child,
    v1: std::net::SocketAddr,
    v2: std::net::SocketAddr,
}

impl Haproxy {
    fn start(backend: std::net::SocketAddr) -> Self {
        let haproxy = system_tool("haproxy");
        let (v1, v2) = (free_loopback_addr(), free_loopback_addr());
        let dir = temp_dir("pp-haproxy");
        let config = dir.join("haproxy.cfg");
        std::fs::write(
            &config,
            format!(
                "global\n  maxconn 64\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n\
                 frontend v1\n  bind {v1}\n  default_backend v1\nbackend v1\n  server proxy {backend} send-proxy\n\
                 frontend v2\n  bind {v2}\n  default_backend v2\nbackend v2\n  server proxy {backend} send-proxy-v2\n"
            ),
        )
        .unwrap();
        let child = Command::new(haproxy)
            .args(["-db", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("haproxy.log")).unwrap())
            .spawn()
            .expect("haproxy");
        // Listening once a TCP connect goes through.
        eventually("haproxy listening", WAIT, || {
            std::net::TcpStream::connect(v2).map_err(|e| e.to_string())
        });
        Self { child, v1, v2 }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// curl from `source` to https://localhost:PORT/ of `addr`, verifying the test CA:
/// (exit status, body).
fn curl_from(source: &str, addr: std::net::SocketAddr, path: &str) -> (bool, String) {
    let out = Command::new(system_tool("curl"))
        .args(["-sS", "--max-time", "20", "--interface", source, "--cacert"])
        .arg(&certs().ca_cert)
        .args([
            "--resolve",
            &format!("localhost:{}:{}", addr.port(), addr.ip()),
        ])
        .arg(format!("https://localhost:{}{path}", addr.port()))
        .output()
        .expect("curl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn haproxy_v1_and_v2_headers_carry_the_client_address() {
    let upstream = EchoUpstream::start();
    let log = temp_dir("pp-access").join("access.log");
    let proxy = ProxyProcess::start(
        &upstream.url(),
        ProviderName::AwsLcRs,
        CertAlgorithmName::EcdsaP256,
        &[
            "--proxy-protocol-from",
            "127.0.0.1",
            "--access-log",
            log.to_str().unwrap(),
        ],
    );
    let haproxy = Haproxy::start(proxy.addr);
    for (version, front) in [("v1", haproxy.v1), ("v2", haproxy.v2)] {
        let (ok, body) = curl_from("127.0.0.2", front, "/echo");
        assert!(ok, "{version}: {body}");
        let echoed: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(
            echoed["headers"]["x-forwarded-for"], "127.0.0.2",
            "{version}: the balancer's address instead of the client's: {echoed}"
        );
    }
    // The access log names the client too, on both lines.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().count() >= 2 {
            for line in text.lines() {
                let record: serde_json::Value = serde_json::from_str(line).expect("JSON");
                let peer = record["peer"].as_str().unwrap();
                assert!(peer.starts_with("127.0.0.2:"), "not the client's: {line}");
            }
            break;
        }
        assert!(std::time::Instant::now() < deadline, "access log: {text}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }

    // Straight to the proxy: from an untrusted source, and from the trusted one with no
    // header (a TLS ClientHello first). Both refused before any handshake, and counted.
    let (ok, out) = curl_from("127.0.0.3", proxy.addr, "/echo");
    assert!(!ok, "an untrusted source was served: {out}");
    proxy.wait_metric(
        "proxy_connection_errors_total",
        &[("kind", "proxy_protocol_untrusted")],
        1.0,
    );
    let (ok, out) = curl_from("127.0.0.1", proxy.addr, "/echo");
    assert!(!ok, "a connection without a header was served: {out}");
    proxy.wait_metric(
        "proxy_connection_errors_total",
        &[("kind", "proxy_protocol_malformed")],
        1.0,
    );
    let text = proxy.metrics();
    assert_eq!(
        metric_sum(&text, "proxy_tls_handshakes_total", &[("outcome", "ok")]),
        2.0,
        "only the two balanced connections handshook:\n{text}"
    );
    let logged = proxy.log_text();
    assert!(
        logged.contains("127.0.0.3 is not a trusted source"),
        "{logged}"
    );
}
