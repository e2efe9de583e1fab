//! Keep-alive uploads: REST JSON over h2 and over HTTP/1.1 to an HTTP/1.1 upstream, gRPC
//! over h2 to h2c; the terminator's CPU per MB of request bodies, and its kernel share.

use std::sync::Arc;

use bytes::Bytes;

use super::{timed_figure, LoopPlan, Measure, Measuring, Round, RowSet, TerminatorRows, PER_MB};
use crate::bench::table::Table;
use crate::bench::workloads::{
    grpc_body, json_body, Bulk, Upload, BULK_JSON_BYTES, UPSERT_GRPC_BYTES,
};
use crate::driver::ConnectionPolicy;

/// The bulk rows.
pub struct KeepAliveBulk {
    rest: Bytes,
    grpc: Bytes,
    /// Per kind of upload: its row, and its kernel share's.
    keys: Vec<(Bulk, String, String)>,
}

impl KeepAliveBulk {
    /// The bodies, built once.
    pub fn new() -> Self {
        Self {
            rest: json_body(BULK_JSON_BYTES),
            grpc: grpc_body(UPSERT_GRPC_BYTES),
            keys: Vec::new(),
        }
    }
}

impl Default for KeepAliveBulk {
    fn default() -> Self {
        Self::new()
    }
}

impl RowSet for KeepAliveBulk {
    fn declare(&mut self, table: &mut Table) {
        for (kind, name, short) in [
            (
                Bulk::H2Rest,
                "keep-alive 763 KB JSON, h2 client -> HTTP/1.1 upstream",
                "h2 -> HTTP/1.1",
            ),
            (
                Bulk::H1Rest,
                "keep-alive 763 KB JSON, HTTP/1.1 client -> HTTP/1.1 upstream",
                "HTTP/1.1 -> HTTP/1.1",
            ),
            (
                Bulk::Grpc,
                "keep-alive 416 KB gRPC, h2 -> h2c upstream",
                "gRPC",
            ),
        ] {
            self.keys.push((
                kind,
                table.declare(name.to_owned(), "ms CPU per MB"),
                table.declare(
                    format!("  of which in the kernel, {short}"),
                    "ms CPU per MB",
                ),
            ));
        }
    }

    fn how(&self) -> Measure<'_> {
        Measure::EveryRound(self)
    }
}

impl TerminatorRows for KeepAliveBulk {
    fn measure<'a>(&'a self, round: &'a Round<'a>, table: &'a mut Table) -> Measuring<'a, ()> {
        Box::pin(async move {
            // Any certificate: no handshake is timed.
            let Some(addr) = round.any_listener() else {
                return;
            };
            for (kind, key, kernel_key) in &self.keys {
                if round.bench.stop.is_cancelled() {
                    return;
                }
                let body = if *kind == Bulk::Grpc {
                    &self.grpc
                } else {
                    &self.rest
                };
                let plan = LoopPlan {
                    addr,
                    kind: *kind,
                    policy: ConnectionPolicy::Reuse,
                    concurrency: round.bench.plan.flags.bulk_connections,
                };
                let figure = timed_figure(
                    round,
                    table,
                    (key, kernel_key),
                    &format!("{kind:?}"),
                    plan,
                    |authority| {
                        Ok(Arc::new(Upload::new(
                            *kind,
                            body.clone(),
                            authority,
                            false,
                        )?))
                    },
                    &PER_MB,
                )
                .await;
                table.put(key, round.label, figure);
            }
        })
    }
}
