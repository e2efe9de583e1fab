//! Hardware readers against the file trees and HTTP answers in tests/fixtures: this machine
//! has no RAPL counters and no BMC, so these stand in for them (and say so).

use std::path::{Path, PathBuf};

use loadgen::probe::rapl::Rapl;
use loadgen::probe::redfish::{parse_power, Redfish};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dest = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), dest).unwrap();
        }
    }
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("loadgen-probes-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn rapl_sums_packages_only_and_survives_a_counter_wrap() {
    let root = scratch("rapl");
    copy_tree(&fixtures().join("rapl/two-packages"), &root);
    let mut rapl = Rapl::open(&root).expect("fixture opens");
    assert_eq!(rapl.domain_names(), vec!["package-0", "package-1"]);

    // Package 0 wraps: 262100000000 -> max (262143328850) -> 0 -> 57000000.
    std::fs::write(root.join("intel-rapl:0/energy_uj"), "57000000\n").unwrap();
    // Package 1 advances 2 J; its dram sub-zone moves too and must not be counted.
    std::fs::write(root.join("intel-rapl:1/energy_uj"), "3000000\n").unwrap();
    std::fs::write(
        root.join("intel-rapl:1/intel-rapl:1:0/energy_uj"),
        "9000000\n",
    )
    .unwrap();
    rapl.sample().unwrap();
    let expected_uj = (262_143_328_850u64 - 262_100_000_000) + 57_000_000 + 2_000_000;
    assert!(
        (rapl.joules() - expected_uj as f64 / 1e6).abs() < 1e-9,
        "{}",
        rapl.joules()
    );
    assert_eq!(rapl.wraps(), 1);

    // A second interval without a wrap adds plainly.
    std::fs::write(root.join("intel-rapl:0/energy_uj"), "60000000\n").unwrap();
    rapl.sample().unwrap();
    assert!((rapl.joules() - (expected_uj + 3_000_000) as f64 / 1e6).abs() < 1e-9);
    assert_eq!(rapl.wraps(), 1);
    std::fs::remove_dir_all(root).ok();
}

#[test]
fn rapl_absent_or_without_packages_is_a_reason_not_a_number() {
    let err = Rapl::open(Path::new("/nonexistent/powercap"))
        .err()
        .expect("absent");
    assert!(err.contains("no RAPL powercap tree"), "{err}");
    let err = Rapl::open(&fixtures().join("rapl/psys-only"))
        .err()
        .expect("no package");
    assert!(err.contains("package"), "{err}");
    let root = scratch("rapl-bad");
    copy_tree(&fixtures().join("rapl/two-packages"), &root);
    std::fs::write(root.join("intel-rapl:1/energy_uj"), "not a number\n").unwrap();
    let err = Rapl::open(&root).err().expect("garbage counter");
    assert!(err.contains("not a counter"), "{err}");
    std::fs::remove_dir_all(root).ok();
}

/// Serves `body` with HTTP/1.1 to `accepts` connections, 401 unless the request carries
/// basic auth root:calvin (iDRAC's factory credentials).
async fn serve_redfish(
    body: Vec<u8>,
    accepts: usize,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        for _ in 0..accepts {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let n = s.read(&mut buf).await.unwrap();
            let head = String::from_utf8_lossy(&buf[..n]).to_string();
            let resp = if head.contains("Basic cm9vdDpjYWx2aW4=") {
                let mut r = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                )
                .into_bytes();
                r.extend_from_slice(&body);
                r
            } else {
                b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    .to_vec()
            };
            s.write_all(&resp).await.unwrap();
            s.shutdown().await.ok();
        }
    });
    (addr, server)
}

#[test]
fn redfish_reads_power_consumed_watts_from_a_served_answer() {
    let body = std::fs::read(fixtures().join("redfish/idrac9-power.json")).unwrap();
    assert_eq!(parse_power(&body).unwrap(), 612.0);
    assert!(parse_power(br#"{"PowerControl":[]}"#).is_err());
    assert!(parse_power(b"<html>").is_err());

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let (addr, server) = serve_redfish(body, 2).await;
        let url = format!("http://{addr}/redfish/v1/Chassis/System.Embedded.1/Power");
        let good = Redfish::new(&url, Some("root"), Some("calvin"), None);
        assert_eq!(good.watts().await.unwrap(), 612.0);
        let bad = Redfish::new(&url, Some("root"), Some("wrong"), None);
        let err = format!("{:#}", bad.watts().await.unwrap_err());
        assert!(err.contains("401"), "{err}");
        server.await.unwrap();
    });
}
