//! `loadgen report DIR`: renders a comparison from its JSON alone (the cell results in
//! `DIR/cells`) into `report.md`, `report.csv` and a self-contained `report.html` with SVG
//! charts. Deterministic: the same JSON gives byte-identical files.
//!
//! Each figure is the median over the repeats of a cell, with the min-max spread; each is
//! also given as a ratio against the best software provider for that algorithm (ring,
//! aws-lc-rs, openssl), oriented so that above 1.00x is better, the way the reference study
//! reports QAT against AWS-LC ("1.39x the requests/s", "1.30x lower median latency").

pub mod chart;
mod html;
mod markdown;
mod metrics;

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Result};

use proxy::crypto::{CertAlgorithmName, ProviderName};

use crate::result::{CellFailure, CellProvider, RunResult};
use crate::result::{OnOff, TlsVersion};
pub use metrics::{Better, Metric, METRICS};

const ALGORITHM_ORDER: [&str; 4] = [
    CertAlgorithmName::ALL[0].as_str(),
    CertAlgorithmName::ALL[1].as_str(),
    CertAlgorithmName::ALL[2].as_str(),
    CertAlgorithmName::ALL[3].as_str(),
];

/// One figure of one provider x algorithm, over its repeats.
#[derive(Clone, Debug)]
pub enum Figure {
    /// Measured in `n` rounds.
    Value {
        /// The median over the rounds.
        median: f64,
        /// The smallest round.
        min: f64,
        /// The largest round.
        max: f64,
        /// Rounds.
        n: usize,
    },
    /// Not measured in any round, and why.
    Missing(String),
}

impl Figure {
    /// The median, if measured.
    pub fn median(&self) -> Option<f64> {
        match self {
            Figure::Value { median, .. } => Some(*median),
            Figure::Missing(_) => None,
        }
    }
}

/// Everything the renderers need, computed once.
pub struct Report {
    /// In report order (`CellProvider`'s: the registry's providers, then peers by name).
    pub providers: Vec<CellProvider>,
    /// In report order (the reference study's).
    pub algorithms: Vec<String>,
    /// (provider, algorithm) -> metric key -> figure.
    pub figures: BTreeMap<(CellProvider, String), BTreeMap<&'static str, Figure>>,
    /// (algorithm, metric key) -> (best software provider, its median).
    pub baselines: BTreeMap<(String, &'static str), (CellProvider, f64)>,
    /// Cells that could not be measured.
    pub failures: Vec<CellFailure>,
    /// Facts about the set-up, from the first result.
    pub setup: Vec<(String, String)>,
    /// The most rounds any cell has.
    pub repeats: u32,
    /// Results read (rounds of cells).
    pub cells_measured: usize,
    /// Per algorithm, in algorithm order: what decides (see `verdicts()`).
    pub verdicts: Vec<(String, Vec<String>)>,
    /// (provider, algorithm) -> what bounded the cell's throughput, from its first round.
    pub bounds: BTreeMap<(CellProvider, String), String>,
}

impl Report {
    /// The metrics the tables, charts and CSV show: every figure, and each optional one
    /// that at least one cell measured.
    pub fn metrics(&self) -> Vec<&'static Metric> {
        METRICS
            .iter()
            .filter(|m| {
                !m.optional
                    || self
                        .figures
                        .values()
                        .any(|f| matches!(f.get(m.key), Some(Figure::Value { .. })))
            })
            .collect()
    }

    /// One metric of one cell.
    pub fn figure(
        &self,
        provider: &CellProvider,
        algorithm: &str,
        metric: &str,
    ) -> Option<&Figure> {
        self.figures
            .get(&(provider.clone(), algorithm.to_owned()))
            .and_then(|m| m.get(metric))
    }

    /// The ratio against the best software provider, oriented so that above 1 is better.
    pub fn ratio(&self, provider: &CellProvider, algorithm: &str, metric: &Metric) -> Option<f64> {
        let value = self.figure(provider, algorithm, metric.key)?.median()?;
        let (_, best) = self.baselines.get(&(algorithm.to_owned(), metric.key))?;
        let r = match metric.better {
            Better::Higher => value / best,
            Better::Lower => best / value,
        };
        r.is_finite().then_some(r)
    }
}

fn order_key(list: &[&str], s: &str) -> (usize, String) {
    (
        list.iter().position(|x| *x == s).unwrap_or(list.len()),
        s.to_owned(),
    )
}

fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// Reads every cell JSON of `dir/cells`.
pub fn load(dir: &Path) -> Result<Report> {
    let cells_dir = dir.join("cells");
    let (runs, failures) = crate::cells::read(&cells_dir)?;
    if runs.is_empty() && failures.is_empty() {
        bail!("no cell results in {}", cells_dir.display());
    }
    let mut providers: Vec<CellProvider> = runs
        .keys()
        .map(|(p, _)| p.clone())
        .chain(failures.iter().map(|f| f.cell.provider.clone()))
        .collect();
    providers.sort();
    providers.dedup();
    let mut algorithms: Vec<String> = runs
        .keys()
        .map(|(_, a)| a.clone())
        .chain(failures.iter().map(|f| f.cell.algorithm.clone()))
        .collect();
    algorithms.sort_by_key(|a| order_key(&ALGORITHM_ORDER, a));
    algorithms.dedup();

    let figures: BTreeMap<_, _> = runs
        .iter()
        .map(|(cell, list)| (cell.clone(), cell_figures(list)))
        .collect();
    let baselines = baselines(&figures, &algorithms);
    let setup = runs
        .values()
        .flatten()
        .next()
        .map(setup_facts)
        .unwrap_or_default();
    let bounds = runs
        .iter()
        .filter_map(|(key, list)| {
            let r = list.iter().find(|r| r.requests_ok > 0)?;
            Some((key.clone(), bound(r)))
        })
        .collect();
    let mut report = Report {
        providers,
        algorithms,
        figures,
        baselines,
        failures,
        setup,
        repeats: runs.values().map(|l| l.len() as u32).max().unwrap_or(0),
        cells_measured: runs.values().map(Vec::len).sum(),
        verdicts: Vec::new(),
        bounds,
    };
    report.verdicts = verdicts(&report);
    Ok(report)
}

/// Every metric of one cell over its rounds: median, range and count, or why it is missing.
fn cell_figures(rounds: &[RunResult]) -> BTreeMap<&'static str, Figure> {
    // A result in which every request failed carries no figures; its failure shows.
    let ok: Vec<&RunResult> = rounds.iter().filter(|r| r.requests_ok > 0).collect();
    let mut per_metric = BTreeMap::new();
    for m in METRICS {
        let mut values = Vec::new();
        let mut reason = None;
        for r in &ok {
            match (m.extract)(r) {
                Ok(v) if v.is_finite() => values.push(v),
                Ok(_) => reason = Some("not a finite number".to_owned()),
                Err(e) => reason = Some(e),
            }
        }
        let fig = if values.is_empty() {
            Figure::Missing(reason.unwrap_or_else(|| "every request failed".to_owned()))
        } else {
            values.sort_by(f64::total_cmp);
            Figure::Value {
                median: median(&values),
                min: values[0],
                max: values[values.len() - 1],
                n: values.len(),
            }
        };
        per_metric.insert(m.key, fig);
    }
    per_metric
}

/// Per algorithm and metric, the best software provider's median: what ratios compare with.
fn baselines(
    figures: &BTreeMap<(CellProvider, String), BTreeMap<&'static str, Figure>>,
    algorithms: &[String],
) -> BTreeMap<(String, &'static str), (CellProvider, f64)> {
    let mut baselines = BTreeMap::new();
    for a in algorithms {
        for m in METRICS {
            let mut best: Option<(CellProvider, f64)> = None;
            for p in ProviderName::SOFTWARE.map(CellProvider::Proxy) {
                let Some(v) = figures
                    .get(&(p.clone(), a.clone()))
                    .and_then(|f| f.get(m.key))
                    .and_then(Figure::median)
                else {
                    continue;
                };
                let better = match (&best, m.better) {
                    (None, _) => true,
                    (Some((_, b)), Better::Higher) => v > *b,
                    (Some((_, b)), Better::Lower) => v < *b,
                };
                if better {
                    best = Some((p, v));
                }
            }
            if let Some(b) = best {
                baselines.insert((a.clone(), m.key), b);
            }
        }
    }
    baselines
}

/// A component counts as the bound when it used at least this share of what it could.
const SATURATED: f64 = 0.9;

/// What bounded one run's throughput: the first of the machine's CPU (all cores busy), a
/// process at the CPU it was allowed (its `cpus_allowed`, its cgroup's quota where that is
/// less, or every core), or, when nothing
/// was saturated, the client's concurrency against the round trip (latency-bound).
pub fn bound(r: &RunResult) -> String {
    let qat = r.proxy_metrics.value.as_ref().and_then(|p| {
        let offloaded = p.qat_signatures_offloaded?;
        let total = offloaded + p.qat_signatures_not_offloaded.unwrap_or(0.0);
        let mode = match (&p.qat_mode, p.qat_batch) {
            (Some(mode), Some(batch)) => format!(" ({mode}, batch {batch})"),
            _ => String::new(),
        };
        let padding = p
            .qat_part_batches
            .filter(|n| *n > 0.0)
            .map(|n| format!(", {n:.0} part batches went to the provider as they were"))
            .unwrap_or_default();
        (total > 0.0).then(|| {
            format!(
                "; QAT{mode}: {:.0} % of {total:.0} signatures offloaded (the rest in software: \
                 too few handshakes at once to fill a batch, or a key kept in software){padding}",
                100.0 * offloaded / total
            )
        })
    });
    format!("{}{}", bound_by_cpu(r), qat.unwrap_or_default())
}

fn bound_by_cpu(r: &RunResult) -> String {
    let cores = r.environment.cores.max(1) as f64;
    let mut procs: Vec<(String, f64)> = r
        .cpu
        .watched
        .iter()
        .chain(std::iter::once(&r.cpu.loadgen))
        .map(|p| (p.name.clone(), p.percent_of_core / 100.0))
        .collect();
    procs.sort_by(|a, b| b.1.total_cmp(&a.1));
    let usage: Vec<String> = procs.iter().map(|(n, c)| format!("{n} {c:.2}")).collect();
    let usage = format!("cores used: {}", usage.join(", "));
    // What a process could use: the cores it may run on, or its cgroup's quota (a CPU
    // budget) where that is less.
    let allowed = |name: &str| {
        let p = r
            .cpu
            .watched
            .iter()
            .chain(std::iter::once(&r.cpu.loadgen))
            .find(|p| p.name == name);
        let on = p
            .and_then(|p| p.cpus_allowed.as_deref())
            .map_or(cores, |l| cpu_list_len(l).max(1) as f64);
        match p.and_then(|p| p.cpu_quota.as_ref()) {
            Some(q) if q.cores < on => (q.cores, format!("its {:.2}-core budget", q.cores), true),
            _ => (on, format!("{on:.0} cores"), false),
        }
    };
    let at_limit = |budgeted: bool| {
        procs.iter().find_map(|(name, used)| {
            let (limit, what, has_budget) = allowed(name);
            (has_budget == budgeted && *used >= SATURATED * limit)
                .then(|| format!("{name}'s CPU ({used:.2} of {what}); {usage}"))
        })
    };
    // A process at its budget is throttled there whatever the rest of the machine does.
    if let Some(bound) = at_limit(true) {
        return bound;
    }
    if let Some(system) = r.cpu.system_utilisation_percent.value {
        if system / 100.0 >= SATURATED {
            let top = procs.first().map_or("?", |(n, _)| n.as_str());
            return format!(
                "the machine's CPU ({system:.0} % of {cores:.0} cores; most: {top}); {usage}"
            );
        }
    }
    if let Some(bound) = at_limit(false) {
        return bound;
    }
    let busiest = procs.first().map_or(String::new(), |(n, c)| {
        format!(" (busiest: {n}, {c:.2} cores)")
    });
    format!(
        "no process at its CPU limit{busiest}: the client's concurrency against the round trip, or a single-threaded stage of the busiest process; {usage}"
    )
}

/// The number of CPUs in a /proc `Cpus_allowed_list` such as "0-3,6".
fn cpu_list_len(list: &str) -> usize {
    list.split(',')
        .filter_map(|part| {
            let part = part.trim();
            match part.split_once('-') {
                Some((a, b)) => Some(b.parse::<usize>().ok()? + 1 - a.parse::<usize>().ok()?),
                None => part.parse::<usize>().ok().map(|_| 1),
            }
        })
        .sum()
}

/// Whether two figures differ beyond their run-to-run spread: their min-max ranges do not
/// overlap. With one round there is no spread, and nothing is called a difference.
fn beyond_spread(a: &Figure, b: &Figure) -> Option<bool> {
    match (a, b) {
        (
            Figure::Value {
                min: amin,
                max: amax,
                n: an,
                ..
            },
            Figure::Value {
                min: bmin,
                max: bmax,
                n: bn,
                ..
            },
        ) => {
            if *an < 2 || *bn < 2 {
                None
            } else {
                Some(amax < bmin || bmax < amin)
            }
        }
        _ => None,
    }
}

/// Per algorithm: the provider that costs the proxy the least CPU per request and by how
/// much, whether the throughput differences exceed the run-to-run spread, and whether
/// throughput was the proxy's at all (what bounded the cells).
fn verdicts(r: &Report) -> Vec<(String, Vec<String>)> {
    let metric = |key: &str| METRICS.iter().find(|m| m.key == key).expect("metric");
    let ranked = |a: &str, m: &Metric| {
        let mut v: Vec<(&CellProvider, &Figure, f64)> = r
            .providers
            .iter()
            .filter_map(|p| {
                let f = r.figure(p, a, m.key)?;
                Some((p, f, f.median()?))
            })
            .collect();
        v.sort_by(|x, y| match m.better {
            Better::Higher => y.2.total_cmp(&x.2),
            Better::Lower => x.2.total_cmp(&y.2),
        });
        v
    };
    let judge = |best: &Figure, next: &Figure| match beyond_spread(best, next) {
        Some(true) => "beyond the run-to-run spread",
        Some(false) => "within the run-to-run spread: no difference",
        None => "one round, no spread: not a difference on this evidence",
    };
    let mut out = Vec::new();
    for a in &r.algorithms {
        let mut lines = Vec::new();
        let cpu = metric("requests_per_proxy_cpu_second");
        let by_cpu = ranked(a, cpu);
        match by_cpu.as_slice() {
            [] => lines.push("proxy CPU per request: not measured".to_owned()),
            [(p, _, _)] => lines.push(format!("proxy CPU per request: only {p} measured")),
            [(p, f, v), (q, g, w), ..] => lines.push(format!(
                "least proxy CPU per request: {p}, {:.2}x the requests per CPU-second of {q} ({})",
                v / w,
                judge(f, g)
            )),
        }
        let tput = metric("requests_per_second");
        let by_tput = ranked(a, tput);
        if let [(p, f, v), rest @ ..] = by_tput.as_slice() {
            let same: Vec<&str> = rest
                .iter()
                .filter(|(_, g, _)| beyond_spread(f, g) != Some(true))
                .map(|(q, _, _)| q.as_str())
                .collect();
            let bound = r
                .bounds
                .get(&((*p).clone(), a.clone()))
                .map(String::as_str)
                .unwrap_or("unknown");
            let proxy_bound = bound.starts_with("proxy") || bound.contains("most: proxy");
            let mut line = format!("highest throughput: {p} ({v:.1} requests/s)");
            // How far the ranking spans: the leader against the slowest provider.
            if let Some((q, g, w)) = rest.last().filter(|(_, _, w)| *w > 0.0) {
                let _ = std::fmt::Write::write_fmt(
                    &mut line,
                    format_args!(", {:.2}x the lowest ({q}, {w:.1}; {})", v / w, judge(f, g)),
                );
            }
            if !same.is_empty() {
                let _ = std::fmt::Write::write_fmt(
                    &mut line,
                    format_args!(
                        "; no difference from {} (spread overlaps or one round)",
                        same.join(", ")
                    ),
                );
            }
            if !proxy_bound {
                line.push_str(
                    "; throughput was not bounded by the proxy here, so it ranks the set-up, not the provider: compare proxy CPU per request",
                );
            }
            lines.push(line);
        }
        out.push((a.clone(), lines));
    }
    out
}

fn setup_facts(r: &RunResult) -> Vec<(String, String)> {
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

fn run_facts(r: &RunResult) -> Vec<(String, String)> {
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
fn budget_fact(r: &RunResult) -> String {
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

/// The study's columns, in its order: requests/s, requests/s per watt (measured, then
/// estimated, never in one column), and the CPU left for co-located work.
pub const STUDY_METRICS: [&str; 4] = [
    "requests_per_second",
    "requests_per_watt",
    "requests_per_estimated_watt",
    "cpu_headroom_percent",
];

/// The header of [`study_table`]'s rows.
pub const STUDY_HEADER: [&str; 7] = [
    "algorithm",
    "provider",
    "requests/s",
    "requests/s per W (measured)",
    "requests/s per estimated W",
    "CPU left for co-located work (% of all cores)",
    "bounded by",
];

/// The table the study reports, one row per algorithm and provider: each figure as its
/// median with the spread and its ratio against the best software provider, then what
/// bounded the cell, so a reader sees at once whether requests/s ranks the providers.
pub fn study_table(r: &Report) -> Vec<[String; 7]> {
    let mut rows = Vec::new();
    for a in &r.algorithms {
        for p in &r.providers {
            let cell = |key: &str| {
                let m = METRICS.iter().find(|m| m.key == key).expect("a metric");
                match r.figure(p, a, key) {
                    Some(f @ Figure::Value { .. }) => {
                        let ratio = r
                            .ratio(p, a, m)
                            .map(|x| format!(" · {x:.2}x"))
                            .unwrap_or_default();
                        format!("{}{ratio}", format_value(f))
                    }
                    Some(Figure::Missing(_)) => "n/a".to_owned(),
                    None => "failed".to_owned(),
                }
            };
            let bound = r
                .bounds
                .get(&(p.clone(), a.clone()))
                .map(|b| b.split(';').next().unwrap_or(b).to_owned())
                .unwrap_or_else(|| "-".to_owned());
            rows.push([
                a.clone(),
                p.as_str().to_owned(),
                cell(STUDY_METRICS[0]),
                cell(STUDY_METRICS[1]),
                cell(STUDY_METRICS[2]),
                cell(STUDY_METRICS[3]),
                bound,
            ]);
        }
    }
    rows
}

/// Formats a figure for tables: median, and the spread when there were repeats.
pub fn format_value(f: &Figure) -> String {
    match f {
        Figure::Value {
            median,
            min,
            max,
            n,
        } if *n > 1 => {
            format!("{} ({}-{})", fmt_num(*median), fmt_num(*min), fmt_num(*max))
        }
        Figure::Value { median, .. } => fmt_num(*median),
        Figure::Missing(_) => "n/a".to_owned(),
    }
}

/// Three significant digits, no exponent for the ranges reports show.
pub fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".to_owned()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// Writes report.md, report.csv and report.html into `dir`.
pub fn render(dir: &Path) -> Result<Report> {
    let report = load(dir)?;
    std::fs::write(dir.join("report.md"), markdown::render(&report))?;
    std::fs::write(dir.join("report.csv"), csv(&report))?;
    std::fs::write(dir.join("report.html"), html::render(&report))?;
    Ok(report)
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// Long format: one row per provider x algorithm x metric.
pub fn csv(r: &Report) -> String {
    let mut out = String::from(
        "provider,algorithm,metric,unit,median,min,max,repeats,ratio_vs_best_software,best_software_provider,not_available_reason\n",
    );
    for a in &r.algorithms {
        for p in &r.providers {
            for m in r.metrics() {
                let Some(f) = r.figure(p, a, m.key) else {
                    let reason = r
                        .failures
                        .iter()
                        .find(|f| &f.cell.provider == p && &f.cell.algorithm == a)
                        .map(|f| f.reason.clone())
                        .unwrap_or_else(|| "cell not run".into());
                    out.push_str(&format!(
                        "{p},{a},{},{},,,,0,,,{}\n",
                        m.key,
                        csv_field(m.unit),
                        csv_field(&reason)
                    ));
                    continue;
                };
                let baseline = r
                    .baselines
                    .get(&(a.clone(), m.key))
                    .map(|(b, _)| b.as_str())
                    .unwrap_or_default();
                let ratio = r
                    .ratio(p, a, m)
                    .map(|x| format!("{x:.4}"))
                    .unwrap_or_default();
                match f {
                    Figure::Value {
                        median,
                        min,
                        max,
                        n,
                    } => out.push_str(&format!(
                        "{p},{a},{},{},{median:.6},{min:.6},{max:.6},{n},{ratio},{baseline},\n",
                        m.key,
                        csv_field(m.unit)
                    )),
                    Figure::Missing(reason) => out.push_str(&format!(
                        "{p},{a},{},{},,,,0,,{baseline},{}\n",
                        m.key,
                        csv_field(m.unit),
                        csv_field(reason)
                    )),
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(cpu_list_len("0-3"), 4);
        assert_eq!(cpu_list_len("0-3,6"), 5);
        assert_eq!(cpu_list_len("1"), 1);
        assert_eq!(cpu_list_len("0,2-3"), 3);
    }

    #[test]
    fn a_difference_needs_two_rounds_and_ranges_that_do_not_overlap() {
        let f = |min: f64, max: f64, n: usize| Figure::Value {
            median: (min + max) / 2.0,
            min,
            max,
            n,
        };
        assert_eq!(
            beyond_spread(&f(10.0, 12.0, 3), &f(13.0, 14.0, 3)),
            Some(true)
        );
        assert_eq!(
            beyond_spread(&f(10.0, 12.0, 3), &f(11.5, 14.0, 3)),
            Some(false)
        );
        assert_eq!(beyond_spread(&f(10.0, 10.0, 1), &f(20.0, 20.0, 1)), None);
    }
}
