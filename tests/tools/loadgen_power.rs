//! `loadgen run`'s power and target-host CPU sources: Redfish, a real Prometheus (with and
//! without basic auth), node_exporter through Prometheus, and what a result says when a
//! source is absent. RAPL counters and a BMC do not exist here: Redfish is served by a
//! stand-in that answers as a BMC's Power resource does, and says so.

use e2e::*;
use serde_json::Value;

#[test]
fn absent_power_sources_are_null_with_a_reason() {
    let s = LoadgenStack::start();
    let dir = temp_dir("lg-power");
    let mut a = base_args(&format!("localhost:{}", s.grpc.addr.port()), "pw");
    a.extend(args(&["--protocol", "grpc"]));
    set_flag(&mut a, "--power", "rapl");
    a.extend(args(&[
        "--requests",
        "2",
        "--rapl-root",
        "/nonexistent/powercap",
    ]));
    let run = run_loadgen(&a, Some(&dir.join("p.json")));
    assert!(run.status.success(), "{}", run.stderr);
    let r = run.result.unwrap();
    assert_eq!(r["power"]["value"], Value::Null);
    assert!(r["power"]["reason"]
        .as_str()
        .unwrap()
        .contains("no RAPL powercap tree"));
    assert!(run.stdout.contains("power: n/a (no RAPL"), "{}", run.stdout);
}

/// A gRPC run through the stack with `--power SOURCE` (instead of none) and `extra` flags.
fn power_run(s: &LoadgenStack, collection: &str, source: &str, extra: &[&str]) -> LoadgenRun {
    let out = temp_dir(collection).join("r.json");
    let mut a = base_args(&format!("localhost:{}", s.grpc.addr.port()), collection);
    set_flag(&mut a, "--power", source);
    a.extend(args(&["--protocol", "grpc"]));
    a.extend(args(extra));
    run_loadgen(&a, Some(&out))
}

#[test]
fn redfish_power_is_sampled_through_the_run() {
    // A BMC cannot exist here: the recorded-shape iDRAC answer is served over real HTTP.
    let s = LoadgenStack::start();
    let body = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/redfish/idrac9-power.json"),
    )
    .unwrap();
    let bmc = StaticAnswer::start(body);
    let run = power_run(
        &s,
        "power",
        "redfish",
        &[
            "--duration",
            "2s",
            "--redfish",
            &format!("{}/redfish/v1/Chassis/System.Embedded.1/Power", bmc.url()),
            "--redfish-user",
            "root",
        ],
    );
    assert!(run.status.success(), "{}", run.stderr);
    let r = run.result.unwrap();
    let p = &r["power"]["value"];
    assert_eq!(p["source"], "redfish", "{r:#}");
    assert_eq!(num(p, &["mean_watts"]), 612.0);
    assert!(num(p, &["samples"]) >= 2.0, "sampled through the run: {p}");
    let expected = 612.0 * num(&r, &["measured_seconds"]);
    assert!(
        (num(p, &["joules"]) - expected).abs() / expected < 0.05,
        "{p}"
    );
    assert!(
        run.stdout.contains("power: redfish 612.0 W"),
        "{}",
        run.stdout
    );
}

#[test]
fn prometheus_power_is_sampled_from_a_real_prometheus_server() {
    // The power sensor cannot exist here, so an exporter stand-in serves two PSU readings in
    // ipmi_exporter's metric name; the Prometheus server that scrapes it and evaluates the
    // query is the real one (Debian's package).
    let s = LoadgenStack::start();
    let exporter = StaticAnswer::start_metrics(
        "# HELP ipmi_dcmi_power_consumption_watts Current power consumption in watts.\n\
         # TYPE ipmi_dcmi_power_consumption_watts gauge\n\
         ipmi_dcmi_power_consumption_watts{psu=\"1\"} 301.5\n\
         ipmi_dcmi_power_consumption_watts{psu=\"2\"} 298\n",
    );
    let prometheus = PrometheusServer::start(&[("ipmi", exporter.addr)]);
    let query = "ipmi_dcmi_power_consumption_watts{job=\"ipmi\"}";
    prometheus.wait_for_series(query);
    let run = power_run(
        &s,
        "power-prom",
        "prometheus",
        &[
            "--duration",
            "2s",
            "--prometheus",
            &prometheus.url(),
            "--prometheus-query",
            query,
        ],
    );
    assert!(run.status.success(), "{}", run.stderr);
    let r = run.result.unwrap();
    let p = &r["power"]["value"];
    assert_eq!(p["source"], "prometheus", "{r:#}");
    assert_eq!(num(p, &["mean_watts"]), 599.5, "both series summed: {p}");
    assert!(num(p, &["samples"]) >= 2.0, "sampled through the run: {p}");
    assert!(p["detail"].as_str().unwrap().contains("2 series"), "{p}");
    let expected = 599.5 * num(&r, &["measured_seconds"]);
    assert!(
        (num(p, &["joules"]) - expected).abs() / expected < 0.05,
        "{p}"
    );

    // A query that matches nothing leaves power null with Prometheus' reason, never 0 W.
    let run = power_run(
        &s,
        "power-prom-none",
        "prometheus",
        &[
            "--requests",
            "2",
            "--prometheus",
            &prometheus.url(),
            "--prometheus-query",
            "no_such_power_metric_watts",
        ],
    );
    assert!(run.status.success(), "{}", run.stderr);
    let r = run.result.unwrap();
    assert!(r["power"]["value"].is_null(), "{r:#}");
    let reason = r["power"]["reason"].as_str().unwrap();
    assert!(reason.contains("no series"), "{reason}");
}

#[test]
fn prometheus_behind_basic_auth_needs_the_credentials() {
    // Prometheus' own web.config basic auth; the bcrypt hash is of "power-reader-test",
    // made for this test with Python's crypt module (cost 4, the minimum, for speed).
    const HASH: &str = "$2b$04$a3zeotSzuLk5fSMbhQcQCuT6ymfQiphCS37duTNsE7gUiX5hZMw7C";
    let s = LoadgenStack::start();
    let exporter = StaticAnswer::start_metrics(
        "# TYPE ipmi_dcmi_power_consumption_watts gauge\nipmi_dcmi_power_consumption_watts 412.5\n",
    );
    let prometheus = PrometheusServer::start_with_basic_auth(
        &[("ipmi", exporter.addr)],
        ("loadgen", "power-reader-test", HASH),
    );
    let query = "ipmi_dcmi_power_consumption_watts";
    prometheus.wait_for_series(query);
    let url = prometheus.url();
    let flags = |password| {
        [
            "--requests",
            "2",
            "--prometheus",
            url.as_str(),
            "--prometheus-query",
            query,
            "--prometheus-user",
            "loadgen",
            "--prometheus-password",
            password,
        ]
    };

    let run = power_run(
        &s,
        "power-prom-auth",
        "prometheus",
        &flags("power-reader-test"),
    );
    assert!(run.status.success(), "{}", run.stderr);
    let r = run.result.unwrap();
    assert_eq!(num(&r["power"]["value"], &["mean_watts"]), 412.5, "{r:#}");
    assert_eq!(
        r["config"]["prometheus_password"],
        Value::Null,
        "the password is not written to the result"
    );

    let run = power_run(&s, "power-prom-noauth", "prometheus", &flags("wrong"));
    assert!(run.status.success(), "{}", run.stderr);
    let r = run.result.unwrap();
    assert!(r["power"]["value"].is_null(), "{r:#}");
    let reason = r["power"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("refused the request (HTTP 401)"),
        "{reason}"
    );
}

#[test]
fn the_target_hosts_cpu_comes_from_its_node_exporter_through_prometheus() {
    // Real node_exporter and real Prometheus; the "remote" host is this one, so the figure
    // must be a utilisation of this machine: a number in 0..=100 like the /proc/stat one.
    let s = LoadgenStack::start();
    let node = NodeExporter::start();
    let prometheus = PrometheusServer::start(&[("node", node.addr)]);
    let instance = node.addr.to_string();
    // rate() needs two scrapes inside the window.
    prometheus.wait_for_series(&format!(
        "rate(node_cpu_seconds_total{{mode=\"idle\",instance=\"{instance}\"}}[3s])"
    ));
    let url = prometheus.url();
    let run = power_run(
        &s,
        "target-cpu",
        "none",
        &[
            "--duration",
            "3s",
            "--prometheus",
            &url,
            "--target-node-exporter",
            &instance,
        ],
    );
    assert!(run.status.success(), "{}", run.stderr);
    let r = run.result.unwrap();
    let target = num(&r["cpu"]["target_host_utilisation_percent"], &["value"]);
    assert!((0.0..=100.0).contains(&target), "{r:#}");
    let local = num(&r["cpu"]["system_utilisation_percent"], &["value"]);
    assert!((0.0..=100.0).contains(&local), "{r:#}");
    assert!(
        run.stdout
            .contains("CPU of the target host (node_exporter via Prometheus): "),
        "{}",
        run.stdout
    );

    // A host Prometheus does not scrape: null with the reason, the run still succeeds.
    let run = power_run(
        &s,
        "target-cpu-none",
        "none",
        &[
            "--requests",
            "2",
            "--prometheus",
            &url,
            "--target-node-exporter",
            "no-such-host:9100",
        ],
    );
    assert!(run.status.success(), "{}", run.stderr);
    let r = run.result.unwrap();
    let m = &r["cpu"]["target_host_utilisation_percent"];
    assert!(m["value"].is_null(), "{m}");
    let reason = m["reason"].as_str().unwrap();
    assert!(
        reason.contains("no-such-host:9100") && reason.contains("no series"),
        "{reason}"
    );
}
