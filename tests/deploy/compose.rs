//! deploy/compose started the way an operator starts it, in Docker Engine with
//! docker-compose, from images built on this machine: the shipped compose file, with only
//! the images that cannot be pulled here replaced through its variables (Qdrant by
//! embedded-qdrant under Qdrant's image contract, Prometheus by Debian's package, OVMS by
//! the tests' real embedding model run by OpenVINO behind OVMS's API and flags) and the
//! published ports moved to free ones. node_exporter and Grafana have no stand-in and are
//! not started.
//!
//! Up from nothing; the official Python client over REST and gRPC with TLS verified
//! against the stack's CA and the API key; the bench profile's loadgen embedding the corpus
//! through OVMS and keeping it busy beside ingestion; `loadgen run` through it while Qdrant is
//! restarted and then the proxy (SIGTERM, drain), with every acknowledged point stored;
//! Prometheus scraping the proxy with the shipped rules loaded; `down -v` leaving nothing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::*;

/// A file from one of the project's volumes, read through a throwaway container.
fn volume_file(images: &TestImages, volume: &str, path: &str) -> String {
    run_ok(
        Command::new("docker")
            .args(["run", "--rm", "--network", "none", "--entrypoint", "cat"])
            .args(["-v", &format!("{volume}:/v:ro"), &images.proxy])
            .arg(format!("/v/{path}")),
        &format!("reading {path} from {volume}"),
    )
}

fn wait_healthy(container: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let status = run_ok(
            Command::new("docker").args(["inspect", "-f", "{{.State.Health.Status}}", container]),
            "docker inspect",
        );
        if status.trim() == "healthy" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{container} not healthy within {limit:?}: {status}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `curl` against the stack: the HTTP status of GET `url` with `headers`.
fn curl_status(ca: &Path, url: &str, headers: &[&str]) -> String {
    let mut cmd = Command::new(system_tool("curl"));
    cmd.args([
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--max-time",
        "10",
    ])
    .arg("--cacert")
    .arg(ca);
    for h in headers {
        cmd.args(["-H", h]);
    }
    cmd.arg(url);
    String::from_utf8_lossy(&cmd.output().expect("curl").stdout).into_owned()
}

/// The official Python qdrant-client's call list (tests/interop) against the stack.
fn python_client_calls(rest: u16, grpc: u16, ca: &Path, key: &str, prefer_grpc: bool) {
    let dir = std::env::var_os("INTEROP_CLIENTS").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                .join(".cache/vector-tls-proxy/interop")
        },
        PathBuf::from,
    );
    run_ok(
        Command::new(repo_root().join("tests/interop/install.sh")).env("INTEROP_CLIENTS", &dir),
        "tests/interop/install.sh",
    );
    let mut cmd = Command::new(dir.join("qdrant-client/bin/python"));
    cmd.arg(repo_root().join("tests/interop/qdrant_client_calls.py"))
        .args(["--host", "localhost", "--rest-port", &rest.to_string()])
        .args(["--grpc-port", &grpc.to_string(), "--api-key", key])
        .arg("--ca")
        .arg(ca);
    if prefer_grpc {
        cmd.arg("--prefer-grpc");
    }
    let out = run_ok(
        &mut cmd,
        "the official Python client through the compose stack",
    );
    let last = out.lines().last().unwrap_or_default();
    assert!(last.ends_with(" 0 failed"), "{out}");
    eprintln!("python qdrant-client (prefer_grpc={prefer_grpc}): {last}");
}

/// The acknowledged-point check of a loadgen result: (count after - before, acknowledged).
fn count_check(result: &serde_json::Value) -> (u64, u64) {
    fn find(v: &serde_json::Value) -> Option<&serde_json::Value> {
        if v.get("points_acknowledged").is_some() {
            return Some(v);
        }
        v.as_object()?.values().find_map(find)
    }
    let v = find(&result["verification"])
        .unwrap_or_else(|| panic!("no count check: {}", result["verification"]));
    let n = |k: &str| v[k].as_u64().expect(k);
    (
        n("count_after") - n("count_before"),
        n("points_acknowledged"),
    )
}

#[test]
fn compose_stack_comes_up_serves_survives_restarts_and_leaves_nothing() {
    if !containers_available("compose") {
        return;
    }
    let images = test_images();
    let (rest, grpc, prom) = (free_port(), free_port(), free_port());
    let project = ComposeProject::new(
        "vtp-compose",
        &[repo_root().join("deploy/compose/compose.yaml")],
        &[
            ("QDRANT_IMAGE", images.qdrant.clone()),
            ("PROXY_IMAGE", images.proxy.clone()),
            ("TOOLS_IMAGE", images.tools.clone()),
            ("PROMETHEUS_IMAGE", images.prometheus.clone()),
            ("PROXY_REST_PORT", rest.to_string()),
            ("PROXY_GRPC_PORT", grpc.to_string()),
            ("PROMETHEUS_PORT", prom.to_string()),
            // OVMS's stand-in runs the tests' real model under the shipped file's flags.
            ("OVMS_IMAGE", ovms_stand_in_image().to_owned()),
            ("EMBEDDING_MODEL", REAL_MODEL.to_owned()),
            ("EMBEDDING_POOLING", "MEAN".to_owned()),
        ],
    );
    let started = Instant::now();
    project.ok(&["up", "-d", "--no-build", "proxy", "qdrant"]);
    // Prometheus without node_exporter, which has no stand-in here.
    project.ok(&["up", "-d", "--no-build", "--no-deps", "prometheus"]);
    let proxy = project.container("proxy");
    wait_healthy(&proxy, Duration::from_secs(90));
    eprintln!("compose up to a healthy proxy: {:?}", started.elapsed());

    // The containers as shipped: non-root, read-only, no capabilities.
    let security = run_ok(
        Command::new("docker").args([
            "inspect",
            "-f",
            "{{.Config.User}} {{.HostConfig.ReadonlyRootfs}} {{.HostConfig.CapDrop}}",
            &proxy,
        ]),
        "docker inspect",
    );
    assert_eq!(security.trim(), "10001:10001 true [ALL]", "{security}");

    let dir = temp_dir("compose");
    let (ca, key, key_file) = secrets_of_the_stack(images, &project, &dir);

    tls_and_api_key_through_the_proxy(&project, (rest, grpc), &ca, &key);

    the_pipeline_runs_beside_ingestion(&project);

    faults_lose_no_acknowledged_point(&project, &proxy, grpc, &dir, (&ca, &key_file));

    prometheus_scrapes_the_proxy(&project, prom);
    project.down();
}

/// The stack's CA and Qdrant API key, read from its volumes into `dir`: (CA file, key,
/// key file).
fn secrets_of_the_stack(
    images: &TestImages,
    project: &ComposeProject,
    dir: &Path,
) -> (PathBuf, String, PathBuf) {
    let ca = dir.join("ca.crt");
    std::fs::write(
        &ca,
        volume_file(images, &format!("{}_certs", project.name), "ca.crt"),
    )
    .unwrap();
    let key = volume_file(
        images,
        &format!("{}_secrets", project.name),
        "qdrant-api-key",
    );
    assert_eq!(key.len(), 64, "a 32-byte hex API key");
    let key_file = dir.join("api-key");
    std::fs::write(&key_file, &key).unwrap();
    (ca, key, key_file)
}

/// TLS verified against the stack's CA; Qdrant's API key required through the proxy; the
/// official Python client over REST and gRPC.
fn tls_and_api_key_through_the_proxy(
    project: &ComposeProject,
    (rest, grpc): (u16, u16),
    ca: &Path,
    key: &str,
) {
    // TLS verified against the stack's CA; Qdrant's API key required through the proxy.
    let collections = format!("https://localhost:{rest}/collections");
    let with_key = format!("api-key: {key}");
    assert_eq!(
        curl_status(ca, &collections, &[]),
        "401",
        "{}",
        project.logs()
    );
    assert_eq!(
        curl_status(ca, &collections, &[&with_key]),
        "200",
        "{}",
        project.logs()
    );

    python_client_calls(rest, grpc, ca, key, false);
    python_client_calls(rest, grpc, ca, key, true);
}

/// The pipeline's first stage in the stack: OVMS embeds the corpus the bench profile
/// mounts, then stays busy beside ingestion (closed loop, as the bench profile runs it)
/// while loadgen, on the stack's own network, writes through the proxy.
fn the_pipeline_runs_beside_ingestion(project: &ComposeProject) {
    // The pipeline's first stage in the stack: OVMS embeds the corpus the bench profile
    // mounts, then stays busy beside ingestion (closed loop, as the bench profile runs it)
    // while loadgen, on the stack's own network, writes through the proxy.
    project.ok(&["up", "-d", "--no-build", "--no-deps", "ovms"]);
    let ovms = project.container("ovms");
    let waited = Instant::now();
    while !project.ok(&["logs", "ovms"]).contains("listening on") {
        assert!(
            waited.elapsed() < Duration::from_secs(120),
            "OVMS's stand-in did not start: {}",
            project.ok(&["logs", "ovms"])
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let user = run_ok(
        Command::new("docker").args(["inspect", "-f", "{{.Config.User}}", &ovms]),
        "docker inspect ovms",
    );
    assert_eq!(user.trim(), "5000:5000", "as OVMS's image runs");
    let live = project
        .command(&[
            "--profile",
            "bench",
            "run",
            "--rm",
            "-T",
            "--no-deps",
            "loadgen",
            "run",
            "--target",
            "proxy:6334",
            "--protocol",
            "grpc",
            "--ca",
            "/etc/vector-tls-proxy/certs/ca.crt",
            "--api-key-file",
            "/run/secrets/vector-tls-proxy/qdrant-api-key",
            "--collection",
            "pipeline",
            "--recreate",
            "--vectors",
            "embeddings",
            "--embeddings-url",
            "http://ovms:8000",
            "--embeddings-model",
            REAL_MODEL,
            "--corpus",
            "/corpus",
            "--vectors-file",
            "/tmp/vectors.bin",
            // all-MiniLM-L6-v2 takes 512 tokens: 1,000 characters of the README's Markdown
            // came to 514, which the server refuses as OVMS does.
            "--chunk-chars",
            "600",
            "--embed-concurrency",
            "2",
            "--embed-batch",
            "8",
            "--concurrency",
            "2",
            "--warmup",
            "1s",
            "--duration",
            "5s",
            "--power",
            "none",
        ])
        .output()
        .expect("docker-compose run loadgen");
    let ran = live.status.success();
    // The summary on stdout, the vectors' source on stderr.
    let live = format!(
        "{}{}",
        String::from_utf8_lossy(&live.stdout),
        String::from_utf8_lossy(&live.stderr)
    );
    eprintln!("loadgen with OVMS live in compose:\n{live}");
    assert!(ran, "loadgen with OVMS live: {live}");
    assert!(
        live.contains(&format!(
            "x {REAL_MODEL_DIM}-d from embeddings(http://ovms:8000"
        )),
        "the corpus embedded by the model in the stack: {live}"
    );
    let embedded = live
        .lines()
        .find(|l| l.starts_with("co-located embeddings (closed loop, 2 in flight"))
        .unwrap_or_else(|| panic!("the live first stage in the summary: {live}"));
    assert!(
        embedded.contains(", 0 failed") && !embedded.contains(" 0 calls ok"),
        "{embedded}"
    );
    assert!(
        live.contains("points: match"),
        "every acknowledged point stored: {live}"
    );
    // Its cores back for the fault run below.
    project.ok(&["stop", "ovms"]);
}

/// loadgen through the stack over gRPC for 24 s: Qdrant restarted at 5 s, the proxy at
/// 14 s (SIGTERM: it drains, then Docker starts it again); no acknowledged point lost, and
/// failures only inside the faults.
fn faults_lose_no_acknowledged_point(
    project: &ComposeProject,
    proxy: &str,
    grpc: u16,
    dir: &Path,
    (ca, key_file): (&Path, &Path),
) {
    // loadgen through the stack over gRPC for 24 s: Qdrant restarted at 5 s, the proxy
    // at 14 s (SIGTERM: it drains, then Docker starts it again).
    let out = dir.join("run.json");
    let mut loadgen = Command::new(binary("loadgen"));
    loadgen
        .args([
            "run",
            "--target",
            &format!("localhost:{grpc}"),
            "--protocol",
            "grpc",
        ])
        .arg("--ca")
        .arg(ca)
        .arg("--api-key-file")
        .arg(key_file)
        .args([
            "--collection",
            "compose-faults",
            "--recreate",
            "--dim",
            "64",
        ])
        .args([
            "--points-per-request",
            "20",
            "--concurrency",
            "2",
            "--duration",
            "24s",
        ])
        .args([
            "--warmup",
            "0s",
            "--power",
            "none",
            "--quiet",
            "--request-timeout",
            "10s",
        ])
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = loadgen.spawn().expect("loadgen");
    std::thread::sleep(Duration::from_secs(5));
    let qdrant = project.container("qdrant");
    run_ok(
        Command::new("docker").args(["restart", "-t", "10", &qdrant]),
        "restart qdrant",
    );
    std::thread::sleep(Duration::from_secs(6));
    run_ok(
        Command::new("docker").args(["restart", "-t", "30", proxy]),
        "restart the proxy",
    );
    let status = wait_bounded(
        &mut child,
        Duration::from_secs(120),
        "loadgen through compose",
    );
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        status.success() || out.exists(),
        "loadgen: {status}\n{stderr}"
    );
    let result: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("loadgen result")).unwrap();
    let (stored, acknowledged) = count_check(&result);
    eprintln!(
        "loadgen through compose with Qdrant and the proxy restarted: {} requests acknowledged, {} failed {}, {stored} points stored of {acknowledged} acknowledged",
        result["requests_ok"], result["requests_failed"], result["failures"]
    );
    assert!(result["requests_ok"].as_u64().unwrap() > 0);
    assert_eq!(
        stored, acknowledged,
        "acknowledged points lost (or unacknowledged ones stored)"
    );
    // Failures only inside the faults: none in the first 4 s (before Qdrant's restart),
    // none in the last 3 s (after the proxy is back), as loadgen's timeline shows.
    let timeline = result["timeline"].as_array().expect("a timeline");
    let first = timeline[0]["at_unix_s"].as_u64().unwrap();
    let failed_at: Vec<u64> = timeline
        .iter()
        .filter(|s| s["failed"].as_u64().unwrap() > 0)
        .map(|s| s["at_unix_s"].as_u64().unwrap() - first)
        .collect();
    let last = timeline.last().unwrap()["at_unix_s"].as_u64().unwrap() - first;
    eprintln!("seconds with failures (from the start): {failed_at:?} of 0-{last}");
    assert!(
        failed_at.iter().all(|s| *s >= 4 && *s + 3 <= last),
        "failures outside the faults: {failed_at:?} of 0-{last}"
    );
}

/// Prometheus scrapes the proxy (TLS, verified with the stack's CA) with the rules loaded.
fn prometheus_scrapes_the_proxy(project: &ComposeProject, prom: u16) {
    // Prometheus scrapes the proxy (TLS, verified with the stack's CA) with the rules loaded.
    let deadline = Instant::now() + Duration::from_secs(60);
    let prom_url = format!("http://127.0.0.1:{prom}");
    loop {
        let (_, targets) = plain_get(
            format!("127.0.0.1:{prom}").parse().unwrap(),
            "/api/v1/targets",
        );
        let up = serde_json::from_str::<serde_json::Value>(&targets)
            .ok()
            .and_then(|t| {
                t["data"]["activeTargets"].as_array().map(|list| {
                    list.iter()
                        .any(|t| t["labels"]["job"] == "vector-tls-proxy" && t["health"] == "up")
                })
            })
            .unwrap_or(false);
        if up {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus ({prom_url}) never scraped the proxy: {targets}\n{}",
            project.logs()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let (_, rules) = plain_get(
        format!("127.0.0.1:{prom}").parse().unwrap(),
        "/api/v1/rules",
    );
    assert!(
        rules.contains(r#""type":"alerting""#),
        "no alerting rules loaded: {rules}"
    );
}
