//! PostgreSQL + pgvector behind a tcp listener with `protocol = "postgres"`, driven by
//! libpq's own clients: psycopg 3 (its binary package bundles libpq 18) and Debian's psql
//! (libpq 15). The database is Debian's PostgreSQL with pgvector installed into it (the
//! vector extension: pgvector's install guide, or ../shared/pgvector/build.sh in CI); without
//! pgvector these tests say so and skip, unless `VTP_REQUIRE_PGVECTOR=1` (CI) makes that a
//! failure. PostgreSQL runs as its own user when the tests run as root (it refuses root).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use e2e::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PASSWORD: &str = "pgvector-test-password";

/// A PostgreSQL cluster of its own on a loopback port, stopped on drop.
struct Postgres {
    bindir: PathBuf,
    data: PathBuf,
    port: u16,
}

impl Postgres {
    /// initdb with SCRAM on TCP (as Debian's default pg_hba.conf has it) and starts it;
    /// `None` (the test skips) when pgvector is not installed.
    fn start() -> Option<Self> {
        let bindir = postgres_bindir();
        let version = bindir
            .parent()
            .and_then(|p| p.file_name())
            .expect("/usr/lib/postgresql/<version>/bin")
            .to_string_lossy()
            .into_owned();
        let control = PathBuf::from(format!(
            "/usr/share/postgresql/{version}/extension/vector.control"
        ));
        if !control.exists() {
            let why = format!(
                "pgvector is not installed for PostgreSQL {version} ({} missing): see \
                 https://github.com/pgvector/pgvector#installation",
                control.display()
            );
            assert!(
                std::env::var_os("VTP_REQUIRE_PGVECTOR").is_none(),
                "VTP_REQUIRE_PGVECTOR is set: {why}"
            );
            eprintln!("skipped: {why}");
            return None;
        }
        let dir = temp_dir("postgres");
        let data = dir.join("data");
        let pwfile = dir.join("password");
        std::fs::write(&pwfile, PASSWORD).unwrap();
        let port = free_loopback_addr().port();
        let pg = Self { bindir, data, port };
        if nix::unistd::geteuid().is_root() {
            let user = nix::unistd::User::from_name("postgres")
                .unwrap()
                .expect("the postgres user (Debian's postgresql package creates it)");
            for path in [&dir, &pwfile] {
                std::os::unix::fs::chown(path, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
                    .unwrap();
            }
        }
        pg.run(
            "initdb",
            &[
                "-D",
                pg.data.to_str().unwrap(),
                "-U",
                "postgres",
                "--pwfile",
                pwfile.to_str().unwrap(),
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
            ],
        );
        pg.run("pg_ctl", &pg.ctl_args("start"));
        Some(pg)
    }

    /// `program` of PostgreSQL's bindir as the postgres user where the tests run as root.
    fn command(&self, program: &str) -> Command {
        let path = self.bindir.join(program);
        if nix::unistd::geteuid().is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    fn argv(&self, program: &str, args: &[String]) -> Vec<String> {
        let c = self.command(program);
        std::iter::once(c.get_program().to_string_lossy().into_owned())
            .chain(c.get_args().map(|a| a.to_string_lossy().into_owned()))
            .chain(args.iter().cloned())
            .collect()
    }

    fn run(&self, program: &str, args: &[impl AsRef<std::ffi::OsStr>]) {
        let out = self
            .command(program)
            .args(args)
            .current_dir("/")
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        assert!(
            out.status.success(),
            "{program}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// pg_ctl's arguments for `action` (start, restart): loopback TCP on our port, the
    /// socket in the data folder's parent, waiting until it accepts connections.
    fn ctl_args(&self, action: &str) -> Vec<String> {
        let dir = self.data.parent().unwrap().display().to_string();
        vec![
            "-D".into(),
            self.data.display().to_string(),
            "-l".into(),
            format!("{dir}/postgres.log"),
            "-o".into(),
            format!(
                "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={dir}",
                self.port
            ),
            "-w".into(),
            "-m".into(),
            "fast".into(),
            action.into(),
        ]
    }

    /// A libpq connection string to the database itself (plaintext, as the proxy reaches it).
    fn direct(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres password={PASSWORD} dbname=postgres sslmode=disable",
            self.port
        )
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .args(["-D", self.data.to_str().unwrap(), "-m", "immediate", "stop"])
            .current_dir("/")
            .output();
    }
}

/// A libpq connection string through `proxy`, verifying its certificate against the test CA.
fn through(proxy: &ProxyProcess, extra: &str) -> String {
    format!(
        "host=localhost port={} user=postgres password={PASSWORD} dbname=postgres sslmode=verify-full sslrootcert={} {extra}",
        proxy.addr.port(),
        certs().ca_cert.display()
    )
}

fn postgres_proxy(pg: &Postgres) -> ProxyProcess {
    ProxyProcess::in_front_of(
        &format!("tcp://127.0.0.1:{}", pg.port),
        &["--mode", "tcp", "--protocol", "postgres"],
    )
}

fn exercise(conninfo: &str, mode: &str, arg: Option<&str>) -> serde_json::Value {
    let python = interop_python("postgres");
    let script = repo_root().join("tests/interop/pgvector_exercise.py");
    let mut cmd = Command::new(&python);
    cmd.arg(&script).args([conninfo, mode]).args(arg);
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_bounded(&mut child, Duration::from_secs(240), "pgvector_exercise.py");
    let mut out = String::new();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "pgvector_exercise.py {mode}: {out}{err}");
    serde_json::from_str(out.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {out}{err}"))
}

fn openings(proxy: &ProxyProcess, opening: &str) -> f64 {
    proxy.metric("proxy_postgres_openings_total", &[("opening", opening)])
}

/// The whole pgvector exercise gives the same answers direct and through the proxy with
/// `sslmode=verify-full`, by SSLRequest and by direct TLS (ALPN postgresql); Postgres's own
/// errors arrive as Postgres's; a client that does not trust the proxy's CA refuses it; and
/// SCRAM channel binding, which a terminator cannot carry, fails with libpq's own message.
#[test]
fn pgvector_exercise_direct_and_through_the_proxy() {
    let Some(pg) = Postgres::start() else { return };
    let proxy = postgres_proxy(&pg);
    let direct = exercise(&pg.direct(), "exercise", None);
    let negotiated = exercise(&through(&proxy, ""), "exercise", None);
    let direct_tls = exercise(&through(&proxy, "sslnegotiation=direct"), "exercise", None);
    for field in [
        "vector_version",
        "count",
        "count_many",
        "top5",
        "same_in_both",
        "prepared",
        "notify",
        "count_after_delete",
        "undefined_table",
        "wrong_dimension",
    ] {
        assert_eq!(negotiated[field], direct[field], "{field}: {negotiated}");
        assert_eq!(direct_tls[field], direct[field], "{field}: {direct_tls}");
    }
    assert_eq!(direct["count"], 2000);
    assert_eq!(direct["top5"][0], 42, "{direct}");
    assert_eq!(direct["count_after_delete"], 1950);
    assert_eq!(direct["undefined_table"]["sqlstate"], "42P01");
    assert_eq!(direct["wrong_dimension"]["sqlstate"], "22000");
    assert_eq!(direct["tls"], false);
    assert_eq!(negotiated["tls"], true);
    assert_eq!(direct_tls["tls"], true);
    for (what, run) in [
        ("direct", &direct),
        ("proxy", &negotiated),
        ("proxy, direct TLS", &direct_tls),
    ] {
        eprintln!(
            "pgvector ({what}): COPY of 2,000 x 384-d in {:.3} s, executemany in {:.3} s (libpq {})",
            run["copy_seconds"].as_f64().unwrap(),
            run["executemany_seconds"].as_f64().unwrap(),
            run["libpq"]
        );
    }
    // Three exercises, two connections each plus the ones libpq opened for LISTEN.
    assert!(
        openings(&proxy, "ssl_request") >= 2.0,
        "{}",
        proxy.metrics()
    );
    assert!(openings(&proxy, "direct_tls") >= 2.0, "{}", proxy.metrics());

    // sslrootcert=system: libpq trusts only the system's CAs, which do not know the proxy's.
    let untrusted = exercise(
        &through(&proxy, "").replace(
            &format!("sslrootcert={}", certs().ca_cert.display()),
            "sslrootcert=system",
        ),
        "refused",
        None,
    );
    let error = untrusted["error"].as_str().unwrap_or_default();
    assert!(error.contains("certificate verify failed"), "{untrusted}");

    let bound = exercise(&through(&proxy, "channel_binding=require"), "refused", None);
    let error = bound["error"].as_str().unwrap_or_default();
    assert!(error.contains("channel binding"), "{bound}");
}

/// A query cancelled from the client stops on the server, whether libpq sends the
/// CancelRequest in clear on a new connection (PQcancel, what libpq before 17 does; the
/// proxy passes it on) or inside TLS (libpq 17+'s PQcancelCreate; spliced like any
/// connection).
#[test]
fn a_cancelled_query_stops_on_the_server() {
    let Some(pg) = Postgres::start() else { return };
    let proxy = postgres_proxy(&pg);
    let cancelled = exercise(&through(&proxy, ""), "cancel", None);
    for how in ["cancel", "cancel_safe"] {
        assert_eq!(cancelled[how]["sqlstate"], "57014", "{cancelled}");
        assert!(
            cancelled[how]["seconds"].as_f64().unwrap() < 10.0,
            "{cancelled}"
        );
        assert_eq!(cancelled[how]["still_sleeping"], 0, "{cancelled}");
    }
    assert_eq!(
        openings(&proxy, "cancel_request"),
        1.0,
        "{}",
        proxy.metrics()
    );
}

/// PostgreSQL restarted behind the proxy: the open connection's next query fails with
/// PostgreSQL's own error (57P01, "terminating connection due to administrator command",
/// which the server sends each session as it shuts down, spliced through), and a new
/// connection through the proxy works at once.
#[test]
fn postgres_restarted_behind_the_proxy() {
    let Some(pg) = Postgres::start() else { return };
    let proxy = postgres_proxy(&pg);
    let restart = serde_json::to_string(&pg.argv("pg_ctl", &pg.ctl_args("restart"))).unwrap();
    let seen = exercise(&through(&proxy, ""), "restart", Some(&restart));
    assert_eq!(seen["before"], 1);
    let after = &seen["after_restart"];
    assert_eq!(after["operational"], true, "{seen}");
    assert_eq!(after["sqlstate"], "57P01", "{seen}");
    assert!(
        after["message"]
            .as_str()
            .unwrap_or_default()
            .contains("terminating connection due to administrator command"),
        "{seen}"
    );
    assert_eq!(seen["reconnected"], 1, "{seen}");
}

/// What libpq sends before TLS, and what it gets: psql with `sslmode=disable` sends its
/// startup in clear and shows the proxy's FATAL error (SQLSTATE 28000); a GSSENCRequest is
/// answered N and the SSLRequest after it S on the same connection; direct TLS without ALPN
/// `postgresql` is refused after the handshake; bytes of another protocol are refused.
#[tokio::test]
async fn openings_are_answered_as_postgres_answers_them() {
    let Some(pg) = Postgres::start() else { return };
    let proxy = postgres_proxy(&pg);

    let out = Command::new(system_tool("psql"))
        .arg(format!(
            "host=127.0.0.1 port={} user=postgres sslmode=disable",
            proxy.addr.port()
        ))
        .args(["-c", "SELECT 1"])
        .env("PGPASSWORD", PASSWORD)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("FATAL:  TLS required by the proxy"),
        "{stderr}"
    );
    assert_eq!(openings(&proxy, "plaintext_refused"), 1.0);
    let out = Command::new(system_tool("psql"))
        .arg(through(&proxy, ""))
        .args([
            "-tAc",
            "SELECT extname FROM pg_extension WHERE extname = 'plpgsql'",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "plpgsql",
        "{out:?}"
    );

    // GSSENCRequest, then SSLRequest, then TLS and a startup message: the database answers
    // with its authentication request ('R').
    let mut tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let request = |code: u32| [8u32.to_be_bytes(), code.to_be_bytes()].concat();
    tcp.write_all(&request(80_877_104)).await.unwrap();
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"N");
    tcp.write_all(&request(80_877_103)).await.unwrap();
    tcp.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"S");
    let config = client_config(&ClientOpts {
        alpn: vec![b"postgresql".to_vec()],
        ..ClientOpts::default()
    });
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let params = b"user\0postgres\0database\0postgres\0\0";
    let mut startup = ((8 + params.len()) as u32).to_be_bytes().to_vec();
    startup.extend_from_slice(&(3u32 << 16).to_be_bytes());
    startup.extend_from_slice(params);
    tls.write_all(&startup).await.unwrap();
    tls.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"R", "the database's authentication request");
    assert_eq!(openings(&proxy, "gssenc_refused"), 1.0);

    // Direct TLS without ALPN: the handshake completes, then the proxy closes.
    let config = client_config(&ClientOpts {
        alpn: vec![],
        ..ClientOpts::default()
    });
    let mut tls = tls_connect(proxy.addr, config).await.unwrap();
    let _ = tls.write_all(&startup).await;
    let mut rest = Vec::new();
    let _ = tls.read_to_end(&mut rest).await;
    assert!(rest.is_empty(), "{rest:?}");
    assert_eq!(openings(&proxy, "direct_tls_without_alpn"), 1.0);

    let mut tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let _ = tcp.read_to_end(&mut rest).await;
    assert!(rest.is_empty());
    assert_eq!(openings(&proxy, "invalid"), 1.0, "{}", proxy.metrics());
}
