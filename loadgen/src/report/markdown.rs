//! The Markdown report: set-up, one table per algorithm (providers as rows), failures.

use std::fmt::Write;

use super::{format_value, study_table, Figure, Report, STUDY_HEADER};

pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# TLS provider comparison: secure vector ingestion\n");
    for (k, v) in &r.setup {
        let _ = writeln!(s, "- **{k}**: {v}");
    }
    let _ = writeln!(
        s,
        "- **Cells**: {} measured, {} failed; {} round(s); figures are medians over rounds (min-max in brackets)\n",
        r.cells_measured,
        r.failures.len(),
        r.repeats.max(1)
    );
    let _ = writeln!(
        s,
        "Ratios (x) compare each provider with the best software provider (ring, aws-lc-rs, openssl) on that figure and algorithm; above 1.00x is better, whichever way the figure runs.\n"
    );
    let _ = writeln!(
        s,
        "## The study's table\n\nMedian (min-max over rounds) · ratio against the best software provider; \"estimated W\" is a CPU-utilisation model (see Estimated power above), never a measurement.\n\n| {} |\n|---|---|{}",
        STUDY_HEADER.join(" | "),
        "---:|".repeat(STUDY_HEADER.len() - 3) + "---|"
    );
    for row in study_table(r) {
        let _ = writeln!(s, "| {} |", row.join(" | "));
    }
    let _ = writeln!(s);
    let mut missing: Vec<String> = Vec::new();
    for a in &r.algorithms {
        let _ = writeln!(s, "## {a}\n");
        if let Some((_, lines)) = r.verdicts.iter().find(|(alg, _)| alg == a) {
            for l in lines {
                let _ = writeln!(s, "- **{l}**");
            }
            let _ = writeln!(s);
        }
        let mut header = String::from("| provider |");
        let mut rule = String::from("|---|");
        for m in r.metrics() {
            let _ = write!(header, " {} ({}) |", m.title, m.unit);
            rule.push_str("---:|");
        }
        let _ = writeln!(s, "{header}\n{rule}");
        for p in &r.providers {
            let mut row = format!("| {p} |");
            for m in r.metrics() {
                match r.figure(p, a, m.key) {
                    Some(f @ Figure::Value { .. }) => {
                        let ratio = r
                            .ratio(p, a, m)
                            .map(|x| format!(" · {x:.2}x"))
                            .unwrap_or_default();
                        let _ = write!(row, " {}{ratio} |", format_value(f));
                    }
                    Some(Figure::Missing(reason)) => {
                        let note = format!("{} ({p}, {a}): {reason}", m.title);
                        if !missing.contains(&note) {
                            missing.push(note);
                        }
                        row.push_str(" n/a |");
                    }
                    None => row.push_str(" failed |"),
                }
            }
            let _ = writeln!(s, "{row}");
        }
        let _ = writeln!(s);
        let bounded: Vec<String> = r
            .providers
            .iter()
            .filter_map(|p| {
                let b = r.bounds.get(&(p.clone(), a.clone()))?;
                Some(format!("- {p}: bounded by {b}"))
            })
            .collect();
        if !bounded.is_empty() {
            let _ = writeln!(
                s,
                "What bounded each cell (first round):\n\n{}\n",
                bounded.join("\n")
            );
        }
    }
    if !r.failures.is_empty() {
        let _ = writeln!(s, "## Failed cells\n");
        for f in &r.failures {
            let _ = writeln!(
                s,
                "- {} {} round {}: {}",
                f.cell.provider, f.cell.algorithm, f.cell.repeat, f.reason
            );
        }
        let _ = writeln!(s);
    }
    if !missing.is_empty() {
        not_measured(&mut s, missing);
    }
    s
}

/// "Not measured": each figure that is n/a somewhere, grouped by why.
fn not_measured(s: &mut String, missing: Vec<String>) {
    // One line per distinct reason keeps the list short when, say, no power meter exists.
    let _ = writeln!(s, "## Not measured\n");
    let mut by_reason: Vec<(String, Vec<String>)> = Vec::new();
    for m in missing {
        let (what, reason) = m
            .split_once(": ")
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .unwrap_or((m.clone(), String::new()));
        match by_reason.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, list)) => list.push(what),
            None => by_reason.push((reason, vec![what])),
        }
    }
    for (reason, whats) in by_reason {
        let figures: Vec<&str> = whats
            .iter()
            .map(|w| w.split(" (").next().unwrap_or(w))
            .collect();
        let mut uniq: Vec<&str> = Vec::new();
        for f in figures {
            if !uniq.contains(&f) {
                uniq.push(f);
            }
        }
        let _ = writeln!(s, "- {}: n/a ({reason})", uniq.join(", "));
    }
}
