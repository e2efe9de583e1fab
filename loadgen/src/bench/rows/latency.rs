//! The mean time of one 800 KB JSON request over h2 at concurrency 1 through the
//! terminator, and what it adds over the direct path (the same requests in plaintext
//! straight to the sink, measured once before any terminator).

use std::sync::Arc;

use anyhow::{bail, Result};
use bytes::Bytes;

use super::{Bench, Measure, Measuring, Round, RowSet, TerminatorRows, UNIT_LIMIT};
use crate::bench::table::Table;
use crate::bench::workloads::{self, json_body, Bulk, Upload};
use crate::client::Connector;
use crate::driver::{self, ConnectionPolicy, DriverConfig, Mode};

/// The request: an UPSERT_100 of 1024-d vectors as REST JSON with four decimals.
const BODY: usize = 800 * 1024;

/// The latency rows.
pub struct Latency {
    body: Bytes,
    /// The mean's row, and the row of what it adds over the direct path.
    keys: (String, String),
    /// The direct path's mean, in ms (from `prepare`).
    direct_ms: Option<f64>,
}

impl Latency {
    /// The body, built once.
    pub fn new() -> Self {
        Self {
            body: json_body(BODY),
            keys: Default::default(),
            direct_ms: None,
        }
    }
}

impl Default for Latency {
    fn default() -> Self {
        Self::new()
    }
}

/// Mean time in ms of one request at concurrency 1 on one kept-alive connection through
/// `connector`: after the warm-up (`--warmup`, which also opens the connection), at most
/// `--latency-requests` requests within three times `--duration`.
async fn mean_ms(
    bench: &Bench<'_>,
    connector: Arc<Connector>,
    authority: &str,
    body: &Bytes,
) -> Result<f64> {
    let plan = bench.plan;
    let source = Arc::new(Upload::new(Bulk::H2Rest, body.clone(), authority, false)?);
    let config = DriverConfig {
        mode: Mode::Closed,
        concurrency: 1,
        policy: ConnectionPolicy::Reuse,
        duration: Some(plan.flags.duration * 3),
        requests: Some(plan.flags.latency_requests.max(1) as u64),
        warmup: plan.flags.warmup,
        request_timeout: UNIT_LIMIT,
        shared_connections: None,
        progress: false,
    };
    let out = driver::run(source, connector, config, bench.stop.child_token()).await;
    if let Some((kind, e)) = out.failure_examples.iter().next() {
        bail!("{kind}: {e}");
    }
    if out.ok == 0 {
        bail!("no request finished within {:?}", plan.flags.duration * 3);
    }
    Ok(out.latency_us.mean() / 1000.0)
}

impl RowSet for Latency {
    fn declare(&mut self, table: &mut Table) {
        self.keys = (
            table.declare(
                "mean time of one 800 KB h2 request at concurrency 1".into(),
                "ms",
            ),
            table.declare("  added over the direct path".into(), "ms"),
        );
    }

    fn prepare<'a>(&'a mut self, bench: &'a Bench<'a>) -> Measuring<'a, Result<()>> {
        Box::pin(async move {
            let sink = bench.sinks[0];
            let connector = workloads::direct_connector(sink, bench.clients).await?;
            let direct = mean_ms(bench, connector, &sink.to_string(), &self.body)
                .await
                .map_err(|e| e.context("the direct path to the sink"))?;
            eprintln!("direct path: {direct:.3} ms per 800 KB request");
            self.direct_ms = Some(direct);
            Ok(())
        })
    }

    fn how(&self) -> Measure<'_> {
        Measure::EveryRound(self)
    }
}

impl TerminatorRows for Latency {
    fn measure<'a>(&'a self, round: &'a Round<'a>, table: &'a mut Table) -> Measuring<'a, ()> {
        Box::pin(async move {
            let (key, added_key) = &self.keys;
            let (Some(addr), Some(direct)) = (round.any_listener(), self.direct_ms) else {
                return;
            };
            let figure = async {
                let connector =
                    workloads::connector(addr, round.bench.clients, Bulk::H2Rest).await?;
                mean_ms(
                    round.bench,
                    connector,
                    &workloads::authority(addr),
                    &self.body,
                )
                .await
            }
            .await;
            eprintln!("{}: 800 KB at concurrency 1: {figure:?} ms", round.label);
            match figure {
                Ok(ms) => {
                    table.put(key, round.label, Ok(ms));
                    table.put(added_key, round.label, Ok(ms - direct));
                }
                Err(e) => table.put_missing(&[key, added_key], round.label, &format!("{e:#}")),
            }
        })
    }
}
