//! Several upstream nodes behind one listener: per-request balancing (REST and gRPC),
//! active health checks (Qdrant's `/readyz`, the gRPC health service), passive ejection
//! and retry on a failed connect, readmission, per-node metrics. The nodes are real
//! embedded-qdrant processes; loadgen drives the REST failover run.

use std::time::{Duration, Instant};

use e2e::*;
use proxy::crypto::{CertAlgorithmName, ProviderName};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const COLLECTION: &str = "failover";

fn node_requests(proxy: &ProxyProcess, node: &str) -> f64 {
    metric_sum(
        &proxy.metrics(),
        "proxy_upstream_node_requests_total",
        &[("upstream", node)],
    )
}

/// Polls the proxy's metrics until `node`'s `name` is `want` (bounded).
fn wait_node_metric(proxy: &ProxyProcess, name: &str, node: &str, want: f64) {
    proxy.wait_metric(name, &[("upstream", node)], want);
}

/// A proxy whose one listener forwards to every node of `addrs` (`host:port`).
fn proxy_over(addrs: &[String], provider: ProviderName, extra: &[&str]) -> ProxyProcess {
    let more: Vec<String> = addrs[1..]
        .iter()
        .flat_map(|a| ["--upstream".to_owned(), format!("http://{a}")])
        .collect();
    let flags: Vec<&str> = more
        .iter()
        .map(String::as_str)
        .chain(extra.iter().copied())
        .collect();
    ProxyProcess::start(
        &format!("http://{}", addrs[0]),
        provider,
        CertAlgorithmName::EcdsaP256,
        &flags,
    )
}

#[test]
fn three_nodes_one_killed_and_restarted_under_load() {
    let nodes: Vec<EmbeddedQdrant> = (0..3)
        .map(|i| EmbeddedQdrant::start(&temp_dir(&format!("node{i}"))))
        .collect();
    // Independent stores, not a cluster: the collection is made on each, and each point
    // lands on exactly one node, so the nodes' counts add up to what was stored.
    for n in &nodes {
        create_collection(n.rest, COLLECTION, 64);
    }
    let addrs: Vec<String> = nodes.iter().map(|n| n.rest.to_string()).collect();
    let proxy = proxy_over(
        &addrs,
        ProviderName::AwsLcRs,
        &["--health-check-interval", "300ms"],
    );
    let log = proxy.log_text();
    for a in &addrs {
        assert!(
            log.contains(a.as_str()),
            "every node is listed at start-up: {log}"
        );
    }

    let ca = certs().ca_cert.display().to_string();
    let target = format!("localhost:{}", proxy.addr.port());
    let out = temp_dir("failover").join("result.json");
    let run_args = failover_run(&target, &ca);
    let started = Instant::now();
    let loadgen = {
        let out = out.clone();
        std::thread::spawn(move || run_loadgen(&run_args, Some(&out)))
    };

    // Into the run, node 2 crashes (SIGKILL: in-flight requests on it are lost).
    std::thread::sleep(Duration::from_secs(6));
    let mut nodes = nodes;
    let victim = nodes.pop().expect("three nodes");
    let (victim_rest, victim_grpc, victim_data) = (victim.rest, victim.grpc, victim.data.clone());
    victim.kill();
    let killed_at = started.elapsed();
    // Ejected on the first refused connect, unhealthy after two failed probes.
    wait_node_metric(&proxy, "proxy_upstream_node_healthy", &addrs[2], 0.0);
    let noticed_after = started.elapsed() - killed_at;
    let requests_while_down_start = node_requests(&proxy, &addrs[2]);
    std::thread::sleep(Duration::from_secs(4));
    let requests_while_down = node_requests(&proxy, &addrs[2]) - requests_while_down_start;

    // It comes back on its ports with its data, and is readmitted.
    let restarted = EmbeddedQdrant::start_on(&victim_data, victim_rest, victim_grpc);
    wait_node_metric(&proxy, "proxy_upstream_node_healthy", &addrs[2], 1.0);
    let before_readmission = node_requests(&proxy, &addrs[2]);
    eventually("requests to the restarted node", WAIT, || {
        let now = node_requests(&proxy, &addrs[2]);
        ready(now > before_readmission, || format!("{now} requests"))
    });
    let readmitted_after = started.elapsed();

    let run = loadgen.join().expect("loadgen thread");
    let r = run.result.expect("loadgen wrote its result");
    let ok = r["requests_ok"].as_u64().expect("requests_ok");
    let failed = r["requests_failed"].as_u64().expect("requests_failed");
    eprintln!(
        "failover: {ok} requests ok, {failed} failed ({:?}); killed at {killed_at:?}, marked unhealthy {noticed_after:?} later; {requests_while_down} requests sent to it while down; readmitted by {readmitted_after:?}",
        r["failures"]
    );
    assert!(ok > 50, "the run kept going: {r:#}");
    // Only what was on the crashed node when it died may fail: at most one request per
    // client connection (4), and a retry of a failed connect sends nothing twice.
    assert!(failed <= 4, "{failed} failed: {r:#}");
    assert_eq!(
        requests_while_down, 0.0,
        "an ejected, unhealthy node gets no requests"
    );

    let m = proxy.metrics();
    let ejections = metric_sum(
        &m,
        "proxy_upstream_node_ejections_total",
        &[("upstream", addrs[2].as_str())],
    );
    let retries = metric_sum(&m, "proxy_upstream_retries_total", &[]);
    eprintln!("failover: {ejections} ejections of the killed node, {retries} retries");
    let log = proxy.log_text();
    assert!(log.contains("upstream node unhealthy"), "{log}");
    assert!(
        log.contains("readmitted") || log.contains("healthy again"),
        "{log}"
    );

    // The two nodes that stayed up both carried the load. Least requests sends more to
    // the node that answers sooner, which on this shared 2-core machine is whichever
    // embedded-qdrant the scheduler favours (seen: 4,090 / 3,675 on a quiet machine, 2,516
    // / 1,869 beside a build), so this bounds the split at 2:1 rather than asserting a
    // speed; the tie rotation itself is unit-tested exactly (upstream::tests).
    let (a, b) = (
        node_requests(&proxy, &addrs[0]),
        node_requests(&proxy, &addrs[1]),
    );
    assert!(
        a.min(b) * 2.0 >= a.max(b),
        "nodes 0 and 1 took {a} and {b} requests"
    );

    // Every acknowledged point is stored on exactly one node. A request lost with the
    // crashed node may have been stored before it died (it was flushed, its answer was
    // not sent): those are the only points allowed beyond the acknowledged ones.
    let acknowledged = ok * 20;
    let stored: u64 = nodes
        .iter()
        .map(|n| count_points(n.rest, COLLECTION))
        .sum::<u64>()
        + count_points(restarted.rest, COLLECTION);
    eprintln!("failover: {acknowledged} points acknowledged, {stored} stored across the nodes");
    assert!(
        stored >= acknowledged && stored <= acknowledged + failed * 20,
        "{stored} stored, {acknowledged} acknowledged, {failed} failed"
    );
}

/// The failover test's load: 20 s of REST upserts of 20 points from 4 clients, no warm-up.
fn failover_run(target: &str, ca: &str) -> Vec<String> {
    args(&[
        "run",
        "--target",
        target,
        "--ca",
        ca,
        "--protocol",
        "rest",
        "--collection",
        COLLECTION,
        "--dim",
        "64",
        "--points-per-request",
        "20",
        "--concurrency",
        "4",
        "--duration",
        "20s",
        "--warmup",
        "0s",
        "--verify-count",
        "false",
        "--quiet",
        "--power",
        "none",
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_is_balanced_per_request_and_checked_with_the_health_service() {
    let nodes: Vec<EmbeddedQdrant> = (0..3)
        .map(|i| EmbeddedQdrant::start(&temp_dir(&format!("gnode{i}"))))
        .collect();
    let addrs: Vec<String> = nodes.iter().map(|n| n.grpc.to_string()).collect();
    let proxy = proxy_over(
        &addrs,
        ProviderName::Ring,
        &[
            "--upstream-protocol",
            "h2c",
            "--balance",
            "round-robin",
            "--health-check-interval",
            "300ms",
        ],
    );
    assert!(
        proxy.log_text().contains("health_check=Grpc"),
        "{}",
        proxy.log_text()
    );
    // One client connection; its requests still spread over every node.
    let mut client = HealthClient::new(grpc_channel(proxy.addr));
    for _ in 0..30 {
        client
            .check(HealthCheckRequest::default())
            .await
            .expect("check through the proxy");
    }
    for a in &addrs {
        assert_eq!(
            node_requests(&proxy, a),
            10.0,
            "round-robin over one connection"
        );
    }

    // A node that stops (its health service answers NOT_SERVING while it drains, then
    // nothing) is taken out by the gRPC probes; every request still succeeds.
    let mut nodes = nodes;
    let stopped = nodes.remove(1);
    assert!(stopped.stop().success());
    wait_node_metric(&proxy, "proxy_upstream_node_healthy", &addrs[1], 0.0);
    let before = node_requests(&proxy, &addrs[1]);
    for _ in 0..20 {
        client
            .check(HealthCheckRequest::default())
            .await
            .expect("check through the proxy with one node down");
    }
    assert_eq!(node_requests(&proxy, &addrs[1]), before);
    for a in [&addrs[0], &addrs[2]] {
        assert_eq!(node_requests(&proxy, a), 20.0, "the other two took it all");
    }
}

#[test]
fn a_refused_connect_is_retried_on_another_node_and_ejects_the_first() {
    // Health checks off: only passive ejection decides here.
    let node = EmbeddedQdrant::start(&temp_dir("rnode"));
    let dead = free_loopback_addr();
    let proxy = ProxyProcess::start(
        &format!("http://{dead}"),
        ProviderName::AwsLcRs,
        CertAlgorithmName::EcdsaP256,
        &[
            "--upstream",
            &format!("http://{}", node.rest),
            "--balance",
            "round-robin",
            "--health-check",
            "off",
        ],
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    for _ in 0..6 {
        let answer = rt.block_on(get(proxy.addr, "/readyz")).expect("answer");
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
    }
    let m = proxy.metrics();
    let dead_label = dead.to_string();
    let refused = metric_sum(
        &m,
        "proxy_upstream_node_errors_total",
        &[("upstream", dead_label.as_str()), ("kind", "connect")],
    );
    // Tried, then ejected for a backoff (1 s, then 2 s, ...): at most a few times in six
    // requests however slow this machine is, and every refusal was retried.
    assert!((1.0..=3.0).contains(&refused), "{refused}:\n{m}");
    assert_eq!(
        metric_sum(&m, "proxy_upstream_retries_total", &[]),
        refused,
        "{m}"
    );
    assert_eq!(
        metric_value(
            &m,
            "proxy_upstream_node_ejected",
            &[("upstream", dead_label.as_str())]
        ),
        Some(1.0)
    );
    assert_eq!(
        metric_sum(
            &m,
            "proxy_upstream_node_requests_total",
            &[("upstream", node.rest.to_string().as_str())]
        ),
        6.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_and_back_is_reached_on_new_connections() {
    // The node is reached through a link that can be cut as a network partition cuts it:
    // the connections it carried go half-open (silent, never closed), new ones are refused
    // until it is mended. Before the proxy dropped a taken-out node's connections, both
    // its gRPC probes and the requests after the mend went on the half-open h2c
    // connections: the node never came back, or its requests hung to the response timeout.
    let node = EmbeddedQdrant::start(&temp_dir("cutnode"));
    let link = CuttableLink::to(node.grpc);
    let proxy = ProxyProcess::start(
        &format!("http://{}", link.addr),
        ProviderName::AwsLcRs,
        CertAlgorithmName::EcdsaP256,
        &[
            "--upstream-protocol",
            "h2c",
            "--health-check",
            "grpc",
            "--health-check-interval",
            "200ms",
        ],
    );
    let upstream = link.addr.to_string();
    let client = HealthClient::new(grpc_channel(proxy.addr));
    // Well under the response timeout (60 s): an answer in time came on a live connection.
    let in_time = Duration::from_secs(5);
    let checks = |when: &'static str| {
        let mut client = client.clone();
        async move {
            for _ in 0..5 {
                tokio::time::timeout(in_time, client.check(HealthCheckRequest::default()))
                    .await
                    .unwrap_or_else(|_| panic!("no answer within {in_time:?} {when}"))
                    .unwrap_or_else(|e| panic!("check {when}: {e}"));
            }
        }
    };
    checks("before the cut").await;

    link.cut();
    tokio::task::block_in_place(|| {
        wait_node_metric(&proxy, "proxy_upstream_node_healthy", &upstream, 0.0)
    });
    link.mend();
    tokio::task::block_in_place(|| {
        wait_node_metric(&proxy, "proxy_upstream_node_healthy", &upstream, 1.0)
    });
    checks("after the mend").await;
    assert!(
        proxy
            .log_text()
            .contains("those made before are not used again"),
        "{}",
        proxy.log_text()
    );
}
