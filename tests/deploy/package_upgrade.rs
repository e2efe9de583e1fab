//! The package upgrading a running proxy in place, as an operator upgrades it for a
//! security fix: in a container booted with systemd, revision 1 of the package installed
//! by the README's quick start, then revisions 2, 3 and 4 installed with `dpkg -i` one after
//! another while writers upsert through the proxy (each upsert `wait=true` on a new TLS
//! connection, and large uploads in flight). The package's postinst upgrades the running
//! proxy in place (`proxy upgrade`): no request fails or is refused, every acknowledged
//! point is stored, systemd follows each new process as the service's main one and every
//! old one exits after its drain. Then `systemctl restart`, which stays a stop and a start,
//! under the same load: its refused requests are counted and printed, not asserted.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::*;

/// The writers, started in the container: `small` writers upsert one point per request on
/// a new TLS connection, one `big` writer upserts the mounted 1,000-point body; each logs
/// `epoch_ms id http_code seconds` per request into /root/load/.
const WRITERS: &str = r#"
set -u
mkdir -p /root/load
KEY=$(sed -n 's/^QDRANT__SERVICE__API_KEY=//p' /etc/qdrant/api-key.env)
send() { # send ID BODY_ARG...: one upsert on a new connection
  curl -s -o /dev/null -w '%{http_code} %{time_total}' --cacert /etc/vector-tls-proxy/certs/ca.crt \
    -H "api-key: $KEY" -H 'content-type: application/json' -X PUT \
    'https://localhost:6333/collections/upgrade/points?wait=true' "${@:2}"
}
small() { # small N SECONDS
  local n=$1 end=$((SECONDS + $2)) i=0
  while [ $SECONDS -lt $end ]; do
    local id=$((n * 1000000 + i)) at
    at=$(date +%s%3N)
    echo "$at $id $(send $id -d "{\"points\":[{\"id\":$id,\"vector\":[0.1,0.2,0.3,0.4]}]}")" >> /root/load/small.$n
    i=$((i + 1))
  done
  touch /root/done.small.$n
}
big() { # big SECONDS: the mounted body, ids 900000000.., again and again
  local end=$((SECONDS + $1))
  while [ $SECONDS -lt $end ]; do
    local at
    at=$(date +%s%3N)
    echo "$at big $(send 0 --data-binary @/root/big.json)" >> /root/load/big
  done
  touch /root/done.big
}
"#;

/// A 1,000-point upsert of 4-d vectors (about 60 KB), ids 900000000 to 900000999.
fn big_body() -> PathBuf {
    let points: Vec<String> = (0..1000)
        .map(|i| {
            format!(
                "{{\"id\":{},\"vector\":[0.5,0.25,{i}.0,1.0]}}",
                900_000_000 + i
            )
        })
        .collect();
    let file = temp_dir("upgrade-big").join("big.json");
    std::fs::write(&file, format!("{{\"points\":[{}]}}", points.join(","))).unwrap();
    file
}

/// Revision `rev` of the package, from this test build's binary.
fn package(rev: u32) -> PathBuf {
    let dist = temp_dir(&format!("upgrade-dist-{rev}"));
    run_ok(
        Command::new(repo_root().join("deploy/package/build.sh"))
            .env("CARGO_TARGET_DIR", target_dir())
            .args([
                "--profile",
                "dev",
                "--no-build",
                "--revision",
                &rev.to_string(),
            ])
            .arg("--out")
            .arg(&dist),
        "deploy/package/build.sh",
    );
    dist
}

/// Requests logged by the writers: (epoch ms, what, HTTP code, seconds).
fn logged(sd: &SystemdContainer) -> Vec<(u64, String, String, f64)> {
    sd.sh("cat /root/load/*")
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((
                f[0].parse().ok()?,
                f[1].to_owned(),
                f.get(2)?.to_string(),
                f.get(3)?.parse().ok()?,
            ))
        })
        .collect()
}

fn p99(mut seconds: Vec<f64>) -> f64 {
    seconds.sort_by(f64::total_cmp);
    seconds
        .get((seconds.len() * 99 / 100).min(seconds.len().saturating_sub(1)))
        .copied()
        .unwrap_or(f64::NAN)
}

fn main_pid(sd: &SystemdContainer) -> u32 {
    sd.sh("systemctl show -p MainPID --value vector-tls-proxy")
        .trim()
        .parse()
        .unwrap()
}

fn now_ms(sd: &SystemdContainer) -> u64 {
    sd.sh("date +%s%3N").trim().parse().unwrap()
}

#[test]
fn the_package_upgrades_a_running_proxy_in_place_under_load() {
    if !containers_available("package_upgrade") {
        return;
    }
    let images = test_images();
    let dists: Vec<PathBuf> = (1..=4).map(package).collect();
    let big = big_body();
    let qdrant_double = binary("embedded-qdrant");
    let mut mounts: Vec<(&Path, String)> = vec![
        (
            qdrant_double.as_path(),
            "/usr/local/lib/qdrant-test-double".into(),
        ),
        (big.as_path(), "/root/big.json".into()),
        (dists[0].as_path(), "/root/dist".into()),
    ];
    for (i, d) in dists.iter().enumerate().skip(1) {
        mounts.push((d.as_path(), format!("/root/dist{}", i + 1)));
    }
    let mounts: Vec<(&Path, &str)> = mounts.iter().map(|(h, c)| (*h, c.as_str())).collect();
    let sd = SystemdContainer::boot(&images.systemd_base, &mounts);
    sd.sh("install -m 755 /usr/local/lib/qdrant-test-double /usr/bin/qdrant");
    for block in &crate::systemd::quick_start_blocks()[1..] {
        sd.sh(&format!("sudo() {{ \"$@\"; }}\nset -euo pipefail\n{block}"));
    }
    eventually("the proxy serves", WAIT, || {
        let (code, text) = sd.try_sh("curl -fsS http://127.0.0.1:9900/readyz");
        ready(code == 0, || text)
    });
    sd.sh(
        "KEY=$(sed -n 's/^QDRANT__SERVICE__API_KEY=//p' /etc/qdrant/api-key.env); \
           curl -fsS --cacert /etc/vector-tls-proxy/certs/ca.crt -H \"api-key: $KEY\" -X PUT \
           -H 'content-type: application/json' https://localhost:6333/collections/upgrade \
           -d '{\"vectors\":{\"size\":4,\"distance\":\"Cosine\"}}'",
    );

    // 4 small writers and the big one, for 24 s; the upgrades start after 4 s.
    sd.sh(&format!(
        "cat > /root/writers.sh <<'EOF'\n{WRITERS}\nEOF\n\
         for n in 1 2 3 4; do setsid bash -c \"source /root/writers.sh; small $n 24\" >/dev/null 2>&1 < /dev/null & done; \
         setsid bash -c 'source /root/writers.sh; big 24' >/dev/null 2>&1 < /dev/null & \
         echo started"
    ));
    std::thread::sleep(Duration::from_secs(4));
    let quiet_until = now_ms(&sd);
    let (pids, windows) = upgrade_to_revisions_2_to_4(&sd);
    assert_eq!(
        sd.sh("dpkg-query -W -f '${Version}' vector-tls-proxy"),
        format!("{}-4", env!("CARGO_PKG_VERSION"))
    );
    // The writers finish; nothing failed, and every acknowledged point is stored.
    let deadline = Instant::now() + Duration::from_secs(40);
    while sd.try_sh("ls /root/done.* 2>/dev/null | wc -l").1.trim() != "5" {
        assert!(Instant::now() < deadline, "the writers did not finish");
        std::thread::sleep(Duration::from_millis(500));
    }
    let requests = logged(&sd);
    let failed: Vec<_> = requests.iter().filter(|r| r.2 != "200").collect();
    assert!(
        requests.len() > 100,
        "too little load: {} requests",
        requests.len()
    );
    assert!(
        failed.is_empty(),
        "{} of {} failed: {failed:?}",
        failed.len(),
        requests.len()
    );
    let acked_small = requests.iter().filter(|r| r.1 != "big").count();
    let expected = acked_small
        + if requests.iter().any(|r| r.1 == "big") {
            1000
        } else {
            0
        };
    let count = sd.sh("KEY=$(sed -n 's/^QDRANT__SERVICE__API_KEY=//p' /etc/qdrant/api-key.env); \
           curl -fsS --cacert /etc/vector-tls-proxy/certs/ca.crt -H \"api-key: $KEY\" -X POST \
           -H 'content-type: application/json' https://localhost:6333/collections/upgrade/points/count \
           -d '{\"exact\":true}'");
    let count: serde_json::Value = serde_json::from_str(&count).unwrap();
    assert_eq!(
        count["result"]["count"], expected,
        "acknowledged points missing: {count}"
    );
    // Every old process drained and exited; systemd's main process is the last one.
    for old in &pids[..pids.len() - 1] {
        eventually(&format!("old pid {old} exits"), WAIT, || {
            let (code, _) = sd.try_sh(&format!("kill -0 {old}"));
            ready(code != 0, || format!("pid {old} still runs"))
        });
    }
    let in_window = |at: u64| windows.iter().any(|(a, b)| at >= *a && at <= *b);
    let quiet: Vec<f64> = requests
        .iter()
        .filter(|r| r.0 < quiet_until)
        .map(|r| r.3)
        .collect();
    let during: Vec<f64> = requests
        .iter()
        .filter(|r| in_window(r.0))
        .map(|r| r.3)
        .collect();
    eprintln!(
        "package upgrade under load: {} requests, 0 failed, {} points stored as acknowledged; P99 {:.3} s quiet ({} requests) against {:.3} s during the upgrades ({} requests)",
        requests.len(),
        expected,
        p99(quiet.clone()),
        quiet.len(),
        p99(during.clone()),
        during.len()
    );
    assert!(!quiet.is_empty() && !during.is_empty());
    restart_under_load(&sd);
}

/// The package upgraded in place to revisions 2, 3 and 4 with dpkg, each through `proxy
/// upgrade`: a new main process each time, the unit active. Returns the pids in order and
/// each upgrade's window (ms, with a second after).
fn upgrade_to_revisions_2_to_4(sd: &SystemdContainer) -> (Vec<u32>, Vec<(u64, u64)>) {
    let mut windows = Vec::new();
    let mut pids = vec![main_pid(sd)];
    for rev in 2..=4 {
        let from = now_ms(sd);
        let (code, said) = sd.try_sh(&format!(
            "dpkg -i /root/dist{rev}/vector-tls-proxy_{}-{rev}_amd64.deb 2>&1",
            env!("CARGO_PKG_VERSION")
        ));
        assert_eq!(
            code,
            0,
            "revision {rev}: {said}\n{}",
            sd.try_sh("journalctl --no-pager -u vector-tls-proxy -n 40")
                .1
        );
        assert!(said.contains("upgraded: pid"), "revision {rev}: {said}");
        windows.push((from, now_ms(sd) + 1000));
        let pid = main_pid(sd);
        assert!(
            !pids.contains(&pid),
            "revision {rev}: systemd still names pid {pid}: {said}"
        );
        pids.push(pid);
        assert_eq!(
            sd.sh("systemctl is-active vector-tls-proxy").trim(),
            "active"
        );
        std::thread::sleep(Duration::from_secs(3));
    }
    (pids, windows)
}

/// `systemctl restart` is a stop and a start: its refused requests under the same load
/// are measured and printed, not asserted.
fn restart_under_load(sd: &SystemdContainer) {
    sd.sh("rm -f /root/load/*; for n in 5 6; do setsid bash -c \"source /root/writers.sh; small $n 8\" >/dev/null 2>&1 < /dev/null & done; echo started");
    std::thread::sleep(Duration::from_secs(2));
    sd.sh("systemctl restart vector-tls-proxy");
    std::thread::sleep(Duration::from_secs(8));
    let restart = logged(sd);
    let refused = restart.iter().filter(|r| r.2 != "200").count();
    eprintln!(
        "systemctl restart under the same load: {refused} of {} requests failed (connection refused while the proxy was down)",
        restart.len()
    );
}
