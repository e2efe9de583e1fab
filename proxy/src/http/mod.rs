//! L7 forwarding: hyper serves the client connection (HTTP/1.1 or HTTP/2 by ALPN), and each
//! request is forwarded over pooled plaintext upstream connections: HTTP/1.1 for REST, h2c
//! with prior knowledge for gRPC. Bodies stream both ways; trailers pass through.
//!
//! It also keeps each connection's deadlines (first request, idle, stall, maximum age,
//! drain) and its reset budget, the upstream's request cap, and the request buffer budget
//! (see `budget`). It knows nothing of TLS providers: it is handed a decrypted stream.

mod body;
mod budget;
pub(crate) mod calm;
mod errors;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::access_log::{AccessLog, ConnectionFacts, PendingRecord};
use crate::config::{Limits, UpstreamProtocol};
use crate::error_chain;
use crate::io::{Activity, Quiet, QuietLimits, RequestGuard};
use crate::metrics::ListenerMetrics;
use crate::trust::TrustedProxies;
use crate::upstream::{NodeLease, UpstreamConnector, UpstreamPool};

pub use body::{BodyReturn, CappedBody, RequestBodyError, ResponseBody, UpstreamSlot};
pub use budget::{BufferBudget, WindowGrant};
use errors::{error_response, Failure};

/// HTTP/2 flow-control windows. hyper's defaults (64 KiB) make one 800 KB upsert take a
/// dozen round trips of WINDOW_UPDATEs; these let a whole UPSERT_100 fly at once while
/// bounding what a single stream can buffer.
const H2_STREAM_WINDOW: u32 = 4 * 1024 * 1024;
/// The largest connection window; the request buffer budget grants less when it is short.
pub const H2_CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;
/// `Strict-Transport-Security` for listeners with `security_headers` (the usual one year).
const HSTS_ONE_YEAR: &str = "max-age=31536000";
/// A connection that cancelled too many streams gets its GOAWAY and this long to read it.
const RESET_FLOOD_DRAIN: Duration = Duration::from_secs(1);
/// Idle upstream connections kept per upstream: one per client connection in flight at a
/// typical benchmark concurrency, so keep-alive upstream reuse is the norm.
const UPSTREAM_POOL_MAX_IDLE: usize = 256;

/// Oversized HTTP/1.1 bodies up to this size are read and discarded before the 413 so the
/// client sees the answer; larger ones just get the answer and a closed connection.
const LINGER_DRAIN_MAX_BYTES: u64 = 256 * 1024 * 1024;
/// Time allowed for that draining.
const LINGER_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

type UpstreamClient = Client<UpstreamConnector, CappedBody>;

/// Everything the request path of one listener shares.
pub struct HttpForwarder {
    pool: Arc<UpstreamPool>,
    protocol: UpstreamProtocol,
    http1: UpstreamClient,
    h2c: UpstreamClient,
    limits: Limits,
    quiet: QuietLimits,
    upstream_slots: Arc<Semaphore>,
    budget: Arc<BufferBudget>,
    trusted: TrustedProxies,
    security_headers: bool,
    metrics: ListenerMetrics,
    access_log: Option<Arc<AccessLog>>,
    /// The listener's name as access log records share it (one allocation, not one per
    /// connection).
    log_name: Arc<str>,
}

/// What the TLS handshake of a connection established, for its access log lines.
#[derive(Clone, Copy, Debug)]
pub struct TlsFacts {
    /// `1.3` or `1.2`.
    pub version: &'static str,
    /// A resumed session.
    pub resumed: bool,
    /// The provider that made the handshake.
    pub provider: &'static str,
}

impl HttpForwarder {
    /// Builds the pooled upstream clients for one listener. `trusted` proxies may set
    /// X-Forwarded-For; everybody else's is replaced.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        pool: Arc<UpstreamPool>,
        protocol: UpstreamProtocol,
        idle_timeout: Duration,
        limits: Limits,
        metrics: ListenerMetrics,
        budget: Arc<BufferBudget>,
        trusted: TrustedProxies,
        security_headers: bool,
        access_log: Option<Arc<AccessLog>>,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(limits.upstream_connect_timeout));
        let tls = pool.tls();
        let handshake_timeout = limits.upstream_connect_timeout;
        // The pool lets an idle connection go before the upstream would close it (see
        // `DEFAULT_UPSTREAM_IDLE_TIMEOUT`): hyper checks the idle time when it picks one.
        // Zero keeps none. A request hyper never wrote to a pooled connection that turned
        // out closed is sent again on a new one (hyper-util's retry of canceled requests,
        // on by default); one that was written is never sent twice.
        let max_idle = if idle_timeout.is_zero() {
            0
        } else {
            UPSTREAM_POOL_MAX_IDLE
        };
        // The write queues are part of the request buffer budget (see `budget`).
        let http1 = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(idle_timeout)
            .pool_max_idle_per_host(max_idle)
            .pool_timer(TokioTimer::new())
            .http1_max_buf_size(crate::config::UPSTREAM_WRITE_BUFFER)
            .build(UpstreamConnector::http1(
                connector.clone(),
                tls.map(|t| t.http1.clone()),
                handshake_timeout,
            ));
        let h2c = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .http2_initial_stream_window_size(H2_STREAM_WINDOW)
            .http2_initial_connection_window_size(H2_CONNECTION_WINDOW)
            .http2_max_send_buf_size(crate::config::UPSTREAM_WRITE_BUFFER)
            .pool_idle_timeout(idle_timeout)
            .pool_max_idle_per_host(max_idle)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .build(UpstreamConnector::h2(
                connector,
                tls.map(|t| t.h2.clone()),
                handshake_timeout,
            ));
        let quiet = QuietLimits {
            // A connection that never sent a request is idle too: it gets no longer than one
            // that has (a short --idle-timeout alone must close silent connections).
            first_request: limits.first_request_timeout.min(limits.idle_timeout),
            idle: limits.idle_timeout,
            stall: limits.stall_timeout,
        };
        Self {
            pool,
            protocol,
            http1,
            h2c,
            upstream_slots: Arc::new(Semaphore::new(limits.max_upstream_requests)),
            quiet,
            limits,
            budget,
            trusted,
            security_headers,
            log_name: Arc::from(metrics.name()),
            metrics,
            access_log,
        }
    }

    /// The deadlines of this listener's connections.
    pub fn quiet_limits(&self) -> &QuietLimits {
        &self.quiet
    }

    /// Serves one decrypted client connection until it closes, goes idle, or `shutdown`
    /// asks it to drain (in-flight requests finish; HTTP/2 gets a GOAWAY).
    pub async fn serve<IO>(
        self: &Arc<Self>,
        io: IO,
        h2: bool,
        peer: SocketAddr,
        tls: TlsFacts,
        activity: Arc<Activity>,
        shutdown: CancellationToken,
    ) -> Result<(), hyper::Error>
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let svc = ForwardService {
            forwarder: self.clone(),
            // Computed once per connection, not per request.
            peer_ip: HeaderValue::from_str(&peer.ip().to_string())
                .expect("an IP address is a valid header value"),
            peer_trusted: self.trusted.contains(peer.ip()),
            client_protocol: if h2 { "h2" } else { "http1" },
            activity: activity.clone(),
            // Only connections whose requests may be logged pay for this.
            facts: self.access_log.as_ref().map(|_| {
                Arc::new(ConnectionFacts {
                    listener: self.log_name.clone(),
                    peer,
                    tls_version: tls.version,
                    provider: tls.provider,
                    resumed: tls.resumed,
                })
            }),
        };
        let limits = &self.limits;
        if h2 {
            let io = TokioIo::new(calm::CalmIo::new(
                io,
                activity.clone(),
                limits.h2_max_reset_streams,
            ));
            // Held for the connection's life: its window is reserved from the budget.
            let grant = self.budget.grant_h2_window();
            let window = grant.connection_window();
            let conn = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_concurrent_streams(limits.h2_max_concurrent_streams)
                .max_header_list_size(limits.max_header_bytes as u32)
                .initial_stream_window_size(H2_STREAM_WINDOW.min(window))
                .initial_connection_window_size(window)
                .max_frame_size(grant.max_frame_size())
                .keep_alive_interval(limits.h2_keepalive_interval)
                .keep_alive_timeout(limits.h2_keepalive_timeout)
                .serve_connection(io, svc);
            let result = self.drive(conn, &activity, shutdown).await;
            drop(grant);
            result
        } else {
            let io = TokioIo::new(io);
            // Held for the connection's life, as an HTTP/2 window is.
            let grant = self.budget.grant_h1_read();
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .max_buf_size(grant.max_buf_size())
                // The read buffer may now exceed the head limit: hyper refuses a larger
                // head itself (`forward` checks the exact limit on every request too).
                .max_header_size(limits.max_header_bytes)
                .serve_connection(io, svc);
            let result = self.drive(conn, &activity, shutdown).await;
            drop(grant);
            result
        }
    }

    /// Runs a hyper connection to its end, enforcing its deadlines: when it has been quiet
    /// too long (see [`Quiet`]), reaches its maximum age, cancels too many streams, or the
    /// proxy drains, it is asked to close gracefully (HTTP/2 GOAWAY; HTTP/1.1 after the
    /// response in flight); one that has not closed after the drain timeout, or that
    /// stalled, is closed hard by dropping it.
    async fn drive<C>(
        &self,
        conn: C,
        activity: &Activity,
        shutdown: CancellationToken,
    ) -> Result<(), hyper::Error>
    where
        C: GracefulConnection<Error = hyper::Error>,
    {
        let limits = &self.limits;
        let mut conn = pin!(conn);
        let max_age = async {
            match limits.max_connection_age {
                Some(age) => tokio::time::sleep(age).await,
                None => std::future::pending().await,
            }
        };
        let mut max_age = pin!(max_age);
        let drain = tokio::time::sleep(Duration::MAX / 4);
        let mut drain = pin!(drain);
        let mut closing = false;
        let mut draining = false;
        loop {
            let (reason, drain_for) = tokio::select! {
                res = conn.as_mut() => {
                    if !closing && res.as_ref().is_err_and(is_h2_reset_flood) {
                        // h2's own limit on streams the client reset before they were
                        // accepted: a burst, which it ends with ENHANCE_YOUR_CALM before
                        // the premature-reset count is reached. The same attack, counted
                        // under the same reason.
                        self.metrics.connection_closed("reset_flood");
                        crate::peer_warn!(
                            listener = %self.metrics.name(),
                            "client reset a burst of streams before they were accepted (rapid reset): h2 closed its connection"
                        );
                    }
                    return res;
                }
                _ = shutdown.cancelled(), if !closing => {
                    // The process's shutdown grace bounds this drain.
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                    continue;
                }
                quiet = activity.wait_quiet(&self.quiet), if !closing => {
                    if quiet == Quiet::Stalled {
                        // Nothing can be delivered to this client: no point in a GOAWAY.
                        self.metrics.connection_closed(quiet.label());
                        return Ok(());
                    }
                    (quiet.label(), limits.drain_timeout)
                }
                _ = &mut max_age, if !closing => ("max_age", limits.drain_timeout),
                _ = activity.flooding(), if !closing => {
                    let (premature, opened) = activity.flood_counts();
                    crate::peer_warn!(
                        listener = %self.metrics.name(),
                        premature_resets = premature,
                        streams = opened,
                        cancelled = activity.requests_cancelled(),
                        "client reset too many streams just after opening them (rapid reset): closing its connection"
                    );
                    ("reset_flood", RESET_FLOOD_DRAIN.min(limits.drain_timeout))
                }
                _ = &mut drain, if draining => {
                    self.metrics.connection_closed("drain_deadline");
                    return Ok(());
                }
            };
            self.metrics.connection_closed(reason);
            closing = true;
            draining = true;
            drain.as_mut().reset(Instant::now() + drain_for);
            conn.as_mut().graceful_shutdown();
        }
    }

    async fn forward(
        &self,
        mut req: Request<Incoming>,
        client: &ForwardService,
        request: RequestGuard,
    ) -> Response<ResponseBody> {
        let started = Instant::now();
        let grpc = is_grpc(req.headers());
        let head_only = req.method() == http::Method::HEAD;
        let protocol_label = if grpc { "grpc" } else { client.client_protocol };
        let request_id = ensure_request_id(req.headers_mut());
        let mut log = match (&self.access_log, &client.facts) {
            (Some(access_log), Some(facts)) => {
                access_log.begin(facts, req.method(), req.uri(), protocol_label)
            }
            _ => None,
        };
        if let Some(log) = &mut log {
            log.set_request_id(request_id);
        }
        let mut resp = self
            .exchange(req, grpc, client, started, log.as_mut())
            .await;
        if self.security_headers {
            let h = resp.headers_mut();
            h.entry(header::STRICT_TRANSPORT_SECURITY)
                .or_insert(HeaderValue::from_static(HSTS_ONE_YEAR));
            h.entry(header::X_CONTENT_TYPE_OPTIONS)
                .or_insert(HeaderValue::from_static("nosniff"));
        }
        self.metrics
            .request(protocol_label, resp.status(), started.elapsed());
        if grpc {
            // A trailers-only answer (an error, usually) carries its status in the head.
            let in_head = resp
                .headers()
                .get("grpc-status")
                .map(|v| crate::metrics::grpc_status_label(v.as_bytes()));
            let status = resp.status();
            resp.body_mut()
                .count_grpc(self.metrics.grpc_outcomes(), status, in_head);
        }
        let bodiless = head_only
            || resp.status() == http::StatusCode::NO_CONTENT
            || resp.status() == http::StatusCode::NOT_MODIFIED;
        resp.body_mut().track(request, bodiless);
        if let Some(mut log) = log {
            log.set_status(resp.status());
            resp.body_mut().log_with(log);
        }
        resp
    }

    /// One request forwarded: refusals (flooding, budget, upstream cap), the node picked
    /// and leased, the request rewritten and sent, a failed connect retried on another node,
    /// and the response or the proxy's own error answer. It stays one function because
    /// every step hands the next one borrowed state of this request (the lease, the budget
    /// reservation, the log record) and its early returns release them in order; split, each
    /// piece would take most of that state as arguments and the order of release would be
    /// spread over several functions on the hottest path of the proxy.
    async fn exchange(
        &self,
        req: Request<Incoming>,
        grpc: bool,
        client: &ForwardService,
        started: Instant,
        mut log: Option<&mut PendingRecord>,
    ) -> Response<ResponseBody> {
        let fail = |failure: Failure, msg: &str| {
            error_response(failure, grpc, msg, started.elapsed().as_secs_f64())
        };
        if client.activity.is_flooding() {
            // The connection is being closed for resetting too many streams; until the
            // client has read the GOAWAY, its new streams cost the upstream nothing.
            return fail(
                Failure::Overloaded,
                "this connection cancelled too many requests and is closing",
            );
        }
        if req.method() == http::Method::CONNECT {
            self.metrics.client_error("method");
            return fail(
                Failure::MethodNotAllowed,
                "CONNECT is not served: the proxy forwards requests, it opens no tunnels",
            );
        }
        // hyper bounds its read buffer, but a head that arrives in one read can exceed it;
        // this check makes the configured limit exact for HTTP/1.1 and HTTP/2 alike.
        let head_bytes: usize = req
            .headers()
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum();
        if head_bytes > self.limits.max_header_bytes {
            return fail(
                Failure::HeadersTooLarge,
                &format!(
                    "request headers larger than the proxy's limit of {} bytes",
                    self.limits.max_header_bytes
                ),
            );
        }
        let max_body = self.limits.max_request_body_bytes;
        if let Some(len) = content_length(req.headers()).filter(|len| *len > max_body) {
            let resp = fail(
                Failure::RequestTooLarge,
                &format!("request body larger than the proxy's limit of {max_body} bytes"),
            );
            // An HTTP/1.1 client is still writing the body it announced: closing now would
            // reset the connection under it and it would never read the 413. Read and
            // discard a bounded amount first (nginx's lingering close); HTTP/2 cancels the
            // stream instead.
            if req.version() < Version::HTTP_2 && len <= LINGER_DRAIN_MAX_BYTES {
                let mut body = req.into_body();
                let _ = tokio::time::timeout(LINGER_DRAIN_TIMEOUT, async {
                    while let Some(Ok(_)) = body.frame().await {}
                })
                .await;
            }
            return resp;
        }
        let use_h2c = match self.protocol {
            UpstreamProtocol::H2c => true,
            UpstreamProtocol::Http1 => false,
            UpstreamProtocol::Auto => grpc,
        };
        // At the cap the answer is immediate: queueing would hold the client's slot and
        // body while the upstream is already saturated.
        let Ok(permit) = self.upstream_slots.clone().try_acquire_owned() else {
            self.metrics.upstream_rejected.inc();
            return fail(
                Failure::Overloaded,
                "the upstream is at its limit of concurrent requests; retry later",
            );
        };
        let mut slot = UpstreamSlot::new(permit, self.metrics.upstream_in_flight.clone());
        let (mut parts, body) = req.into_parts();
        let client_is_h2 = parts.version == Version::HTTP_2;
        let path_and_query = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
        rewrite_head(
            &mut parts,
            use_h2c,
            &self.pool.nodes()[0].addr().authority,
            &client.peer_ip,
            client.peer_trusted,
        );
        let upstream_client = if use_h2c { &self.h2c } else { &self.http1 };

        // Nodes tried so far (bit i: node i); only a failed connect moves on to another.
        let mut tried = 0u64;
        let mut parts = Some(parts);
        let mut body = Some(body);
        loop {
            let Some(lease) = self.pool.pick(tried) else {
                // Every node refused the connection; the last failure was logged.
                return fail(Failure::UpstreamUnavailable, "the upstream is unavailable");
            };
            if let Some(log) = log.as_deref_mut() {
                log.set_upstream(&lease.addr().authority);
            }
            let bytes_in = log.as_deref().map(PendingRecord::bytes_in);
            let uri = match Uri::builder()
                .scheme(lease.addr().scheme())
                .authority(lease.addr().authority.clone())
                .path_and_query(path_and_query.clone())
                .build()
            {
                Ok(uri) => uri,
                Err(e) => {
                    return fail(
                        Failure::Internal,
                        &format!("cannot build upstream URI: {e}"),
                    )
                }
            };
            let Some(client_body) = body.take() else {
                return fail(Failure::Internal, "the request body was lost");
            };
            // With another node left, the head is copied and the body kept returnable so a
            // failed connect can go elsewhere; the last (or only) node takes them as they are.
            let can_retry = self.pool.has_alternatives()
                && (tried | lease.bit()).count_ones() < self.pool.nodes().len() as u32;
            let (upstream_req, body_return) = if can_retry {
                let (capped, back) =
                    CappedBody::returnable(client_body, max_body, client.activity.clone());
                let capped = capped
                    .counting(bytes_in)
                    .draining_when_abandoned(client_is_h2);
                let head = parts.as_ref().expect("kept while retries remain");
                let mut req = Request::new(capped);
                *req.method_mut() = head.method.clone();
                *req.uri_mut() = uri;
                *req.version_mut() = head.version;
                *req.headers_mut() = head.headers.clone();
                (req, Some(back))
            } else {
                let mut head = parts.take().expect("the head is used once, last");
                head.uri = uri;
                let capped = CappedBody::new(client_body, max_body, client.activity.clone())
                    .counting(bytes_in)
                    .draining_when_abandoned(client_is_h2);
                (Request::from_parts(head, capped), None)
            };

            let sent = Instant::now();
            let result = tokio::time::timeout(
                self.limits.upstream_response_timeout,
                upstream_client.request(upstream_req),
            )
            .await;
            return match result {
                Ok(Ok(resp)) => {
                    self.metrics
                        .upstream_response(if use_h2c { "h2c" } else { "http1" }, sent.elapsed());
                    self.pool.connected(&lease);
                    slot.hold(lease);
                    let (mut parts, body) = resp.into_parts();
                    strip_hop_by_hop(&mut parts.headers);
                    Response::from_parts(parts, ResponseBody::upstream(body, slot))
                }
                Ok(Err(e)) => {
                    let failure = classify(&e);
                    if e.is_connect() {
                        self.pool.connect_failed(&lease);
                        let back = body_return.as_ref().and_then(BodyReturn::take_back);
                        if let Some(back) = back {
                            // Nothing reached the node: the same request goes to another.
                            self.note_upstream_failure(&lease, failure, &e);
                            tried |= lease.bit();
                            body = Some(back);
                            self.pool.retried();
                            continue;
                        }
                    }
                    // The details (address, OS error) go to the log, never to the client.
                    let msg = match failure {
                        Failure::RequestTooLarge => {
                            format!(
                                "request body larger than the proxy's limit of {max_body} bytes"
                            )
                        }
                        Failure::ClientBody => {
                            self.metrics.client_error("body");
                            "the request body was malformed or cut off".to_owned()
                        }
                        Failure::UpstreamTimeout => {
                            self.note_upstream_failure(&lease, failure, &e);
                            "the upstream did not accept the connection in time".to_owned()
                        }
                        _ => {
                            self.note_upstream_failure(&lease, failure, &e);
                            "the upstream is unavailable".to_owned()
                        }
                    };
                    fail(failure, &msg)
                }
                Err(_) => {
                    self.metrics.upstream_error("timeout");
                    lease.failed("timeout");
                    crate::peer_warn!(listener = %self.metrics.name(), upstream = %lease.addr(), timeout = ?self.limits.upstream_response_timeout, "upstream did not answer in time");
                    fail(
                        Failure::UpstreamTimeout,
                        &format!(
                            "the upstream did not answer within {:?}",
                            self.limits.upstream_response_timeout
                        ),
                    )
                }
            };
        }
    }

    /// Counts and logs an exchange with `lease`'s node that failed on the upstream's side.
    fn note_upstream_failure(
        &self,
        lease: &NodeLease,
        failure: Failure,
        e: &hyper_util::client::legacy::Error,
    ) {
        let kind = if failure == Failure::UpstreamTimeout {
            "connect_timeout"
        } else if e.is_connect() {
            "connect"
        } else {
            "protocol"
        };
        self.metrics.upstream_error(kind);
        lease.failed(kind);
        let what = if kind == "connect_timeout" {
            "upstream connect timed out"
        } else {
            "upstream request failed"
        };
        crate::peer_warn!(listener = %self.metrics.name(), upstream = %lease.addr(), error = %error_chain(e), "{what}");
    }
}

/// The per-connection hyper service.
#[derive(Clone)]
struct ForwardService {
    forwarder: Arc<HttpForwarder>,
    peer_ip: HeaderValue,
    peer_trusted: bool,
    client_protocol: &'static str,
    activity: Arc<Activity>,
    /// For the access log; `None` when it is off.
    facts: Option<Arc<ConnectionFacts>>,
}

impl hyper::service::Service<Request<Incoming>> for ForwardService {
    type Response = Response<ResponseBody>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        // Started here, so a stream the client resets while the upstream is still working
        // (hyper drops this future) counts as cancelled, and the upstream request with it.
        let request = self.activity.request_started();
        let this = self.clone();
        Box::pin(async move { Ok(this.forwarder.forward(req, &this, request).await) })
    }
}

/// Whether hyper's connection ended because h2 sent GOAWAY ENHANCE_YOUR_CALM itself.
fn is_h2_reset_flood(e: &hyper::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(h2) = s.downcast_ref::<h2::Error>() {
            return h2.is_go_away()
                && !h2.is_remote()
                && h2.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM);
        }
        source = s.source();
    }
    false
}

/// The client's request head as the upstream gets it: hop-by-hop headers gone (but `te:
/// trailers`, which gRPC over HTTP/2 requires), the host where the upstream's protocol
/// names it (`:authority` alone on h2c; `Host` on HTTP/1.1, from the client's
/// `:authority` or else `first_node`), X-Forwarded-For and X-Forwarded-Proto set, and the
/// upstream protocol's version. The URI is the caller's to set per node.
pub(crate) fn rewrite_head(
    parts: &mut http::request::Parts,
    use_h2c: bool,
    first_node: &http::uri::Authority,
    peer_ip: &HeaderValue,
    peer_trusted: bool,
) {
    let keep_te_trailers = use_h2c && te_is_trailers(&parts.headers);
    strip_hop_by_hop(&mut parts.headers);
    if keep_te_trailers {
        parts
            .headers
            .insert(header::TE, HeaderValue::from_static("trailers"));
    }
    if use_h2c {
        // HTTP/2 names the host in :authority (from the URI) and nowhere else: a host
        // header beside it is a "duplicate host" 400 for nginx and others.
        parts.headers.remove(header::HOST);
    } else if !parts.headers.contains_key(header::HOST) {
        let host = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .or_else(|| HeaderValue::from_str(first_node.as_str()).ok());
        if let Some(host) = host {
            parts.headers.insert(header::HOST, host);
        }
    }
    set_forwarded_for(&mut parts.headers, peer_ip, peer_trusted);
    parts.headers.insert(
        HeaderName::from_static("x-forwarded-proto"),
        HeaderValue::from_static("https"),
    );
    parts.version = if use_h2c {
        Version::HTTP_2
    } else {
        Version::HTTP_11
    };
}

fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// The request's `x-request-id`: the client's (or a front proxy's), kept as it came, or a
/// new one, added to the request so that the upstream and the access log carry the same.
/// A new id is 32 hex digits: a random per-process prefix and a hashed per-request
/// counter (unique within the process, unlikely to repeat across processes; not secret).
fn ensure_request_id(headers: &mut http::HeaderMap) -> HeaderValue {
    static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
    if let Some(id) = headers.get(&X_REQUEST_ID) {
        return id.clone();
    }
    use std::hash::BuildHasher;
    static STATE: std::sync::OnceLock<(std::collections::hash_map::RandomState, u64)> =
        std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let (state, prefix) = STATE.get_or_init(|| {
        let state = std::collections::hash_map::RandomState::new();
        let prefix = state.hash_one(std::process::id());
        (state, prefix)
    });
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut text = [0u8; 32];
    let hex = b"0123456789abcdef";
    for (i, word) in [*prefix, state.hash_one(n)].into_iter().enumerate() {
        for j in 0..16 {
            text[i * 16 + j] = hex[((word >> (60 - 4 * j)) & 0xf) as usize];
        }
    }
    let id = HeaderValue::from_bytes(&text).expect("hex digits are a valid header value");
    headers.insert(X_REQUEST_ID.clone(), id.clone());
    id
}

fn te_is_trailers(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::TE)
        .iter()
        .any(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"))
}

/// Hop-by-hop headers (RFC 9110 7.6.1) describe one connection and must not be forwarded,
/// nor any header the Connection header names.
/// The headers a `Connection` header names: hop-by-hop for this connection only.
pub(crate) fn connection_named(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect()
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in connection_named(headers) {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
}

/// X-Forwarded-For names the peer. A trusted proxy's list is extended; anybody else's
/// is replaced, and their Forwarded and X-Real-IP dropped, so the upstream never takes a
/// client's word for its own address.
fn set_forwarded_for(headers: &mut HeaderMap, peer_ip: &HeaderValue, peer_trusted: bool) {
    let name = HeaderName::from_static("x-forwarded-for");
    if !peer_trusted {
        headers.remove(header::FORWARDED);
        headers.remove(HeaderName::from_static("x-real-ip"));
        headers.insert(name, peer_ip.clone());
        return;
    }
    let combined = headers.get(&name).and_then(|prev| {
        let mut v = Vec::with_capacity(prev.len() + 2 + peer_ip.len());
        v.extend_from_slice(prev.as_bytes());
        v.extend_from_slice(b", ");
        v.extend_from_slice(peer_ip.as_bytes());
        HeaderValue::from_bytes(&v).ok()
    });
    headers.insert(name, combined.unwrap_or_else(|| peer_ip.clone()));
}

/// Decides whose fault a failed exchange was and the answer it gets.
fn classify(e: &hyper_util::client::legacy::Error) -> Failure {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        match err.downcast_ref::<RequestBodyError>() {
            Some(RequestBodyError::TooLarge) => return Failure::RequestTooLarge,
            Some(RequestBodyError::Client(_)) => return Failure::ClientBody,
            None => {}
        }
        source = err.source();
    }
    if e.is_connect() {
        let chain = error_chain(e);
        if chain.contains("timed out") || chain.contains("timeout") {
            return Failure::UpstreamTimeout;
        }
    }
    Failure::UpstreamUnavailable
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key(header::CONTENT_TYPE));
    }

    #[test]
    fn forwarded_for_is_extended_for_trusted_peers_only() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("6.6.6.6"));
        h.insert(header::FORWARDED, HeaderValue::from_static("for=6.6.6.6"));
        h.insert("x-real-ip", HeaderValue::from_static("6.6.6.6"));
        set_forwarded_for(&mut h, &HeaderValue::from_static("127.0.0.1"), false);
        assert_eq!(h["x-forwarded-for"], "127.0.0.1");
        assert!(!h.contains_key(header::FORWARDED) && !h.contains_key("x-real-ip"));
        set_forwarded_for(&mut h, &HeaderValue::from_static("10.0.0.9"), true);
        assert_eq!(h["x-forwarded-for"], "127.0.0.1, 10.0.0.9");
    }
}
