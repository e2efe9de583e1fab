//! `loadgen run`: one measured run, from vectors to the JSON result and the summary.
//!
//! `args.rs` the flags and their checks; `setup.rs` what the flags set up (vectors,
//! embeddings, Prometheus, power, watched processes); here the plan, preparation and the
//! measured phase; `record.rs` the result assembled from the measurements.

mod args;
mod record;
mod setup;

pub(crate) use args::{serialize_display, serialize_joined, serialize_opt_duration};
pub use args::{PowerChoice, RunArgs, VectorSource};
pub use record::write_json;
use record::{read_out, verify};
use setup::{power_source, prepare_vectors, prometheus_server, watched, Embeddings};

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use proxy::crypto::{Provider, ProviderName};
use tokio_util::sync::CancellationToken;

use crate::client::http::Options;
use crate::client::qdrant::Admin;
use crate::client::{Connector, Protocol, Target};
use crate::driver::{self, DriverConfig, Mode};
use crate::probe::{self, PowerSource, ProbeConfig, Watched};
use crate::result::*;
use crate::vectors::{self, EmbeddingsClient, LiveEmbedder, LiveOutcome, LivePace, VectorSet};
use crate::workload::{id_base_for_run, UpsertSpec, Workload, TEMPLATE_VARIANTS};

/// A run, decided before anything is changed: every flag checked (`RunArgs::check`) and
/// turned into what the run uses, typed (the target, protocol, client TLS configuration,
/// request headers, the driver's settings, the processes to watch, the power source).
/// Building it touches neither the target nor the collection.
pub struct RunPlan {
    /// Where the load goes.
    pub target: Target,
    /// REST or gRPC.
    pub protocol: Protocol,
    /// The client's provider and its library, for the record.
    pub client_provider: ProviderName,
    client_library: String,
    /// The client's TLS configuration (none: a plaintext baseline).
    tls: Option<Arc<rustls::ClientConfig>>,
    /// `--header` values and the API key.
    headers: http::HeaderMap,
    /// The measured phase: loop, concurrency, connection policy, duration or count.
    pub driver: DriverConfig,
    /// Processes whose CPU is measured.
    watched: Vec<Watched>,
    /// The watched proxy's pid and the CPU budget it gets for the run.
    proxy_budget: Option<(u32, f64)>,
    /// Where watts come from, or why they do not.
    power: PowerSource,
    /// The target host's CPU through Prometheus and node_exporter.
    target_host: Option<(Arc<probe::prometheus::Prometheus>, String)>,
    /// /proc, where this host's CPU is read.
    proc_root: PathBuf,
    /// The pace of the live embedding load beside the measured phase, if any.
    live_pace: Option<LivePace>,
    /// The embeddings endpoint (the vectors' source, the live load), if the run uses one.
    embeddings: Option<Embeddings>,
}

impl RunPlan {
    /// Checks `args` and decides everything that can be decided without the network.
    pub fn new(args: &RunArgs) -> Result<Self> {
        args.check()?;
        let target = Target::parse(&args.target)?;
        let protocol = args.protocol.unwrap_or_else(|| target.default_protocol());
        let client_provider = args.client_provider;
        let client_library = Provider::new(client_provider, &args.kx)
            .context("--client-provider")?
            .library_version();
        let tls = if target.tls {
            Some(
                proxy::tls::client::ClientTls {
                    provider: client_provider,
                    kx_groups: args.kx.clone(),
                    versions: args.tls_version.into_iter().collect(),
                    trust: crate::client::tls::trust(
                        client_provider,
                        args.ca.as_deref(),
                        args.insecure,
                    )?,
                    resumption: args.resumption == OnOff::On,
                    alpn: vec![match protocol {
                        Protocol::Rest => b"http/1.1".to_vec(),
                        Protocol::Grpc => b"h2".to_vec(),
                    }],
                    ..Default::default()
                }
                .build()?,
            )
        } else {
            None
        };
        let proc_root = PathBuf::from("/proc");
        let driver = DriverConfig {
            mode: match args.rate {
                Some(r) => Mode::Open(r),
                None => Mode::Closed,
            },
            concurrency: args.concurrency.max(1),
            policy: args.connection_policy,
            duration: match (args.duration, args.requests) {
                (Some(d), _) => Some(Duration::from(d)),
                (None, Some(_)) => None,
                (None, None) => Some(Duration::from_secs(10)),
            },
            requests: args.requests,
            warmup: args.warmup.into(),
            request_timeout: args.request_timeout.into(),
            shared_connections: args.connections,
            progress: !args.quiet,
        };
        let live_pace = match (args.embed_live, args.embed_concurrency) {
            (Some(rate), _) => Some(LivePace::Rate(rate)),
            (None, Some(concurrency)) => Some(LivePace::ClosedLoop(concurrency)),
            (None, None) => None,
        };
        let watched = watched(args, &proc_root)?;
        let proxy_budget = match args.proxy_cpu_budget {
            Some(crate::budget::BudgetChoice::Cores(cores)) => {
                let pid = watched
                    .iter()
                    .find(|w| w.name == "proxy")
                    .and_then(|w| w.pids.first().copied())
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "--proxy-cpu-budget needs the proxy watched: --watch-pid proxy=PID or --watch-process proxy"
                        )
                    })?;
                Some((pid, cores))
            }
            _ => None,
        };
        Ok(Self {
            embeddings: Embeddings::of(args, live_pace.is_some())?,
            live_pace,
            watched,
            proxy_budget,
            power: power_source(args)?,
            target_host: match (&args.target_node_exporter, prometheus_server(args)?) {
                (Some(instance), Some(server)) => Some((server, instance.clone())),
                _ => None,
            },
            headers: args.request_headers()?,
            target,
            protocol,
            client_provider,
            client_library,
            tls,
            driver,
            proc_root,
        })
    }
}

/// What is ready before the clock starts: vectors encoded into request bodies, the
/// connector, the collection, and the point count to verify against.
struct Prepared {
    vectors: VectorSet,
    connector: Arc<Connector>,
    workload: Arc<Workload>,
    count_before: Option<Result<u64>>,
}

/// Everything that can be prepared is, outside any timing: vectors (embedded if asked),
/// bodies, the control connection (which also proves the target speaks TLS), the
/// collection (recreated if asked) and its count before the run.
async fn prepare(args: &RunArgs, plan: &RunPlan) -> Result<Prepared> {
    let vectors = prepare_vectors(
        args,
        plan.embeddings.as_ref(),
        TEMPLATE_VARIANTS * args.points_per_request,
    )
    .await?;
    let mut connector = Connector::new(
        plan.target.clone(),
        plan.protocol,
        plan.tls.clone(),
        args.server_name.as_deref(),
    )
    .await
    .with_context(|| format!("--target {}", args.target))?;
    connector.extra_headers = plan.headers.clone();
    let connector =
        Arc::new(connector.with_congestion_control(args.congestion_control().map(Arc::from)));
    // Picks this run's id range. Random, not the clock: processes started side by side
    // (--start-at, an indexed Job) prepare in the same millisecond, and equal ranges would
    // overwrite each other's points. (RandomState is seeded randomly per process.)
    let nonce = {
        use std::hash::BuildHasher;
        std::collections::hash_map::RandomState::new().hash_one((
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        ))
    };
    let spec = UpsertSpec {
        protocol: plan.protocol,
        collection: args.collection.clone(),
        points_per_request: args.points_per_request,
        wait: args.wait,
        json_decimals: args.json_decimals,
    };
    let mut workload = Workload::build(
        spec,
        &vectors,
        id_base_for_run(nonce),
        if plan.target.tls { "https" } else { "http" },
        connector.authority().as_str(),
    )?;
    workload.extra_headers = plan.headers.clone();
    let mut admin = Admin::connect(&connector).await.with_context(|| {
        format!(
            "cannot reach {} over {}",
            plan.target,
            plan.protocol.as_str()
        )
    })?;
    admin
        .ensure_collection(&args.collection, vectors.dim, args.recreate)
        .await
        .with_context(|| format!("preparing collection {:?}", args.collection))?;
    let count_before = if args.verify_count {
        Some(admin.count(&args.collection).await)
    } else {
        None
    };
    Ok(Prepared {
        vectors,
        connector,
        workload: Arc::new(workload),
        count_before,
    })
}

/// Waits for `--start-at`, the barrier of processes started side by side.
async fn wait_for_start(at: Option<std::time::SystemTime>, stop: &CancellationToken) -> Result<()> {
    let Some(at) = at else {
        return Ok(());
    };
    match at.duration_since(std::time::SystemTime::now()) {
        Ok(wait) => {
            tokio::select! {
                _ = tokio::time::sleep(wait) => Ok(()),
                _ = stop.cancelled() => bail!("interrupted while waiting for --start-at"),
            }
        }
        Err(late) => bail!(
            "--start-at is {:.1} s in the past once the run was prepared: give a later time",
            late.duration().as_secs_f64()
        ),
    }
}

/// Runs the whole thing: plan, set-up, warm-up, measured phase, read-out.
pub async fn execute(args: &RunArgs, stop: CancellationToken) -> Result<RunResult> {
    let plan = RunPlan::new(args)?;
    let prepared = prepare(args, &plan).await?;
    // The proxy's budget holds from here to the end of the run (the guard lifts it).
    let _budget = match plan.proxy_budget {
        Some((pid, cores)) => {
            let lent = crate::budget::Lent::new(&crate::budget::Cgroups::default(), pid, cores)
                .context("--proxy-cpu-budget")?;
            tracing::info!(pid, cores, mechanism = %lent.quota.mechanism, "proxy CPU budget for the run");
            Some(lent)
        }
        None => None,
    };
    // Everything is prepared; the barrier is the last thing before the load.
    wait_for_start(args.start_at, &stop).await?;
    let started_at = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    // The measured phase starts when the warm-up ends, on the wall clock too.
    let measured_from = (std::time::SystemTime::now() + plan.driver.warmup)
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let (outcome, finished, embed_live) = measure(args, &plan, &prepared, &stop).await?;
    let verification = match &prepared.count_before {
        None => Measured::missing("--verify-count false"),
        Some(Err(e)) => Measured::missing(format!("counting before the run: {e:#}")),
        Some(Ok(before)) => {
            verify(
                &prepared.connector,
                &args.collection,
                *before,
                outcome.points_acknowledged,
                args.wait,
            )
            .await
        }
    };
    let result = read_out(
        args,
        &plan,
        &prepared,
        Measurements {
            started_at,
            measured_from,
            outcome,
            finished,
            embed_live,
            verification,
        },
    )?;
    if let Some(path) = &args.out {
        write_json(path, &result)?;
    }
    Ok(result)
}

/// The warm-up and the measured phase, with the probes around the measured phase and the
/// live embedding load beside it.
async fn measure(
    args: &RunArgs,
    plan: &RunPlan,
    prepared: &Prepared,
    stop: &CancellationToken,
) -> Result<(driver::Outcome, probe::Finished, Option<EmbedLiveRecord>)> {
    let proxy_metrics = args.proxy_metrics.clone().map(|url| {
        (
            url,
            Options {
                timeout: Some(Duration::from_secs(5)),
                ..Default::default()
            },
        )
    });
    let live = match (plan.live_pace, &plan.embeddings) {
        (Some(pace), Some(endpoint)) => {
            let opts = &endpoint.options;
            let mut texts = vectors::chunk_corpus(&opts.corpus, opts.chunk_chars)?;
            if opts.max_chunks > 0 {
                texts.truncate(opts.max_chunks);
            }
            let client = EmbeddingsClient::new(&opts.url, &opts.model, endpoint.http.clone());
            Some((
                pace,
                opts.batch,
                LiveEmbedder::start(client, texts, opts.batch, pace),
            ))
        }
        _ => None,
    };

    // Warm-up runs inside the driver; probes start when the measured phase does. Without a
    // warm-up they start before the first request, so the proxy's counters match exactly.
    let warmup = plan.driver.warmup;
    let probe_config = ProbeConfig {
        proc_root: plan.proc_root.clone(),
        target_host: plan.target_host.clone(),
        power: plan.power.clone(),
        watched: plan.watched.clone(),
        proxy_metrics,
        sample_interval: Duration::from_secs(1),
    };
    let (probes, outcome) = if warmup.is_zero() {
        let probes = probe_config.start().await;
        if let Some((_, _, live)) = &live {
            live.start_counting();
        }
        let outcome = driver::run(
            prepared.workload.clone(),
            prepared.connector.clone(),
            plan.driver.clone(),
            stop.clone(),
        )
        .await;
        (probes, outcome)
    } else {
        let driver_task = tokio::spawn(driver::run(
            prepared.workload.clone(),
            prepared.connector.clone(),
            plan.driver.clone(),
            stop.clone(),
        ));
        tokio::select! {
            _ = tokio::time::sleep(warmup) => {}
            _ = stop.cancelled() => {}
        }
        let probes = probe_config.start().await;
        if let Some((_, _, live)) = &live {
            live.start_counting();
        }
        (probes, driver_task.await.context("driver task")?)
    };
    // The live load stops with the driver, before the probes' last reading, so both cover
    // the same seconds.
    let embed_live = match live {
        Some((pace, batch, live)) => Some(embed_live_record(pace, batch, live.stop().await)),
        None => None,
    };
    let finished = probes.finish(outcome.ok).await;
    Ok((outcome, finished, embed_live))
}

/// The record of a live load that ran at `pace` with `batch` texts per call.
fn embed_live_record(pace: LivePace, batch: usize, outcome: LiveOutcome) -> EmbedLiveRecord {
    let (mode, rate_per_s, concurrency) = match pace {
        LivePace::Rate(rate) => ("rate", Some(rate), None),
        LivePace::ClosedLoop(n) => ("closed-loop", None, Some(n)),
    };
    EmbedLiveRecord {
        mode: mode.to_owned(),
        rate_per_s,
        concurrency,
        batch,
        ok: outcome.ok,
        failed: outcome.failed,
        embeddings: outcome.embeddings,
        seconds: outcome.seconds,
        embeddings_per_second: if outcome.seconds > 0.0 {
            outcome.embeddings as f64 / outcome.seconds
        } else {
            0.0
        },
        latency_ms: Percentiles::from_us(&outcome.latency_us),
        first_error: outcome.first_error,
    }
}

/// What the measured phase produced, for [`read_out`].
struct Measurements {
    started_at: String,
    measured_from: f64,
    outcome: driver::Outcome,
    finished: probe::Finished,
    embed_live: Option<EmbedLiveRecord>,
    verification: Measured<Verification>,
}
