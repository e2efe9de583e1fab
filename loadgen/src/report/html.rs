//! The HTML report: one self-contained page (inline CSS and SVG, no scripts, no network).

use std::fmt::Write;

use super::chart::{bar_chart, first_reason};
use super::{format_value, study_table, Figure, Report, STUDY_HEADER};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}\
table{border-collapse:collapse;margin:1em 0;font-size:13px}th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}\
th:first-child,td:first-child{text-align:left}th{background:#f3f3f3}.na{color:#888}.good{color:#06612f}.bad{color:#8a1c1c}\
figure{margin:1.5em 0}figcaption{font-size:13px;color:#555}.charts{display:grid;grid-template-columns:1fr;gap:1em}";

pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>TLS provider comparison</title><style>{STYLE}</style></head><body>\n"
    );
    let _ = writeln!(
        s,
        "<h1>TLS provider comparison: secure vector ingestion</h1>\n<ul>"
    );
    for (k, v) in &r.setup {
        let _ = writeln!(s, "<li><b>{}</b>: {}</li>", esc(k), esc(v));
    }
    let _ = writeln!(
        s,
        "<li><b>Cells</b>: {} measured, {} failed; {} round(s); bars are medians, whiskers min-max over rounds</li></ul>",
        r.cells_measured,
        r.failures.len(),
        r.repeats.max(1)
    );
    let _ = writeln!(
        s,
        "<h2>The study's table</h2><p>Median (min-max over rounds) · ratio against the best software provider. <i>Estimated W</i> is a CPU-utilisation model (see Estimated power above), never a measurement.</p><table id=\"study\"><tr>{}</tr>",
        STUDY_HEADER.map(|h| format!("<th>{}</th>", esc(h))).concat()
    );
    for row in study_table(r) {
        let _ = writeln!(
            s,
            "<tr>{}</tr>",
            row.iter()
                .map(|c| format!("<td>{}</td>", esc(c)))
                .collect::<String>()
        );
    }
    let _ = writeln!(s, "</table>");
    let _ = writeln!(s, "<h2>Charts</h2>\n<div class=\"charts\">");
    for m in r.metrics().into_iter().filter(|m| m.charted) {
        let _ = writeln!(s, "<figure id=\"chart-{}\">{}", m.key, bar_chart(r, m));
        if let Some(reason) = first_reason(r, m) {
            let _ = writeln!(
                s,
                "<figcaption>n/a where shown: {}</figcaption>",
                esc(&reason)
            );
        }
        let _ = writeln!(s, "</figure>");
    }
    let _ = writeln!(s, "</div>");
    let _ = writeln!(
        s,
        "<h2>Tables</h2><p>Each cell: median (min-max over rounds) and the ratio against the best software provider for that algorithm; above 1.00x is better.</p>"
    );
    for a in &r.algorithms {
        algorithm_section(&mut s, r, a);
    }
    if !r.failures.is_empty() {
        let _ = writeln!(s, "<h2>Failed cells</h2><ul>");
        for f in &r.failures {
            let _ = writeln!(
                s,
                "<li>{} {} round {}: {}</li>",
                esc(f.cell.provider.as_str()),
                esc(&f.cell.algorithm),
                f.cell.repeat,
                esc(&f.reason)
            );
        }
        let _ = writeln!(s, "</ul>");
    }
    let _ = writeln!(s, "</body></html>");
    s
}

/// One algorithm's verdicts, its table of every provider and metric, and what bounded each
/// cell.
fn algorithm_section(s: &mut String, r: &Report, a: &str) {
    let _ = writeln!(s, "<h3>{}</h3>", esc(a));
    if let Some((_, lines)) = r.verdicts.iter().find(|(alg, _)| alg == a) {
        let _ = writeln!(s, "<ul class=\"verdict\">");
        for l in lines {
            let _ = writeln!(s, "<li><b>{}</b></li>", esc(l));
        }
        let _ = writeln!(s, "</ul>");
    }
    let _ = writeln!(s, "<table><tr><th>provider</th>");
    for m in r.metrics() {
        let _ = write!(
            s,
            "<th>{}<br><small>{}</small></th>",
            esc(m.title),
            esc(m.unit)
        );
    }
    let _ = writeln!(s, "</tr>");
    for p in &r.providers {
        let _ = write!(s, "<tr><td>{}</td>", esc(p.as_str()));
        for m in r.metrics() {
            match r.figure(p, a, m.key) {
                Some(f @ Figure::Value { .. }) => {
                    let ratio = r.ratio(p, a, m);
                    let class = match ratio {
                        Some(x) if x > 1.005 => "good",
                        Some(x) if x < 0.995 => "bad",
                        _ => "",
                    };
                    let _ = write!(
                        s,
                        "<td>{}{}</td>",
                        esc(&format_value(f)),
                        ratio
                            .map(|x| format!("<br><span class=\"{class}\">{x:.2}x</span>"))
                            .unwrap_or_default()
                    );
                }
                Some(Figure::Missing(reason)) => {
                    let _ = write!(s, "<td class=\"na\" title=\"{}\">n/a</td>", esc(reason));
                }
                None => {
                    let _ = write!(s, "<td class=\"na\">failed</td>");
                }
            }
        }
        let _ = writeln!(s, "</tr>");
    }
    let _ = writeln!(s, "</table>");
    let bounded: Vec<String> = r
        .providers
        .iter()
        .filter_map(|p| {
            let b = r.bounds.get(&(p.clone(), a.to_owned()))?;
            Some(format!(
                "<li>{}: bounded by {}</li>",
                esc(p.as_str()),
                esc(b)
            ))
        })
        .collect();
    if !bounded.is_empty() {
        let _ = writeln!(
            s,
            "<p>What bounded each cell (first round):</p><ul>{}</ul>",
            bounded.concat()
        );
    }
}
