//! The `loadgen` command line.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use loadgen::run::RunArgs;

#[derive(Parser)]
#[command(
    name = "loadgen",
    version,
    about = "Secure vector ingestion load generator: UPSERT_100 over REST and gRPC through a TLS terminator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// One measured run against a target: the JSON result (--out) and a summary.
    Run(Box<RunArgs>),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(args.worker_threads())
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("error: starting the runtime: {e}");
                    return ExitCode::from(1);
                }
            };
            runtime.block_on(async move {
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
