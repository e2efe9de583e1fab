//! A new TLS connection per tiny GET, per certificate algorithm: the terminator's CPU per
//! connection, its kernel share, and for our providers the same handshake in memory,
//! server side only (the floor), and what lies beyond it.

use std::sync::Arc;

use proxy::config::TlsPolicy;
use proxy::crypto::{CertAlgorithmName, ProviderName};

use super::{
    timed_figure, LoopPlan, Measure, Measuring, Round, RowSet, TerminatorRows, PER_CONNECTION,
};
use crate::bench::table::Table;
use crate::bench::workloads::{Bulk, TinyGet};
use crate::bench::BenchPlan;
use crate::driver::ConnectionPolicy;

/// Why a peer has no in-memory handshake figure (rendered as a dash, not as a note).
pub const NOT_RUSTLS: &str = "not rustls";
/// Why openssl-qat has none: its signatures need the QAT provider loaded and its signer
/// running, which only the proxy process has.
const NOT_IN_PROCESS: &str = "QAT provider not loaded in loadgen";

/// The rows of one certificate algorithm.
struct Keys {
    alg: CertAlgorithmName,
    /// CPU per connection.
    total: String,
    /// Its system time: what the kernel's TCP and socket work cost the terminator.
    kernel: String,
    /// The provider's handshake alone, in memory (ours only).
    in_memory: String,
    /// `total` minus `in_memory`.
    beyond: String,
}

/// The new-connection rows.
pub struct TinyOnNewConnection {
    algorithms: Vec<CertAlgorithmName>,
    keys: Vec<Keys>,
}

impl TinyOnNewConnection {
    /// For `--algorithms`.
    pub fn new(plan: &BenchPlan) -> Self {
        Self {
            algorithms: plan.algorithms().to_vec(),
            keys: Vec::new(),
        }
    }
}

impl RowSet for TinyOnNewConnection {
    fn declare(&mut self, table: &mut Table) {
        for alg in &self.algorithms {
            let name = alg.as_str();
            self.keys.push(Keys {
                alg: *alg,
                total: table.declare(format!("new TLS connection + tiny GET, {name}"), "us CPU"),
                kernel: table.declare(format!("  of which in the kernel, {name}"), "us CPU"),
                in_memory: table.declare(
                    format!("  of which the in-memory handshake, {name}"),
                    "us CPU",
                ),
                beyond: table.declare(
                    format!("  beyond the in-memory handshake, {name}"),
                    "us CPU",
                ),
            });
        }
    }

    fn how(&self) -> Measure<'_> {
        Measure::EveryRound(self)
    }
}

impl TerminatorRows for TinyOnNewConnection {
    fn measure<'a>(&'a self, round: &'a Round<'a>, table: &'a mut Table) -> Measuring<'a, ()> {
        Box::pin(async move {
            for k in &self.keys {
                if round.bench.stop.is_cancelled() {
                    return;
                }
                measure_algorithm(round, k, table).await;
            }
        })
    }
}

async fn measure_algorithm(round: &Round<'_>, keys: &Keys, table: &mut Table) {
    let label = round.label;
    let plan = LoopPlan {
        addr: round.t.addrs[&keys.alg],
        kind: Bulk::H1Rest,
        policy: ConnectionPolicy::New,
        concurrency: round.bench.plan.flags.concurrency,
    };
    let per_conn = timed_figure(
        round,
        table,
        (&keys.total, &keys.kernel),
        keys.alg.as_str(),
        plan,
        |authority| Ok(Arc::new(TinyGet::new(authority)?)),
        &PER_CONNECTION,
    )
    .await;
    let (mem_key, beyond_key) = (&keys.in_memory, &keys.beyond);
    match (&per_conn, in_memory_handshake_us(round, keys.alg)) {
        (_, None) => {
            let why = if round.t.provider.is_some() {
                NOT_IN_PROCESS
            } else {
                NOT_RUSTLS
            };
            table.put_missing(&[mem_key, beyond_key], label, why);
        }
        (Ok(total), Some(Ok(mem))) => {
            table.put(mem_key, label, Ok(mem));
            table.put(beyond_key, label, Ok(total - mem));
        }
        (Err(_), Some(Ok(mem))) => {
            table.put(mem_key, label, Ok(mem));
            table.put(
                beyond_key,
                label,
                Err(anyhow::anyhow!("no connection figure")),
            );
        }
        (_, Some(Err(e))) => {
            table.put_missing(&[mem_key, beyond_key], label, &format!("{e:#}"));
        }
    }
    table.put(&keys.total, label, per_conn);
}

/// The same provider's server side of a full handshake with no sockets, in µs (our
/// providers in loadgen's process only: None for a peer and for openssl-qat).
fn in_memory_handshake_us(
    round: &Round<'_>,
    alg: CertAlgorithmName,
) -> Option<anyhow::Result<f64>> {
    let provider = round
        .t
        .provider
        .filter(|p| *p != ProviderName::OpensslQat)?;
    let certs = round.bench.certs;
    let policy = TlsPolicy {
        resumption: false,
        ..TlsPolicy::default()
    };
    Some((|| {
        let (_, _, server) = proxy::tls::listener_tls(
            provider,
            &certs.dir.join(format!("{}.crt", alg.as_str())),
            &certs.dir.join(format!("{}.key", alg.as_str())),
            &policy,
            &[],
        )?;
        let n = match alg {
            CertAlgorithmName::Rsa4096 => 200,
            _ => 1000,
        };
        let d = proxy::tls::measure::mean_server_handshake(
            &server,
            &round.bench.clients.in_memory,
            n / 10,
            n,
        )?;
        Ok(d.as_secs_f64() * 1e6)
    })())
}
