//! What a run sets up from its flags before it plans: the vectors, the embeddings client,
//! the Prometheus server, the power source and the processes whose CPU is watched.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};

use super::args::{PowerChoice, RunArgs, VectorSource};
use crate::client::http::{trust_config, Options};
use crate::probe::{self, PowerSource, Watched, WattMeter};
use crate::vectors::{self, EmbeddingsOptions, VectorSet};

/// The embeddings endpoint a run uses (the vectors' source with `--vectors embeddings`,
/// the live load beside the measured phase with `--embed-live` or `--embed-concurrency`):
/// what it embeds and how it is reached, decided once from the flags.
#[derive(Clone)]
pub(super) struct Embeddings {
    /// The endpoint, model, corpus, batch and cache.
    pub options: EmbeddingsOptions,
    /// HTTP settings of its requests (TLS for https://, the timeout).
    pub http: Options,
}

impl Embeddings {
    /// The endpoint of `args`, when they use one.
    pub(super) fn of(args: &RunArgs, live: bool) -> Result<Option<Self>> {
        if args.vectors != VectorSource::Embeddings && !live {
            return Ok(None);
        }
        Ok(Some(Self {
            options: embeddings_options(args)?,
            http: embeddings_http(args)?,
        }))
    }
}

/// Vectors for the run, prepared before anything is timed.
pub(super) async fn prepare_vectors(
    args: &RunArgs,
    embeddings: Option<&Embeddings>,
    needed: usize,
) -> Result<VectorSet> {
    match args.vectors {
        VectorSource::Synthetic => Ok(vectors::synthetic(needed, args.dim, args.seed)),
        VectorSource::File => {
            let path = args
                .vectors_file
                .as_ref()
                .ok_or_else(|| anyhow!("--vectors file needs --vectors-file PATH"))?;
            Ok(vectors::read_vectors_file(path)?.0)
        }
        VectorSource::Embeddings => {
            let endpoint = embeddings.context("--vectors embeddings needs --embeddings-url")?;
            let (set, cached) =
                vectors::load_or_embed(&endpoint.options, endpoint.http.clone()).await?;
            if !args.quiet {
                eprintln!(
                    "vectors: {} x {}-d from {}{}",
                    set.len(),
                    set.dim,
                    set.source,
                    if cached { " (cached)" } else { "" }
                );
            }
            Ok(set)
        }
    }
}

fn embeddings_options(args: &RunArgs) -> Result<EmbeddingsOptions> {
    let url = args
        .embeddings_url
        .clone()
        .ok_or_else(|| anyhow!("--vectors embeddings needs --embeddings-url URL"))?;
    let corpus = args
        .corpus
        .clone()
        .ok_or_else(|| anyhow!("--vectors embeddings needs --corpus FILE|DIR"))?;
    Ok(EmbeddingsOptions {
        url,
        model: args.embeddings_model.clone(),
        corpus,
        batch: args.embed_batch,
        chunk_chars: args.chunk_chars,
        max_chunks: args.max_chunks,
        cache: args
            .vectors_file
            .clone()
            .unwrap_or_else(|| PathBuf::from("vectors-cache.bin")),
    })
}

fn embeddings_http(args: &RunArgs) -> Result<Options> {
    let https = args
        .embeddings_url
        .as_deref()
        .is_some_and(|u| u.starts_with("https://"));
    Ok(Options {
        tls: if https {
            Some(trust_config(None, false)?)
        } else {
            None
        },
        headers: Vec::new(),
        timeout: Some(*args.embed_timeout),
        ..Default::default()
    })
}

/// The Prometheus server of `--prometheus`, with its TLS trust and credentials.
pub(super) fn prometheus_server(
    args: &RunArgs,
) -> Result<Option<Arc<probe::prometheus::Prometheus>>> {
    let Some(url) = &args.prometheus else {
        return Ok(None);
    };
    let tls = if url.starts_with("https://") {
        Some(trust_config(args.prometheus_ca.as_deref(), false)?)
    } else {
        None
    };
    let auth = match (&args.prometheus_user, &args.prometheus_bearer_token_file) {
        (Some(user), _) => Some(probe::prometheus::Auth::Basic {
            user: user.clone(),
            password: args.prometheus_password.clone().unwrap_or_default(),
        }),
        (None, Some(file)) => Some(probe::prometheus::Auth::Bearer(
            std::fs::read_to_string(file)
                .with_context(|| format!("--prometheus-bearer-token-file {}", file.display()))?
                .trim()
                .to_owned(),
        )),
        (None, None) => None,
    };
    Ok(Some(Arc::new(probe::prometheus::Prometheus::new(
        url, tls, auth,
    ))))
}

pub(super) fn power_source(args: &RunArgs) -> Result<PowerSource> {
    let redfish = || -> Result<PowerSource> {
        let url = args
            .redfish
            .as_deref()
            .ok_or_else(|| anyhow!("--power redfish needs --redfish URL"))?;
        let tls = if url.starts_with("https://") {
            Some(trust_config(
                args.redfish_ca.as_deref(),
                args.redfish_insecure,
            )?)
        } else {
            None
        };
        Ok(PowerSource::Meter(Arc::new(WattMeter::Redfish(
            probe::redfish::Redfish::new(
                url,
                args.redfish_user.as_deref(),
                args.redfish_password.as_deref(),
                tls,
            ),
        ))))
    };
    let prometheus = || -> Result<PowerSource> {
        let (Some(server), Some(query)) = (prometheus_server(args)?, &args.prometheus_query) else {
            bail!("--power prometheus needs --prometheus URL and --prometheus-query PROMQL");
        };
        Ok(PowerSource::Meter(Arc::new(WattMeter::Prometheus(
            probe::prometheus::PrometheusPower::new(server, query),
        ))))
    };
    Ok(match args.power {
        PowerChoice::None => PowerSource::None("power measurement off (--power none)".to_owned()),
        PowerChoice::Rapl => PowerSource::Rapl(args.rapl_root.clone()),
        PowerChoice::Redfish => redfish()?,
        PowerChoice::Prometheus => prometheus()?,
        PowerChoice::Auto if args.redfish.is_some() => redfish()?,
        PowerChoice::Auto if args.prometheus.is_some() || args.prometheus_query.is_some() => {
            prometheus()?
        }
        PowerChoice::Auto => match probe::rapl::Rapl::open(&args.rapl_root) {
            Ok(_) => PowerSource::Rapl(args.rapl_root.clone()),
            Err(reason) => PowerSource::None(reason),
        },
    })
}

pub(super) fn watched(args: &RunArgs, proc_root: &std::path::Path) -> Result<Vec<Watched>> {
    let mut out = Vec::new();
    for spec in &args.watch_pid {
        let (name, pids) = match spec.split_once('=') {
            Some((n, p)) => (n.to_owned(), p),
            None => (format!("pid {spec}"), spec.as_str()),
        };
        let pids = pids
            .split(',')
            .map(|p| p.trim().parse::<u32>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| {
                anyhow!("--watch-pid {spec:?}: expected PID, NAME=PID or NAME=PID,PID,...")
            })?;
        out.push(Watched { name, pids });
    }
    for name in &args.watch_process {
        let pids = probe::cpu::find_processes(proc_root, name);
        if pids.is_empty() {
            bail!("--watch-process {name}: no running process has that name");
        }
        out.push(Watched {
            name: name.clone(),
            pids,
        });
    }
    Ok(out)
}
