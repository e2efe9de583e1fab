//! What bounded each cell (the machine's CPU, a process at its allowed CPU, or the client's
//! concurrency, with the QAT offload share), and the verdicts per algorithm: which provider
//! ranks where, beyond the run-to-run spread.

use super::*;

/// A component counts as the bound when it used at least this share of what it could.
pub(super) const SATURATED: f64 = 0.9;

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

pub(super) fn bound_by_cpu(r: &RunResult) -> String {
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
                "the machine's CPU ({system:.0} % of {cores:.0} cores, most: {top}); {usage}"
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
pub(super) fn cpu_list_len(list: &str) -> usize {
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
pub(super) fn beyond_spread(a: &Figure, b: &Figure) -> Option<bool> {
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
pub(super) fn verdicts(r: &Report) -> Vec<(String, Vec<String>)> {
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
