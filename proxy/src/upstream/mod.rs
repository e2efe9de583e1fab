//! Where a listener forwards to: its upstream nodes, how they are reached (plaintext or
//! TLS, `tls.rs`), which node takes the next request (balancing), and which nodes are fit
//! to take one (active health checks in [`health`], passive ejection on connect failures
//! here).
//!
//! Any node of a Qdrant cluster accepts any request and routes it inside the cluster, so
//! every request (every connection in tcp mode) is free to go to any node. A node is
//! *available* while its health checks pass and no recent connect to it failed. When no
//! node is available the least loaded one is tried anyway (Envoy's "panic" mode): the
//! checks may be stale, and an immediate 502 helps nobody more than an attempt does.

mod addr;
mod coalesce;
pub mod health;
mod settings;
mod tls;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounter;
use tokio::time::Instant;

pub use addr::UpstreamAddr;
pub use coalesce::UpstreamConnector;
pub use settings::{
    Balance, HealthCheckConfig, HealthCheckKind, HealthCheckPlan, UpstreamTlsConfig,
};
pub use tls::UpstreamTlsPair;

use crate::metrics::{ListenerMetrics, NodeMetrics};

/// The nodes one listener forwards to.
pub struct UpstreamPool {
    nodes: Box<[Arc<Node>]>,
    balance: Balance,
    /// Where the next round-robin turn (or least-requests tie) starts.
    cursor: AtomicUsize,
    /// Zero of the nodes' ejection clocks.
    epoch: Instant,
    ejection_base: Duration,
    ejection_max: Duration,
    retries: IntCounter,
    listener: String,
    /// How `https://` nodes are reached (`None`: every node is plaintext).
    tls: Option<UpstreamTlsPair>,
}

/// One upstream node and what is known of it.
pub struct Node {
    addr: UpstreamAddr,
    in_flight: AtomicU32,
    /// The active health checks' verdict (true until they say otherwise).
    healthy: AtomicBool,
    /// Milliseconds since the pool's epoch until which the node is skipped; 0: not ejected.
    ejected_until_ms: AtomicU64,
    /// Connect failures since the last success: the exponent of the next ejection.
    connect_failures: AtomicU32,
    /// Moved on each time the health checks take the node out: connections made before
    /// are not used again (see `http::node_clients`).
    connection_epoch: AtomicU64,
    metrics: NodeMetrics,
}

impl Node {
    /// The node's address.
    pub fn addr(&self) -> &UpstreamAddr {
        &self.addr
    }

    /// The active health checks' verdict.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// How many times the health checks have taken the node out.
    pub fn connection_epoch(&self) -> u64 {
        self.connection_epoch.load(Ordering::Acquire)
    }

    fn is_available(&self, now_ms: &mut Option<u64>, epoch: Instant) -> bool {
        if !self.is_healthy() {
            return false;
        }
        let until = self.ejected_until_ms.load(Ordering::Relaxed);
        // The clock is read only when some node is ejected.
        until == 0 || until <= *now_ms.get_or_insert_with(|| millis_since(epoch))
    }
}

fn millis_since(epoch: Instant) -> u64 {
    epoch.elapsed().as_millis() as u64
}

impl UpstreamPool {
    /// A pool of `addrs` (at least one; validated by the config) for `metrics`' listener;
    /// `tls` for its `https://` nodes.
    pub fn new(
        addrs: Vec<UpstreamAddr>,
        balance: Balance,
        health: &HealthCheckConfig,
        tls: Option<UpstreamTlsPair>,
        metrics: &ListenerMetrics,
    ) -> Self {
        assert!(
            !addrs.is_empty(),
            "a listener has at least one upstream node"
        );
        let nodes = addrs
            .into_iter()
            .map(|addr| {
                let metrics = metrics.node(&addr.to_string());
                metrics.healthy.set(1);
                Arc::new(Node {
                    addr,
                    in_flight: AtomicU32::new(0),
                    healthy: AtomicBool::new(true),
                    ejected_until_ms: AtomicU64::new(0),
                    connect_failures: AtomicU32::new(0),
                    connection_epoch: AtomicU64::new(0),
                    metrics,
                })
            })
            .collect();
        Self {
            nodes,
            balance,
            cursor: AtomicUsize::new(0),
            epoch: Instant::now(),
            ejection_base: health.ejection_base,
            ejection_max: health.ejection_max,
            retries: metrics.upstream_retries.clone(),
            listener: metrics.name().to_owned(),
            tls,
        }
    }

    /// How `https://` nodes are reached; `None` when every node is plaintext.
    pub fn tls(&self) -> Option<&UpstreamTlsPair> {
        self.tls.as_ref()
    }

    /// Every node, in configured order.
    pub fn nodes(&self) -> &[Arc<Node>] {
        &self.nodes
    }

    /// More than one node: a failed connect can be retried elsewhere.
    pub fn has_alternatives(&self) -> bool {
        self.nodes.len() > 1
    }

    /// The nodes as the log shows them: `a:1, b:2`.
    pub fn describe(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.addr.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Leases the node the next request goes to, skipping the nodes in `tried` (bit i:
    /// node i); `None` once every node has been tried.
    pub fn pick(&self, tried: u64) -> Option<NodeLease> {
        let n = self.nodes.len();
        let index = if n == 1 {
            (tried & 1 == 0).then_some(0)
        } else {
            self.choose(tried)
        }?;
        let node = self.nodes[index].clone();
        node.in_flight.fetch_add(1, Ordering::Relaxed);
        node.metrics.in_flight.inc();
        node.metrics.requests.inc();
        Some(NodeLease { node, index })
    }

    fn choose(&self, tried: u64) -> Option<usize> {
        let n = self.nodes.len();
        let turn = self.cursor.fetch_add(1, Ordering::Relaxed);
        let mut now_ms = None;
        let untried = |i: &usize| tried & (1 << i) == 0;
        let available: u64 = (0..n)
            .filter(untried)
            .filter(|&i| self.nodes[i].is_available(&mut now_ms, self.epoch))
            .fold(0, |set, i| set | 1 << i);
        if available != 0 && self.balance == Balance::RoundRobin {
            // Turns go round the available nodes only, so one node out does not hand its
            // turns to its neighbour.
            let k = turn % available.count_ones() as usize;
            return (0..n).filter(|i| available & (1 << i) != 0).nth(k);
        }
        // Least requests among the available nodes (else, Envoy's panic mode, among all
        // untried ones). Ties go to the first candidate scanned, and the scan starts at a
        // turn that rotates over the candidates themselves: rotating over every node would
        // hand an unavailable node's turns to its next neighbour (seen: with one of three
        // nodes out, the next took 10 % more than the other under light load, where
        // nothing is in flight and every pick is a tie).
        let candidates = if available != 0 {
            available
        } else {
            (0..n).filter(untried).fold(0, |set, i| set | 1 << i)
        };
        let in_order = (0..n).filter(|i| candidates & (1 << i) != 0);
        let start = turn % (candidates.count_ones() as usize).max(1);
        in_order
            .clone()
            .skip(start)
            .chain(in_order.take(start))
            .min_by_key(|&i| self.nodes[i].in_flight.load(Ordering::Relaxed))
    }

    /// Counts a request sent to another node after a failed connect.
    pub fn retried(&self) {
        self.retries.inc();
    }

    /// Takes a node out for a backoff after a failed connect (doubling per failure since
    /// its last success).
    pub fn connect_failed(&self, lease: &NodeLease) {
        let node = &lease.node;
        let failures = node.connect_failures.fetch_add(1, Ordering::Relaxed) + 1;
        let backoff = self
            .ejection_base
            .saturating_mul(1u32 << (failures - 1).min(16))
            .min(self.ejection_max);
        let until = millis_since(self.epoch) + backoff.as_millis() as u64;
        node.ejected_until_ms.store(until.max(1), Ordering::Relaxed);
        node.metrics.ejections.inc();
        node.metrics.ejected.set(1);
        crate::peer_warn!(listener = %self.listener, upstream = %node.addr, failures, ejected_for = ?backoff, "upstream node ejected: connecting to it failed");
    }

    /// A node answered: whatever ejected it is over.
    pub fn connected(&self, lease: &NodeLease) {
        let node = &lease.node;
        if node.connect_failures.load(Ordering::Relaxed) != 0 {
            self.readmit(node, "it answered a request");
        }
    }

    /// Whether a failed connect ejected `node` and nothing has readmitted it since.
    pub fn is_ejected(&self, node: &Node) -> bool {
        node.connect_failures.load(Ordering::Relaxed) != 0
    }

    /// Marks `node` healthy or not by the active checks' verdict (`why` it is not).
    pub fn set_healthy(&self, node: &Node, healthy: bool, why: &str) {
        let was = node.healthy.swap(healthy, Ordering::Relaxed);
        node.metrics.healthy.set(i64::from(healthy));
        if healthy {
            if node.connect_failures.load(Ordering::Relaxed) != 0 {
                self.readmit(node, "its health check passed");
            } else if !was {
                tracing::info!(listener = %self.listener, upstream = %node.addr, "upstream node healthy again");
            }
        } else if was {
            node.connection_epoch.fetch_add(1, Ordering::Release);
            tracing::warn!(listener = %self.listener, upstream = %node.addr, reason = %why, "upstream node unhealthy: its health checks failed");
        }
    }

    fn readmit(&self, node: &Node, why: &str) {
        node.connect_failures.store(0, Ordering::Relaxed);
        node.ejected_until_ms.store(0, Ordering::Relaxed);
        node.metrics.ejected.set(0);
        tracing::info!(listener = %self.listener, upstream = %node.addr, "upstream node readmitted: {why}");
    }
}

/// A request's hold on its node: counted in the node's in-flight requests until dropped
/// (with the response body, see `http::UpstreamSlot`).
pub struct NodeLease {
    node: Arc<Node>,
    index: usize,
}

impl NodeLease {
    /// The node's address.
    pub fn addr(&self) -> &UpstreamAddr {
        &self.node.addr
    }

    /// The node's bit in a `tried` set.
    pub fn bit(&self) -> u64 {
        1 << self.index
    }

    /// The node's place in its pool.
    pub fn index(&self) -> usize {
        self.index
    }

    /// See [`Node::connection_epoch`].
    pub fn connection_epoch(&self) -> u64 {
        self.node.connection_epoch()
    }

    /// Counts a failed exchange with the node, by kind.
    pub fn failed(&self, kind: &'static str) {
        self.node.metrics.error(kind);
    }
}

impl std::fmt::Debug for NodeLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("NodeLease").field(&self.node.addr).finish()
    }
}

impl Drop for NodeLease {
    fn drop(&mut self) {
        self.node.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.node.metrics.in_flight.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn pool(n: usize, balance: Balance) -> UpstreamPool {
        let m = Metrics::new();
        let lm = m.listener("l", "ring", "ecdsa-p256", "http", "inline");
        let addrs = (0..n)
            .map(|i| UpstreamAddr::parse(&format!("127.0.0.1:{}", 1000 + i), false).unwrap())
            .collect();
        UpstreamPool::new(addrs, balance, &HealthCheckConfig::default(), None, &lm)
    }

    #[test]
    fn least_requests_prefers_the_idle_node_and_spreads_ties() {
        let p = pool(3, Balance::LeastRequests);
        let held: Vec<_> = (0..3).map(|_| p.pick(0).unwrap()).collect();
        let mut seen: Vec<usize> = held.iter().map(|l| l.index).collect();
        seen.sort();
        assert_eq!(
            seen,
            [0, 1, 2],
            "three picks with nothing in flight cover every node"
        );
        let second_on_1 = p.pick(0).unwrap();
        drop(held);
        // Node of `second_on_1` has one in flight; the others none: never it.
        for _ in 0..10 {
            assert_ne!(p.pick(0).unwrap().index, second_on_1.index);
        }
    }

    #[test]
    fn least_requests_ties_do_not_favour_an_unavailable_nodes_neighbour() {
        let p = pool(3, Balance::LeastRequests);
        p.set_healthy(&p.nodes[2].clone(), false, "test");
        // Nothing in flight: every pick is a tie between nodes 0 and 1.
        let mut taken = [0u32; 3];
        for _ in 0..600 {
            taken[p.pick(0).unwrap().index] += 1;
        }
        assert_eq!(
            taken,
            [300, 300, 0],
            "ties split evenly between the nodes up"
        );
    }

    #[test]
    fn round_robin_turns_and_skips_what_was_tried() {
        let p = pool(3, Balance::RoundRobin);
        let order: Vec<usize> = (0..6).map(|_| p.pick(0).unwrap().index).collect();
        assert_eq!(order, [0, 1, 2, 0, 1, 2]);
        let a = p.pick(0).unwrap();
        let b = p.pick(a.bit()).unwrap();
        let c = p.pick(a.bit() | b.bit()).unwrap();
        assert!(a.index != b.index && b.index != c.index && a.index != c.index);
        assert!(p.pick(a.bit() | b.bit() | c.bit()).is_none());
    }

    #[test]
    fn an_ejected_or_unhealthy_node_gets_nothing_until_readmitted() {
        let p = pool(2, Balance::RoundRobin);
        let lease = p.pick(0).unwrap();
        let bad = lease.index;
        p.connect_failed(&lease);
        drop(lease);
        for _ in 0..6 {
            assert_ne!(p.pick(0).unwrap().index, bad);
        }
        p.set_healthy(&p.nodes[bad].clone(), true, "");
        let picks: Vec<usize> = (0..4).map(|_| p.pick(0).unwrap().index).collect();
        assert!(
            picks.contains(&bad),
            "readmitted by a passing check: {picks:?}"
        );
        p.set_healthy(&p.nodes[bad].clone(), false, "test");
        for _ in 0..6 {
            assert_ne!(p.pick(0).unwrap().index, bad);
        }
    }

    #[test]
    fn with_every_node_out_the_least_loaded_is_still_tried() {
        let p = pool(2, Balance::LeastRequests);
        for node in p.nodes().to_vec() {
            p.set_healthy(&node, false, "test");
        }
        let first = p.pick(0).expect("panic mode still picks a node");
        let second = p.pick(0).unwrap();
        assert_ne!(
            first.index, second.index,
            "the least loaded of the unavailable"
        );
    }

    #[test]
    fn ejection_doubles_up_to_the_maximum() {
        let p = pool(2, Balance::RoundRobin);
        let lease = p.pick(0).unwrap();
        let node = p.nodes[lease.index].clone();
        let mut last = 0;
        for _ in 0..8 {
            p.connect_failed(&lease);
            let until = node.ejected_until_ms.load(Ordering::Relaxed);
            assert!(until >= last);
            last = until;
        }
        // 1 s doubling eight times would be 128 s; the maximum is 30 s.
        assert!(last <= millis_since(p.epoch) + 30_000, "{last}");
        p.connected(&lease);
        assert_eq!(node.ejected_until_ms.load(Ordering::Relaxed), 0);
    }
}
