//! `loadgen compare` with a tiny profile on loopback: real proxies started per cell under
//! their CPU budget (a real cgroup quota, read back), the embedded upstream, every cell's
//! JSON, the Markdown, CSV and HTML report, a failing cell reported while the others
//! complete, `--resume`, and the report regenerated identically.

use std::path::Path;

use e2e::*;
use loadgen::report::chart::{colour_hex, provider_colour};

/// Providers in report order: ring, aws-lc-rs, then openssl-qat, which cannot start here
/// (no QAT provider is installed), so its cells fail with the proxy's reason.
const PROVIDERS: &str = "ring,aws-lc-rs,openssl-qat";
const ALGORITHMS: [&str; 2] = ["rsa2048", "ecdsa-p256"];

fn compare_args(out: &Path, extra: &[&str]) -> Vec<String> {
    let mut a = args(&[
        "compare",
        "--providers",
        PROVIDERS,
        "--algorithms",
        &ALGORITHMS.join(","),
        "--out",
        out.to_str().unwrap(),
        "--requests",
        "6",
        "--warmup",
        "0s",
        "--concurrency",
        "2",
        "--proxy-bin",
        binary("proxy").to_str().unwrap(),
        "--upstream-bin",
        binary("embedded-qdrant").to_str().unwrap(),
    ]);
    a.extend(extra.iter().map(|s| (*s).to_owned()));
    a.extend(args(&[
        "--",
        "--dim",
        "32",
        "--points-per-request",
        "10",
        "--power",
        "none",
    ]));
    a
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn tiny_matrix_writes_cells_and_report_and_survives_a_failing_provider() {
    let out = temp_dir("compare");
    let run = run_loadgen(&compare_args(&out, &[]), None);
    assert!(run.status.success(), "{}\n{}", run.stdout, run.stderr);
    // The upstream's points are not left behind (GBs in the real profiles); its log is.
    assert!(!out.join("work/upstream-data").exists());
    assert!(
        run.stderr.contains("removed the upstream's data"),
        "{}",
        run.stderr
    );
    assert!(out.join("work/embedded-qdrant.log").is_file());

    every_cell_has_its_json(&out);

    let md = read(&out.join("report.md"));
    let csv = read(&out.join("report.csv"));
    let html = read(&out.join("report.html"));
    assert!(
        md.contains("## rsa2048") && md.contains("## ecdsa-p256"),
        "{md}"
    );
    assert!(
        md.contains("| ring |") && md.contains("| aws-lc-rs |"),
        "{md}"
    );
    assert!(md.contains("TCP congestion control cubic"), "{md}");
    assert!(
        md.contains("- **Proxy CPU budget**: 0.10 cores (cgroup v"),
        "{md}"
    );
    assert!(
        md.contains("concurrency 2,"),
        "the flag's, for every provider: {md}"
    );
    assert!(
        md.find("## The study's table").unwrap() < md.find("## rsa2048").unwrap(),
        "{md}"
    );
    assert!(
        md.contains("## Failed cells") && md.contains("openssl-qat rsa2048 round 1"),
        "{md}"
    );
    assert!(
        md.contains("Requests per watt, Energy: n/a (power measurement off"),
        "{md}"
    );
    assert!(
        run.stdout.contains("## rsa2048"),
        "compare prints the table"
    );
    // What decides, per algorithm: the cheapest provider in proxy CPU, judged against the
    // run-to-run spread of the quick profile's three rounds, and what bounded each cell.
    assert_eq!(
        md.matches("least proxy CPU per request: ").count(),
        ALGORITHMS.len(),
        "{md}"
    );
    assert!(md.contains("run-to-run spread"), "{md}");
    assert!(md.contains("- **highest throughput: "), "{md}");
    assert_eq!(
        md.matches("- ring: bounded by ").count(),
        ALGORITHMS.len(),
        "{md}"
    );
    assert!(md.contains("cores used: "), "{md}");

    the_csv_has_a_row_per_cell_and_metric(&csv);
    the_html_is_self_contained_with_a_bar_per_cell(&html);
    // The report is a function of the JSON: regenerating gives identical files.
    let again = run_loadgen(&args(&["report", out.to_str().unwrap()]), None);
    assert!(again.status.success(), "{}", again.stderr);
    assert_eq!(read(&out.join("report.md")), md);
    assert_eq!(read(&out.join("report.csv")), csv);
    assert_eq!(read(&out.join("report.html")), html);

    // --resume skips the finished cells (failed ones too) and leaves their JSON alone.
    let before = read(&out.join("cells/ring__rsa2048__r1.json"));
    let resumed = run_loadgen(&compare_args(&out, &["--resume"]), None);
    assert!(resumed.status.success(), "{}", resumed.stderr);
    // 3 providers x 2 algorithms x the quick profile's 3 rounds.
    assert_eq!(
        resumed.stderr.matches("skipped").count(),
        18,
        "{}",
        resumed.stderr
    );
    assert_eq!(read(&out.join("cells/ring__rsa2048__r1.json")), before);
}

/// Every cell has its JSON: measured ones as run results (full handshakes on a fresh proxy
/// under compare's default budget), the QAT ones as failures saying why.
fn every_cell_has_its_json(out: &std::path::Path) {
    // Every cell has its JSON: measured ones as run results, the QAT ones as failures.
    for alg in ALGORITHMS {
        for provider in ["ring", "aws-lc-rs"] {
            let v: serde_json::Value = serde_json::from_str(&read(
                &out.join(format!("cells/{provider}__{alg}__r1.json")),
            ))
            .unwrap();
            assert_eq!(v["schema"], "loadgen.run/v1");
            assert_eq!(v["cell"]["provider"], provider);
            assert_eq!(v["cell"]["algorithm"], alg);
            assert_eq!(v["requests_ok"], 6, "{v:#}");
            assert_eq!(v["verification"]["value"]["matches"], true);
            // The proxy runs on this machine: the clients' congestion control is compare's
            // (a pacing client's timer would run under the proxy's reads on loopback).
            assert_eq!(v["config"]["congestion_control"], "cubic", "{v:#}");
            // Every request was a full handshake on a fresh proxy; the proxy's CPU is attributed.
            assert_eq!(v["handshakes"]["count"], 6);
            assert_eq!(v["proxy_metrics"]["value"]["handshakes"], 6.0);
            assert!(v["proxy_metrics"]["value"]["cpu_seconds"].as_f64().unwrap() > 0.0);
            let listeners = v["environment"]["proxy_listeners"].to_string();
            assert!(
                listeners.contains(provider) && listeners.contains(alg),
                "{listeners}"
            );
            // compare's default budget, as the proxy's cgroup files gave it back.
            let proxy = &v["cpu"]["watched"][0];
            assert_eq!(proxy["name"], "proxy");
            assert_eq!(proxy["cpu_quota"]["cores"], 0.1, "{proxy:#}");
            assert_eq!(proxy["cpu_quota"]["period_us"], 100_000, "{proxy:#}");
        }
        let failed: serde_json::Value = serde_json::from_str(&read(
            &out.join(format!("cells/openssl-qat__{alg}__r1.json")),
        ))
        .unwrap();
        assert_eq!(failed["schema"], "loadgen.cell-failure/v1");
        let reason = failed["reason"].as_str().unwrap();
        assert!(reason.contains("proxy"), "{reason}");
        assert!(reason.to_lowercase().contains("qat"), "{reason}");
    }
}

/// The CSV: one row per provider x algorithm x metric, plus the header; the optional
/// metrics (a co-located embedding load's) only when a cell measured them, and this
/// comparison ran none.
fn the_csv_has_a_row_per_cell_and_metric(csv: &str) {
    let rows: Vec<&str> = csv.lines().collect();
    let metrics = loadgen::report::METRICS
        .iter()
        .filter(|m| !m.optional)
        .count();
    assert!(!csv.contains("embeddings_per_second"), "{csv}");
    assert_eq!(rows.len(), 1 + 3 * ALGORITHMS.len() * metrics, "{csv}");
    let throughput_ring = rows
        .iter()
        .find(|r| r.starts_with("ring,rsa2048,requests_per_second,"))
        .unwrap();
    let fields: Vec<&str> = throughput_ring.split(',').collect();
    assert!(fields[4].parse::<f64>().unwrap() > 0.0, "{throughput_ring}");
    assert!(rows
        .iter()
        .any(|r| r.starts_with("openssl-qat,rsa2048,requests_per_second,") && r.contains("proxy")));
}

/// The HTML: self-contained, and each chart has one bar per provider per algorithm (bars
/// and the legend swatch share the provider's colour; the failed provider has only its
/// swatch).
fn the_html_is_self_contained_with_a_bar_per_cell(html: &str) {
    // Self-contained: no scripts, stylesheets or images fetched from anywhere.
    assert!(!html.contains("<script") && !html.contains("<link") && !html.contains(" src="));
    assert_eq!(
        html.matches("<svg").count(),
        loadgen::report::METRICS
            .iter()
            .filter(|m| m.charted && !m.optional)
            .count()
    );
    let throughput = chart_svg(html, "requests_per_second");
    for (index, bars) in [(0, ALGORITHMS.len()), (1, ALGORITHMS.len()), (2, 0)] {
        let fill = format!("fill=\"{}\"", colour_hex(provider_colour(index)));
        let coloured = throughput
            .split("<rect")
            .skip(1)
            .filter(|r| r.split('>').next().unwrap_or("").contains(&fill))
            .count();
        assert_eq!(
            coloured,
            bars + 1,
            "provider {index}: {bars} bars + 1 legend swatch"
        );
    }
    assert!(
        throughput.contains("n/a"),
        "the failed provider's slots say n/a"
    );
    let power = chart_svg(html, "requests_per_watt");
    assert!(
        power.contains("n/a:") && power.contains("power measurement off"),
        "{power}"
    );
}

/// The SVG inside `<figure id="chart-KEY">`.
fn chart_svg<'a>(html: &'a str, key: &str) -> &'a str {
    let start = html
        .find(&format!("<figure id=\"chart-{key}\">"))
        .unwrap_or_else(|| panic!("chart {key} missing"));
    let end = html[start..].find("</svg>").expect("svg end") + start;
    &html[start..end]
}

#[test]
fn bad_run_flags_after_the_separator_are_refused_before_anything_starts() {
    let out = temp_dir("compare-bad");
    let mut a = compare_args(&out, &[]);
    a.push("--no-such-flag".into());
    let run = run_loadgen(&a, None);
    assert_eq!(run.status.code(), Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("--no-such-flag"), "{}", run.stderr);
    assert!(!out.join("certs").exists(), "nothing was generated");
}

#[test]
fn remote_mode_switches_a_running_proxy_between_cells() {
    let data = temp_dir("compare-remote-data");
    let qdrant = EmbeddedQdrant::start(&data);
    let token = temp_dir("compare-remote-token").join("token");
    std::fs::write(&token, "remote-token-0123456789abcdef").unwrap();
    let proxy = ProxyProcess::start(
        &format!("http://{}", qdrant.grpc),
        proxy::crypto::ProviderName::Openssl,
        proxy::crypto::CertAlgorithmName::Rsa4096,
        &[
            "--upstream-protocol",
            "h2c",
            "--admin-token-file",
            token.to_str().unwrap(),
        ],
    );
    let cert_dir = certs().ca_cert.parent().unwrap().to_owned();
    let out = temp_dir("compare-remote");
    let mut a = compare_args(
        &out,
        &[
            "--proxy-admin",
            &format!("http://{}", proxy.admin),
            "--proxy-admin-token-file",
            token.to_str().unwrap(),
            "--target",
            &format!("localhost:{}", proxy.addr.port()),
            "--remote-cert-dir",
            cert_dir.to_str().unwrap(),
            "--ca",
            certs().ca_cert.to_str().unwrap(),
        ],
    );
    set_flag(&mut a, "--providers", "ring,aws-lc-rs");
    set_flag(&mut a, "--algorithms", "ecdsa-p256,rsa2048");
    set_flag(&mut a, "--requests", "4");
    let run = run_loadgen(&a, None);
    assert!(run.status.success(), "{}\n{}", run.stdout, run.stderr);
    for alg in ["ecdsa-p256", "rsa2048"] {
        for provider in ["ring", "aws-lc-rs"] {
            let v: serde_json::Value = serde_json::from_str(&read(
                &out.join(format!("cells/{provider}__{alg}__r1.json")),
            ))
            .unwrap();
            assert_eq!(v["requests_ok"], 4, "{v:#}");
            // The proxy's own metrics say it served this cell with this provider and cert.
            let listeners = &v["environment"]["proxy_listeners"];
            assert_eq!(listeners[0]["provider"], provider, "{listeners}");
            assert_eq!(listeners[0]["algorithm"], alg, "{listeners}");
            assert_eq!(v["proxy_metrics"]["value"]["handshakes"], 4.0);
        }
    }
    // A wrong token stops the cell with the proxy's answer as the reason.
    std::fs::write(&token, "wrong-token-0123456789abcdefgh").unwrap();
    let out2 = temp_dir("compare-remote-bad");
    set_flag(&mut a, "--out", out2.to_str().unwrap());
    let run = run_loadgen(&a, None);
    assert!(
        run.status.success(),
        "failed cells are reported, not fatal: {}",
        run.stderr
    );
    let failed: serde_json::Value =
        serde_json::from_str(&read(&out2.join("cells/ring__ecdsa-p256__r1.json"))).unwrap();
    assert_eq!(failed["schema"], "loadgen.cell-failure/v1");
    assert!(
        failed["reason"].as_str().unwrap().contains("401"),
        "{failed}"
    );
}

#[test]
fn cpu_pinning_holds_for_the_proxy_the_upstream_and_loadgen() {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let (proxy_cpu, other_cpu) = if cpus >= 2 { ("0", "1") } else { ("0", "0") };
    let out = temp_dir("compare-pinned");
    let mut a = compare_args(&out, &[]);
    set_flag(&mut a, "--providers", "aws-lc-rs");
    set_flag(&mut a, "--algorithms", "ecdsa-p256");
    set_flag(&mut a, "--proxy-cpus", proxy_cpu);
    set_flag(&mut a, "--upstream-cpus", other_cpu);
    set_flag(&mut a, "--loadgen-cpus", other_cpu);
    a.insert(1, "--keep-upstream-data".into());
    // A cell left from an earlier comparison in the same folder must not reach this report.
    std::fs::create_dir_all(out.join("cells")).unwrap();
    std::fs::write(out.join("cells/ring__rsa4096__r1.json"), "{}").unwrap();
    let run = run_loadgen(&a, None);
    assert!(run.status.success(), "{}\n{}", run.stdout, run.stderr);
    assert!(!out.join("cells/ring__rsa4096__r1.json").exists());
    assert!(!read(&out.join("report.md")).contains("rsa4096"));
    assert!(
        out.join("work/upstream-data").is_dir(),
        "--keep-upstream-data keeps the upstream's points"
    );
    let v: serde_json::Value =
        serde_json::from_str(&read(&out.join("cells/aws-lc-rs__ecdsa-p256__r1.json"))).unwrap();
    let watched = v["cpu"]["watched"].as_array().unwrap();
    let allowed = |name: &str| {
        watched
            .iter()
            .find(|w| w["name"] == name)
            .and_then(|w| w["cpus_allowed"].as_str())
            .unwrap_or_else(|| panic!("{name} not watched: {watched:?}"))
            .to_owned()
    };
    assert_eq!(allowed("proxy"), proxy_cpu);
    assert_eq!(allowed("upstream"), other_cpu);
    assert_eq!(v["cpu"]["loadgen"]["cpus_allowed"], other_cpu);
}

/// The budget on a real process through the machine's own cgroup tree: the group made
/// under loadgen's, the process moved in, the quota read back from its files and from
/// /proc/PID/cgroup's path, and the group removed once the process is gone. Where this
/// machine has no mechanism (no writable cgroup cpu controller, no systemd), the refusal
/// names what is missing instead.
#[test]
fn a_cpu_budget_is_a_real_cgroup_quota_read_back_from_the_process() {
    use loadgen::budget::{read_quota, Cgroups, Prepared};
    let cgroups = Cgroups::default();
    let name = format!("vtp-e2e-{}-budget", std::process::id());
    let prepared = match Prepared::new(&cgroups, 0.25, &name) {
        Ok(p) => p,
        Err(e) => {
            let text = format!("{e:#}");
            assert!(
                text.contains("--proxy-cpu-budget none") && text.contains("cgroup"),
                "{text}"
            );
            eprintln!("SKIPPED the quota itself: no budget mechanism here: {text}");
            return;
        }
    };
    let mut sleep = std::process::Command::new("sleep");
    sleep.arg("30");
    let mut sleeper = prepared.command(sleep).spawn().expect("sleep");
    let quota = prepared.attach(&cgroups, sleeper.id(), 0.25);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let quota = quota.expect("the quota, read back");
    assert_eq!(
        (quota.quota_us, quota.period_us),
        (25_000, 100_000),
        "{quota:?}"
    );
    let written = std::fs::read_to_string(&quota.file).unwrap();
    assert!(
        written.trim() == "25000" || written.trim() == "25000 100000",
        "{}: {written:?}",
        quota.file.display()
    );
    assert!(quota.mechanism.starts_with("cgroup v"), "{quota:?}");
    let group = quota.file.parent().unwrap().to_path_buf();
    assert!(group.ends_with(&name), "{}", group.display());
    // This test process itself is outside the group: only the budgeted one was moved.
    let own = read_quota(&cgroups, std::process::id()).unwrap();
    assert!(own.as_ref().is_none_or(|q| q.file != quota.file), "{own:?}");
    prepared.remove();
    assert!(!group.exists(), "{} left behind", group.display());
}
