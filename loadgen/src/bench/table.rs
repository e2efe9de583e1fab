//! The bench's table: its rows, declared before anything is measured, each column's value
//! per round, and at the end each figure (the median over the rounds) with its ratio to
//! nginx in the same set-up, paired round by round.

use std::collections::BTreeMap;

use anyhow::Result;
use serde::Serialize;

use super::terminators::Setup;

/// One figure of one terminator, or why there is none.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Figure {
    /// The figure.
    Value(f64),
    /// None.
    Missing {
        /// Why.
        reason: String,
    },
}

/// One row of the table.
#[derive(Debug, Serialize)]
pub struct Row {
    /// What the row measures, as the table prints it.
    pub name: String,
    /// Its unit.
    pub unit: String,
    /// Column label -> figure (the median over the rounds).
    pub figures: BTreeMap<String, Figure>,
    /// Column label -> every round's value, in round order (from `by_round`, at the end).
    pub rounds: BTreeMap<String, Vec<f64>>,
    /// Column label -> its ratio to nginx: the median over the rounds of the two columns'
    /// ratio within each round (rows of their own, not the indented parts of one).
    pub ratios_to_nginx: BTreeMap<String, f64>,
    /// Work done per column (connections, MB, requests), for the reader's judgement.
    pub work: BTreeMap<String, String>,
    /// The first reason a round had no value, per column.
    #[serde(skip)]
    errors: BTreeMap<String, String>,
    /// The round being measured, and each column's value by round: the medians' and the
    /// paired ratios' source.
    #[serde(skip)]
    round: usize,
    #[serde(skip)]
    by_round: BTreeMap<String, BTreeMap<usize, f64>>,
}

impl Row {
    fn new(name: impl Into<String>, unit: &str) -> Self {
        Self {
            name: name.into(),
            unit: unit.to_owned(),
            figures: BTreeMap::new(),
            rounds: BTreeMap::new(),
            ratios_to_nginx: BTreeMap::new(),
            work: BTreeMap::new(),
            errors: BTreeMap::new(),
            round: 1,
            by_round: BTreeMap::new(),
        }
    }

    /// One round's value for `column`, or why there is none.
    fn set(&mut self, column: &str, figure: Result<f64>) {
        match figure {
            Ok(v) if v.is_finite() => {
                self.by_round
                    .entry(column.to_owned())
                    .or_default()
                    .insert(self.round, v);
            }
            Ok(v) => {
                self.errors
                    .entry(column.to_owned())
                    .or_insert_with(|| format!("not a number ({v})"));
            }
            Err(e) => {
                self.errors
                    .entry(column.to_owned())
                    .or_insert_with(|| format!("{e:#}"));
            }
        }
    }

    /// The figures: each column's median over its rounds, or the first reason it has none.
    fn finish(mut self) -> Self {
        self.rounds = self
            .by_round
            .iter()
            .map(|(c, values)| (c.clone(), values.values().copied().collect()))
            .collect();
        let columns: std::collections::BTreeSet<String> = self
            .rounds
            .keys()
            .chain(self.errors.keys())
            .cloned()
            .collect();
        for c in columns {
            let figure = match self.rounds.get(&c) {
                Some(values) if !values.is_empty() => Figure::Value(median(values)),
                _ => Figure::Missing {
                    reason: self.errors.get(&c).cloned().unwrap_or_default(),
                },
            };
            self.figures.insert(c, figure);
        }
        // Ratios pair the columns round by round: a machine that slows down between rounds
        // slows every column of that round alike, and the pairing cancels it, where a ratio
        // of two medians from different rounds would not. Each column is paired with nginx
        // in its own set-up.
        if self.name.starts_with("  ") {
            return self;
        }
        for (c, values) in &self.by_round {
            let baseline = baseline_of(c);
            let Some(nginx) = self.by_round.get(&baseline) else {
                continue;
            };
            let paired: Vec<f64> = values
                .iter()
                .filter_map(|(round, v)| Some(v / nginx.get(round).filter(|n| **n > 0.0)?))
                .collect();
            if *c != baseline && !paired.is_empty() {
                self.ratios_to_nginx.insert(c.clone(), median(&paired));
            }
        }
        self
    }
}

/// The column every ratio is to, in the one-worker set-up.
const NGINX: &str = "nginx";

/// The column `column`'s ratios are to: nginx in the same set-up.
fn baseline_of(column: &str) -> String {
    let suffix = Setup::Defaults.suffix();
    if column.ends_with(suffix) {
        format!("{NGINX}{suffix}")
    } else {
        NGINX.to_owned()
    }
}

/// The median (the mean of the middle two for an even count).
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    }
}

/// The rows by key, in the order they were declared.
#[derive(Default)]
pub struct Table {
    rows: BTreeMap<String, Row>,
    order: Vec<String>,
}

impl Table {
    /// Declares the row `key` (its name as printed) in `unit`, once; returns the key.
    pub fn declare(&mut self, key: String, unit: &str) -> String {
        if !self.rows.contains_key(&key) {
            self.order.push(key.clone());
            self.rows.insert(key.clone(), Row::new(key.clone(), unit));
        }
        key
    }

    /// How many rows are declared (a mark for [`Table::declared_since`]).
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether no row is declared.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The keys declared after `mark`, in order.
    pub fn declared_since(&self, mark: usize) -> Vec<String> {
        self.order[mark..].to_vec()
    }

    /// The round the values set from now on belong to.
    pub fn set_round(&mut self, round: usize) {
        for row in self.rows.values_mut() {
            row.round = round;
        }
    }

    /// Sets `column`'s value in the row `key` for the current round.
    pub fn put(&mut self, key: &str, column: &str, figure: Result<f64>) {
        if let Some(row) = self.rows.get_mut(key) {
            row.set(column, figure);
        }
    }

    /// The same reason for several rows of one column.
    pub fn put_missing(&mut self, keys: &[&String], column: &str, reason: &str) {
        for key in keys {
            self.put(key, column, Err(anyhow::anyhow!("{reason}")));
        }
    }

    /// The same reason for every row of one column (it did not start, it died).
    pub fn fail_column(&mut self, column: &str, reason: &str) {
        for row in self.rows.values_mut() {
            row.set(column, Err(anyhow::anyhow!("{reason}")));
        }
    }

    /// Records the work behind `column`'s figure in the row `key`.
    pub fn note_work(&mut self, key: &str, column: &str, work: String) {
        if let Some(row) = self.rows.get_mut(key) {
            row.work.insert(column.to_owned(), work);
        }
    }

    /// The rows in declaration order, each finished: figures, rounds and ratios.
    pub fn finish(mut self) -> Vec<Row> {
        self.order
            .iter()
            .filter_map(|k| self.rows.remove(k))
            .map(Row::finish)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_is_the_median_of_its_rounds_and_a_failed_round_does_not_hide_the_others() {
        let mut row = Row::new("r", "us");
        for (round, v) in [(1, 30.0), (2, 10.0), (3, 20.0)] {
            row.round = round;
            row.set("a", Ok(v));
        }
        row.round = 1;
        row.set("b", Ok(4.0));
        row.round = 2;
        row.set("b", Err(anyhow::anyhow!("refused")));
        row.round = 3;
        row.set("b", Ok(2.0));
        row.set("c", Err(anyhow::anyhow!("did not start")));
        row.set("c", Ok(f64::NAN));
        let row = row.finish();
        assert!(matches!(row.figures["a"], Figure::Value(v) if v == 20.0));
        assert!(matches!(row.figures["b"], Figure::Value(v) if v == 3.0));
        assert!(
            matches!(&row.figures["c"], Figure::Missing { reason } if reason == "did not start")
        );
        assert_eq!(row.rounds["a"], [30.0, 10.0, 20.0]);
    }

    #[test]
    fn ratios_pair_the_columns_round_by_round() {
        let mut row = Row::new("work", "us");
        let mut part = Row::new("  part of it", "us");
        // Round 2 ran on a slow machine for both; "b" failed in round 3.
        for (round, ours, nginx, b) in [
            (1, 10.0, 20.0, Some(30.0)),
            (2, 12.0, 13.0, Some(13.0)),
            (3, 30.0, 60.0, None),
        ] {
            for r in [&mut row, &mut part] {
                r.round = round;
                r.set("ours", Ok(ours));
                r.set(NGINX, Ok(nginx));
                r.set("b", b.ok_or_else(|| anyhow::anyhow!("refused")));
            }
        }
        let row = row.finish();
        // Per round 0.5, 0.92, 0.5: the median is 0.5, where the medians' ratio (12 / 20)
        // would say 0.6.
        assert_eq!(row.ratios_to_nginx["ours"], 0.5);
        // Only rounds both have count: 1.5 and 1.0.
        assert_eq!(row.ratios_to_nginx["b"], 1.25);
        assert!(!row.ratios_to_nginx.contains_key(NGINX));
        // An indented row is a part of the row above it: no ratio of its own.
        assert!(part.finish().ratios_to_nginx.is_empty());
    }
}
