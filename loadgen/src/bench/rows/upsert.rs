//! The mission's unit of work: a new TLS connection that carries one UPSERT_100-sized body,
//! read to its answer, then closed (`Connection: close` over HTTP/1.1; GOAWAY after one call
//! over h2), per certificate algorithm. The driver awaits each close, so the terminator's
//! teardown falls inside the window that timed it.

use std::sync::Arc;

use bytes::Bytes;
use proxy::crypto::CertAlgorithmName;

use super::{
    timed_figure, LoopPlan, Measure, Measuring, Round, RowSet, TerminatorRows, PER_UPSERT,
};
use crate::bench::table::Table;
use crate::bench::workloads::{
    grpc_body, json_body, Bulk, Upload, UPSERT_GRPC_BYTES, UPSERT_JSON_BYTES,
};
use crate::bench::BenchPlan;
use crate::driver::ConnectionPolicy;

/// The rows of one algorithm and one kind of upsert.
struct Keys {
    alg: CertAlgorithmName,
    kind: Bulk,
    /// CPU per upsert.
    total: String,
    /// Its system time.
    kernel: String,
}

/// The new-connection-per-upsert rows.
pub struct UpsertOnNewConnection {
    algorithms: Vec<CertAlgorithmName>,
    json: Bytes,
    grpc: Bytes,
    keys: Vec<Keys>,
}

impl UpsertOnNewConnection {
    /// For `--algorithms`.
    pub fn new(plan: &BenchPlan) -> Self {
        Self {
            algorithms: plan.algorithms().to_vec(),
            json: json_body(UPSERT_JSON_BYTES),
            grpc: grpc_body(UPSERT_GRPC_BYTES),
            keys: Vec::new(),
        }
    }
}

impl RowSet for UpsertOnNewConnection {
    fn declare(&mut self, table: &mut Table) {
        for alg in &self.algorithms {
            for (kind, name, short) in [
                (
                    Bulk::H1Rest,
                    "new TLS connection + one 800 KB JSON upsert, HTTP/1.1",
                    "JSON",
                ),
                (
                    Bulk::Grpc,
                    "new TLS connection + one 416 KB gRPC upsert, h2",
                    "gRPC",
                ),
            ] {
                self.keys.push(Keys {
                    alg: *alg,
                    kind,
                    total: table.declare(format!("{name}, {}", alg.as_str()), "ms CPU"),
                    kernel: table.declare(
                        format!("  of which in the kernel, {short} {}", alg.as_str()),
                        "ms CPU",
                    ),
                });
            }
        }
    }

    fn how(&self) -> Measure<'_> {
        Measure::EveryRound(self)
    }
}

impl TerminatorRows for UpsertOnNewConnection {
    fn measure<'a>(&'a self, round: &'a Round<'a>, table: &'a mut Table) -> Measuring<'a, ()> {
        Box::pin(async move {
            for k in &self.keys {
                if round.bench.stop.is_cancelled() {
                    return;
                }
                let addr = round.t.addrs[&k.alg];
                let body = if k.kind == Bulk::Grpc {
                    &self.grpc
                } else {
                    &self.json
                };
                let plan = LoopPlan {
                    addr,
                    kind: k.kind,
                    policy: ConnectionPolicy::New,
                    concurrency: round.bench.plan.flags.concurrency,
                };
                let what = format!("{:?} upsert, new connection, {}", k.kind, k.alg.as_str());
                let figure = timed_figure(
                    round,
                    table,
                    (&k.total, &k.kernel),
                    &what,
                    plan,
                    |authority| {
                        Ok(Arc::new(Upload::new(
                            k.kind,
                            body.clone(),
                            authority,
                            true,
                        )?))
                    },
                    &PER_UPSERT,
                )
                .await;
                table.put(&k.total, round.label, figure);
            }
        })
    }
}
