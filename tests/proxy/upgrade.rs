//! The in-place upgrade (SIGUSR2, `proxy upgrade`): under ingestion load the new binary
//! takes the listening sockets over and nothing is refused or lost; a new binary that cannot
//! start changes nothing; a second signal while an upgrade is under way is refused.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::*;
use proxy::crypto::ProviderName;

/// `proxy upgrade --ready-file F`, the command an operator (and the package) runs:
/// (success, what it printed).
fn proxy_upgrade(ready_file: &Path) -> (bool, String) {
    let out = Command::new(binary("proxy"))
        .args(["upgrade", "--timeout", "60s", "--ready-file"])
        .arg(ready_file)
        .output()
        .expect("proxy upgrade");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// A copy of the proxy binary in a folder of the test's, which the test may replace.
fn binary_copy(tag: &str) -> PathBuf {
    let bin = temp_dir(tag).join("proxy");
    std::fs::copy(binary("proxy"), &bin).expect("copy the proxy binary");
    bin
}

/// Replaces `bin` the way a package does: a new file renamed over the old path.
fn replace_with_script(bin: &Path, script: &str) {
    let new = bin.with_extension("new");
    std::fs::write(&new, script).unwrap();
    std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&new, bin).unwrap();
}

/// tests/interop/upsert_until.py, the official Python qdrant-client upserting over gRPC
/// with `wait=true` through the proxy for `seconds`, in a thread: its JSON line.
fn official_client_upserts(port: u16, seconds: u32) -> std::thread::JoinHandle<serde_json::Value> {
    let python = interop_python("qdrant-client");
    std::thread::spawn(move || {
        let out = Command::new(python)
            .arg(repo_root().join("tests/interop/upsert_until.py"))
            .args(["--host", "localhost", "--grpc-port", &port.to_string()])
            .arg("--ca")
            .arg(&certs().ca_cert)
            .args(["--seconds", &seconds.to_string()])
            .output()
            .expect("the official client");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(text.lines().last().unwrap_or_default()).expect("its JSON line")
    })
}

/// Ingestion through the proxy, the study's way (a new TLS connection per upsert, gRPC,
/// `wait=true`), over one long-lived HTTP/2 connection, and by the official Python client
/// over its gRPC channel, while the proxy is upgraded three times with `proxy upgrade`: no
/// request fails, every acknowledged point is stored, every old process exits after its
/// drain.
#[test]
fn three_upgrades_under_ingestion_load_refuse_nothing_and_lose_nothing() {
    let eq = EmbeddedQdrant::start(&temp_dir("upgrade-qdrant"));
    let proxy = ProxyProcess::in_front_of(
        &format!("http://{}", eq.grpc),
        &["--upstream-protocol", "h2c", "--shutdown-grace", "20s"],
    );
    let target = format!("localhost:{}", proxy.addr.port());
    let load = |policy: &str, concurrency: &str, collection: &str| {
        let mut a = base_args(&target, collection);
        set_flag(&mut a, "--concurrency", concurrency);
        a.extend(args(&[
            "--protocol",
            "grpc",
            "--connection-policy",
            policy,
            "--duration",
            "14s",
        ]));
        let out = temp_dir(&format!("upgrade-load-{collection}")).join("result.json");
        std::thread::spawn(move || run_loadgen(&a, Some(&out)))
    };
    let new_connections = load("new", "6", "upgrade_new");
    let long_lived = load("reuse", "2", "upgrade_reuse");
    let official = official_client_upserts(proxy.addr.port(), 14);

    std::thread::sleep(Duration::from_secs(2));
    let mut pids = vec![proxy.serving_pid()];
    for round in 1..=3 {
        let (ok, said) = proxy_upgrade(proxy.ready_file());
        assert!(ok, "upgrade {round}: {said}\n{}", proxy.log_text());
        let pid = proxy.serving_pid();
        assert!(
            !pids.contains(&pid),
            "upgrade {round}: still pid {pid}: {said}"
        );
        pids.push(pid);
        std::thread::sleep(Duration::from_secs(3));
    }

    for (what, run) in [
        (
            "a new connection per upsert",
            new_connections.join().unwrap(),
        ),
        (
            "one long-lived HTTP/2 connection",
            long_lived.join().unwrap(),
        ),
    ] {
        assert!(run.status.success(), "{what}: {}", run.stderr);
        let r = run.result.expect("the run's result");
        assert!(r["requests_ok"].as_u64().unwrap() > 0, "{what}: {r:#}");
        assert_eq!(
            r["requests_failed"], 0,
            "{what}: {:#}",
            r["failure_examples"]
        );
        // Every acknowledged point is in the collection (loadgen counts it afterwards).
        assert_eq!(r["verification"]["value"]["matches"], true, "{what}: {r:#}");
    }
    // The official Python client, over its one gRPC channel: nothing failed, all stored.
    let official = official.join().unwrap();
    assert_eq!(official["failed"], 0, "{official}");
    assert!(official["acked"].as_u64().unwrap() > 0, "{official}");
    assert_eq!(official["count"], official["acked"], "{official}");
    // The old processes drained and exited; the last one serves.
    let (old, last) = pids.split_at(pids.len() - 1);
    eventually("the old processes exit after their drain", WAIT, || {
        let left: Vec<&u32> = old.iter().filter(|p| !gone(**p)).collect();
        ready(left.is_empty(), || format!("still running: {left:?}"))
    });
    assert!(!gone(last[0]));
    let log = proxy.log_text();
    assert_eq!(
        log.matches("upgrade: the new process serves").count(),
        3,
        "{log}"
    );
    assert!(log.contains("started by an in-place upgrade"), "{log}");
    let (status, _) = plain_get(proxy.admin, "/readyz");
    assert_eq!(status, 200, "the admin port came over too");
}

/// A new binary that cannot start (here: one that exits at once) leaves the running proxy
/// serving as before, and every place says so: `proxy upgrade`'s exit status, the log, the
/// metric and the ready file. Then a new binary that takes a moment: a second SIGUSR2 in
/// that moment is refused, and the upgrade goes through.
#[test]
fn a_new_binary_that_cannot_start_changes_nothing_and_a_second_signal_waits_its_turn() {
    let upstream = EchoUpstream::start();
    let bin = binary_copy("upgrade-broken");
    let (cert, key) = server_cert(proxy::crypto::CertAlgorithmName::EcdsaP256);
    let proxy = ProxyProcess::start_binary(
        &bin,
        &listener_args(&upstream.url(), ProviderName::AwsLcRs, &cert, &key),
    );
    let before = proxy.serving_pid();
    replace_with_script(&bin, "#!/bin/sh\necho 'this build is broken' >&2\nexit 3\n");
    let (ok, said) = proxy_upgrade(proxy.ready_file());
    assert!(!ok, "{said}");
    assert!(said.contains("keeps serving"), "{said}");
    assert_eq!(proxy.serving_pid(), before);
    assert_eq!(
        proxy.metric("proxy_upgrades_total", &[("outcome", "failed")]),
        1.0
    );
    let log = proxy.log_text();
    assert!(
        log.contains("upgrade failed: this process keeps serving"),
        "{log}"
    );
    assert!(
        log.contains("this build is broken"),
        "the new binary's own words: {log}"
    );
    let (status, _) = plain_get(proxy.admin, "/healthz");
    assert_eq!(status, 200);
    let served = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(request_bounded(
            proxy.addr,
            client_config(&ClientOpts::default()),
            "GET",
            "/still",
            &[],
            bytes::Bytes::new(),
        ));
    assert_eq!(served.expect("still serving").status, 200);

    // A new binary that takes a second to start: the second signal arrives meanwhile.
    replace_with_script(
        &bin,
        &format!(
            "#!/bin/sh\nsleep 1\nexec {} \"$@\"\n",
            binary("proxy").display()
        ),
    );
    let pid = nix::unistd::Pid::from_raw(before as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR2).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR2).unwrap();
    let started = Instant::now();
    eventually("the upgrade through the slow binary", WAIT, || {
        let now = proxy.serving_pid();
        ready(now != before, || {
            format!("pid {now} after {:?}", started.elapsed())
        })
    });
    let log = proxy.log_text();
    assert!(
        log.contains("SIGUSR2 refused: an upgrade is already under way"),
        "{log}"
    );
}
