//! `loadgen report DIR`: renders a comparison from its JSON alone (the cell results in
//! `DIR/cells`) into `report.md`, `report.csv` and a self-contained `report.html` with SVG
//! charts. Deterministic: the same JSON gives byte-identical files.
//!
//! Each figure is the median over the repeats of a cell, with the min-max spread; each is
//! also given as a ratio against the best software provider for that algorithm (ring,
//! aws-lc-rs, openssl), oriented so that above 1.00x is better, the way the reference study
//! reports QAT against AWS-LC ("1.39x the requests/s", "1.30x lower median latency").

pub mod chart;
mod facts;
mod html;
mod markdown;
mod metrics;
mod verdicts;

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Result};

use proxy::crypto::{CertAlgorithmName, ProviderName};

use crate::result::{CellFailure, CellProvider, RunResult};
use crate::result::{OnOff, TlsVersion};
use facts::setup_facts;
pub use metrics::{Better, Metric, METRICS};
pub use verdicts::bound;
use verdicts::verdicts;

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
    use super::verdicts::{beyond_spread, cpu_list_len};
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
