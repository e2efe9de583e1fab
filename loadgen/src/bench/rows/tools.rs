//! The rows of the handshake, upsert and bulk parts again, driven by the load tools users
//! measure terminators with instead of the bench's own client: ApacheBench (`ab`: HTTP/1.0,
//! a new connection per request) for the tiny GET and the JSON upsert on new connections,
//! nghttp2's `h2load` for the gRPC upsert on new connections and for keep-alive bulk over h2,
//! HTTP/1.1 (`--h1`) and gRPC. Both are OpenSSL clients with OpenSSL's stock settings (TLS 1.3,
//! X25519 first, their own record and frame sizes: h2load's DATA frames are 16 KiB,
//! whatever the server allows), which is how they differ from the bench's rustls client; a
//! terminator that handles their traffic worse shows it here, with the same client in front
//! of every column.
//!
//! Each tool runs as a process of its own, bounded in time and count, against one
//! terminator at a time: an unmeasured warm-up run, then the measured run inside a CPU
//! window on the terminator's process tree, the units counted from the tool's own report
//! (ab's complete requests less failed and non-2xx ones; h2load's 2xx answers). h2load has
//! no connection-per-request mode, so the new-connection gRPC row runs it over and over with
//! as many clients as requests (`-c N -n N`, N = `--concurrency`): N connections at once,
//! each carrying one call, then closed.
//!
//! The tools come from Debian's apache2-utils and nghttp2-client, installed with apt-get
//! when missing (as root), as the peers are; without them the rows say what to install.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use proxy::crypto::CertAlgorithmName;

use super::{
    Measure, Measuring, Round, RowSet, TerminatorRows, Unit, PER_CONNECTION, PER_MB, PER_UPSERT,
};
use crate::bench::table::Table;
use crate::bench::terminators::ensure_tool;
use crate::bench::workloads::{
    grpc_body, json_body, TinyGet, BULK_JSON_BYTES, GRPC_UPSERT_PATH, REST_UPSERT_PATH,
    UPSERT_GRPC_BYTES, UPSERT_JSON_BYTES,
};
use crate::bench::BenchPlan;

/// Most h2load runs of one new-connection loop, whatever its duration.
const MAX_BURSTS: u32 = 100_000;
/// Most requests of one ab run (it sizes its statistics for them up front).
const AB_MAX_REQUESTS: u32 = 500_000;
/// How long a tool may run beyond the time it was given before it is killed.
const OVERRUN: Duration = Duration::from_secs(30);

/// A load tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tool {
    Ab,
    H2load,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Self::Ab => "ab",
            Self::H2load => "h2load",
        }
    }

    fn package(self) -> &'static str {
        match self {
            Self::Ab => "apache2-utils",
            Self::H2load => "nghttp2-client",
        }
    }
}

/// What a row sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    /// ab: a GET of a few bytes on a new connection each.
    TinyGet,
    /// ab: an 800 KB JSON POST on a new connection each.
    JsonUpsert,
    /// h2load: one 416 KB gRPC call on a new connection each.
    GrpcUpsert,
    /// h2load: 763 KB JSON POSTs over h2, kept alive.
    BulkH2Json,
    /// h2load --h1: 763 KB JSON POSTs over HTTP/1.1, kept alive.
    BulkH1Json,
    /// h2load: 416 KB gRPC calls, kept alive.
    BulkGrpc,
}

impl Work {
    fn tool(self) -> Tool {
        match self {
            Self::TinyGet | Self::JsonUpsert => Tool::Ab,
            _ => Tool::H2load,
        }
    }

    fn unit(self) -> &'static Unit {
        match self {
            Self::TinyGet => &PER_CONNECTION,
            Self::JsonUpsert | Self::GrpcUpsert => &PER_UPSERT,
            Self::BulkH2Json | Self::BulkH1Json | Self::BulkGrpc => &PER_MB,
        }
    }

    /// The body file's index in [`Bodies`], if any.
    fn body(self) -> Option<usize> {
        match self {
            Self::TinyGet => None,
            Self::JsonUpsert => Some(0),
            Self::BulkH2Json | Self::BulkH1Json => Some(1),
            Self::GrpcUpsert | Self::BulkGrpc => Some(2),
        }
    }

    fn grpc(self) -> bool {
        matches!(self, Self::GrpcUpsert | Self::BulkGrpc)
    }

    fn new_connection(self) -> bool {
        matches!(self, Self::TinyGet | Self::JsonUpsert | Self::GrpcUpsert)
    }
}

/// One row: its work, the listener's algorithm, and its keys.
struct Keys {
    work: Work,
    alg: Option<CertAlgorithmName>,
    total: String,
    kernel: String,
}

/// The body files every tool reads (`-p` for ab, `-d` for h2load), written once.
struct Bodies {
    files: [PathBuf; 3],
    sizes: [u64; 3],
}

/// The rows driven by ab and h2load.
pub struct ToolRows {
    algorithms: Vec<CertAlgorithmName>,
    keys: Vec<Keys>,
    bodies: Option<Bodies>,
    /// Each tool's binary, or why it is missing.
    ab: Result<PathBuf, String>,
    h2load: Result<PathBuf, String>,
}

impl ToolRows {
    /// For `--algorithms`; the tools are looked for (and installed) when the rows prepare.
    pub fn new(plan: &BenchPlan) -> Self {
        Self {
            algorithms: plan.algorithms().to_vec(),
            keys: Vec::new(),
            bodies: None,
            ab: Err("not looked for yet".into()),
            h2load: Err("not looked for yet".into()),
        }
    }

    fn binary(&self, tool: Tool) -> Result<&Path> {
        match tool {
            Tool::Ab => &self.ab,
            Tool::H2load => &self.h2load,
        }
        .as_deref()
        .map_err(|e| anyhow!("{e}"))
    }
}

impl RowSet for ToolRows {
    fn declare(&mut self, table: &mut Table) {
        let mut declare = |work: Work, alg: Option<CertAlgorithmName>, name: String| {
            let short = match alg {
                Some(alg) => format!("{} {}", work.tool().name(), alg.as_str()),
                None => work.tool().name().to_owned(),
            };
            let unit = match work {
                Work::TinyGet => "us CPU",
                Work::JsonUpsert | Work::GrpcUpsert => "ms CPU",
                _ => "ms CPU per MB",
            };
            self.keys.push(Keys {
                work,
                alg,
                total: table.declare(name.clone(), unit),
                kernel: table.declare(
                    format!("  of which in the kernel, {}", name_short(work, &short)),
                    unit,
                ),
            });
        };
        for alg in &self.algorithms {
            let a = alg.as_str();
            declare(
                Work::TinyGet,
                Some(*alg),
                format!("new TLS connection + tiny GET, {a}, ab"),
            );
            declare(
                Work::JsonUpsert,
                Some(*alg),
                format!("new TLS connection + one 800 KB JSON upsert, HTTP/1.0, {a}, ab"),
            );
            declare(
                Work::GrpcUpsert,
                Some(*alg),
                format!("new TLS connection + one 416 KB gRPC upsert, h2, {a}, h2load"),
            );
        }
        declare(
            Work::BulkH2Json,
            None,
            "keep-alive 763 KB JSON, h2 client -> HTTP/1.1 upstream, h2load".into(),
        );
        declare(
            Work::BulkH1Json,
            None,
            "keep-alive 763 KB JSON, HTTP/1.1 client -> HTTP/1.1 upstream, h2load --h1".into(),
        );
        declare(
            Work::BulkGrpc,
            None,
            "keep-alive 416 KB gRPC, h2 -> h2c upstream, h2load".into(),
        );
    }

    fn prepare<'a>(&'a mut self, bench: &'a super::Bench<'a>) -> Measuring<'a, Result<()>> {
        Box::pin(async move {
            self.ab =
                ensure_tool(Tool::Ab.name(), Tool::Ab.package()).map_err(|e| format!("{e:#}"));
            self.h2load = ensure_tool(Tool::H2load.name(), Tool::H2load.package())
                .map_err(|e| format!("{e:#}"));
            for (tool, found) in [(Tool::Ab, &self.ab), (Tool::H2load, &self.h2load)] {
                if let Err(e) = found {
                    eprintln!("{}: its rows are not measured: {e}", tool.name());
                }
            }
            let dir = bench.plan.flags.out.join("work").join("tool-bodies");
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let bodies = [
                ("upsert.json", json_body(UPSERT_JSON_BYTES)),
                ("bulk.json", json_body(BULK_JSON_BYTES)),
                ("upsert.grpc", grpc_body(UPSERT_GRPC_BYTES)),
            ];
            let mut files: [PathBuf; 3] = Default::default();
            let mut sizes = [0u64; 3];
            for (i, (name, body)) in bodies.iter().enumerate() {
                let path = dir.join(name);
                std::fs::write(&path, body)
                    .with_context(|| format!("writing {}", path.display()))?;
                files[i] = path;
                sizes[i] = body.len() as u64;
            }
            self.bodies = Some(Bodies { files, sizes });
            Ok(())
        })
    }

    fn how(&self) -> Measure<'_> {
        Measure::EveryRound(self)
    }
}

impl TerminatorRows for ToolRows {
    fn measure<'a>(&'a self, round: &'a Round<'a>, table: &'a mut Table) -> Measuring<'a, ()> {
        Box::pin(async move {
            for k in &self.keys {
                if round.bench.stop.is_cancelled() {
                    return;
                }
                let figure = self.measure_row(round, k, table).await;
                match &figure {
                    Ok(v) => eprintln!(
                        "{} {:?}: {v:.3} {}",
                        round.label,
                        k.work,
                        k.work.unit().name
                    ),
                    Err(e) => {
                        eprintln!("{} {:?}: {e:#}", round.label, k.work);
                        table.put(&k.kernel, round.label, Err(anyhow!("{e:#}")));
                    }
                }
                table.put(&k.total, round.label, figure);
            }
        })
    }
}

/// The kernel row's short name: the work and the tool.
fn name_short(work: Work, tool: &str) -> String {
    let what = match work {
        Work::TinyGet => "tiny GET",
        Work::JsonUpsert => "JSON upsert",
        Work::GrpcUpsert => "gRPC upsert",
        Work::BulkH2Json => "h2 -> HTTP/1.1",
        Work::BulkH1Json => "HTTP/1.1 -> HTTP/1.1",
        Work::BulkGrpc => "gRPC",
    };
    format!("{what}, {tool}")
}

/// What one tool run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counted {
    /// Requests answered with a 2xx, whole.
    ok: u64,
    /// Requests that ended otherwise (not counting those cut off by the end of a timed run).
    failed: u64,
}

impl std::ops::AddAssign for Counted {
    fn add_assign(&mut self, other: Self) {
        self.ok += other.ok;
        self.failed += other.failed;
    }
}

impl ToolRows {
    /// One row's figure for `round`'s terminator: a warm-up run, then the measured one in a
    /// CPU window; its kernel share put now, the figure returned.
    async fn measure_row(&self, round: &Round<'_>, k: &Keys, table: &mut Table) -> Result<f64> {
        let tool = k.work.tool();
        let bin = self.binary(tool)?;
        let bodies = self
            .bodies
            .as_ref()
            .context("the body files were not written")?;
        let addr = match k.alg {
            Some(alg) => round.t.addrs.get(&alg).copied(),
            None => round.any_listener(),
        }
        .context("no listener for this row")?;
        let plan = round.bench.plan;
        let spec = RunSpec {
            bin,
            work: k.work,
            addr,
            body: k.work.body().map(|i| bodies.files[i].as_path()),
            concurrency: if k.work.new_connection() {
                plan.flags.concurrency
            } else {
                plan.flags.bulk_connections
            }
            .max(1),
        };
        spec.run(plan.flags.warmup, round.bench.stop).await?;
        let window = round.t.cpu_window()?;
        let counted = spec.run(plan.flags.duration, round.bench.stop).await?;
        let cpu = window.close()?;
        if counted.ok == 0 {
            bail!(
                "{}: nothing succeeded ({} failed)",
                tool.name(),
                counted.failed
            );
        }
        if counted.failed > 0 {
            eprintln!("{} {:?}: {} failed", round.label, k.work, counted.failed);
        }
        let unit = k.work.unit();
        let (count, work) = match k.work.body() {
            Some(i) if !k.work.new_connection() => {
                let mb = (counted.ok * bodies.sizes[i]) as f64 / 1e6;
                (
                    mb,
                    format!(
                        "{} requests, {mb:.0} MB, {} failed ({})",
                        counted.ok,
                        counted.failed,
                        tool.name()
                    ),
                )
            }
            _ => (
                counted.ok as f64,
                format!(
                    "{} connections, {} failed ({})",
                    counted.ok,
                    counted.failed,
                    tool.name()
                ),
            ),
        };
        table.note_work(&k.total, round.label, work);
        table.put(&k.kernel, round.label, Ok(cpu.system * unit.scale / count));
        Ok(cpu.total() * unit.scale / count)
    }
}

/// One tool run's arguments.
struct RunSpec<'a> {
    bin: &'a Path,
    work: Work,
    addr: std::net::SocketAddr,
    body: Option<&'a Path>,
    concurrency: usize,
}

impl RunSpec<'_> {
    /// The tool for `duration` (ab's whole seconds, at least one), or h2load over and over
    /// until it has passed (the new-connection gRPC row); what it counted.
    async fn run(
        &self,
        duration: Duration,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Result<Counted> {
        if self.work == Work::GrpcUpsert {
            let started = Instant::now();
            let mut total = Counted::default();
            for _ in 0..MAX_BURSTS {
                if started.elapsed() >= duration || stop.is_cancelled() {
                    break;
                }
                total += self.once(self.args(None)).await?;
            }
            return Ok(total);
        }
        self.once(self.args(Some(duration))).await
    }

    /// The tool's arguments: a timed run (`Some`), or one burst of `concurrency`
    /// connections with a request each.
    fn args(&self, duration: Option<Duration>) -> Vec<String> {
        let c = self.concurrency.to_string();
        let url = |path: &str| format!("https://{}{path}", self.addr);
        let mut args: Vec<String> = Vec::new();
        match self.work.tool() {
            Tool::Ab => {
                let secs = duration.map_or(1, |d| d.as_secs_f64().ceil().max(1.0) as u64);
                // -t first: it sets -n to 50,000, which the -n after it raises. -r: a
                // connection the terminator drops is a failed request, not the end of the run.
                args.extend(["-q", "-r", "-f", "TLS1.3", "-c"].map(String::from));
                args.push(c);
                args.extend([
                    "-t".into(),
                    secs.to_string(),
                    "-n".into(),
                    AB_MAX_REQUESTS.to_string(),
                ]);
                match self.body {
                    Some(body) => {
                        args.extend(["-p".into(), body.display().to_string()]);
                        args.extend(["-T".into(), "application/json".into()]);
                        args.push(url(REST_UPSERT_PATH));
                    }
                    None => args.push(url(TinyGet::PATH)),
                }
            }
            Tool::H2load => {
                args.extend(["-c".into(), c.clone(), "-m".into(), "1".into()]);
                match duration {
                    Some(d) => args.extend(["-D".into(), format!("{}ms", d.as_millis().max(1))]),
                    None => args.extend(["-n".into(), c]),
                }
                if self.work == Work::BulkH1Json {
                    args.push("--h1".into());
                }
                if let Some(body) = self.body {
                    args.extend(["-d".into(), body.display().to_string()]);
                }
                if self.work.grpc() {
                    args.extend(["-H".into(), "content-type: application/grpc".into()]);
                    args.extend(["-H".into(), "te: trailers".into()]);
                    args.push(url(GRPC_UPSERT_PATH));
                } else {
                    args.extend(["-H".into(), "content-type: application/json".into()]);
                    args.push(url(REST_UPSERT_PATH));
                }
            }
        }
        args
    }

    /// One run of the tool with `args`, killed if it overruns; what it reported.
    async fn once(&self, args: Vec<String>) -> Result<Counted> {
        let tool = self.work.tool();
        let child = tokio::process::Command::new(self.bin)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        let out = tokio::time::timeout(run_limit(&args), child.wait_with_output())
            .await
            .map_err(|_| anyhow!("{} did not finish in time: {}", tool.name(), args.join(" ")))??;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let parsed = match tool {
            Tool::Ab => parse_ab(&stdout),
            Tool::H2load => parse_h2load(&stdout),
        };
        match parsed {
            Ok(counted) if out.status.success() => Ok(counted),
            _ => Err(anyhow!(
                "{} {} ended {}: {}",
                tool.name(),
                args.join(" "),
                out.status,
                last_lines(&String::from_utf8_lossy(&out.stderr), &stdout)
            )),
        }
    }
}

/// The time a run with `args` is allowed: what it was given, and [`OVERRUN`].
fn run_limit(args: &[String]) -> Duration {
    let given = args
        .iter()
        .position(|a| a == "-t" || a == "-D")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| {
            humantime::parse_duration(v)
                .ok()
                .or_else(|| v.parse().ok().map(Duration::from_secs))
        })
        .unwrap_or(Duration::ZERO);
    given + OVERRUN
}

/// What a tool said last, for an error.
fn last_lines(stderr: &str, stdout: &str) -> String {
    let said = if stderr.trim().is_empty() {
        stdout
    } else {
        stderr
    };
    let lines: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" / ")
}

/// ab's report: complete requests, less the failed (refused, reset, wrong length) and the
/// non-2xx ones.
fn parse_ab(report: &str) -> Result<Counted> {
    let field = |name: &str| -> Option<u64> {
        report
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    let complete =
        field("Complete requests:").context("ab's report has no \"Complete requests\"")?;
    let failed = field("Failed requests:").context("ab's report has no \"Failed requests\"")?;
    let non_2xx = field("Non-2xx responses:").unwrap_or(0);
    let bad = failed.saturating_add(non_2xx).min(complete);
    Ok(Counted {
        ok: complete - bad,
        failed: bad,
    })
}

/// h2load's report: the 2xx answers of its status-code line, and the requests done
/// otherwise.
fn parse_h2load(report: &str) -> Result<Counted> {
    let numbers = |prefix: &str| -> Option<Vec<(u64, String)>> {
        let line = report.lines().find_map(|l| l.strip_prefix(prefix))?;
        line.split(',')
            .map(|part| {
                let mut words = part.split_whitespace();
                let n = words.next()?.parse().ok()?;
                Some((n, words.next()?.to_owned()))
            })
            .collect()
    };
    let find =
        |list: &[(u64, String)], name: &str| list.iter().find(|(_, w)| w == name).map(|(n, _)| *n);
    let requests = numbers("requests:").context("h2load's report has no \"requests:\" line")?;
    let codes =
        numbers("status codes:").context("h2load's report has no \"status codes:\" line")?;
    let done = find(&requests, "done").context("h2load's requests line has no \"done\"")?;
    let ok = find(&codes, "2xx")
        .context("h2load's status codes have no 2xx")?
        .min(done);
    Ok(Counted {
        ok,
        failed: done - ok,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abs_report_counts_complete_requests_less_failed_and_non_2xx() {
        let report = "Concurrency Level:      4\nTime taken for tests:   1.002 seconds\n\
                      Complete requests:      1520\nFailed requests:        3\n   (Connect: 0, Receive: 0, Length: 3, Exceptions: 0)\n\
                      Non-2xx responses:      2\nTotal transferred:      1000 bytes\n";
        assert_eq!(
            parse_ab(report).unwrap(),
            Counted {
                ok: 1515,
                failed: 5
            }
        );
        let clean = "Complete requests:      10\nFailed requests:        0\n";
        assert_eq!(parse_ab(clean).unwrap(), Counted { ok: 10, failed: 0 });
        assert!(parse_ab("apr_socket_connect(): Connection refused (111)\n").is_err());
    }

    #[test]
    fn h2loads_report_counts_2xx_answers_of_the_requests_done() {
        let report = "finished in 4.00s, 25.00 req/s, 19.00MB/s\n\
                      requests: 103 total, 103 started, 100 done, 98 succeeded, 2 failed, 0 errored, 0 timeout\n\
                      status codes: 97 2xx, 0 3xx, 1 4xx, 0 5xx\n";
        assert_eq!(parse_h2load(report).unwrap(), Counted { ok: 97, failed: 3 });
        assert!(parse_h2load("finished in 0.00s\n").is_err());
    }

    #[test]
    fn each_tool_is_told_the_work_and_its_bounds() {
        let addr: std::net::SocketAddr = "127.0.0.1:4433".parse().unwrap();
        let body = PathBuf::from("/b/upsert.json");
        let spec = |work, body| RunSpec {
            bin: Path::new("/usr/bin/x"),
            work,
            addr,
            body,
            concurrency: 4,
        };
        let ab =
            spec(Work::JsonUpsert, Some(body.as_path())).args(Some(Duration::from_millis(1500)));
        assert_eq!(
            ab.join(" "),
            "-q -r -f TLS1.3 -c 4 -t 2 -n 500000 -p /b/upsert.json -T application/json \
             https://127.0.0.1:4433/collections/bench/points?wait=true"
        );
        assert_eq!(run_limit(&ab), Duration::from_secs(2) + OVERRUN);
        let burst = spec(Work::GrpcUpsert, Some(body.as_path())).args(None);
        assert_eq!(
            burst.join(" "),
            "-c 4 -m 1 -n 4 -d /b/upsert.json -H content-type: application/grpc -H te: trailers \
             https://127.0.0.1:4433/qdrant.Points/Upsert"
        );
        assert_eq!(run_limit(&burst), OVERRUN);
        let h1 = spec(Work::BulkH1Json, Some(body.as_path())).args(Some(Duration::from_secs(4)));
        assert!(
            h1.join(" ")
                .starts_with("-c 4 -m 1 -D 4000ms --h1 -d /b/upsert.json"),
            "{h1:?}"
        );
        assert_eq!(run_limit(&h1), Duration::from_secs(4) + OVERRUN);
        let tiny = spec(Work::TinyGet, None).args(Some(Duration::from_secs(4)));
        assert!(
            tiny.join(" ")
                .ends_with("-n 500000 https://127.0.0.1:4433/tiny"),
            "{tiny:?}"
        );
    }
}
