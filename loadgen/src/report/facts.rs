//! The facts of a comparison's set-up and run that the reports print beside the figures:
//! the machine, the proxy's CPU budget and how it was applied, the workload and what was
//! measured how.

use super::*;

pub(super) fn setup_facts(r: &RunResult) -> Vec<(String, String)> {
    let mut facts = run_facts(r);
    if let Some(e) = &r.embed_live {
        let pace = e.pace();
        let model = r
            .config
            .other
            .get("embeddings_model")
            .and_then(|v| v.as_str())
            .unwrap_or("unknown");
        facts.push((
            "Co-located embedding".into(),
            format!(
                "the pipeline's first stage beside ingestion on the same host: {pace}, {} texts a call, model {model}; the same load in every cell, so its embeddings/s is what each provider left it",
                e.batch
            ),
        ));
    }
    facts
}

pub(super) fn run_facts(r: &RunResult) -> Vec<(String, String)> {
    let c = &r.config;
    let or_default = |v: Option<&str>| v.unwrap_or("default").to_owned();
    let w = &r.workload;
    vec![
        (
            "Machine".into(),
            format!(
                "{} ({} cores), Linux {}",
                r.environment.cpu_model, r.environment.cores, r.environment.kernel
            ),
        ),
        (
            "Workload".into(),
            format!(
                "{} points x {}-d per upsert over {} ({} bytes per request), wait={}, vectors {}",
                w.points_per_request,
                w.dim,
                w.protocol,
                w.request_body_bytes,
                w.wait,
                w.vectors_source
            ),
        ),
        (
            "Connections".into(),
            format!(
                "policy {}, resumption {}, TLS {}, key exchange {}, concurrency {}, TCP congestion control {}",
                c.connection_policy,
                or_default(c.resumption.map(OnOff::as_str)),
                or_default(c.tls_version.map(TlsVersion::as_str)),
                c.kx,
                c.concurrency,
                match c.congestion_control.as_deref() {
                    None | Some(crate::result::HOST_CONGESTION_CONTROL) => "the host's default",
                    Some(name) => name,
                }
            ),
        ),
        (
            "Per cell".into(),
            format!(
                "warm-up {}, measured {} each",
                c.warmup,
                match (c.requests, &c.duration) {
                    (Some(n), _) => format!("{n} requests"),
                    (None, d) => or_default(d.as_deref()),
                }
            ),
        ),
        (
            "Client".into(),
            format!(
                "loadgen {} with {} ({})",
                r.environment.loadgen_version,
                r.environment.client_provider,
                r.environment.client_library
            ),
        ),
        (
            "TLS verification".into(),
            if r.tls_verification {
                "on".into()
            } else {
                "off (--insecure)".into()
            },
        ),
        (
            "System CPU".into(),
            match &r.cpu.target_host_utilisation_percent.value {
                Some(_) => format!(
                    "the target host's, from node_exporter {} through Prometheus",
                    or_default(c.target_node_exporter.as_deref())
                ),
                None => "this host's (/proc/stat)".into(),
            },
        ),
        (
            "Power".into(),
            match (&r.power.value, &r.power.reason) {
                (Some(p), _) if p.detail.is_empty() => p.source.clone(),
                (Some(p), _) => format!("{} ({})", p.source, p.detail),
                (None, _) => "not measured (each n/a says why)".into(),
            },
        ),
        (
            "Estimated power".into(),
            match &r.power_estimate.value {
                Some(e) => format!(
                    "{}: per vCPU {} W idle + utilisation x ({} - {}) W, x {} vCPUs of this host; \
                     an estimate, never a measurement: it restates CPU utilisation as watts and \
                     cannot see a QAT device's own power",
                    e.model,
                    e.idle_watts_per_vcpu,
                    e.full_watts_per_vcpu,
                    e.idle_watts_per_vcpu,
                    e.vcpus
                ),
                None => format!(
                    "none ({})",
                    r.power_estimate.reason.as_deref().unwrap_or("not estimated")
                ),
            },
        ),
        ("Proxy CPU budget".into(), budget_fact(r)),
    ]
}

/// The proxy's CPU budget as its cgroup files gave it, and what it means beside the study.
pub(super) fn budget_fact(r: &RunResult) -> String {
    let proxy = r.cpu.watched.iter().find(|p| p.name == "proxy");
    match proxy.and_then(|p| p.cpu_quota.as_ref()) {
        Some(q) => format!(
            "{:.2} cores ({}: {} us per {} us, read back from {}). The study gave its proxy \
             whole cores of a larger host with more clients than they served; here a fraction \
             of a core plays that part so that the proxy, not the database beside it, bounds \
             throughput. Requests/s over the budget (requests per proxy core-second) is the \
             figure that scales: times the cores you give the proxy on a bigger machine, while \
             its clients and database keep up",
            q.cores,
            q.mechanism,
            q.quota_us,
            q.period_us,
            q.file.display()
        ),
        None if proxy.is_some() => "none: the proxy could use every core it was allowed, so \
            throughput may be bounded by the database or the client (see what bounded each cell)"
            .into(),
        None => "not known (no proxy process watched)".into(),
    }
}
