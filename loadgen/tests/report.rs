//! The report's arithmetic on a hand-built matrix: medians and spreads over repeats, the
//! best software provider as the baseline, ratios oriented so that above 1 is better, power
//! figures derived only where power was measured, and error bars drawn for repeats.

use std::path::{Path, PathBuf};

use loadgen::report::{self, Figure, METRICS};
use serde_json::{json, Value};

fn template() -> Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/report/cell-template.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn write_cell(
    dir: &Path,
    provider: &str,
    alg: &str,
    repeat: u32,
    rps: f64,
    p50: f64,
    watts: Option<f64>,
) {
    let mut v = template();
    v["cell"] = json!({"provider": provider, "algorithm": alg, "repeat": repeat});
    v["requests_per_second"] = json!(rps);
    v["measured_seconds"] = json!(10.0);
    v["requests_ok"] = json!((rps * 10.0) as u64);
    v["latency_ms"]["p50"] = json!(p50);
    v["power"] = match watts {
        Some(w) => {
            json!({"value": {"source": "rapl", "joules": w * 10.0, "mean_watts": w, "samples": 10, "detail": "domains package-0"}})
        }
        None => json!({"value": null, "reason": "no RAPL here"}),
    };
    let path = dir
        .join("cells")
        .join(format!("{provider}__{alg}__r{repeat}.json"));
    std::fs::write(path, serde_json::to_vec(&v).unwrap()).unwrap();
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("loadgen-report-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("cells")).unwrap();
    dir
}

fn metric(key: &str) -> &'static report::Metric {
    METRICS.iter().find(|m| m.key == key).unwrap()
}

#[test]
fn medians_spreads_baselines_and_oriented_ratios() {
    let dir = scratch("math");
    // Three rounds each; the middle value is the median.
    for (r, (ring, aws, qat)) in [
        (100.0, 120.0, 200.0),
        (90.0, 130.0, 180.0),
        (110.0, 125.0, 190.0),
    ]
    .into_iter()
    .enumerate()
    {
        let r = r as u32 + 1;
        write_cell(&dir, "ring", "rsa2048", r, ring, 40.0, Some(200.0));
        write_cell(&dir, "aws-lc-rs", "rsa2048", r, aws, 30.0, Some(250.0));
        write_cell(&dir, "openssl-qat", "rsa2048", r, qat, 20.0, None);
    }
    let rep = report::load(&dir).unwrap();
    assert_eq!(rep.providers, vec!["ring", "aws-lc-rs", "openssl-qat"]);
    assert_eq!(rep.repeats, 3);
    match rep
        .figure(&"aws-lc-rs".into(), "rsa2048", "requests_per_second")
        .unwrap()
    {
        Figure::Value {
            median,
            min,
            max,
            n,
        } => {
            assert_eq!((*median, *min, *max, *n), (125.0, 120.0, 130.0, 3));
        }
        other => panic!("{other:?}"),
    }
    // Throughput: higher is better; the best software provider is aws-lc-rs (125).
    let rps = metric("requests_per_second");
    assert_eq!(
        rep.baselines[&("rsa2048".to_owned(), "requests_per_second")].0,
        "aws-lc-rs"
    );
    assert!(
        (rep.ratio(&"openssl-qat".into(), "rsa2048", rps).unwrap() - 190.0 / 125.0).abs() < 1e-9
    );
    assert!((rep.ratio(&"ring".into(), "rsa2048", rps).unwrap() - 100.0 / 125.0).abs() < 1e-9);
    // P50: lower is better, so the ratio is best / value (30 / 20 = 1.5x for QAT).
    let p50 = metric("latency_p50_ms");
    assert!((rep.ratio(&"openssl-qat".into(), "rsa2048", p50).unwrap() - 1.5).abs() < 1e-9);
    // Requests per watt: derived where power exists (125 / 250 = 0.5 for aws-lc-rs), n/a with
    // the reason where it does not.
    let rpw = rep
        .figure(&"aws-lc-rs".into(), "rsa2048", "requests_per_watt")
        .unwrap();
    assert!((rpw.median().unwrap() - 0.5).abs() < 1e-9);
    match rep
        .figure(&"openssl-qat".into(), "rsa2048", "requests_per_watt")
        .unwrap()
    {
        Figure::Missing(reason) => assert_eq!(reason, "no RAPL here"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        rep.ratio(
            &"openssl-qat".into(),
            "rsa2048",
            metric("requests_per_watt")
        ),
        None
    );

    // Rendered: the spread shows in the tables, whiskers in the chart.
    report::render(&dir).unwrap();
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("125 (120-130) · 1.00x"), "{md}");
    assert!(md.contains("190 (180-200) · 1.52x"), "{md}");
    assert!(
        md.contains("- **Power**: rapl (domains package-0)\n"),
        "where the watts came from: {md}"
    );
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    let chart_start = html
        .find("<figure id=\"chart-requests_per_second\">")
        .unwrap();
    let chart = &html[chart_start..chart_start + html[chart_start..].find("</svg>").unwrap()];
    // Three providers with repeats: a vertical line and two caps each.
    let whisker = format!(
        "stroke=\"{}\"",
        report::chart::colour_hex(report::chart::WHISKER)
    );
    let whiskers = chart
        .split("<polyline")
        .skip(1)
        .filter(|p| p.split('>').next().unwrap().contains(&whisker))
        .count();
    assert_eq!(whiskers, 9, "{chart}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_folder_without_cells_is_a_clear_error() {
    let dir = scratch("empty");
    let err = report::load(&dir).err().unwrap().to_string();
    assert!(err.contains("no cell results"), "{err}");
    let err = report::load(Path::new("/nonexistent/compare"))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("loadgen compare"), "{err}");
    std::fs::write(dir.join("cells/x.json"), b"{\"schema\":\"other\"}").unwrap();
    let err = format!("{:#}", report::load(&dir).err().unwrap());
    assert!(err.contains("unknown schema"), "{err}");
    std::fs::remove_dir_all(dir).ok();
}

/// A proxy under a CPU budget: the cell is bounded by the proxy at its budget (read from the
/// quota each result recorded), the study's table opens the report with that bound, and
/// watts estimated from CPU utilisation stay in their own labelled columns, never mixed with
/// measured ones; the model and its coefficients are printed.
#[test]
fn a_budgeted_proxy_bounds_its_cells_and_estimated_watts_stay_apart_from_measured_ones() {
    let dir = scratch("budget");
    for (r, (ring, aws)) in [(30.0, 60.0), (32.0, 58.0), (31.0, 61.0)]
        .into_iter()
        .enumerate()
    {
        let r = r as u32 + 1;
        write_cell(&dir, "ring", "rsa4096", r, ring, 400.0, None);
        write_cell(&dir, "aws-lc-rs", "rsa4096", r, aws, 200.0, Some(20.0));
        for provider in ["ring", "aws-lc-rs"] {
            let path = dir.join(format!("cells/{provider}__rsa4096__r{r}.json"));
            let mut v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            // The proxy used 0.097 cores of its 0.10-core budget; the database 0.55.
            v["cpu"]["watched"][0]["percent_of_core"] = json!(9.7);
            v["cpu"]["watched"][0]["cpu_quota"] = json!({
                "cores": 0.1, "quota_us": 10000, "period_us": 100000,
                "file": "/sys/fs/cgroup/cpu/vtp-loadgen-1-cell/cpu.cfs_quota_us",
                "mechanism": "cgroup v1 cpu.cfs_quota_us"
            });
            v["cpu"]["watched"][1]["percent_of_core"] = json!(55.0);
            v["cpu"]["system_utilisation_percent"] = json!({"value": 40.0});
            // CCF's AWS averages at 40 % of 2 vCPUs: 2 x (0.74 + 0.4 x 2.76) = 3.688 W.
            v["power_estimate"] =
                json!({"value": loadgen::power_estimate::CCF_AWS_AVERAGE.estimate(2, 40.0, 10.0)});
            std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
        }
    }
    let rep = report::load(&dir).unwrap();
    let bound = &rep.bounds[&("aws-lc-rs".into(), "rsa4096".to_owned())];
    assert!(
        bound.starts_with("proxy's CPU (0.10 of its 0.10-core budget)"),
        "{bound}"
    );
    let verdicts = &rep.verdicts[0].1;
    assert!(
        verdicts
            .iter()
            .all(|l| !l.contains("not bounded by the proxy")),
        "{verdicts:?}"
    );
    // Estimated: 60 requests/s over 3.688 W; measured only where a meter was read.
    let est = rep
        .figure(
            &"aws-lc-rs".into(),
            "rsa4096",
            "requests_per_estimated_watt",
        )
        .and_then(Figure::median)
        .unwrap();
    assert!((est - 60.0 / 3.688).abs() < 1e-6, "{est}");
    let measured = rep
        .figure(&"aws-lc-rs".into(), "rsa4096", "requests_per_watt")
        .and_then(Figure::median)
        .unwrap();
    assert!((measured - 60.0 / 20.0).abs() < 1e-9, "{measured}");
    assert!(matches!(
        rep.figure(&"ring".into(), "rsa4096", "requests_per_watt"),
        Some(Figure::Missing(_))
    ));

    report::render(&dir).unwrap();
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    let study = md.find("## The study's table").expect("the study's table");
    assert!(
        study < md.find("## rsa4096").unwrap(),
        "it opens the report"
    );
    assert!(
        md.contains("| rsa4096 | aws-lc-rs | 60.0 (58.0-61.0) · 1.00x | 3.00 (2.90-3.05) · 1.00x | 16.3 (15.7-16.5) · 1.00x |"),
        "{md}"
    );
    assert!(
        md.contains("| rsa4096 | ring | 31.0 (30.0-32.0) · 0.52x | n/a |"),
        "{md}"
    );
    assert!(
        md.contains("proxy's CPU (0.10 of its 0.10-core budget) |"),
        "{md}"
    );
    assert!(
        md.contains("- **Proxy CPU budget**: 0.10 cores (cgroup v1 cpu.cfs_quota_us: 10000 us per 100000 us"),
        "{md}"
    );
    assert!(
        md.contains("- **Estimated power**: Cloud Carbon Footprint compute model, AWS average coefficients (SPECpower): per vCPU 0.74 W idle + utilisation x (3.5 - 0.74) W, x 2 vCPUs"),
        "{md}"
    );
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(
        html.find("<table id=\"study\">").unwrap() < html.find("<h2>Charts</h2>").unwrap(),
        "the study's table is at the top of the page"
    );
    std::fs::remove_dir_all(dir).ok();
}
