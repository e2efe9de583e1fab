//! A multi-node topology on a private container network, each node with its own address:
//! an L4 balancer (HAProxy, PROXY protocol v2, health checks) in front of two proxies, in
//! front of three database nodes, driven by two load generators started together whose
//! results `loadgen merge` combines. Faults during the run: a database node killed, another
//! cut off from the network and reconnected, one proxy rolled (SIGTERM, then a new
//! container), a SIGHUP reload of the other.
//!
//! The database nodes are embedded-qdrant under Qdrant's image contract (a test double: no
//! Qdrant image can be pulled here), each a store of its own, not a cluster: the proxies
//! balance every request over the three, so the stored points are the sum of the three
//! nodes' counts, read directly from each at the end. Checked: every acknowledged point is
//! stored, points stored beyond them are no more than the failed requests carried (an
//! answer lost in a fault does not undo the write), and failures fall only inside the
//! faults, as the merged timeline shows.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use e2e::*;

/// The run's length and when each fault starts, in seconds from the load generators'
/// common start.
const RUN_SECONDS: u64 = 32;
const KILL_DB1_AT: u64 = 6;
const CUT_DB2_AT: u64 = 10;
const RECONNECT_DB2_AT: u64 = 15;
const ROLL_PROXY1_AT: u64 = 18;
const RELOAD_PROXY2_AT: u64 = 25;

fn docker(args: &[&str]) -> String {
    run_ok(
        Command::new("docker").args(args),
        &format!("docker {}", args.join(" ")),
    )
}

/// The containers, volumes and network of one run, all removed when dropped.
struct Topology {
    net: String,
    /// The logs of containers removed during the run (the rolled proxy), for a failure.
    removed_logs: std::cell::RefCell<Vec<String>>,
}

impl Topology {
    fn name(&self, node: &str) -> String {
        format!("{}-{node}", self.net)
    }

    /// `docker run -d` of `image` as `node` on the network (reachable by that name).
    fn run(&self, node: &str, flags: &[&str], image: &str, args: &[&str]) {
        let name = self.name(node);
        let mut all = vec!["run", "-d", "--name", &name, "--network", &self.net];
        all.extend(["--network-alias", node]);
        all.extend(flags);
        all.push(image);
        all.extend(args);
        docker(&all);
    }

    /// Runs `script` with sh in `node`; its output.
    fn exec(&self, node: &str, script: &str) -> String {
        docker(&["exec", &self.name(node), "sh", "-c", script])
    }
}

impl Topology {
    /// `Ok` once `url` answers 2xx inside `node` (curl in the container), for `eventually`.
    fn ready(&self, node: &str, url: &str) -> Result<(), String> {
        Command::new("docker")
            .args(["exec", &self.name(node), "curl", "-fsS", url])
            .output()
            .is_ok_and(|o| o.status.success())
            .then_some(())
            .ok_or_else(|| format!("{url} does not answer yet"))
    }
}

impl Topology {
    /// Keeps the last lines of `node`'s log before its container is removed.
    fn save_log(&self, node: &str) {
        let log = self.log_tail(node, "before it was removed");
        self.removed_logs.borrow_mut().push(log);
    }

    /// The last lines of `node`'s log, headed by its name and `when`.
    fn log_tail(&self, node: &str, when: &str) -> String {
        let text = Command::new("docker")
            .args(["logs", "--tail", "60", &self.name(node)])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout).into_owned()
                    + &String::from_utf8_lossy(&o.stderr)
            })
            .unwrap_or_else(|e| format!("docker logs: {e}"));
        format!("--- {node}'s log {when}, last lines:\n{text}")
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        // A failed run shows what the proxies and the balancer saw: the fault that
        // explains a failure outside the windows is in their logs, gone with the containers.
        if std::thread::panicking() {
            for log in self.removed_logs.borrow().iter() {
                eprintln!("{log}");
            }
            for node in ["proxy1", "proxy2", "balancer"] {
                eprintln!("{}", self.log_tail(node, "at the end"));
            }
        }
        let label = format!("name={}-", self.net);
        let ids = Command::new("docker")
            .args(["ps", "-aq", "--filter", &label])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for id in ids.split_whitespace() {
            let _ = Command::new("docker").args(["rm", "-f", "-v", id]).output();
        }
        for i in 1..=3 {
            let _ = Command::new("docker")
                .args(["volume", "rm", "-f", &format!("{}-db{i}", self.net)])
                .output();
        }
        let _ = Command::new("docker")
            .args(["network", "rm", &self.net])
            .output();
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_balanced_topology_keeps_every_acknowledged_point_through_node_and_proxy_faults() {
    if !containers_available("topology") {
        return;
    }
    let images = test_images();
    let topo = Topology {
        net: format!("vtp-topo-{}", std::process::id()),
        removed_logs: Default::default(),
    };
    docker(&["network", "create", &topo.net]);
    let subnet = docker(&[
        "network",
        "inspect",
        "-f",
        "{{(index .IPAM.Config 0).Subnet}}",
        &topo.net,
    ])
    .trim()
    .to_owned();
    let dir = temp_dir("topology");
    let (certs, results) = certificates_and_results(&dir);
    // Three database nodes, each with its storage on a volume (a killed node's points are
    // counted once it is back).
    for i in 1..=3 {
        let volume = format!("{}-db{i}:/qdrant/storage", topo.net);
        topo.run(&format!("db{i}"), &["-v", &volume], &images.qdrant, &[]);
    }
    let proxies = Proxies {
        certs: certs.clone(),
        config: proxy_config(&dir, &subnet),
    };
    for p in ["proxy1", "proxy2"] {
        proxies.start(&topo, images, p);
    }
    start_the_balancer(&topo, images, &dir);
    wait_until_ready(&topo);
    let start = start_two_load_generators(&topo, images, &certs, &results);
    inject_the_faults(&topo, images, &proxies, start);
    let merged = merged_results(&topo, &dir, &results);
    every_acknowledged_point_is_stored(&topo, &merged);
    failures_only_inside_the_faults(&merged);
}

/// Certificates for the balancer's name and a results folder, both readable (and the
/// folder writable) by the containers' user.
fn certificates_and_results(dir: &Path) -> (PathBuf, PathBuf) {
    let certs = dir.join("certs");
    run_ok(
        Command::new(binary("proxy"))
            .args([
                "gen-certs",
                "--algorithms",
                "ecdsa-p256",
                "--san",
                "balancer",
                "--out",
            ])
            .arg(&certs),
        "proxy gen-certs",
    );
    run_ok(Command::new("chmod").args(["-R", "a+rX"]).arg(dir), "chmod");
    let results = dir.join("results");
    std::fs::create_dir_all(&results).unwrap();
    run_ok(Command::new("chmod").arg("777").arg(&results), "chmod");
    (certs, results)
}

/// The proxies' configuration: gRPC in front of the three nodes, the PROXY header
/// required from the balancer's network (`subnet`), three seconds of accept grace on
/// SIGTERM (the balancer's health check takes a proxy out within that).
fn proxy_config(dir: &Path, subnet: &str) -> PathBuf {
    write(
        dir,
        "proxy.toml",
        &format!(
            r#"provider = "aws-lc-rs"
[limits]
accept_grace = "3s"
[admin]
listen = "0.0.0.0:9900"
[[listener]]
name = "grpc"
listen = "0.0.0.0:6334"
cert = "/etc/vector-tls-proxy/certs/ecdsa-p256.crt"
key = "/etc/vector-tls-proxy/certs/ecdsa-p256.key"
upstream = ["http://db1:6334", "http://db2:6334", "http://db3:6334"]
upstream_protocol = "h2c"
[listener.proxy_protocol]
trusted = ["{subnet}"]
[listener.health_check]
interval = "1s"
"#
        ),
    )
}

/// How a proxy of the topology is started: read-only, no capabilities, the certificates
/// and the configuration mounted.
struct Proxies {
    certs: PathBuf,
    config: PathBuf,
}

impl Proxies {
    fn start(&self, topo: &Topology, images: &TestImages, name: &str) {
        let certs_mount = format!("{}:/etc/vector-tls-proxy/certs:ro", self.certs.display());
        let config_mount = format!(
            "{}:/etc/vector-tls-proxy/topology.toml:ro",
            self.config.display()
        );
        let flags = [
            "--read-only",
            "--cap-drop",
            "ALL",
            "-v",
            &certs_mount,
            "-v",
            &config_mount,
        ];
        let args = ["run", "--config", "/etc/vector-tls-proxy/topology.toml"];
        topo.run(name, &flags, &images.proxy, &args);
    }
}

/// The balancer: TCP round robin over the proxies with PROXY v2, health-checked every
/// 500 ms (with the header, which the proxies require), names re-resolved through Docker's
/// DNS (a rolled proxy comes back at another address).
fn start_the_balancer(topo: &Topology, images: &TestImages, dir: &Path) {
    let haproxy_cfg = write(
        dir,
        "haproxy.cfg",
        r#"global
    maxconn 4000
resolvers docker
    nameserver dns 127.0.0.11:53
    hold valid 1s
defaults
    mode tcp
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    default-server init-addr last,libc,none resolvers docker check inter 500ms fall 2 rise 2 send-proxy-v2 check-send-proxy
frontend grpc
    bind :6334
    default_backend proxies
backend proxies
    balance roundrobin
    server proxy1 proxy1:6334
    server proxy2 proxy2:6334
"#,
    );
    let haproxy_mount = format!(
        "{}:/usr/local/etc/haproxy/haproxy.cfg:ro",
        haproxy_cfg.display()
    );
    topo.run("balancer", &["-v", &haproxy_mount], &images.haproxy, &[]);
}

/// Ready: every node answers, and the collection exists on each (they are separate
/// stores; a request may land on any); both proxies ready.
fn wait_until_ready(topo: &Topology) {
    for i in 1..=3 {
        let db = format!("db{i}");
        eventually(&format!("{db} answers"), WAIT, || {
            topo.ready(&db, "http://127.0.0.1:6333/readyz")
        });
        topo.exec(
            &db,
            r#"curl -fsS -X PUT http://127.0.0.1:6333/collections/topo -H 'content-type: application/json' -d '{"vectors":{"size":64,"distance":"Cosine"}}'"#,
        );
    }
    for p in ["proxy1", "proxy2"] {
        eventually(&format!("{p} ready"), WAIT, || {
            topo.ready(p, "http://127.0.0.1:9900/readyz")
        });
    }
}

/// Two load generators, started together a few seconds from now; when they start.
fn start_two_load_generators(
    topo: &Topology,
    images: &TestImages,
    certs: &Path,
    results: &Path,
) -> SystemTime {
    let start = SystemTime::now() + Duration::from_secs(4);
    let start_text = humantime::format_rfc3339_seconds(start).to_string();
    let results_mount = format!("{}:/results", results.display());
    let ca_mount = format!("{}:/certs:ro", certs.display());
    let duration = format!("{RUN_SECONDS}s");
    for i in 1..=2 {
        let out = format!("/results/part-{i}.json");
        topo.run(
            &format!("loadgen{i}"),
            &["-v", &results_mount, "-v", &ca_mount],
            &images.tools,
            &[
                "run",
                "--target",
                "balancer:6334",
                "--protocol",
                "grpc",
                "--ca",
                "/certs/ca.crt",
                "--collection",
                "topo",
                "--dim",
                "64",
                "--points-per-request",
                "20",
                "--concurrency",
                "2",
                "--duration",
                &duration,
                "--warmup",
                "0s",
                "--power",
                "none",
                "--quiet",
                "--verify-count",
                "false",
                "--request-timeout",
                "10s",
                "--start-at",
                &start_text,
                "--out",
                &out,
            ],
        );
    }
    start
}

/// The faults, on the run's clock: db1 killed, db2 cut off and reconnected, proxy1 rolled,
/// proxy2 reloaded.
fn inject_the_faults(topo: &Topology, images: &TestImages, proxies: &Proxies, start: SystemTime) {
    let at = |s: u64| {
        let due = start + Duration::from_secs(s);
        if let Ok(wait) = due.duration_since(SystemTime::now()) {
            std::thread::sleep(wait);
        }
    };
    at(KILL_DB1_AT);
    docker(&["kill", &topo.name("db1")]);
    at(CUT_DB2_AT);
    docker(&["network", "disconnect", &topo.net, &topo.name("db2")]);
    at(RECONNECT_DB2_AT);
    docker(&[
        "network",
        "connect",
        "--alias",
        "db2",
        &topo.net,
        &topo.name("db2"),
    ]);
    at(ROLL_PROXY1_AT);
    docker(&["stop", "-t", "20", &topo.name("proxy1")]);
    topo.save_log("proxy1");
    docker(&["rm", &topo.name("proxy1")]);
    proxies.start(topo, images, "proxy1");
    at(RELOAD_PROXY2_AT);
    docker(&["kill", "-s", "HUP", &topo.name("proxy2")]);
}

/// Waits for both load generators to succeed and merges their results.
fn merged_results(topo: &Topology, dir: &Path, results: &Path) -> serde_json::Value {
    for i in 1..=2 {
        let code = docker(&["wait", &topo.name(&format!("loadgen{i}"))]);
        assert_eq!(
            code.trim(),
            "0",
            "loadgen{i}: {}",
            Command::new("docker")
                .args(["logs", "--tail", "30", &topo.name(&format!("loadgen{i}"))])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                .unwrap_or_default()
        );
    }
    let merged = dir.join("merged.json");
    let summary = run_ok(
        Command::new(binary("loadgen"))
            .arg("merge")
            .arg("--out")
            .arg(&merged)
            .arg(results.join("part-1.json"))
            .arg(results.join("part-2.json")),
        "loadgen merge",
    );
    eprintln!("merged report:\n{summary}");
    serde_json::from_slice(&std::fs::read(&merged).unwrap()).unwrap()
}

/// Every node back, then the stored points (the sum of the three nodes' exact counts)
/// against the acknowledged ones.
fn every_acknowledged_point_is_stored(topo: &Topology, merged: &serde_json::Value) {
    docker(&["start", &topo.name("db1")]);
    eventually("db1 back", WAIT, || {
        topo.ready("db1", "http://127.0.0.1:6333/readyz")
    });
    let mut stored = 0;
    let mut per_node = Vec::new();
    for i in 1..=3 {
        let answer = topo.exec(
            &format!("db{i}"),
            r#"curl -fsS -X POST http://127.0.0.1:6333/collections/topo/points/count -H 'content-type: application/json' -d '{"exact":true}'"#,
        );
        let v: serde_json::Value = serde_json::from_str(&answer).expect("a count");
        let n = v["result"]["count"].as_u64().expect("a count");
        per_node.push(n);
        stored += n;
    }
    let ok = merged["requests_ok"].as_u64().unwrap();
    let acknowledged = ok * 20;
    eprintln!(
        "stored {stored} points (db1 {}, db2 {}, db3 {}), acknowledged {acknowledged} ({ok} requests), failed {} {}",
        per_node[0], per_node[1], per_node[2], merged["requests_failed"], merged["failures"]
    );
    assert!(ok > 0, "nothing acknowledged");
    // Every acknowledged point is stored. A request whose answer was lost in a fault (a
    // node cut off mid-request, a timeout) may have been applied all the same: at most the
    // points of the failed requests are stored beyond the acknowledged ones (each request
    // carries ids of its own, so nothing is counted twice).
    let failed = merged["requests_failed"].as_u64().unwrap();
    assert!(
        stored >= acknowledged,
        "acknowledged points lost: {stored} stored of {acknowledged}"
    );
    assert!(
        stored - acknowledged <= failed * 20,
        "{} points stored beyond the acknowledged ones, more than the {failed} failed requests carried",
        stored - acknowledged
    );
}

/// Failures only inside the faults: none before the first one, none in the last 3 s.
fn failures_only_inside_the_faults(merged: &serde_json::Value) {
    let timeline = merged["timeline"].as_array().expect("a merged timeline");
    let first = timeline[0]["at_unix_s"].as_u64().unwrap();
    let failed_at: Vec<(u64, u64)> = timeline
        .iter()
        .filter(|s| s["failed"].as_u64().unwrap() > 0)
        .map(|s| {
            (
                s["at_unix_s"].as_u64().unwrap() - first,
                s["failed"].as_u64().unwrap(),
            )
        })
        .collect();
    eprintln!("seconds with failures (second, failed): {failed_at:?}");
    assert!(
        failed_at
            .iter()
            .all(|(s, _)| *s >= KILL_DB1_AT && *s + 3 <= RUN_SECONDS),
        "failures outside the faults: {failed_at:?}"
    );
}
