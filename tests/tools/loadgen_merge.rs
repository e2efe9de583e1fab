//! loadgen beyond one process: three `loadgen run` processes started together with
//! `--start-at` against the real proxy and embedded-qdrant, then `loadgen merge` and a
//! report over the three results of one cell.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use e2e::*;
use proxy::crypto::{CertAlgorithmName, ProviderName};
use serde_json::Value;

const COLLECTION: &str = "merged";

/// One part of the side-by-side run, labelled as a compare cell for the report.
fn run_args(target: &str, start_at: &str) -> Vec<String> {
    let mut a = base_args(target, COLLECTION);
    for (flag, value) in [
        ("--points-per-request", "10"),
        ("--duration", "3s"),
        ("--verify-count", "false"),
        ("--start-at", start_at),
    ] {
        set_flag(&mut a, flag, value);
    }
    a.extend(args(&[
        "--cell-provider",
        "aws-lc-rs",
        "--cell-algorithm",
        "ecdsa-p256",
    ]));
    a
}

/// `n` processes of the same run, started together `lead` from now; their result files.
fn side_by_side(target: &str, n: usize, lead: Duration, dir: &Path) -> Vec<PathBuf> {
    let at = humantime::format_rfc3339_millis(SystemTime::now() + lead).to_string();
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let out = dir.join(format!("part{i}.json"));
            let a = run_args(target, &at);
            std::thread::spawn(move || (run_loadgen(&a, Some(&out)), out))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| {
            let (run, out) = h.join().expect("loadgen thread");
            assert!(run.status.success(), "{}", run.stderr);
            out
        })
        .collect()
}

fn read(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn histogram(v: &Value) -> hdrhistogram::Histogram<u64> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(v["histograms"]["latency_us"].as_str().expect("histogram"))
        .unwrap();
    hdrhistogram::serialization::Deserializer::new()
        .deserialize(&mut std::io::Cursor::new(bytes))
        .expect("HDR histogram")
}

/// `loadgen merge` of `parts` into `merged_path`, and what it wrote.
fn merged(parts: &[std::path::PathBuf], merged_path: &std::path::Path) -> Value {
    let mut merge_args = vec!["merge".to_owned()];
    merge_args.extend(parts.iter().map(|p| p.display().to_string()));
    merge_args.extend(["--out".to_owned(), merged_path.display().to_string()]);
    let run = run_loadgen(&merge_args, None);
    assert!(run.status.success(), "{}", run.stderr);
    eprintln!("{}", run.stdout.trim());
    read(merged_path)
}

#[test]
fn three_processes_merge_into_the_union_of_their_samples() {
    let data = temp_dir("merge-data");
    let qdrant = EmbeddedQdrant::start(&data);
    create_collection(qdrant.rest, COLLECTION, 64);
    let proxy = ProxyProcess::start(
        &format!("http://{}", qdrant.rest),
        ProviderName::AwsLcRs,
        CertAlgorithmName::EcdsaP256,
        &[],
    );
    let target = format!("localhost:{}", proxy.addr.port());
    let dir = temp_dir("merge");
    // Lead time for three debug builds to prepare on a busy 2-core machine.
    let parts = side_by_side(&target, 3, Duration::from_secs(10), &dir);
    let results: Vec<Value> = parts.iter().map(|p| read(p)).collect();

    // The barrier lined the measured windows up.
    let starts: Vec<f64> = results
        .iter()
        .map(|r| r["window"]["from_unix_s"].as_f64().unwrap())
        .collect();
    let spread = starts.iter().cloned().fold(f64::MIN, f64::max)
        - starts.iter().cloned().fold(f64::MAX, f64::min);
    assert!(spread < 0.5, "windows start {spread:.3} s apart");
    let m = merged(&parts, &dir.join("merged.json"));

    let sum = |key: &str| {
        results
            .iter()
            .map(|r| r[key].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(m["requests_ok"].as_u64(), Some(sum("requests_ok")));
    assert_eq!(m["requests_failed"].as_u64(), Some(sum("requests_failed")));
    assert_eq!(m["payload_bytes"].as_u64(), Some(sum("payload_bytes")));
    // Every acknowledged point of the three is in the collection, once.
    assert_eq!(
        count_points(qdrant.rest, COLLECTION),
        sum("requests_ok") * 10
    );

    // Percentiles of the union of samples, not an average of the three.
    let first = histogram(&results[0]);
    let mut union = hdrhistogram::Histogram::<u64>::new(first.sigfig()).unwrap();
    union.auto(true);
    for r in &results {
        union.add(histogram(r)).unwrap();
    }
    let ms = |us: u64| us as f64 / 1000.0;
    assert_eq!(m["latency_ms"]["count"].as_u64(), Some(union.len()));
    assert_eq!(
        m["latency_ms"]["p99"].as_f64(),
        Some(ms(union.value_at_quantile(0.99)))
    );
    assert_eq!(
        m["latency_ms"]["p50"].as_f64(),
        Some(ms(union.value_at_quantile(0.50)))
    );
    assert_eq!(m["latency_ms"]["max"].as_f64(), Some(ms(union.max())));
    let mean_of_p99s = results
        .iter()
        .map(|r| r["latency_ms"]["p99"].as_f64().unwrap())
        .sum::<f64>()
        / 3.0;
    eprintln!(
        "merge: {} requests, p99 of the union {:.3} ms (mean of the three p99s {:.3} ms)",
        m["requests_ok"],
        ms(union.value_at_quantile(0.99)),
        mean_of_p99s
    );
    // The loadgen processes' CPU adds up; one host.
    let cpu = |r: &Value| r["cpu"]["loadgen"]["cpu_seconds"].as_f64().unwrap();
    let cpu_sum: f64 = results.iter().map(cpu).sum();
    assert!((cpu(&m) - cpu_sum).abs() < 1e-9, "{} vs {cpu_sum}", cpu(&m));
    assert_eq!(m["merged_from"].as_array().unwrap().len(), 3);
    // The merged result keeps the parts' configuration as it is, so a report reads it as it
    // reads any result.
    assert_eq!(m["config"], results[0]["config"]);
    assert!(
        m["config"]["concurrency"].as_u64().is_some(),
        "{}",
        m["config"]
    );

    // A report over a folder with the three parts of one cell shows it once, merged.
    let report_dir = temp_dir("merge-report");
    std::fs::create_dir_all(report_dir.join("cells")).unwrap();
    for (i, p) in parts.iter().enumerate() {
        std::fs::copy(
            p,
            report_dir.join("cells").join(format!("cell-host{i}.json")),
        )
        .unwrap();
    }
    let run = run_loadgen(&args(&["report", report_dir.to_str().unwrap()]), None);
    assert!(run.status.success(), "{}", run.stderr);
    assert!(
        run.stdout.contains("(1 cells measured, 0 failed)"),
        "{}",
        run.stdout
    );

    // A run that did not overlap the others is refused.
    let late = side_by_side(&target, 1, Duration::from_secs(4), &temp_dir("merge-late"));
    let mut bad = vec!["merge".to_owned(), parts[0].display().to_string()];
    bad.extend([
        late[0].display().to_string(),
        "--out".to_owned(),
        dir.join("bad.json").display().to_string(),
    ]);
    let run = run_loadgen(&bad, None);
    assert_eq!(run.status.code(), Some(2), "{}", run.stdout);
    assert!(run.stderr.contains("do not overlap"), "{}", run.stderr);
}
