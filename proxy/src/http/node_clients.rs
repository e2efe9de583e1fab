//! A listener's upstream clients: per node an HTTP/1.1 and an h2c client, each with hyper's
//! pool of that node's connections, made anew when the node's health checks take it out.
//!
//! Why per node and made anew: a node cut off from the network (a partition, a container
//! disconnected, a host gone without a FIN) leaves its pooled connections half-open. Every
//! request multiplexed on such an h2c connection waits for the response timeout, also
//! after the node is back and its health checks pass again, and hyper's pool cannot drop
//! the connections of one host. So connections made before the node was taken out are not
//! used after it (Envoy's `close_connections_on_host_health_failure`): the health checks
//! move the node's connection epoch on (`upstream::Node`), and the first request after that
//! gets a new pair of clients; the old pair's idle connections close when it is dropped,
//! requests already in flight on them keep their own deadline.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::Request;
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::{CappedBody, H2_CONNECTION_WINDOW, H2_STREAM_WINDOW};
use crate::config::Limits;
use crate::upstream::{NodeLease, UpstreamConnector, UpstreamPool};

/// Idle upstream connections kept per upstream: one per client connection in flight at a
/// typical benchmark concurrency, so keep-alive upstream reuse is the norm.
const UPSTREAM_POOL_MAX_IDLE: usize = 256;

type UpstreamClient = Client<UpstreamConnector, CappedBody>;

/// How a node's clients are made: the connectors and the pools' idle settings.
struct ClientMaker {
    http1: UpstreamConnector,
    h2: UpstreamConnector,
    /// How long an idle pooled connection is kept (zero keeps none).
    upstream_idle: Duration,
    /// HTTP/2 keep-alive PINGs while requests are in flight: the interval and the time
    /// to answer (`limits.h2_keepalive_*`, as on client connections).
    h2_keepalive: (Duration, Duration),
}

impl ClientMaker {
    fn pair(&self, epoch: u64) -> ClientPair {
        // The pool lets an idle connection go before the upstream would close it (see
        // `DEFAULT_UPSTREAM_IDLE_TIMEOUT`): hyper checks the idle time when it picks one.
        // Zero keeps none. A request hyper never wrote to a pooled connection that turned
        // out closed is sent again on a new one (hyper-util's retry of canceled requests,
        // on by default); one that was written is never sent twice.
        let max_idle = if self.upstream_idle.is_zero() {
            0
        } else {
            UPSTREAM_POOL_MAX_IDLE
        };
        // The write queues are part of the request buffer budget (see `budget`).
        let http1 = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(self.upstream_idle)
            .pool_max_idle_per_host(max_idle)
            .pool_timer(TokioTimer::new())
            .http1_max_buf_size(crate::config::UPSTREAM_WRITE_BUFFER)
            .build(self.http1.clone());
        let h2c = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .http2_initial_stream_window_size(H2_STREAM_WINDOW)
            .http2_initial_connection_window_size(H2_CONNECTION_WINDOW)
            .http2_max_send_buf_size(crate::config::UPSTREAM_WRITE_BUFFER)
            .pool_idle_timeout(self.upstream_idle)
            .pool_max_idle_per_host(max_idle)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            // A half-open connection (a node gone without a FIN) fails its requests after
            // an unanswered PING rather than at the response timeout.
            .http2_keep_alive_interval(self.h2_keepalive.0)
            .http2_keep_alive_timeout(self.h2_keepalive.1)
            .build(self.h2.clone());
        ClientPair { epoch, http1, h2c }
    }
}

/// One node's clients, and the connection epoch of the node they were made in.
struct ClientPair {
    epoch: u64,
    http1: UpstreamClient,
    h2c: UpstreamClient,
}

/// The upstream clients of one listener, by node (the pool's order).
pub(super) struct NodeClients {
    by_node: Box<[ArcSwap<ClientPair>]>,
    maker: ClientMaker,
}

impl NodeClients {
    /// Clients for each node of `pool`, connecting with `http1` and `h2`, keeping idle
    /// connections for `upstream_idle`, with `limits`' HTTP/2 keep-alive.
    pub(super) fn new(
        pool: &UpstreamPool,
        (http1, h2): (UpstreamConnector, UpstreamConnector),
        upstream_idle: Duration,
        limits: &Limits,
    ) -> Self {
        let maker = ClientMaker {
            http1,
            h2,
            upstream_idle,
            h2_keepalive: (limits.h2_keepalive_interval, limits.h2_keepalive_timeout),
        };
        let by_node = pool
            .nodes()
            .iter()
            .map(|node| ArcSwap::from_pointee(maker.pair(node.connection_epoch())))
            .collect();
        Self { by_node, maker }
    }

    /// Sends `request` to `lease`'s node, over h2c or HTTP/1.1, on connections made since
    /// the node was last taken out.
    pub(super) fn request(
        &self,
        lease: &NodeLease,
        h2c: bool,
        request: Request<CappedBody>,
    ) -> ResponseFuture {
        let slot = &self.by_node[lease.index()];
        let epoch = lease.connection_epoch();
        let mut pair = slot.load();
        if pair.epoch < epoch {
            let fresh = Arc::new(self.maker.pair(epoch));
            let before = slot.compare_and_swap(&pair, fresh);
            if std::ptr::eq(before.as_ref(), pair.as_ref()) {
                tracing::info!(upstream = %lease.addr(), "new connections for a node its health checks took out: those made before are not used again");
            }
            // Ours, or the pair another request made at the same moment.
            pair = slot.load();
        }
        let client = if h2c { &pair.h2c } else { &pair.http1 };
        // The future owns what it needs (the client's pool among it).
        client.request(request)
    }
}
