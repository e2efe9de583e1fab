//! A local cell: a proxy started for it (from the proxy's own configuration, written
//! sparsely), under the cell's CPU budget where one is asked for, measured, then stopped.

use super::*;

#[allow(clippy::too_many_arguments)]
pub(super) async fn run_local_cell(
    args: &CompareArgs,
    budget: Option<f64>,
    base: &RunArgs,
    cell: &Cell,
    ca: &Path,
    cert_dir: &Path,
    upstream: &str,
    upstream_pid: Option<u32>,
    work: &Path,
    out: &Path,
    stop: CancellationToken,
) -> Result<String> {
    let bin = args.terminators.proxy_bin();
    let loopback_port_0: SocketAddr = ([127, 0, 0, 1], 0).into();
    let mut config = Config::empty();
    config.provider = match &cell.provider {
        CellProvider::Proxy(p) => *p,
        CellProvider::Peer(name) => bail!("{name} is not a provider of the proxy"),
    };
    if let Some(n) = args.proxy_worker_threads {
        config.worker_threads = n;
    }
    config.admin.listen = loopback_port_0.to_string();
    let mut listener = ListenerConfig::new(
        loopback_port_0.to_string(),
        cert_dir.join(format!("{}.crt", cell.algorithm)),
        cert_dir.join(format!("{}.key", cell.algorithm)),
        vec![upstream.to_owned()],
    );
    // The name the proxy gives an unnamed first listener, as when compare started it with
    // flags: results record the listener labels of its /metrics.
    listener.name = Some("listener0".to_owned());
    listener.upstream_protocol = match args.protocol {
        Protocol::Grpc => UpstreamProtocol::H2c,
        Protocol::Rest => UpstreamProtocol::Http1,
    };
    listener.tls.min_version = args.tls_version;
    listener.tls.max_version = args.tls_version;
    listener.tls.kx_groups = Some(args.kx.clone());
    listener.tls.resumption = args.resumption == OnOff::On;
    config.listeners.push(listener);
    let cmd = procs::proxy_command(
        &config,
        &bin,
        work,
        "proxy",
        &args.proxy_args_for(config.provider),
    )?;
    let cpus = args.proxy_cpus.as_ref().map(|l| l.cpus.as_slice());
    // The budget's group (or scope) is the cell's own: made before the proxy starts, removed
    // once it has exited.
    let budget = match budget {
        Some(cores) => {
            let name = format!(
                "vtp-loadgen-{}-{}",
                std::process::id(),
                cell_path_stem(cell)
            );
            Some((Prepared::new(&Cgroups::default(), cores, &name)?, cores))
        }
        None => None,
    };
    let cmd = match &budget {
        Some((prepared, _)) => prepared.command(cmd),
        None => cmd,
    };
    let started = tokio::task::block_in_place(|| procs::start(cmd, "proxy", work, cpus));
    let proxy = match started {
        Ok(p) => p,
        Err(e) => {
            if let Some((prepared, _)) = budget {
                prepared.remove();
            }
            return Err(e.context("the proxy would not start"));
        }
    };
    let result = budgeted_cell(base, cell, ca, upstream_pid, out, stop, &proxy, &budget).await;
    let stopped = tokio::task::block_in_place(|| procs::stop(proxy));
    if let Some((prepared, _)) = budget {
        tokio::task::block_in_place(|| prepared.remove());
    }
    let summary = result?;
    stopped?;
    Ok(summary)
}

/// A started local proxy's cell: its budget attached and read back, then measured.
#[allow(clippy::too_many_arguments)]
async fn budgeted_cell(
    base: &RunArgs,
    cell: &Cell,
    ca: &Path,
    upstream_pid: Option<u32>,
    out: &Path,
    stop: CancellationToken,
    proxy: &Launched,
    budget: &Option<(Prepared, f64)>,
) -> Result<String> {
    if let Some((prepared, cores)) = budget {
        let quota = prepared
            .attach(&Cgroups::default(), proxy.pid(), *cores)
            .context("the proxy's CPU budget")?;
        tracing::info!(
            "proxy budget: {:.2} cores ({}, {} of {} us, {})",
            quota.cores,
            quota.mechanism,
            quota.quota_us,
            quota.period_us,
            quota.file.display()
        );
    }
    let ready = proxy.proxy_ready()?;
    let (Some(listen), Some(admin)) = (ready.first_listener(), ready.admin) else {
        bail!("the proxy's ready file names no listener or no admin address");
    };
    wait_ready(&format!("http://{admin}/readyz")).await?;
    let mut run = cell_run_args(base, cell, &format!("localhost:{}", listen.port()), ca, out);
    if run.congestion_control.is_none() {
        // The proxy runs on this machine: a pacing client's timer (BBR) would run under the
        // proxy's reads and be counted as the proxy's CPU (`--congestion-control host` keeps
        // the host's default; the cell's result records which).
        run.congestion_control = Some(LOCAL_CELL_CONGESTION_CONTROL.to_owned());
    }
    run.proxy_metrics = Some(format!("http://{admin}/metrics"));
    run.watch_pid.push(format!("proxy={}", proxy.pid()));
    if let Some(pid) = upstream_pid {
        run.watch_pid.push(format!("upstream={pid}"));
    }
    measure(run, stop).await
}

/// A cell's name in file names: `provider__algorithm__rN`.
pub(super) fn cell_path_stem(cell: &Cell) -> String {
    format!("{}__{}__r{}", cell.provider, cell.algorithm, cell.repeat)
}

/// Waits up to 30 s for `url` (the started proxy's /readyz) to answer 200.
async fn wait_ready(url: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = send(http::Method::GET, url, None, &Options::default()).await {
            if r.status == 200 {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("{url} did not answer 200 within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
