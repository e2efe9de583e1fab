//! L7 forwarding: hyper serves the client connection (HTTP/1.1 or HTTP/2 by ALPN), and each
//! request is forwarded over pooled plaintext upstream connections: HTTP/1.1 for REST, h2c
//! with prior knowledge for gRPC. Bodies stream both ways; trailers pass through.
//!
//! It also keeps each connection's deadlines (first request, idle, stall, maximum age,
//! drain) and its reset budget, the upstream's request cap, and the request buffer budget
//! (see `budget`). It knows nothing of TLS providers: it is handed a decrypted stream.
//!
//! Its rooms: `exchange` (one request forwarded, stage by stage), `head` (the request head
//! as the upstream gets it), `body` (request and response bodies, capped and counted),
//! `gather` (request chunks held while the upstream cannot take them yet), `node_clients`
//! (each node's pooled clients, made anew after a fault), `errors` (the proxy's own
//! answers), `budget` (the request buffer budget), `idle_http1` (HTTP/1.1 connections
//! parked between requests without hyper's buffers). Rapid reset (premature
//! stream resets counted under hyper, and the flood flag they raise) is the crate's
//! `rapid_reset`, beside the connection state (`liveness`) that holds the flag.

mod body;
mod budget;
mod errors;
mod exchange;
mod gather;
mod head;
mod idle_http1;
mod node_clients;
mod spans;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::access_log::{AccessLog, ConnectionFacts};
use crate::config::{ErrorBody, Limits, UpstreamProtocol};
use crate::liveness::{Activity, Quiet, QuietLimits, RequestGuard};
use crate::metrics::ListenerMetrics;
use crate::plan::HttpPlan;
use crate::trust::TrustedProxies;
use crate::upstream::{UpstreamConnector, UpstreamPool};

pub use body::{CappedBody, ResponseBody};
pub use budget::BufferBudget;
pub(crate) use head::{connection_named, rewrite_head};
use head::{ensure_request_id, is_grpc};
use idle_http1::SetAside;
pub use idle_http1::{ClientStream, NextBytes};
use node_clients::NodeClients;

/// HTTP/2 flow-control windows. hyper's defaults (64 KiB) make one 800 KB upsert take a
/// dozen round trips of WINDOW_UPDATEs; these let a whole UPSERT_100 fly at once while
/// bounding what a single stream can buffer.
const H2_STREAM_WINDOW: u32 = 4 * 1024 * 1024;
/// The largest connection window; the request buffer budget grants less when it is short.
pub const H2_CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;
/// `Strict-Transport-Security` for listeners with `security_headers` (the usual one year).
const HSTS_ONE_YEAR: &str = "max-age=31536000";
/// An idle HTTP/1.1 client set aside gets this long to take its close_notify.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// A connection that cancelled too many streams gets its GOAWAY and this long to read it.
const RESET_FLOOD_DRAIN: Duration = Duration::from_secs(1);
/// The head size h2 (and hyper's HTTP/1.1 server) read before they refuse a request
/// themselves: twice the configured limit (h2 also counts 32 bytes per field that `admit`
/// does not), so that heads up to well over the limit get the proxy's own answer.
fn head_ceiling(max_header_bytes: usize) -> u32 {
    u32::try_from(max_header_bytes.saturating_mul(2)).unwrap_or(u32::MAX)
}

/// Everything the request path of one listener shares.
pub struct HttpForwarder {
    pool: Arc<UpstreamPool>,
    protocol: UpstreamProtocol,
    /// Per node, the pooled HTTP/1.1 and h2c clients.
    clients: NodeClients,
    limits: Limits,
    quiet: QuietLimits,
    upstream_slots: Arc<Semaphore>,
    budget: Arc<BufferBudget>,
    trusted: TrustedProxies,
    security_headers: bool,
    /// The body of the proxy's own REST error answers.
    error_body: ErrorBody,
    metrics: ListenerMetrics,
    access_log: Option<Arc<AccessLog>>,
    /// The listener's rate limits and per-method metrics.
    controls: OperatorControls,
    /// The listener's name as access log records share it (one allocation, not one per
    /// connection).
    log_name: Arc<str>,
}

/// What operators set per listener beyond forwarding: its rate limits, asked in order at
/// admission, and its per-method metrics (`None`: off).
pub(crate) struct OperatorControls {
    /// `[[listener.rate_limit]]`, kept across reloads by the registry that made them.
    pub rate_limits: Vec<Arc<crate::rate_limit::Limiter>>,
    /// `[listener.method_metrics]`.
    pub methods: Option<Arc<crate::metrics::MethodMetrics>>,
    /// `[otel]`: trace context and spans (`None`: off).
    pub tracer: Option<Arc<crate::trace::Tracer>>,
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

/// What a listener's forwarder shares with its listener and the process.
pub(crate) struct ForwarderContext {
    /// The listener's nodes.
    pub pool: Arc<UpstreamPool>,
    /// The listener's limits (its own idle timeout applied).
    pub limits: Limits,
    pub metrics: ListenerMetrics,
    /// The process's request buffer budget.
    pub budget: Arc<BufferBudget>,
    /// Proxies that may set X-Forwarded-For; everybody else's is replaced.
    pub trusted: TrustedProxies,
    pub access_log: Option<Arc<AccessLog>>,
    pub controls: OperatorControls,
}

impl HttpForwarder {
    /// Builds the pooled upstream clients of one http listener from its plan.
    pub(crate) fn new(plan: &HttpPlan, context: ForwarderContext) -> Self {
        let ForwarderContext {
            pool,
            limits,
            metrics,
            budget,
            trusted,
            access_log,
            controls,
        } = context;
        let upstream_idle = plan.upstream_idle_timeout;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(limits.upstream_connect_timeout));
        let tls = pool.tls();
        let handshake_timeout = limits.upstream_connect_timeout;
        let connectors = (
            UpstreamConnector::http1(
                connector.clone(),
                tls.map(|t| t.http1.clone()),
                handshake_timeout,
            ),
            UpstreamConnector::h2(connector, tls.map(|t| t.h2.clone()), handshake_timeout),
        );
        let clients = NodeClients::new(&pool, connectors, upstream_idle, &limits);
        let quiet = QuietLimits {
            // A connection that never sent a request is idle too: it gets no longer than one
            // that has (a short --idle-timeout alone must close silent connections).
            first_request: limits.first_request_timeout.min(limits.idle_timeout),
            idle: limits.idle_timeout,
            stall: limits.stall_timeout,
        };
        Self {
            pool,
            protocol: plan.upstream_protocol,
            clients,
            upstream_slots: Arc::new(Semaphore::new(limits.max_upstream_requests)),
            quiet,
            limits,
            budget,
            trusted,
            security_headers: plan.security_headers,
            error_body: plan.error_body,
            log_name: Arc::from(metrics.name()),
            metrics,
            access_log,
            controls,
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
        IO: ClientStream,
    {
        let svc = ForwardService {
            forwarder: self.clone(),
            // Computed once per connection, not per request.
            peer_ip: HeaderValue::from_str(&peer.ip().to_string())
                .expect("an IP address is a valid header value"),
            peer_trusted: self.trusted.contains(peer.ip()),
            peer_addr: peer.ip(),
            tls,
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
        // One deadline for the connection's life, however many hyper connections serve it.
        let max_age = limits.max_connection_age.map(|age| Instant::now() + age);
        // Each protocol's state in an allocation of its own, sized for it: inline, an
        // HTTP/1.1 connection waiting between requests would carry the size of an h2
        // connection's state as well.
        if h2 {
            Box::pin(self.serve_h2(io, svc, &activity, max_age, shutdown)).await
        } else {
            Box::pin(self.serve_http1(io, svc, &activity, max_age, shutdown)).await
        }
    }

    /// Serves an h2 client until it closes or a deadline or the drain closes it.
    async fn serve_h2<IO: ClientStream>(
        &self,
        io: IO,
        svc: ForwardService,
        activity: &Arc<Activity>,
        max_age: Option<Instant>,
        shutdown: CancellationToken,
    ) -> Result<(), hyper::Error> {
        let limits = &self.limits;
        let io = TokioIo::new(crate::rapid_reset::CalmIo::new(
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
            // The exact limit is `admit`'s, answered 431 / RESOURCE_EXHAUSTED with the
            // setting's name. h2's own check is a ceiling above it: h2 refuses a list over
            // it with a bare 431 and REFUSED_STREAM, which gRPC clients take as "retry".
            .max_header_list_size(head_ceiling(limits.max_header_bytes))
            .initial_stream_window_size(H2_STREAM_WINDOW.min(window))
            .initial_connection_window_size(window)
            .max_frame_size(grant.max_frame_size())
            .keep_alive_interval(limits.h2_keepalive_interval)
            .keep_alive_timeout(limits.h2_keepalive_timeout)
            .serve_connection(io, svc);
        let result = self.drive(pin!(conn), activity, max_age, shutdown).await;
        drop(grant);
        result.map(|_| ())
    }

    /// Serves an HTTP/1.1 client: a hyper connection while requests come, the stream alone
    /// while the client is quiet between them (see `aside`), until it closes, stays quiet
    /// past its limit, reaches its maximum age, or the proxy drains.
    async fn serve_http1<IO: ClientStream>(
        &self,
        mut io: IO,
        mut svc: ForwardService,
        activity: &Arc<Activity>,
        max_age: Option<Instant>,
        shutdown: CancellationToken,
    ) -> Result<(), hyper::Error> {
        let mut unread = Bytes::new();
        loop {
            match Box::pin(self.serve_until_quiet(io, unread, svc, activity, max_age, &shutdown))
                .await
            {
                Http1Turn::Over(result) => return result,
                Http1Turn::SetAside(stream, rest, service) => {
                    (io, unread, svc) = (stream, rest, service);
                }
            }
            if !unread.is_empty() {
                continue;
            }
            let close = tokio::select! {
                next = io.next_bytes(activity, &self.quiet, &shutdown) => match next {
                    NextBytes::Arrived => continue,
                    NextBytes::Quiet(why) => Some(why.label()),
                    NextBytes::Draining => None,
                },
                _ = sleep_until_if(max_age) => Some("max_age"),
            };
            if let Some(reason) = close {
                self.metrics.connection_closed(reason);
            }
            // close_notify and FIN, as hyper's shutdown would have sent them; a client that
            // reads nothing does not hold the task.
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, io.shutdown()).await;
            return Ok(());
        }
    }

    /// One hyper connection over an HTTP/1.1 client's stream (`unread` read first), until
    /// it is set aside or over. Its own function, boxed by the caller, so that everything
    /// it allocated (the connection, hyper's buffers, the drive's timers) is gone before
    /// the wait for the client's next bytes.
    async fn serve_until_quiet<IO: ClientStream>(
        &self,
        io: IO,
        unread: Bytes,
        svc: ForwardService,
        activity: &Arc<Activity>,
        max_age: Option<Instant>,
        shutdown: &CancellationToken,
    ) -> Http1Turn<IO> {
        let limits = &self.limits;
        // Held while hyper serves: a connection set aside holds no read buffer.
        let grant = self.budget.grant_h1_read();
        let mut conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .max_buf_size(grant.max_buf_size())
            // hyper refuses a head over this itself with a bare 431; the exact limit is
            // `admit`'s (answered with the setting's name and counted), so hyper's is the
            // same ceiling above it as h2's. The read buffer bounds it too.
            .max_header_size(head_ceiling(limits.max_header_bytes) as usize)
            .serve_connection(
                TokioIo::new(SetAside::new(io, unread, activity.clone())),
                svc,
            );
        let result = self
            .drive(Pin::new(&mut conn), activity, max_age, shutdown.clone())
            .await;
        let parts = conn.into_parts();
        let (mut stream, set_aside) = parts.io.into_inner().into_inner();
        // The client went quiet between requests, or stopped partway through a request head
        // (hyper calls that an incomplete message): its stream waits for more, with what
        // hyper had read of the head.
        let waits = set_aside
            && match &result {
                Ok(ended) => *ended == Ended::Finished,
                Err(e) => e.is_incomplete_message(),
            };
        if waits {
            // A copy: hyper's read buffer (8 KiB and more) is what the wait must not hold,
            // and `read_buf` shares it, even empty.
            return Http1Turn::SetAside(
                stream,
                Bytes::copy_from_slice(&parts.read_buf),
                parts.service,
            );
        }
        if set_aside {
            // Set aside as a deadline closed it: hyper's shutdown was declined.
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, stream.shutdown()).await;
        }
        Http1Turn::Over(result.map(|_| ()))
    }

    /// Runs a hyper connection to its end, enforcing its deadlines: when it has been quiet
    /// too long (see [`Quiet`]), reaches its maximum age, cancels too many streams, or the
    /// proxy drains, it is asked to close gracefully (HTTP/2 GOAWAY; HTTP/1.1 after the
    /// response in flight); one that has not closed after the drain timeout, or that
    /// stalled, is closed hard (the caller drops it).
    async fn drive<C>(
        &self,
        mut conn: Pin<&mut C>,
        activity: &Activity,
        max_age: Option<Instant>,
        shutdown: CancellationToken,
    ) -> Result<Ended, hyper::Error>
    where
        C: GracefulConnection<Error = hyper::Error>,
    {
        let limits = &self.limits;
        let mut max_age = pin!(sleep_until_if(max_age));
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
                    return res.map(|()| if closing { Ended::Closed } else { Ended::Finished });
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
                        return Ok(Ended::Closed);
                    }
                    (quiet.label(), limits.drain_timeout)
                }
                _ = &mut max_age, if !closing => ("max_age", limits.drain_timeout),
                _ = activity.flood().raised(), if !closing => {
                    let (premature, opened) = activity.flood().counts();
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
                    return Ok(Ended::Closed);
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
        let method = self
            .controls
            .methods
            .as_ref()
            .map(|m| m.resolve(req.method(), req.uri().path(), grpc));
        let mut trace = self.begin_trace(&mut req, client, method.as_deref());
        if let Some(log) = &mut log {
            log.set_trace_id(match &trace {
                Some(t) => Some(t.trace_id),
                None => crate::trace::trace_id_of(req.headers()),
            });
        }
        let mut span = trace.as_mut().and_then(|t| t.span.take());
        // One count of the request's body bytes for whoever needs it: the log, the span,
        // the byte limits.
        let bytes_in = log.as_ref().map(|l| l.bytes_in().clone()).or_else(|| {
            (span.is_some() || self.controls.rate_limits.iter().any(|l| l.limits_bytes()))
                .then(Arc::default)
        });
        let watch = exchange::RequestWatch {
            log: log.as_mut(),
            method: method.as_ref(),
            bytes_in: bytes_in.as_ref(),
            span: span.as_deref_mut(),
        };
        let mut resp = self.exchange(req, grpc, client, started, watch).await;
        if self.security_headers {
            let h = resp.headers_mut();
            h.entry(header::STRICT_TRANSPORT_SECURITY)
                .or_insert(HeaderValue::from_static(HSTS_ONE_YEAR));
            h.entry(header::X_CONTENT_TYPE_OPTIONS)
                .or_insert(HeaderValue::from_static("nosniff"));
        }
        self.metrics
            .request(protocol_label, resp.status(), started.elapsed());
        if let Some(method) = &method {
            method.seconds.observe(started.elapsed().as_secs_f64());
            if !grpc {
                method.count(resp.status(), "");
            }
        }
        if grpc {
            // A trailers-only answer (an error, usually) carries its status in the head.
            let in_head = resp
                .headers()
                .get("grpc-status")
                .map(|v| crate::metrics::grpc_status_label(v.as_bytes()));
            let status = resp.status();
            resp.body_mut().count_grpc(
                self.metrics.grpc_outcomes(),
                status,
                in_head,
                method.clone(),
            );
        }
        if let Some(method) = method {
            resp.body_mut().count_bytes(method);
        }
        if let (Some(span), Some(tracer)) = (span, &self.controls.tracer) {
            let status = resp.status();
            resp.body_mut()
                .finish_span(span, tracer.clone(), status, bytes_in);
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
}

/// The per-connection hyper service.
#[derive(Clone)]
struct ForwardService {
    forwarder: Arc<HttpForwarder>,
    peer_ip: HeaderValue,
    peer_trusted: bool,
    /// The client's address (a trusted balancer's PROXY header's), for rate limits.
    peer_addr: std::net::IpAddr,
    /// The connection's handshake, for spans.
    tls: TlsFacts,
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
        if !http_body::Body::is_end_stream(req.body()) {
            // Until it is read to its end (`CappedBody`), an HTTP/1.1 connection is not
            // set aside: hyper may still read the rest.
            self.activity.body_opened();
        }
        let this = self.clone();
        Box::pin(async move { Ok(this.forwarder.forward(req, &this, request).await) })
    }
}

/// How one hyper connection over an HTTP/1.1 client's stream ended.
enum Http1Turn<IO> {
    /// Set aside: the stream, what hyper had read of a next head, the service.
    SetAside(IO, Bytes, ForwardService),
    /// The client's connection is over.
    Over(Result<(), hyper::Error>),
}

/// How [`HttpForwarder::drive`] left a hyper connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// It ended by itself: the client closed, or went quiet and was set aside.
    Finished,
    /// It was closed: after being asked to (a deadline, the drain), or cut off.
    Closed,
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_if(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
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
