//! The `loadgen` command line.

#![deny(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use loadgen::compare::CompareArgs;
use loadgen::run::RunArgs;

#[derive(Parser)]
#[command(
    name = "loadgen",
    version,
    about = "Secure vector ingestion load generator: UPSERT_100 over REST and gRPC through a TLS terminator",
    long_about = "Secure vector ingestion load generator: UPSERT_100 over REST and gRPC through a TLS terminator.\n\n\
                  `loadgen --target HOST:PORT [flags]` is `loadgen run --target HOST:PORT [flags]`: one measured run.",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Without a command: the flags of `run`, the measured run (the default command).
    #[command(flatten)]
    run: Option<RunArgs>,
}

#[derive(Subcommand)]
enum Command {
    /// One measured run against a target: the JSON result (--out) and a summary.
    Run(Box<RunArgs>),
    /// The provider x certificate-algorithm matrix against the proxy, then the report.
    Compare(Box<CompareArgs>),
    /// Render report.md, report.csv and report.html from a compare folder's JSON.
    Report {
        /// The folder `loadgen compare --out` wrote.
        dir: std::path::PathBuf,
    },
    /// One result from the results of loadgen processes that ran the same cell side by
    /// side (`run --start-at`): counts and bytes summed, latency histograms merged exactly,
    /// CPU summed per host.
    Merge {
        /// Run results (`loadgen run --out`), two or more.
        #[arg(required = true, num_args = 2..)]
        results: Vec<std::path::PathBuf>,
        /// Where the merged result goes.
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// The terminator benchmark: our proxy per provider beside nginx and HAProxy, CPU per
    /// new connection and per MB, memory per idle connection, latency; a table of ratios.
    Bench(Box<loadgen::bench::BenchArgs>),
}

fn runtime(threads: Option<usize>) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        b.worker_threads(n);
    }
    b.enable_all().build().map_err(|e| {
        eprintln!("error: starting the runtime: {e}");
        ExitCode::from(1)
    })
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let command = match (cli.command, cli.run) {
        (Some(command), _) => command,
        (None, Some(run)) => Command::Run(Box::new(run)),
        // arg_required_else_help prints the help when nothing is given; clap's required
        // --target refuses flags without it.
        (None, None) => {
            use clap::CommandFactory;
            let _ = Cli::command().print_help();
            return ExitCode::from(2);
        }
    };
    match command {
        Command::Run(args) => run(*args),
        Command::Compare(args) => compare(*args),
        Command::Bench(args) => bench(*args),
        Command::Merge { results, out } => merge(&results, &out),
        Command::Report { dir } => report(&dir),
    }
}

/// `loadgen run` (also `loadgen --target ...`): one measured run and its summary.
fn run(args: RunArgs) -> ExitCode {
    let rt = match runtime(Some(args.worker_threads())) {
        Ok(r) => r,
        Err(code) => return code,
    };
    rt.block_on(async move {
        let stop = stop_on_ctrl_c();
        match loadgen::run::execute(&args, stop).await {
            Ok(result) => {
                print!("{}", loadgen::summary::render(&result));
                if result.requests_ok == 0 {
                    eprintln!("error: no request succeeded");
                    return ExitCode::from(1);
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        }
    })
}

/// `loadgen compare`: the provider x algorithm matrix, then its report.
fn compare(args: CompareArgs) -> ExitCode {
    if let Err(e) = loadgen::compare::pin_loadgen(&args) {
        eprintln!("error: {e:#}");
        return ExitCode::from(2);
    }
    let rt = match runtime(None) {
        Ok(r) => r,
        Err(code) => return code,
    };
    rt.block_on(async move {
        let stop = stop_on_ctrl_c();
        let failures = match loadgen::compare::execute(&args, stop).await {
            Ok(f) => f,
            Err(e) => {
                eprintln!("error: {e:#}");
                return ExitCode::from(2);
            }
        };
        match loadgen::report::render(&args.out) {
            Ok(report) => {
                print!(
                    "{}",
                    std::fs::read_to_string(args.out.join("report.md")).unwrap_or_default()
                );
                println!(
                    "\nwrote {}/report.md, report.csv, report.html ({} cells measured, {} failed)",
                    args.out.display(),
                    report.cells_measured,
                    failures.len()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: rendering the report: {e:#}");
                ExitCode::from(1)
            }
        }
    })
}

/// `loadgen bench`: the terminator benchmark beside nginx and HAProxy.
fn bench(args: loadgen::bench::BenchArgs) -> ExitCode {
    let rt = match runtime(Some(2)) {
        Ok(r) => r,
        Err(code) => return code,
    };
    rt.block_on(async move {
        let stop = stop_on_ctrl_c();
        match loadgen::bench::execute(&args, stop).await {
            Ok(result) => {
                print!("{}", loadgen::bench::render(&result));
                println!("\nwrote {}/bench.md and bench.json", args.out.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        }
    })
}

/// `loadgen merge`: one result from the side-by-side processes of one cell.
fn merge(results: &[std::path::PathBuf], out: &std::path::Path) -> ExitCode {
    let names: Vec<String> = results.iter().map(|p| p.display().to_string()).collect();
    let merged = loadgen::merge::read(results)
        .and_then(|list| loadgen::merge::merge(&list, &names))
        .and_then(|m| {
            let text = serde_json::to_vec_pretty(&m)?;
            std::fs::write(out, text)?;
            Ok(m)
        });
    match merged {
        Ok(m) => {
            println!(
                "merged {} results into {}: {} requests ok, {} failed, {:.1} requests/s over {:.1} s, p50 {} ms, p99 {} ms",
                results.len(),
                out.display(),
                m.requests_ok,
                m.requests_failed,
                m.requests_per_second,
                m.measured_seconds,
                m.latency_ms.as_ref().map_or("n/a".into(), |l| format!("{:.2}", l.p50)),
                m.latency_ms.as_ref().map_or("n/a".into(), |l| format!("{:.2}", l.p99)),
            );
            // The merged run as a run is reported: failures by kind, and the
            // seconds they fell in (what each fault did to the clients together).
            print!("{}", loadgen::summary::render(&m));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// `loadgen report`: the report rendered again from a comparison's JSON.
fn report(dir: &std::path::Path) -> ExitCode {
    match loadgen::report::render(dir) {
        Ok(report) => {
            println!(
                "wrote {}/report.md, report.csv, report.html ({} cells measured, {} failed)",
                dir.display(),
                report.cells_measured,
                report.failures.len()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Ctrl-C (or SIGTERM) ends the run early; what was measured is still written.
fn stop_on_ctrl_c() -> CancellationToken {
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
        eprintln!("stopping: finishing in-flight requests and writing the result");
        s.cancel();
    });
    stop
}
