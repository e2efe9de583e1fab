//! A comparison's cells as files: every result and failure `loadgen compare` wrote under
//! its `cells/` folder, read back as each cell's rounds, the parts of a round that several
//! loadgen processes ran side by side merged into one result (`merge`). The report reads
//! the cells through this and nothing else of the files.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::result::{CellFailure, CellProvider, RunResult, FAILURE_SCHEMA, SCHEMA};

/// A cell's results by round, each with the file it came from.
type RepeatParts = BTreeMap<u32, Vec<(String, RunResult)>>;

/// Each cell's results, one per round (the processes of a round merged), by cell.
pub type CellRuns = BTreeMap<(CellProvider, String), Vec<RunResult>>;

/// The results and the failures in `cells_dir`, the results of one cell's round merged
/// when several loadgen processes ran it side by side.
pub fn read(cells_dir: &Path) -> Result<(CellRuns, Vec<CellFailure>)> {
    let mut files: Vec<_> = std::fs::read_dir(cells_dir)
        .with_context(|| {
            format!(
                "reading {} (is this a `loadgen compare` output folder?)",
                cells_dir.display()
            )
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    // (provider, algorithm) -> repeat -> the results of that repeat: several when loadgen
    // processes ran the cell side by side (merged below).
    let mut parts: BTreeMap<(CellProvider, String), RepeatParts> = BTreeMap::new();
    let mut failures: Vec<CellFailure> = Vec::new();
    for f in &files {
        let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        let v: serde_json::Value = serde_json::from_slice(&bytes)
            .with_context(|| format!("{} is not JSON", f.display()))?;
        match v["schema"].as_str() {
            Some(SCHEMA) => {
                let r: RunResult = serde_json::from_value(v)
                    .with_context(|| format!("{}: bad run result", f.display()))?;
                let Some(cell) = r.cell.clone() else {
                    bail!(
                        "{}: a run result without a cell (not written by compare)",
                        f.display()
                    );
                };
                parts
                    .entry((cell.provider, cell.algorithm))
                    .or_default()
                    .entry(cell.repeat)
                    .or_default()
                    .push((f.display().to_string(), r));
            }
            Some(FAILURE_SCHEMA) => failures.push(serde_json::from_value(v)?),
            other => bail!("{}: unknown schema {other:?}", f.display()),
        }
    }
    let mut runs = CellRuns::new();
    for (cell, repeats) in parts {
        for (_, mut list) in repeats {
            let run = if list.len() == 1 {
                list.pop().expect("one").1
            } else {
                let (names, results): (Vec<String>, Vec<RunResult>) = list.into_iter().unzip();
                crate::merge::merge(&results, &names)?
            };
            runs.entry(cell.clone()).or_default().push(run);
        }
    }
    Ok((runs, failures))
}
