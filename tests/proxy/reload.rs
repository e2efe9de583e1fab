//! Reloading the whole configuration under load: `loadgen run` ingests through the proxy,
//! a new TLS connection per upsert, while the configuration file is rewritten three times:
//! SIGHUP moves the listener to another Qdrant node and adds a listener, a broken file
//! (picked up by the file watch, no signal) is refused with the old configuration kept, and
//! a SIGHUP balances over both nodes and removes the added listener. Not one request may
//! fail, and each change must show where it should: points on both nodes, the added
//! listener serving and then gone, the refusal logged and counted.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use e2e::*;
use proxy::crypto::CertAlgorithmName;

const COLLECTION: &str = "reloaded";

fn write_config(path: &Path, listeners: &str, extra_top: &str) {
    let (cert, key) = server_cert(CertAlgorithmName::EcdsaP256);
    let text = format!(
        "provider = \"aws-lc-rs\"\ncert_watch_interval = \"200ms\"\n{extra_top}\n{}",
        listeners
            .replace("CERT", &cert.display().to_string())
            .replace("KEY", &key.display().to_string())
    );
    // Written beside and renamed, as configuration management does: never half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn listener(name: &str, listen: &str, upstream: &str) -> String {
    format!(
        "[[listener]]\nname = \"{name}\"\nlisten = \"{listen}\"\ncert = \"CERT\"\nkey = \"KEY\"\n\
         upstream = {upstream}\n"
    )
}

/// Waits until the sum of `name`'s samples with `labels` reaches `at_least`.
fn wait_sum(proxy: &ProxyProcess, name: &str, labels: &[(&str, &str)], at_least: f64) {
    eventually(&format!("{name}{labels:?} >= {at_least}"), WAIT, || {
        let text = proxy.metrics();
        ready(metric_sum(&text, name, labels) >= at_least, || text)
    });
}

fn curl_status(addr: SocketAddr) -> Result<String, String> {
    let out = std::process::Command::new(system_tool("curl"))
        .args([
            "-sS",
            "--max-time",
            "10",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--cacert",
        ])
        .arg(&certs().ca_cert)
        .args(["--resolve", &format!("localhost:{}:127.0.0.1", addr.port())])
        .arg(format!("https://localhost:{}/collections", addr.port()))
        .output()
        .expect("curl");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn a_rolling_reload_under_load_drops_nothing() {
    let a = EmbeddedQdrant::start(&temp_dir("reload-a"));
    let b = EmbeddedQdrant::start(&temp_dir("reload-b"));
    for node in [&a, &b] {
        create_collection(node.rest, COLLECTION, 64);
    }
    let node = |q: &EmbeddedQdrant| format!("\"http://{}\"", q.rest);
    let dir = temp_dir("reload");
    let config = dir.join("proxy.toml");
    write_config(&config, &listener("rest", "127.0.0.1:0", &node(&a)), "");
    let proxy = ProxyProcess::start_raw(&args(&["--config", config.to_str().unwrap()]));
    let target = format!("localhost:{}", proxy.addr.port());
    let extra = free_loopback_addr();

    // About 12 s of ingestion, every upsert on a new TLS connection, so each one meets the
    // configuration in effect when it connects.
    let load = std::thread::spawn(move || {
        let mut a = base_args(&target, COLLECTION);
        a.extend(args(&[
            "--duration",
            "12s",
            "--connection-policy",
            "new",
            "--protocol",
            "rest",
            "--verify-count",
            "false",
        ]));
        let out = temp_dir("reload-result").join("run.json");
        run_loadgen(&a, Some(&out))
    });
    std::thread::sleep(Duration::from_millis(2500));

    // 1. SIGHUP: the listener moves to node b, and a second listener starts.
    write_config(
        &config,
        &(listener("rest", "127.0.0.1:0", &node(&b))
            + &listener("extra", &extra.to_string(), &node(&a))),
        "",
    );
    proxy.hangup();
    wait_sum(
        &proxy,
        "proxy_config_reloads_total",
        &[("outcome", "ok")],
        1.0,
    );
    assert_eq!(
        curl_status(extra),
        Ok("200".to_owned()),
        "the added listener"
    );
    std::thread::sleep(Duration::from_millis(2000));

    // 2. A broken file, found by the watch: refused, counted, the configuration stays.
    write_config(
        &config,
        &listener("rest", "127.0.0.1:0", &node(&a)),
        "bogus_setting = 1",
    );
    wait_sum(
        &proxy,
        "proxy_config_reloads_total",
        &[("outcome", "error")],
        1.0,
    );
    assert_eq!(
        curl_status(extra),
        Ok("200".to_owned()),
        "kept after a refusal"
    );
    std::thread::sleep(Duration::from_millis(2000));

    // 3. SIGHUP: both nodes, balanced; the added listener goes away; a new limit.
    let ok_before = metric_sum(
        &proxy.metrics(),
        "proxy_config_reloads_total",
        &[("outcome", "ok")],
    );
    write_config(
        &config,
        &listener(
            "rest",
            "127.0.0.1:0",
            &format!("[{}, {}]", node(&a), node(&b)),
        ),
        "[limits]\nmax_request_body_bytes = 16777216\n",
    );
    proxy.hangup();
    wait_sum(
        &proxy,
        "proxy_config_reloads_total",
        &[("outcome", "ok")],
        ok_before + 1.0,
    );
    eventually("the removed listener refusing", WAIT, || {
        ready(curl_status(extra).is_err(), || {
            "it still accepts".to_owned()
        })
    });

    nothing_was_dropped(&load.join().unwrap(), &a, &b, &proxy);
}

/// The load through the reloads: no request failed, every acknowledged point is on one of
/// the nodes and both took some, and the log names each reload's outcome.
fn nothing_was_dropped(
    run: &LoadgenRun,
    a: &EmbeddedQdrant,
    b: &EmbeddedQdrant,
    proxy: &ProxyProcess,
) {
    assert!(
        run.status.success(),
        "loadgen: {}\n{}",
        run.stdout,
        run.stderr
    );
    let r = run.result.as_ref().expect("result");
    let ok = r["requests_ok"].as_u64().unwrap();
    assert_eq!(r["requests_failed"].as_u64(), Some(0), "{r:#}");
    assert!(ok > 20, "too little load to say anything: {ok} requests");
    // Every acknowledged point is on one of the nodes, and both took some.
    let (on_a, on_b) = (
        count_points(a.rest, COLLECTION),
        count_points(b.rest, COLLECTION),
    );
    assert!(on_a > 0 && on_b > 0, "a {on_a}, b {on_b}");
    assert_eq!(on_a + on_b, ok * 20, "acknowledged points lost or doubled");
    let log = proxy.log_text();
    assert!(
        log.contains("configuration reload refused") && log.contains("bogus_setting"),
        "{log}"
    );
    assert!(log.contains("listener removed"), "{log}");
    assert!(log.contains("listener reconfigured"), "{log}");
    eprintln!("{ok} upserts, none failed; points on a {on_a}, on b {on_b}");
}
