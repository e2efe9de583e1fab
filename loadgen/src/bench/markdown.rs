//! The bench's table as Markdown (bench.md, and what `loadgen bench` prints): each figure
//! with its ratio to nginx, then the notes that say how the figures were measured and why
//! any is missing.

use super::rows;
use super::table::Figure;
use super::BenchResult;

/// The table: each figure with its ratio to nginx's in the same row (below 1.00x is
/// cheaper or faster than nginx for every row here), then the notes for missing figures.
pub fn render(result: &BenchResult) -> String {
    let mut out = String::new();
    out.push_str("| work | unit |");
    for c in &result.columns {
        out.push_str(&format!(" {c} |"));
    }
    out.push_str("\n|---|---|");
    for _ in &result.columns {
        out.push_str("---:|");
    }
    out.push('\n');
    let mut notes = Vec::new();
    let rounds = result.settings["rounds"].as_u64().unwrap_or(1);
    if let Some(kx) = result.settings["kx"].as_str() {
        // The proxy's production default offers more (ML-KEM first where the provider has
        // it); a comparison pins one group for every terminator, and says so.
        notes.push(format!(
            "every terminator pinned to TLS {} and one key-exchange group, {kx}, without \
             resumption (the proxy's default offers x25519mlkem768 first where its provider has it)",
            result.settings["tls"].as_str().unwrap_or("?")
        ));
    }
    match result.settings["sink"].as_str() {
        Some("early-answer") => notes.push(
            "the sink answered every upload at once, before reading its body (`--sink early-answer`)"
                .to_owned(),
        ),
        Some(_) => notes.push(
            "the sink read every request body whole before it answered, as Qdrant does".to_owned(),
        ),
        None => {}
    }
    if let Some(cache) = result.settings["tcp_metrics_cache"]
        .as_str()
        .filter(|c| c.starts_with("on"))
    {
        notes.push(format!(
            "the kernel's TCP metrics cache was {cache}: each column's connections may have \
             started from what the previous column's left (run as root to turn it off)"
        ));
    }
    if let Some(cc) = result.settings["client_congestion_control"].as_str() {
        notes.push(format!(
            "the clients' TCP congestion control: {cc}; on loopback a client's sending runs \
             partly on the terminator's CPU, as each ACK the terminator sends is processed by \
             the client's socket at once"
        ));
    }
    if let Some(tools) = result.settings["tools"].as_str() {
        notes.push(format!("the rows ending in ab or h2load: {tools}"));
    }
    if let Some(instructions) = result.settings["instructions"].as_str() {
        notes.push(format!("the instruction rows: {instructions}"));
    }
    if let Some(in_process) = result.settings["in_process"].as_str() {
        notes.push(format!("the rows into embedded-qdrant: {in_process}"));
    }
    if rounds > 1 {
        notes.push(format!(
            "median of {rounds} interleaved rounds, and each ratio the median of the {rounds} \
             rounds' own ratios; the spread of each figure is in bench.json"
        ));
    }
    for row in &result.rows {
        out.push_str(&format!("| {} | {} |", row.name, row.unit));
        for c in &result.columns {
            match row.figures.get(c) {
                Some(Figure::Value(v)) => {
                    let ratio = row
                        .ratios_to_nginx
                        .get(c)
                        .map(|r| format!(" ({r:.2}x)"))
                        .unwrap_or_default();
                    out.push_str(&format!(" {}{ratio} |", fmt_value(*v)));
                }
                Some(Figure::Missing { reason }) => {
                    let note = format!("{c}: {reason}");
                    if reason != rows::handshake::NOT_RUSTLS
                        && reason != rows::instructions::PROXY_ONLY
                        && !notes.contains(&note)
                    {
                        notes.push(note);
                    }
                    out.push_str(" - |");
                }
                None => out.push_str(" - |"),
            }
        }
        out.push('\n');
    }
    out.push_str(
        "\nRatios are to nginx in the same row and set-up (below 1.00x: less CPU, memory or time than nginx): \
         columns without a suffix run one worker each, columns marked (defaults) each terminator at its \
         own defaults (the proxy a worker per CPU, nginx `worker_processes auto`, HAProxy its default \
         threads), as `settings` of bench.json records; \
         with several rounds (`--repeat`) each figure is the median, each ratio the median of the \
         ratios within a round, and bench.json holds every round; \
         CPU is the terminator's user+system time over its whole process tree, and \"in the \
         kernel\" its system time (on loopback that includes delivering each of its writes to \
         the receiving socket): the part no terminator's own code can remove; the in-memory \
         handshake is the same provider's server side of a full handshake with no sockets \
         (rustls only), so what lies beyond it includes the kernel's part.\n",
    );
    for n in notes {
        out.push_str(&format!("- {n}\n"));
    }
    out
}

fn fmt_value(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}
