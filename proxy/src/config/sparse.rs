//! The configuration written back with only what differs from the defaults (a listener's
//! required keys always): the file a program that starts a proxy (loadgen) writes, which
//! reads back as the same configuration, and which a build older than a key left at its
//! default still reads.

use serde::Serialize;

use super::{Config, ListenerConfig};

impl Config {
    /// The configuration as TOML with only what differs from the defaults (a listener's
    /// required keys always), for a proxy another program starts: the file reads back as
    /// this configuration, and a build older than a key it leaves at its default still
    /// reads it (a benchmark of the binary before a change, for before/after figures).
    pub fn to_sparse_toml(&self) -> String {
        let mut sparse = as_table(self);
        sparse.remove("listener");
        keep_what_differs(&mut sparse, &as_table(&Self::empty()));
        let listeners: Vec<toml::Value> = self
            .listeners
            .iter()
            .map(|l| {
                let required =
                    ListenerConfig::new(l.listen.clone(), l.cert.clone(), l.key.clone(), vec![]);
                let full = as_table(l);
                let mut table = full.clone();
                keep_what_differs(&mut table, &as_table(&required));
                for key in ["listen", "cert", "key", "upstream"] {
                    if let Some(value) = full.get(key) {
                        table.insert(key.to_owned(), value.clone());
                    }
                }
                // One node as a plain string, which every proxy version reads.
                if let Some(toml::Value::Array(nodes)) = table.get("upstream") {
                    if let [one] = nodes.as_slice() {
                        table.insert("upstream".to_owned(), one.clone());
                    }
                }
                toml::Value::Table(table)
            })
            .collect();
        if !listeners.is_empty() {
            sparse.insert("listener".to_owned(), toml::Value::Array(listeners));
        }
        toml::to_string(&sparse).expect("a table of TOML values renders")
    }
}

/// A configuration struct as a TOML table.
fn as_table<T: Serialize>(value: &T) -> toml::Table {
    toml::Table::try_from(value).expect("a configuration is plain TOML values")
}

/// Removes from `table` every entry equal to `defaults`'s, tables compared key by key (a
/// table left empty goes too).
fn keep_what_differs(table: &mut toml::Table, defaults: &toml::Table) {
    table.retain(|key, value| match (value, defaults.get(key)) {
        (_, None) => true,
        (toml::Value::Table(inner), Some(toml::Value::Table(default))) => {
            keep_what_differs(inner, default);
            !inner.is_empty()
        }
        (value, Some(default)) => value != default,
    });
}
