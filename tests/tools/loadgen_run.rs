//! `loadgen run` against the real proxy and the real Qdrant-compatible upstream
//! (embedded-qdrant), over loopback. Runs are short and bounded by request count. Its
//! power and host-CPU sources are in `loadgen_power`.

use std::time::Duration;

use e2e::*;
use proxy::crypto::CertAlgorithmName;
use serde_json::Value;

#[test]
fn every_policy_over_rest_and_grpc_stores_exactly_what_was_acknowledged() {
    let s = LoadgenStack::start();
    let dir = temp_dir("lg-policies");
    for (protocol, proxy) in [("rest", &s.rest), ("grpc", &s.grpc)] {
        for policy in ["new", "reuse", "per-n=3"] {
            let collection = format!("c-{protocol}-{}", policy.replace('=', ""));
            let out = dir.join(format!("{collection}.json"));
            let mut a = base_args(&format!("localhost:{}", proxy.addr.port()), &collection);
            a.extend(args(&[
                "--protocol",
                protocol,
                "--connection-policy",
                policy,
                "--requests",
                "12",
                "--recreate",
                "--resumption",
                "off",
                "--proxy-metrics",
                &format!("http://{}/metrics", proxy.admin),
                "--watch-pid",
                &format!("upstream={}", s.qdrant.pid()),
            ]));
            let run = run_loadgen(&a, Some(&out));
            let what = format!("{protocol} {policy}: {}\n{}", run.stdout, run.stderr);
            assert!(run.status.success(), "{what}");
            let r = run.result.expect("result written");
            assert_eq!(r["schema"], "loadgen.run/v1");
            assert_eq!(num(&r, &["requests_ok"]), 12.0, "{what}");
            assert_eq!(num(&r, &["requests_failed"]), 0.0, "{what}");
            assert_eq!(r["workload"]["protocol"], protocol);
            // The collection holds exactly the acknowledged points: 12 x 20, ids unique.
            let v = &r["verification"]["value"];
            assert_eq!(num(v, &["points_acknowledged"]), 240.0, "{what}");
            assert_eq!(num(v, &["count_after"]) - num(v, &["count_before"]), 240.0);
            assert_eq!(v["matches"], true);
            // Handshakes follow the policy, and the proxy counted the same ones.
            let handshakes = num(&r, &["handshakes", "count"]);
            match policy {
                "new" => assert_eq!(handshakes, 12.0, "{what}"),
                "reuse" => assert!((1.0..=2.0).contains(&handshakes), "{what}"),
                _ => assert!((4.0..=6.0).contains(&handshakes), "{what}"),
            }
            assert_eq!(num(&r, &["handshakes", "resumed"]), 0.0, "resumption off");
            let pm = &r["proxy_metrics"]["value"];
            assert_eq!(num(pm, &["handshakes"]), handshakes, "{what}");
            assert!(num(pm, &["cpu_seconds"]) > 0.0, "{what}");
            // Bytes, figures and the environment are recorded.
            let body = num(&r, &["workload", "request_body_bytes"]);
            assert!(body > 20.0 * 64.0 * 4.0, "{body}");
            let (min, max) = (
                num(&r, &["workload", "request_body_bytes_min"]),
                num(&r, &["workload", "request_body_bytes_max"]),
            );
            assert!(min <= body && body <= max, "{min} {body} {max}");
            // MB/s is the acknowledged bodies' exact bytes over the measured time.
            let sent = num(&r, &["payload_mb_per_second"]) * num(&r, &["measured_seconds"]) * 1e6;
            assert!(
                sent >= 12.0 * min - 1.0 && sent <= 12.0 * max + 1.0,
                "{sent}"
            );
            assert!(num(&r, &["payload_mb_per_second"]) > 0.0);
            assert!(num(&r, &["latency_ms", "p50"]) > 0.0);
            assert!(num(&r, &["latency_ms", "max"]) >= num(&r, &["latency_ms", "p99"]));
            assert_eq!(r["tls_verification"], true);
            assert_eq!(r["cpu"]["watched"][0]["name"], "upstream");
            assert!(r["environment"]["cpu_model"].as_str().is_some());
            assert_eq!(r["power"]["value"], Value::Null);
            assert!(r["power"]["reason"]
                .as_str()
                .unwrap()
                .contains("--power none"));
            assert!(run.stdout.contains("requests/s"), "{}", run.stdout);
        }
    }
}

#[test]
fn open_loop_latency_includes_the_queueing_behind_a_slow_upstream() {
    // The upstream takes 100 ms per request and one connection serves one at a time, so at
    // most 10 requests/s get through; 20/s are scheduled for 2 s. Request k is due at
    // k x 50 ms and cannot finish before (k + 1) x 100 ms: its latency from the schedule is at
    // least 50k + 100 ms, up to about 2 s for the last one. A driver that measured from the
    // actual send (coordinated omission) would report about 100 ms throughout.
    let slow = StaticAnswer::start_delayed(
        br#"{"result":{"status":"acknowledged"},"status":"ok","time":0.1}"#.to_vec(),
        Duration::from_millis(100),
    );
    let proxy = ProxyProcess::in_front_of(&slow.url(), &[]);
    let out = temp_dir("lg-open").join("open.json");
    let mut a = base_args(&format!("localhost:{}", proxy.addr.port()), "slow");
    set_flag(&mut a, "--concurrency", "1");
    a.extend(args(&[
        "--protocol",
        "rest",
        "--rate",
        "20",
        "--duration",
        "2s",
        "--verify-count",
        "false",
    ]));
    let run = run_loadgen(&a, Some(&out));
    assert!(run.status.success(), "{}\n{}", run.stdout, run.stderr);
    let r = run.result.expect("result");
    assert_eq!(num(&r, &["requests_ok"]), 40.0, "{}", run.stdout);
    let p50 = num(&r, &["latency_ms", "p50"]);
    let max = num(&r, &["latency_ms", "max"]);
    assert!(
        p50 >= 1000.0,
        "p50 {p50} ms must include the queueing delay"
    );
    assert!(
        max >= 2000.0,
        "max {max} ms must include the queueing delay"
    );
    assert!(num(&r, &["schedule_lag_ms", "max"]) >= 1500.0);
    let warnings = r["warnings"].to_string();
    assert!(warnings.contains("could not keep up"), "{warnings}");
}

#[test]
fn embeddings_mode_embeds_once_then_reuses_the_cache_and_the_file() {
    let s = LoadgenStack::start();
    let ovms = FakeOvms::start(48);
    let dir = temp_dir("lg-embed");
    let corpus = dir.join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    for i in 0..3 {
        let text: String = (0..400)
            .map(|w| format!("word{}-{} ", i, w))
            .collect::<String>();
        std::fs::write(corpus.join(format!("doc{i}.txt")), text).unwrap();
    }
    let cache = dir.join("vectors.bin");
    let target = format!("localhost:{}", s.grpc.addr.port());
    let embed_args = |collection: &str| {
        let mut a = base_args(&target, collection);
        a.extend(args(&[
            "--vectors",
            "embeddings",
            "--embeddings-url",
            &ovms.url(),
            "--corpus",
            corpus.to_str().unwrap(),
            "--vectors-file",
            cache.to_str().unwrap(),
            "--embed-batch",
            "8",
            "--chunk-chars",
            "200",
            "--requests",
            "6",
            "--recreate",
            "--protocol",
            "grpc",
        ]));
        a
    };

    let first = run_loadgen(&embed_args("emb1"), Some(&dir.join("1.json")));
    assert!(first.status.success(), "{}\n{}", first.stdout, first.stderr);
    let r1 = first.result.unwrap();
    assert_eq!(
        num(&r1, &["workload", "dim"]),
        48.0,
        "dimension comes from the model"
    );
    assert!(r1["workload"]["vectors_source"]
        .as_str()
        .unwrap()
        .contains("embeddings("));
    assert_eq!(r1["verification"]["value"]["matches"], true, "{r1:#}");
    let calls = ovms.calls();
    assert!(calls >= 2, "corpus sent in batches of 8: {calls} calls");
    assert!(cache.is_file());

    let second = run_loadgen(&embed_args("emb2"), Some(&dir.join("2.json")));
    assert!(second.status.success(), "{}", second.stderr);
    assert_eq!(ovms.calls(), calls, "the rerun used the cache");
    assert!(
        second.stderr.contains("(cached)") || second.stdout.contains("(cached)") || {
            // --quiet hides the vectors line; the source still names the cached file.
            second.result.as_ref().unwrap()["workload"]["vectors_source"]
                .as_str()
                .unwrap()
                .contains("file(")
        }
    );

    let mut from_file = base_args(&target, "emb3");
    from_file.extend(args(&[
        "--vectors",
        "file",
        "--vectors-file",
        cache.to_str().unwrap(),
        "--requests",
        "4",
        "--recreate",
        "--protocol",
        "grpc",
        "--embed-live",
        "20",
        "--embeddings-url",
        &ovms.url(),
        "--corpus",
        corpus.to_str().unwrap(),
    ]));
    let third = run_loadgen(&from_file, Some(&dir.join("3.json")));
    assert!(third.status.success(), "{}", third.stderr);
    let r3 = third.result.unwrap();
    assert!(r3["workload"]["vectors_source"]
        .as_str()
        .unwrap()
        .starts_with("file("));
    assert_eq!(num(&r3, &["workload", "dim"]), 48.0);
    assert_eq!(num(&r3, &["requests_ok"]), 4.0);
    let live = &r3["embed_live"];
    assert!(num(live, &["ok"]) + num(live, &["failed"]) >= 1.0, "{live}");
    assert_eq!(num(live, &["failed"]), 0.0, "{live}");
}

#[test]
fn failed_requests_are_counted_and_reported() {
    let s = LoadgenStack::start();
    let dir = temp_dir("lg-fail");
    let target = format!("localhost:{}", s.rest.addr.port());
    // A 64-d collection, then 32-d vectors into it: every upsert is refused with 400.
    let mut make = base_args(&target, "dims");
    make.extend(args(&["--requests", "2", "--recreate"]));
    assert!(run_loadgen(&make, None).status.success());
    let mut wrong = base_args(&target, "dims");
    set_flag(&mut wrong, "--dim", "32");
    wrong.extend(args(&["--requests", "5"]));
    let run = run_loadgen(&wrong, Some(&dir.join("wrong.json")));
    assert_eq!(
        run.status.code(),
        Some(1),
        "no request succeeded: exit 1\n{}",
        run.stderr
    );
    let r = run
        .result
        .expect("the result is written even when everything failed");
    assert_eq!(num(&r, &["requests_ok"]), 0.0);
    assert_eq!(num(&r, &["requests_failed"]), 5.0);
    assert_eq!(num(&r, &["failures", "http_400"]), 5.0, "{r:#}");
    assert!(r["failure_examples"]["http_400"]
        .as_str()
        .unwrap()
        .contains("400"));
    assert!(run.stdout.contains("failed http_400: 5"), "{}", run.stdout);
    assert_eq!(r["verification"]["value"]["points_acknowledged"], 0);

    // The same over gRPC: InvalidArgument (3).
    let gtarget = format!("localhost:{}", s.grpc.addr.port());
    let mut make = base_args(&gtarget, "gdims");
    make.extend(args(&[
        "--requests",
        "1",
        "--recreate",
        "--protocol",
        "grpc",
    ]));
    assert!(run_loadgen(&make, None).status.success());
    let mut wrong = base_args(&gtarget, "gdims");
    set_flag(&mut wrong, "--dim", "32");
    wrong.extend(args(&["--requests", "3", "--protocol", "grpc"]));
    let run = run_loadgen(&wrong, Some(&dir.join("gwrong.json")));
    let r = run.result.expect("result");
    assert_eq!(num(&r, &["failures", "grpc_3"]), 3.0, "{r:#}");
}

#[test]
fn a_target_that_refuses_tls_or_is_untrusted_gives_a_clear_error() {
    let s = LoadgenStack::start();
    // The plaintext REST port of the upstream: TLS cannot be negotiated.
    let mut a = base_args(&format!("127.0.0.1:{}", s.qdrant.rest.port()), "x");
    a.extend(args(&["--requests", "1", "--protocol", "rest"]));
    let run = run_loadgen(&a, None);
    assert_eq!(run.status.code(), Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("TLS handshake"), "{}", run.stderr);

    // A CA that did not sign the proxy's certificate.
    let other = temp_dir("lg-other-ca");
    let other_set = proxy::crypto::generate_cert_set(&other, &[CertAlgorithmName::EcdsaP256], &[])
        .expect("certs");
    let mut a = base_args(&format!("localhost:{}", s.rest.addr.port()), "x");
    set_flag(&mut a, "--ca", &other_set.ca_cert.display().to_string());
    a.extend(args(&["--requests", "1"]));
    let run = run_loadgen(&a, None);
    assert_eq!(run.status.code(), Some(2));
    assert!(
        run.stderr.to_lowercase().contains("certificate"),
        "{}",
        run.stderr
    );

    // Nothing listening.
    let mut a = base_args("127.0.0.1:1", "x");
    a.extend(args(&["--requests", "1"]));
    let run = run_loadgen(&a, None);
    assert_eq!(run.status.code(), Some(2));
    assert!(run.stderr.contains("connect"), "{}", run.stderr);
}

#[test]
fn grpc_workers_can_share_one_http2_connection_like_a_grpc_channel() {
    let s = LoadgenStack::start();
    let out = temp_dir("lg-shared").join("shared.json");
    let mut a = base_args(&format!("localhost:{}", s.grpc.addr.port()), "shared");
    set_flag(&mut a, "--concurrency", "4");
    a.extend(args(&[
        "--protocol",
        "grpc",
        "--connections",
        "1",
        "--requests",
        "20",
        "--recreate",
        "--proxy-metrics",
        &format!("http://{}/metrics", s.grpc.admin),
    ]));
    let run = run_loadgen(&a, Some(&out));
    assert!(run.status.success(), "{}\n{}", run.stdout, run.stderr);
    let r = run.result.unwrap();
    assert_eq!(num(&r, &["requests_ok"]), 20.0);
    assert_eq!(
        num(&r, &["handshakes", "count"]),
        1.0,
        "one connection for 4 workers"
    );
    assert_eq!(num(&r, &["proxy_metrics", "value", "handshakes"]), 1.0);
    assert_eq!(r["verification"]["value"]["matches"], true);

    // Sharing makes no sense for HTTP/1.1: refused up front.
    let mut rest = base_args(&format!("localhost:{}", s.rest.addr.port()), "shared");
    rest.extend(args(&["--connections", "1", "--requests", "1"]));
    let run = run_loadgen(&rest, None);
    assert_eq!(run.status.code(), Some(2));
    assert!(run.stderr.contains("--protocol grpc"), "{}", run.stderr);
}

#[test]
fn insecure_mode_skips_verification_and_says_so() {
    let s = LoadgenStack::start();
    let other = temp_dir("lg-insecure-ca");
    let other_set = proxy::crypto::generate_cert_set(&other, &[CertAlgorithmName::EcdsaP256], &[])
        .expect("certs");
    let out = temp_dir("lg-insecure").join("r.json");
    let mut a = base_args(&format!("localhost:{}", s.rest.addr.port()), "insecure");
    set_flag(&mut a, "--ca", &other_set.ca_cert.display().to_string());
    a.extend(args(&["--insecure", "--requests", "2"]));
    let run = run_loadgen(&a, Some(&out));
    assert!(run.status.success(), "{}", run.stderr);
    let r = run.result.unwrap();
    assert_eq!(r["tls_verification"], false);
    assert!(
        run.stdout.contains("TLS verification OFF"),
        "{}",
        run.stdout
    );
}

/// A bad value is refused before anything is changed: `--rate 0` with `--recreate` leaves
/// the collection's points where they are, and `compare` refuses the same flag after `--`
/// before it starts any proxy.
#[test]
fn bad_values_are_refused_before_anything_is_changed() {
    let s = LoadgenStack::start();
    let target = format!("localhost:{}", s.rest.addr.port());
    let mut a = base_args(&target, "keepme");
    a.extend(args(&["--requests", "4", "--recreate"]));
    let run = run_loadgen(&a, None);
    assert!(run.status.success(), "{}", run.stderr);
    let count = || {
        let (status, v) = http_json(
            s.qdrant.rest,
            "POST",
            "/collections/keepme/points/count",
            r#"{"exact":true}"#,
        );
        assert_eq!(status, 200, "{v}");
        v["result"]["count"].as_u64().unwrap()
    };
    let before = count();
    assert!(before > 0);

    let mut bad = base_args(&target, "keepme");
    bad.extend(args(&["--requests", "4", "--recreate", "--rate", "0"]));
    let run = run_loadgen(&bad, None);
    assert_eq!(run.status.code(), Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("--rate 0"), "{}", run.stderr);
    assert_eq!(count(), before, "the collection was not recreated");

    // A congestion control the kernel does not offer is refused the same way, with the
    // kernel's reason and how to see what it offers.
    let mut bad = base_args(&target, "keepme");
    bad.extend(args(&[
        "--requests",
        "4",
        "--recreate",
        "--congestion-control",
        "no-such-algorithm",
    ]));
    let run = run_loadgen(&bad, None);
    assert_eq!(run.status.code(), Some(2), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("--congestion-control no-such-algorithm: the kernel refused it")
            && run.stderr.contains("tcp_available_congestion_control"),
        "{}",
        run.stderr
    );
    assert_eq!(count(), before, "the collection was not recreated");

    let out = temp_dir("lg-bad-compare");
    let run = run_loadgen(
        &args(&[
            "compare",
            "--providers",
            "ring",
            "--algorithms",
            "ecdsa-p256",
            "--out",
            out.to_str().unwrap(),
            "--proxy-bin",
            binary("proxy").to_str().unwrap(),
            "--upstream-bin",
            binary("embedded-qdrant").to_str().unwrap(),
            "--",
            "--rate",
            "0",
        ]),
        None,
    );
    assert_eq!(run.status.code(), Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("--rate 0"), "{}", run.stderr);
    assert!(
        !run.stderr.contains("[1/"),
        "no cell started: {}",
        run.stderr
    );
}

/// Qdrant's API key end to end: embedded-qdrant refuses requests without it as Qdrant
/// does (REST 401, gRPC UNAUTHENTICATED; health checks stay open), the proxy forwards
/// `api-key` and `authorization` untouched, `loadgen run --api-key` (or `--header` with a
/// bearer token) ingests over REST and gRPC, and the result records neither secret.
#[test]
fn api_keys_reach_qdrant_through_the_proxy_and_stay_out_of_the_result() {
    const KEY: &str = "k3y-for-the-test-0123456789";
    let LoadgenStack { qdrant, rest, grpc } = LoadgenStack::start_with(&["--api-key", KEY]);
    let (code, body) = http_raw(qdrant.rest, "GET", "/collections", &[], "");
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("Must provide an API key"), "{body}");
    let (code, _) = http_raw(qdrant.rest, "GET", "/healthz", &[], "");
    assert_eq!(code, 200);
    let key_line = format!("api-key: {KEY}");
    let (code, body) = http_raw(qdrant.rest, "GET", "/collections", &[&key_line], "");
    assert_eq!(code, 200, "{body}");
    let bearer = format!("Bearer {KEY}");
    let bearer_line = format!("Authorization: {bearer}");
    let (code, body) = http_raw(qdrant.rest, "GET", "/collections", &[&bearer_line], "");
    assert_eq!(code, 200, "{body}");

    let dir = temp_dir("lg-key");
    for (proxy, protocol) in [(&rest, "rest"), (&grpc, "grpc")] {
        let target = format!("localhost:{}", proxy.addr.port());
        // Without the key: refused by the database, through the proxy, and said so.
        let mut no_key = base_args(&target, "keyed");
        no_key.extend(args(&["--requests", "2", "--protocol", protocol]));
        let run = run_loadgen(&no_key, None);
        assert!(!run.status.success(), "{protocol}: {}", run.stdout);
        assert!(
            // REST: HTTP 401; gRPC: status 16, UNAUTHENTICATED.
            run.stderr.contains("401") || run.stderr.contains("grpc-status 16"),
            "{protocol}: {}",
            run.stderr
        );
        // With it: stored, exactly.
        let out = dir.join(format!("{protocol}.json"));
        let mut keyed = base_args(&target, "keyed");
        keyed.extend(args(&[
            "--requests",
            "6",
            "--recreate",
            "--protocol",
            protocol,
            "--api-key",
            KEY,
            "--header",
            "x-team: ingestion",
        ]));
        let run = run_loadgen(&keyed, Some(&out));
        assert!(run.status.success(), "{protocol}: {}", run.stderr);
        let r = run.result.expect("result");
        assert_eq!(num(&r, &["requests_ok"]), 6.0, "{r:#}");
        assert_eq!(
            r["verification"]["value"]["points_acknowledged"], 120,
            "{r:#}"
        );
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(!text.contains(KEY), "the key leaked into the result");
        assert_eq!(r["config"]["api_key"], "(set)", "{r:#}");
        assert_eq!(r["config"]["headers"][0], "x-team: (redacted)", "{r:#}");
    }
    // A bearer token through --header works as well (REST).
    let target = format!("localhost:{}", rest.addr.port());
    let mut bearer_run = base_args(&target, "keyed");
    bearer_run.extend(args(&[
        "--requests",
        "2",
        "--header",
        &format!("authorization: {bearer}"),
    ]));
    let run = run_loadgen(&bearer_run, None);
    assert!(run.status.success(), "{}", run.stderr);
    // The key from a file (a mounted Secret, compose's generated key), with the newline
    // such files end in; the path is recorded, the key is not.
    let key_file = dir.join("api-key");
    std::fs::write(&key_file, format!("{KEY}\n")).unwrap();
    let out = dir.join("from-file.json");
    let mut file_run = base_args(&target, "keyed");
    file_run.extend(args(&[
        "--requests",
        "2",
        "--api-key-file",
        key_file.to_str().unwrap(),
    ]));
    let run = run_loadgen(&file_run, Some(&out));
    assert!(run.status.success(), "{}", run.stderr);
    assert!(!std::fs::read_to_string(&out).unwrap().contains(KEY));
    assert_eq!(
        run.result.expect("result")["config"]["api_key_file"],
        key_file.to_str().unwrap()
    );
}

/// `--proxy-cpu-budget` on a run: the watched proxy gets the quota for the run (recorded as
/// read back from its cgroup files), and goes back to its own cgroup afterwards. Where this
/// machine has no writable cgroup cpu controller, the refusal names what is missing.
#[test]
fn a_run_lends_the_watched_proxy_a_cpu_budget_and_takes_it_back() {
    let s = LoadgenStack::start();
    let proxy_pid = s.grpc.serving_pid();
    let cgroups = loadgen::budget::Cgroups::default();
    let before = loadgen::budget::read_quota(&cgroups, proxy_pid)
        .ok()
        .flatten();
    let out = temp_dir("lg-budget").join("r.json");
    let mut a = base_args(&format!("localhost:{}", s.grpc.addr.port()), "budget");
    a.extend(args(&[
        "--protocol",
        "grpc",
        "--requests",
        "6",
        "--watch-pid",
        &format!("proxy={proxy_pid}"),
        "--proxy-cpu-budget",
        "0.3",
    ]));
    let run = run_loadgen(&a, Some(&out));
    if !run.status.success() {
        assert!(
            run.stderr.contains("cannot give pid") && run.stderr.contains("cgroup"),
            "{}",
            run.stderr
        );
        eprintln!(
            "SKIPPED the quota itself: no writable cgroup here: {}",
            run.stderr
        );
        return;
    }
    let r = run.result.expect("result written");
    let proxy = &r["cpu"]["watched"][0];
    assert_eq!(proxy["name"], "proxy", "{r:#}");
    assert_eq!(proxy["cpu_quota"]["cores"], 0.3, "{proxy:#}");
    assert_eq!(num(&r, &["requests_ok"]), 6.0);
    let after = loadgen::budget::read_quota(&cgroups, proxy_pid)
        .ok()
        .flatten();
    assert_eq!(after, before, "the proxy is back in its own cgroup");
    // Without a watched proxy there is nothing to budget.
    let mut b = base_args(&format!("localhost:{}", s.grpc.addr.port()), "budget");
    b.extend(args(&["--requests", "1", "--proxy-cpu-budget", "0.3"]));
    let refused = run_loadgen(&b, None);
    assert_eq!(refused.status.code(), Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("--watch-pid proxy=PID"),
        "{}",
        refused.stderr
    );
}
