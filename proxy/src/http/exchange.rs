//! One request's exchange with the upstream, in three stages that each own what they
//! touch:
//!
//! 1. **Admission** ([`HttpForwarder::admit`], synchronous): the refusals that need no upstream (a
//!    connection closing for a reset flood, CONNECT, a head or an announced body over the
//!    limits), then one of the upstream's request slots, taken last so that nothing
//!    refused ever holds one. What passes is an [`Admitted`] request: head, body, slot.
//! 2. **The rewritten head** ([`UpstreamHead`]): hop-by-hop headers gone, the forwarding
//!    headers set, the upstream's protocol version; per attempt, the URI of the node
//!    tried, the head copied while another node is left to try and moved into the last.
//! 3. **Send and retry** ([`HttpForwarder::send`]): a node leased, the request sent under
//!    the response timeout, a failed connect moved to another node with the body handed
//!    back unread, and the answer passed on with the slot holding the node's lease.
//!
//! Any stage may end in a [`Refusal`], which [`HttpForwarder::exchange`] turns into the
//! proxy's own answer. The order of release is kept by ownership: the slot goes into the
//! response body it stays with (and holds the lease from then on), or ends with `send`;
//! a lease that did not answer ends with its attempt, before the slot.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::uri::{Authority, PathAndQuery};
use http::{Request, Response, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::time::Instant;

use super::body::{BodyReturn, CappedBody, RequestBodyError, ResponseBody, UpstreamSlot};
use super::errors::{error_response, Failure};
use super::head::{content_length, rewrite_head, strip_hop_by_hop};
use super::{ForwardService, HttpForwarder};
use crate::access_log::PendingRecord;
use crate::config::UpstreamProtocol;
use crate::error_chain;
use crate::metrics::MethodHandles;
use crate::rate_limit::{Limited, Limiter, Ticket};
use crate::upstream::NodeLease;

/// Oversized HTTP/1.1 bodies up to this size are read and discarded before the 413 so the
/// client sees the answer; larger ones just get the answer and a closed connection.
const LINGER_DRAIN_MAX_BYTES: u64 = 256 * 1024 * 1024;
/// Time allowed for that draining.
const LINGER_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the proxy answers a request itself: the failure, which decides the status, and the
/// message the client reads (naming nothing internal; details go to the log).
pub(super) struct Refusal {
    failure: Failure,
    message: Cow<'static, str>,
    /// When the client may try again (a rate limit's answer).
    retry_after: Option<Duration>,
}

impl Refusal {
    fn new(failure: Failure, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            failure,
            message: message.into(),
            retry_after: None,
        }
    }
}

impl From<Limited> for Refusal {
    fn from(limited: Limited) -> Self {
        Self {
            failure: Failure::RateLimited,
            message: limited.message.into(),
            retry_after: Some(limited.retry_after),
        }
    }
}

/// The byte buckets a body of unknown length is charged to once it has been read: when the
/// exchange ends, with what the counter saw.
struct ByteCharges {
    tickets: Vec<(Arc<Limiter>, Ticket)>,
    counted: Arc<AtomicU64>,
}

impl Drop for ByteCharges {
    fn drop(&mut self) {
        let bytes = self.counted.load(Ordering::Relaxed);
        for (limiter, ticket) in &self.tickets {
            limiter.charge_bytes(*ticket, bytes);
        }
    }
}

/// A request refused at admission, and a body announced too large that an HTTP/1.1 client
/// is still writing: read and discarded before the answer (see [`linger`]).
pub(super) struct Refused {
    refusal: Refusal,
    unread: Option<Incoming>,
}

impl From<Refusal> for Refused {
    fn from(refusal: Refusal) -> Self {
        Self {
            refusal,
            unread: None,
        }
    }
}

/// Reads and discards what remains of `body`, within [`LINGER_DRAIN_TIMEOUT`] (nginx's
/// lingering close), so that the client reads the answer instead of a reset.
async fn linger(mut body: Incoming) {
    let _ = tokio::time::timeout(LINGER_DRAIN_TIMEOUT, async {
        while let Some(Ok(_)) = body.frame().await {}
    })
    .await;
}

/// A request admitted to the upstream: its head and body, the upstream slot it holds, and
/// the upstream protocol it goes over.
pub(super) struct Admitted {
    parts: Parts,
    body: Incoming,
    slot: UpstreamSlot,
    use_h2c: bool,
    grpc: bool,
    /// Byte limits a body of unknown length is charged to (`None` almost always).
    byte_charges: Option<Vec<(Arc<Limiter>, Ticket)>>,
}

/// The client's head rewritten for the upstream; the URI is set per attempt.
struct UpstreamHead {
    /// Copied by attempts that may be retried, taken by the last.
    parts: Option<Parts>,
    path_and_query: PathAndQuery,
    client_is_h2: bool,
    /// The body's pieces are held to the end of each gRPC message (else of the body).
    grpc: bool,
    /// The most body bytes held at a time (see `gather`).
    gather_max: usize,
}

impl UpstreamHead {
    fn new(
        mut parts: Parts,
        use_h2c: bool,
        (grpc, gather_max): (bool, usize),
        first_node: &Authority,
        client: &ForwardService,
    ) -> Self {
        let client_is_h2 = parts.version == Version::HTTP_2;
        let path_and_query = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        rewrite_head(
            &mut parts,
            use_h2c,
            first_node,
            &client.peer_ip,
            client.peer_trusted,
        );
        Self {
            parts: Some(parts),
            path_and_query,
            client_is_h2,
            grpc,
            gather_max,
        }
    }

    /// The request to `lease`'s node, with the client's body capped at `max_body` bytes
    /// and watched by `watch`. With `retryable`, the head is copied and the body kept
    /// returnable (the [`BodyReturn`]) so a failed connect can go elsewhere; otherwise both
    /// are taken as they are.
    fn request(
        &mut self,
        lease: &NodeLease,
        body: Incoming,
        retryable: bool,
        max_body: u64,
        client: &ForwardService,
        watch: BodyWatch<'_>,
    ) -> Result<(Request<CappedBody>, Option<BodyReturn>), Refusal> {
        let BodyWatch {
            bytes_in,
            over_limit,
            method_bytes,
        } = watch;
        let uri = Uri::builder()
            .scheme(lease.addr().scheme())
            .authority(lease.addr().authority.clone())
            .path_and_query(self.path_and_query.clone())
            .build()
            .map_err(|e| {
                Refusal::new(Failure::Internal, format!("cannot build upstream URI: {e}"))
            })?;
        let activity = client.activity.clone();
        if retryable {
            let (capped, back) = CappedBody::returnable(body, max_body, activity);
            let capped = capped
                .counting(bytes_in)
                .counting_for_method(method_bytes)
                .flagging_over_limit(over_limit)
                .draining_when_abandoned(self.client_is_h2)
                .gathering(self.grpc, self.gather_max);
            let head = self.parts.as_ref().expect("kept while retries remain");
            let mut req = Request::new(capped);
            *req.method_mut() = head.method.clone();
            *req.uri_mut() = uri;
            *req.version_mut() = head.version;
            *req.headers_mut() = head.headers.clone();
            Ok((req, Some(back)))
        } else {
            let mut head = self.parts.take().expect("the head is used once, last");
            head.uri = uri;
            let capped = CappedBody::new(body, max_body, activity)
                .counting(bytes_in)
                .counting_for_method(method_bytes)
                .flagging_over_limit(over_limit)
                .draining_when_abandoned(self.client_is_h2)
                .gathering(self.grpc, self.gather_max);
            Ok((Request::from_parts(head, capped), None))
        }
    }
}

/// Who follows a request through its exchange: its access log record, its method's
/// metrics, its byte count (shared by the log, the span and the byte limits) and its span.
pub(super) struct RequestWatch<'a> {
    pub log: Option<&'a mut PendingRecord>,
    pub method: Option<&'a Arc<MethodHandles>>,
    pub bytes_in: Option<&'a Arc<AtomicU64>>,
    pub span: Option<&'a mut crate::trace::SpanRecord>,
}

/// What watches a request body on its way up: the access log's byte count, and the flag
/// its going over the limit sets (see `CappedBody::flagging_over_limit`).
struct BodyWatch<'a> {
    bytes_in: Option<&'a Arc<AtomicU64>>,
    over_limit: Option<&'a Arc<AtomicBool>>,
    /// The request's method's byte counter (per-method metrics).
    method_bytes: Option<&'a prometheus::IntCounter>,
}

impl HttpForwarder {
    /// One request forwarded (admitted, rewritten, sent and retried), or the proxy's own
    /// answer for the stage that refused it.
    pub(super) async fn exchange(
        &self,
        req: Request<Incoming>,
        grpc: bool,
        client: &ForwardService,
        started: Instant,
        watch: RequestWatch<'_>,
    ) -> Response<ResponseBody> {
        let answered = match self.admit(req, grpc, client) {
            Ok(admitted) => self.send(admitted, client, watch).await,
            Err(Refused { refusal, unread }) => {
                if let Some(body) = unread {
                    linger(body).await;
                }
                Err(refusal)
            }
        };
        answered.unwrap_or_else(|r| {
            error_response(
                r.failure,
                grpc,
                self.error_body,
                &r.message,
                started.elapsed().as_secs_f64(),
                r.retry_after,
            )
        })
    }

    /// Stage 1: the refusals that need no upstream, then an upstream slot. Synchronous, so
    /// that the exchange's future holds no state of its own for it.
    fn admit(
        &self,
        req: Request<Incoming>,
        grpc: bool,
        client: &ForwardService,
    ) -> Result<Admitted, Refused> {
        if client.activity.flood().is_raised() {
            // The connection is being closed for resetting too many streams; until the
            // client has read the GOAWAY, its new streams cost the upstream nothing.
            return Err(Refused::from(Refusal::new(
                Failure::Overloaded,
                "this connection cancelled too many requests and is closing",
            )));
        }
        if req.method() == http::Method::CONNECT {
            self.metrics.client_error("method");
            return Err(Refused::from(Refusal::new(
                Failure::MethodNotAllowed,
                "CONNECT is not served: the proxy forwards requests, it opens no tunnels",
            )));
        }
        // hyper bounds its read buffer, but a head that arrives in one read can exceed it;
        // this check makes the configured limit exact for HTTP/1.1 and HTTP/2 alike.
        let head_bytes: usize = req
            .headers()
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum();
        if head_bytes > self.limits.max_header_bytes {
            self.metrics.client_error("headers_too_large");
            return Err(Refused::from(Refusal::new(
                Failure::HeadersTooLarge,
                format!(
                    "request headers larger than the proxy's limit of {} bytes \
                     (limits.max_header_bytes)",
                    self.limits.max_header_bytes
                ),
            )));
        }
        let max_body = self.limits.max_request_body_bytes;
        let length = content_length(req.headers());
        if let Some(len) = length.filter(|len| *len > max_body) {
            // An HTTP/1.1 client is still writing the body it announced: closing now would
            // reset the connection under it and it would never read the 413. Read and
            // discard a bounded amount first (nginx's lingering close); HTTP/2 cancels the
            // stream instead.
            let unread = (req.version() < Version::HTTP_2 && len <= LINGER_DRAIN_MAX_BYTES)
                .then(|| req.into_body());
            self.metrics.client_error("body_too_large");
            return Err(Refused {
                refusal: Refusal::new(
                    Failure::RequestTooLarge,
                    format!(
                        "request body larger than the proxy's limit of {max_body} bytes \
                         (limits.max_request_body_bytes, --max-request-body)"
                    ),
                ),
                unread,
            });
        }
        let byte_charges = self.rate_limited(&req, length, client)?;
        // At the cap the answer is immediate: queueing would hold the client's slot and
        // body while the upstream is already saturated.
        let Ok(permit) = self.upstream_slots.clone().try_acquire_owned() else {
            self.metrics.upstream_rejected.inc();
            return Err(Refused::from(Refusal::new(
                Failure::Overloaded,
                "the upstream is at its limit of concurrent requests; retry later",
            )));
        };
        let slot = UpstreamSlot::new(permit, self.metrics.upstream_in_flight.clone());
        let (parts, body) = req.into_parts();
        let use_h2c = match self.protocol {
            UpstreamProtocol::H2c => true,
            UpstreamProtocol::Http1 => false,
            UpstreamProtocol::Auto => grpc,
        };
        Ok(Admitted {
            parts,
            body,
            slot,
            use_h2c,
            grpc,
            byte_charges,
        })
    }

    /// The listener's rate limits, each asked in turn; the byte limits a body of unknown
    /// length is charged to after it has been read.
    #[allow(clippy::type_complexity)]
    fn rate_limited(
        &self,
        req: &Request<Incoming>,
        length: Option<u64>,
        client: &ForwardService,
    ) -> Result<Option<Vec<(Arc<Limiter>, Ticket)>>, Refused> {
        let mut later = None;
        let unknown_length = length.is_none() && !http_body::Body::is_end_stream(req.body());
        for limiter in &self.controls.rate_limits {
            let ticket = limiter
                .admit(req.headers(), client.peer_addr, length)
                .map_err(|limited| Refused::from(Refusal::from(limited)))?;
            if unknown_length && limiter.limits_bytes() {
                later
                    .get_or_insert_with(Vec::new)
                    .push((limiter.clone(), ticket));
            }
        }
        Ok(later)
    }

    /// Stages 2 and 3: the head rewritten, then sent to a node; only a failed connect,
    /// which the node never read a byte of, moves on to another.
    async fn send(
        &self,
        admitted: Admitted,
        client: &ForwardService,
        watch: RequestWatch<'_>,
    ) -> Result<Response<ResponseBody>, Refusal> {
        let RequestWatch {
            mut log,
            method,
            bytes_in,
            mut span,
        } = watch;
        let Admitted {
            parts,
            mut body,
            slot,
            use_h2c,
            grpc,
            byte_charges,
        } = admitted;
        // Charged when this exchange ends, however it ends, with the request's byte count
        // (there is one on a listener with byte limits).
        // Named so that it lives to the end of this function, where it charges.
        let _charged_at_end = byte_charges.map(|tickets| ByteCharges {
            tickets,
            counted: bytes_in.cloned().unwrap_or_default(),
        });
        // Held body pieces are the chunk in hand the request buffer budget counts for every
        // upstream request: never more than it.
        let gather_max = usize::try_from(self.limits.upstream_chunk_floor()).unwrap_or(usize::MAX);
        let mut head = UpstreamHead::new(
            parts,
            use_h2c,
            (grpc, gather_max),
            &self.pool.nodes()[0].addr().authority,
            client,
        );
        // Nodes tried so far (bit i: node i).
        let mut tried = 0u64;
        // A body the client is still sending may go over the limit on its way: how the
        // forwarder learns that from an HTTP/2 upstream connection (see
        // `CappedBody::flagging_over_limit`). Bodiless requests, and bodies whose length is
        // known to be within the limit (admission refused longer ones), need no flag, so
        // only bodies of unknown length (gRPC, chunked) pay for its allocation.
        let may_go_over = !http_body::Body::is_end_stream(&body)
            && http_body::Body::size_hint(&body).exact().is_none();
        let over_limit = may_go_over.then(|| Arc::new(AtomicBool::new(false)));
        loop {
            // None: every node refused the connection; the last failure was logged.
            let lease = self.pool.pick(tried).ok_or_else(|| {
                Refusal::new(Failure::UpstreamUnavailable, "the upstream is unavailable")
            })?;
            if let Some(log) = log.as_deref_mut() {
                log.set_upstream(&lease.addr().authority);
            }
            let retryable = self.pool.has_alternatives()
                && (tried | lease.bit()).count_ones() < self.pool.nodes().len() as u32;
            let (upstream_req, body_return) = head.request(
                &lease,
                body,
                retryable,
                self.limits.max_request_body_bytes,
                client,
                BodyWatch {
                    bytes_in,
                    over_limit: over_limit.as_ref(),
                    method_bytes: method.map(|m| &m.request_bytes),
                },
            )?;
            let sent = Instant::now();
            let result = tokio::time::timeout(
                self.limits.upstream_response_timeout,
                self.clients.request(&lease, use_h2c, upstream_req),
            )
            .await;
            match result {
                Ok(Ok(resp)) => {
                    let took = sent.elapsed();
                    self.metrics
                        .upstream_response(if use_h2c { "h2c" } else { "http1" }, took);
                    if let Some(span) = span.as_deref_mut() {
                        span.upstream_answered(&lease.addr().authority, took);
                    }
                    return Ok(self.answered(resp, lease, slot));
                }
                Ok(Err(e)) => {
                    let failure = if over_limit
                        .as_ref()
                        .is_some_and(|f| f.load(Ordering::Relaxed))
                    {
                        Failure::RequestTooLarge
                    } else {
                        classify(&e)
                    };
                    if e.is_connect() {
                        self.pool.connect_failed(&lease);
                        if let Some(back) = body_return.as_ref().and_then(BodyReturn::take_back) {
                            // Nothing reached the node: the same request goes to another.
                            self.note_upstream_failure(&lease, failure, &e);
                            tried |= lease.bit();
                            body = back;
                            self.pool.retried();
                            continue;
                        }
                    }
                    return Err(self.upstream_failed(&lease, failure, &e));
                }
                Err(_) => return Err(self.timed_out(&lease)),
            }
        }
    }

    /// The upstream's answer passed on: the node counted as reachable, the upstream slot
    /// holding the lease until the response body ends.
    fn answered(
        &self,
        resp: Response<Incoming>,
        lease: NodeLease,
        mut slot: UpstreamSlot,
    ) -> Response<ResponseBody> {
        self.pool.connected(&lease);
        slot.hold(lease);
        let (mut parts, body) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        Response::from_parts(parts, ResponseBody::upstream(body, slot))
    }

    /// The refusal for an upstream that did not answer within `upstream_response_timeout`.
    fn timed_out(&self, lease: &NodeLease) -> Refusal {
        self.metrics.upstream_error("timeout");
        lease.failed("timeout");
        crate::peer_warn!(listener = %self.metrics.name(), upstream = %lease.addr(), timeout = ?self.limits.upstream_response_timeout, "upstream did not answer in time");
        Refusal::new(
            Failure::UpstreamTimeout,
            format!(
                "the upstream did not answer within {:?}",
                self.limits.upstream_response_timeout
            ),
        )
    }

    /// The refusal for an attempt that failed for good: counted, and the details (address,
    /// OS error) logged, never told to the client.
    fn upstream_failed(
        &self,
        lease: &NodeLease,
        failure: Failure,
        e: &hyper_util::client::legacy::Error,
    ) -> Refusal {
        let message: Cow<'static, str> = match failure {
            Failure::RequestTooLarge => {
                self.metrics.client_error("body_too_large");
                format!(
                    "request body larger than the proxy's limit of {} bytes \
                     (limits.max_request_body_bytes, --max-request-body)",
                    self.limits.max_request_body_bytes
                )
                .into()
            }
            Failure::ClientBody => {
                self.metrics.client_error("body");
                "the request body was malformed or cut off".into()
            }
            Failure::UpstreamTimeout => {
                self.note_upstream_failure(lease, failure, e);
                "the upstream did not accept the connection in time".into()
            }
            _ => {
                self.note_upstream_failure(lease, failure, e);
                "the upstream is unavailable".into()
            }
        };
        Refusal::new(failure, message)
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
