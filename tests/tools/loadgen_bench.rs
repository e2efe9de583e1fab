//! `loadgen bench` end to end with tiny settings: the real proxy, nginx and HAProxy
//! (Debian's packages, which `.ci/run` installs) in front of the bench's sink on loopback.
//! Every row must hold a measured figure for every terminator (the in-memory handshake only
//! for ours), the kernel's share of a CPU figure must be part of it, the table must print
//! each figure with its ratio to nginx, and a client that keeps Nagle on must not wait for
//! a delayed ACK after the handshake.

use e2e::*;

/// The in-process rows' own column: embedded-qdrant terminating TLS itself.
const OWN_TLS: &str = "embedded-qdrant own TLS (defaults)";

#[test]
fn bench_measures_every_row_for_the_proxy_and_both_peers() {
    // The peers, the users' load tools and the instruction counter the rows run.
    let _ = ["nginx", "haproxy", "ab", "h2load", "valgrind"].map(system_tool);
    let out = temp_dir("bench");
    let metrics_save_before = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_no_metrics_save")
        .expect("tcp_no_metrics_save");
    let run = run_loadgen(
        &args(&[
            "bench",
            "--providers",
            "aws-lc-rs",
            "--peers",
            "nginx,haproxy",
            "--algorithms",
            "ecdsa-p256",
            "--duration",
            "400ms",
            "--warmup",
            "100ms",
            "--concurrency",
            "2",
            "--idle",
            "20,40",
            "--latency-requests",
            "5",
            "--first-response-connections",
            "3",
            "--instruction-units",
            "3",
            "--proxy-bin",
            binary("proxy").to_str().unwrap(),
            "--upstream-bin",
            binary("embedded-qdrant").to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]),
        None,
    );
    assert!(
        run.status.success(),
        "bench failed: {}\n{}",
        run.stderr,
        run.stdout
    );
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("bench.json")).expect("bench.json"))
            .expect("bench.json parses");
    the_clients_settings_are_set_and_said(&json, &out, &metrics_save_before);
    let columns: Vec<&str> = json["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    // One worker each, then each at its defaults, then the database with its own TLS.
    assert_eq!(
        columns,
        [
            "proxy aws-lc-rs",
            "nginx",
            "haproxy",
            "proxy aws-lc-rs (defaults)",
            "nginx (defaults)",
            "haproxy (defaults)",
            OWN_TLS,
        ]
    );
    let all_rows = json["rows"].as_array().unwrap();
    // 4 handshake rows, 2 new-connection upserts and 3 bulk with their kernel shares, the
    // same 6 driven by ab and h2load with theirs, 16 idle per client (rustls, OpenSSL:
    // HTTP/1.1 and h2, each before any request and after one, at 20 and 40 open, per
    // connection and in all), first response, 2 latency, 6 instruction counts; then 2 x 3
    // rows of upserts into embedded-qdrant (JSON and gRPC: the total, the terminator's
    // part, the rate).
    assert_eq!(all_rows.len(), 73, "{all_rows:#?}");
    let (rows, into_database) = all_rows.split_at(67);
    in_process_rows_compare_the_database_own_tls(into_database, &columns);
    rows_of_every_kind_are_there(rows);
    let columns = &columns[..columns.len() - 1];
    every_cell_is_measured_or_says_why_not(rows, columns);
    kernel_shares_are_below_their_rows(rows, columns);
    ratios_are_to_nginx_in_the_same_set_up(rows);
    each_set_up_is_what_its_columns_say(&out.join("work"));
    let first = rows
        .iter()
        .find(|r| r["name"].as_str().unwrap().starts_with("first response"))
        .unwrap();
    // Not a speed: a client with Nagle on waits for the kernel's delayed-ACK timer (40 ms)
    // before its request leaves; anything near that means the bench's clients stall.
    let proxy_ms = first["figures"]["proxy aws-lc-rs"].as_f64().unwrap();
    assert!(
        proxy_ms < 20.0,
        "first response {proxy_ms} ms after the handshake"
    );

    let table = std::fs::read_to_string(out.join("bench.md")).expect("bench.md");
    assert_eq!(table, run.stdout.split("\nwrote ").next().unwrap());
    let p256 = table
        .lines()
        .find(|l| l.starts_with("| new TLS connection + tiny GET, ecdsa-p256"))
        .expect("P-256 row");
    // Ours and HAProxy carry a ratio to nginx, in both set-ups; nginx's own cells do not.
    assert_eq!(p256.matches("x) |").count(), 4, "{p256}");
}

/// A row of each kind the bench measures: new connections with each body, idle memory per
/// client and protocol, ab's and h2load's rows, instruction counts.
fn rows_of_every_kind_are_there(rows: &[serde_json::Value]) {
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    for name in [
        "new TLS connection + one 800 KB JSON upsert, HTTP/1.1, ecdsa-p256",
        "new TLS connection + one 416 KB gRPC upsert, h2, ecdsa-p256",
        "RSS per idle TLS connection, 40 open, rustls client",
        "RSS per idle TLS connection, 40 open, OpenSSL client",
        "RSS per idle TLS connection, 40 open, rustls client, h2",
        "RSS per idle TLS connection, 40 open, OpenSSL client, after one HTTP/1.1 request",
        "RSS per idle TLS connection, 40 open, OpenSSL client, after one h2 request",
        "new TLS connection + tiny GET, ecdsa-p256, ab",
        "new TLS connection + one 800 KB JSON upsert, HTTP/1.0, ecdsa-p256, ab",
        "new TLS connection + one 416 KB gRPC upsert, h2, ecdsa-p256, h2load",
        "keep-alive 763 KB JSON, HTTP/1.1 client -> HTTP/1.1 upstream, h2load --h1",
        "keep-alive 416 KB gRPC, h2 -> h2c upstream, h2load",
        "instructions, new TLS connection + tiny GET, ecdsa-p256",
        "instructions, keep-alive 416 KB gRPC, h2 -> h2c",
    ] {
        assert!(names.contains(&name), "{name} missing: {names:#?}");
    }
}

/// The host settings the bench sets for its clients, put back and written down: the
/// kernel's TCP metrics cache off for the run (as root), the clients' congestion control.
fn the_clients_settings_are_set_and_said(
    json: &serde_json::Value,
    out: &std::path::Path,
    metrics_save_before: &str,
) {
    // Every connection goes to 127.0.0.1: the kernel's cache of what the last connection to
    // an address saw (cwnd, RTT) is kept out of the run where the bench may (as root), and
    // the setting put back afterwards.
    let cache = json["settings"]["tcp_metrics_cache"].as_str().unwrap();
    if nix::unistd::geteuid().is_root() {
        assert!(cache.starts_with("off for the run"), "{cache}");
        assert!(
            cache.contains("flushed") && !cache.contains("not flushed"),
            "{cache}"
        );
    } else {
        assert!(cache.starts_with("on"), "{cache}");
    }
    assert_eq!(
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_no_metrics_save").unwrap(),
        metrics_save_before
    );
    // The clients' congestion control is the bench's (cubic by default), not the host's,
    // and bench.md says so.
    let congestion = json["settings"]["client_congestion_control"]
        .as_str()
        .unwrap();
    assert!(
        congestion.starts_with("cubic, set on every client socket"),
        "{congestion}"
    );
    let table = std::fs::read_to_string(out.join("bench.md")).expect("bench.md");
    assert!(
        table.contains("the clients' TCP congestion control: cubic"),
        "{table}"
    );
}

/// Every cell of the measured rows has a figure (positive, where it is a cost) or the
/// reason it has none; the tools' rows say which tool counted.
fn every_cell_is_measured_or_says_why_not(rows: &[serde_json::Value], columns: &[&str]) {
    for row in rows {
        let name = row["name"].as_str().unwrap();
        assert!(
            row["figures"][OWN_TLS].is_null(),
            "{name}: {}",
            row["figures"]
        );
        for column in columns {
            let figure = &row["figures"][column];
            let rustls_only = name.contains("in-memory");
            if rustls_only && !column.starts_with("proxy aws-lc-rs") {
                assert_eq!(figure["reason"], "not rustls", "{name} / {column}");
                continue;
            }
            // Instructions are counted for the proxy with one worker only, under callgrind.
            if name.starts_with("instructions") && *column != "proxy aws-lc-rs" {
                assert_eq!(
                    figure["reason"], "instructions: the proxy with one worker only",
                    "{name} / {column}"
                );
                continue;
            }
            // The tools' rows count what the tool itself reported (noted on the row, not
            // on its kernel share).
            if !name.starts_with("  ") && (name.ends_with(", ab") || name.contains(", h2load")) {
                let work = row["work"][column].as_str().unwrap_or_default();
                let tool = if name.ends_with(", ab") {
                    "(ab)"
                } else {
                    "(h2load)"
                };
                assert!(work.ends_with(tool), "{name} / {column}: {work}");
            }
            let value = figure
                .as_f64()
                .unwrap_or_else(|| panic!("{name} / {column}: {figure}"));
            // "Beyond the in-memory handshake" and "added over the direct path" are
            // differences and may be negative on a noisy machine; a few idle connections may
            // fit in memory the process already holds (RSS grows by 0); /proc counts a
            // process's kernel time in clock ticks (10 ms), so a short test window may see none
            // of it; the rest are measured costs, which are positive.
            if name.starts_with("RSS") || name.starts_with("  of which in the kernel") {
                assert!(value >= 0.0, "{name} / {column}: {value}");
            } else if !name.starts_with("  beyond") && !name.starts_with("  added") {
                assert!(value > 0.0, "{name} / {column}: {value}");
            }
        }
    }
}

/// Each kernel share is the system part of the row above it: below the whole, for every
/// terminator.
fn kernel_shares_are_below_their_rows(rows: &[serde_json::Value], columns: &[&str]) {
    for (i, row) in rows.iter().enumerate() {
        let name = row["name"].as_str().unwrap();
        if !name.starts_with("  of which in the kernel") {
            continue;
        }
        let whole = &rows[i - 1];
        assert!(
            !whole["name"].as_str().unwrap().starts_with("  "),
            "{name} follows its row"
        );
        for column in columns {
            let kernel = row["figures"][column].as_f64().unwrap();
            let total = whole["figures"][column].as_f64().unwrap();
            assert!(kernel < total, "{name} / {column}: {kernel} of {total}");
        }
    }
}

/// One round: each ratio is the figure over nginx's in the same set-up.
fn ratios_are_to_nginx_in_the_same_set_up(rows: &[serde_json::Value]) {
    let p256 = rows
        .iter()
        .find(|r| r["name"] == "new TLS connection + tiny GET, ecdsa-p256")
        .unwrap();
    for (nginx, others) in [
        ("nginx", ["proxy aws-lc-rs", "haproxy"]),
        (
            "nginx (defaults)",
            ["proxy aws-lc-rs (defaults)", "haproxy (defaults)"],
        ),
    ] {
        let nginx = p256["figures"][nginx].as_f64().unwrap();
        for column in others {
            let ratio = p256["ratios_to_nginx"][column].as_f64().unwrap();
            let figure = p256["figures"][column].as_f64().unwrap();
            assert!((ratio - figure / nginx).abs() < 1e-9, "{column}: {ratio}");
        }
    }
}

/// The rows into a real database: each terminator of both set-ups in front of
/// embedded-qdrant in plaintext, and embedded-qdrant terminating TLS itself. Every upsert
/// was acknowledged by the database (the driver checks Qdrant's answer), the terminator's
/// part is below the total with the database's CPU, and each terminator's total has its
/// ratio to nginx of its own set-up.
fn in_process_rows_compare_the_database_own_tls(rows: &[serde_json::Value], columns: &[&str]) {
    let own_tls = columns.last().unwrap();
    for (i, protocol) in ["JSON over HTTP/1.1", "gRPC"].into_iter().enumerate() {
        let [total, terminator, rate] = &rows[3 * i..3 * i + 3] else {
            unreachable!()
        };
        assert_eq!(
            total["name"],
            format!(
                "new TLS connection + UPSERT_100 into embedded-qdrant, {protocol}, ecdsa-p256: \
                 terminator + database"
            )
        );
        assert_eq!(
            terminator["name"],
            format!("  of which the terminator, {protocol} ecdsa-p256")
        );
        assert_eq!(rate["name"], format!("  upserts/s, {protocol} ecdsa-p256"));
        for column in columns {
            let figure = |row: &serde_json::Value| row["figures"][column].as_f64();
            let all = figure(total).unwrap_or_else(|| panic!("{column}: {total}"));
            assert!(figure(rate).unwrap() > 0.0, "{column}: {rate}");
            assert!(
                total["work"][column]
                    .as_str()
                    .unwrap()
                    .contains("upserts on as many connections"),
                "{column}: {total}"
            );
            if column == own_tls {
                assert_eq!(
                    terminator["figures"][column]["reason"], "TLS terminated inside the database",
                    "{terminator}"
                );
                // Compared with nginx in front of the same database.
                assert!(total["ratios_to_nginx"][column].as_f64().unwrap() > 0.0);
            } else {
                let part = figure(terminator).unwrap_or_else(|| panic!("{column}: {terminator}"));
                // /proc counts CPU in 10 ms ticks: in this test's short loops a terminator
                // that used a few milliseconds in all may read zero (nginx with one worker
                // did in CI); the database's part always makes the total larger.
                assert!(0.0 <= part && part < all, "{column}: {part} of {all}");
                if !column.starts_with("nginx") {
                    assert!(
                        total["ratios_to_nginx"][column].as_f64().unwrap() > 0.0,
                        "{column}: {total}"
                    );
                }
            }
        }
    }
}

/// Each set-up is what its columns say: one worker, or each terminator's own default.
fn each_set_up_is_what_its_columns_say(work: &std::path::Path) {
    let read = |p: &str| std::fs::read_to_string(work.join(p)).expect(p);
    assert!(read("nginx/nginx.conf").contains("worker_processes 1;"));
    assert!(read("nginx-defaults/nginx.conf").contains("worker_processes auto;"));
    assert!(read("haproxy/haproxy.cfg").contains("nbthread 1"));
    assert!(!read("haproxy-defaults/haproxy.cfg").contains("nbthread"));
    assert!(read("proxy-aws-lc-rs.toml").contains("worker_threads = 1\n"));
    // The proxy's own default (a worker per CPU) is left out of the file it is started with.
    assert!(!read("proxy-aws-lc-rs-defaults.toml").contains("worker_threads"));
}
