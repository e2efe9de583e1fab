//! Body types that stream without boxing: the client's request body with a size cap on its
//! way upstream, and a response that is either the upstream's stream or a local answer.
//! Both report progress to the connection's [`Activity`], and the response carries the
//! request's [`RequestGuard`] and upstream slot until it has been sent or abandoned.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use prometheus::{IntCounter, IntGauge};
use tokio::sync::OwnedSemaphorePermit;

use super::gather::{Gather, Units};
use crate::access_log::PendingRecord;
use crate::liveness::{Activity, RequestGuard};
use crate::metrics::{grpc_status_label, GrpcOutcomes, MethodHandles, GRPC_STATUS_NONE};
use crate::trace::{SpanRecord, Tracer};
use crate::upstream::NodeLease;

/// An HTTP/2 request body the upstream stopped reading (it answered early) is read on and
/// discarded up to this many bytes, so that its stream ends with the client's END_STREAM
/// instead of a reset: see [`CappedBody::draining_when_abandoned`]. UPSERT_100 bodies
/// (0.4-0.8 MB) fit many times over; past it the stream is reset as before.
pub const ABANDONED_DRAIN_MAX_BYTES: u64 = 16 * 1024 * 1024;
/// Time allowed for that draining.
pub const ABANDONED_DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The request body as forwarded upstream: the client's stream, cut off with an error once
/// more than the configured maximum has arrived (requests without Content-Length).
#[derive(Debug)]
pub struct CappedBody {
    inner: Source,
    remaining: u64,
    activity: Arc<Activity>,
    /// The access log's count of request bytes, for logged requests.
    counted: Option<Arc<AtomicU64>>,
    /// The request's method's byte counter, with per-method metrics on.
    method_bytes: Option<IntCounter>,
    /// Set when the client went over the limit: an HTTP/2 upstream connection resets the
    /// stream on a body error and reports only its own reset, so the forwarder learns the
    /// cause here (see [`CappedBody::flagging_over_limit`]).
    over_limit: Option<Arc<AtomicBool>>,
    /// Drain the client's stream if it is dropped unfinished (HTTP/2 clients).
    drain_when_abandoned: bool,
    /// The client's stream is counted as unfinished on `activity` (see
    /// [`Activity::body_opened`]) until this body reads its end.
    counted_open: bool,
    /// Pieces held until the upstream can use them (see `gather`); none for bodies that
    /// arrive whole.
    gather: Option<Gather>,
}

/// Where a [`CappedBody`] reads from.
#[derive(Debug)]
enum Source {
    Owned(Incoming),
    /// Left in `cell` until first read, so that a request whose connect failed (hyper
    /// reads nothing before it has a connection) can be sent to another node.
    Returnable {
        cell: Arc<Mutex<Option<Incoming>>>,
        taken: Option<Incoming>,
    },
    /// Handed to the drain (see [`CappedBody::draining_when_abandoned`]).
    Gone,
}

/// Takes back a body that was never read: see [`CappedBody::returnable`].
pub struct BodyReturn(Arc<Mutex<Option<Incoming>>>);

impl BodyReturn {
    /// The client's body, if the upstream request never read any of it.
    pub fn take_back(&self) -> Option<Incoming> {
        self.0.lock().ok()?.take()
    }
}

impl CappedBody {
    /// Caps `inner` at `max` bytes; each frame counts as progress on `activity`.
    pub fn new(inner: Incoming, max: u64, activity: Arc<Activity>) -> Self {
        Self {
            counted_open: !inner.is_end_stream(),
            inner: Source::Owned(inner),
            remaining: max,
            activity,
            counted: None,
            method_bytes: None,
            over_limit: None,
            drain_when_abandoned: false,
            gather: None,
        }
    }

    /// If this body is dropped before the client's stream ended (the upstream answered
    /// without reading all of it: an unknown gRPC method, a refused key, a size check),
    /// the rest of the stream is read and discarded in a task of its own, within
    /// `ABANDONED_DRAIN_MAX_BYTES` and `ABANDONED_DRAIN_TIMEOUT` (16 MiB, 10 s), instead of being
    /// reset at once.
    ///
    /// For HTTP/2 clients. Resetting is what RFC 9113 8.1 allows, but the DATA the client
    /// already sent keeps arriving after the reset, and the h2 crate remembers only 50
    /// reset streams for one second (hyper does not expose either setting): DATA on a
    /// stream it forgot is answered with a STREAM_CLOSED reset that counts toward its
    /// lifetime limit of 1,024 locally caused resets, and at that limit it closes the
    /// connection with ENHANCE_YOUR_CALM, failing every call in flight. A long-lived gRPC
    /// connection whose calls the upstream refused early died after 2,000 to 6,000 calls.
    /// Draining costs the bytes the client sends anyway; the upstream's answer is not
    /// delayed by it.
    pub fn draining_when_abandoned(mut self, yes: bool) -> Self {
        self.drain_when_abandoned = yes;
        self
    }

    /// Adds the bytes read to `counter` as well (the access log's `bytes_in`).
    pub fn counting(mut self, counter: Option<&Arc<AtomicU64>>) -> Self {
        self.counted = counter.cloned();
        self
    }

    /// Adds the bytes read to the request's method's counter as well.
    pub fn counting_for_method(mut self, counter: Option<&IntCounter>) -> Self {
        self.method_bytes = counter.cloned();
        self
    }

    /// Sets `flag` when the client goes over the limit. hyper's HTTP/2 client answers a
    /// request body's error by resetting the stream (INTERNAL_ERROR) and returns its own
    /// "stream error sent by user", not the body's error: without the flag a body over the
    /// limit reads as a failed upstream, answered UNAVAILABLE, which gRPC clients retry.
    pub fn flagging_over_limit(mut self, flag: Option<&Arc<AtomicBool>>) -> Self {
        self.over_limit = flag.cloned();
        self
    }

    /// Holds the body's pieces until the upstream can use them, up to `max_bytes` at a
    /// time (see `gather`): to the end of each gRPC message with `grpc`, else to the body's
    /// end when its length is known. A body that has arrived whole is not held.
    pub fn gathering(mut self, grpc: bool, max_bytes: usize) -> Self {
        let units = if grpc {
            Units::GrpcMessages
        } else if self.peek(|b| b.size_hint().exact().is_some_and(|n| n > 0), false) {
            Units::KnownLength
        } else {
            return self;
        };
        if !self.peek(Incoming::is_end_stream, true) {
            self.gather = Some(Gather::new(units, max_bytes));
        }
        self
    }

    /// As [`CappedBody::new`], and a handle that gets `inner` back if it was never read.
    pub fn returnable(inner: Incoming, max: u64, activity: Arc<Activity>) -> (Self, BodyReturn) {
        let counted_open = !inner.is_end_stream();
        let cell = Arc::new(Mutex::new(Some(inner)));
        let body = Self {
            counted_open,
            inner: Source::Returnable {
                cell: cell.clone(),
                taken: None,
            },
            remaining: max,
            activity,
            counted: None,
            method_bytes: None,
            over_limit: None,
            drain_when_abandoned: false,
            gather: None,
        };
        (body, BodyReturn(cell))
    }

    /// Reads `f` of the body wherever it is.
    fn peek<T>(&self, f: impl FnOnce(&Incoming) -> T, empty: T) -> T {
        match &self.inner {
            Source::Owned(inner)
            | Source::Returnable {
                taken: Some(inner), ..
            } => f(inner),
            Source::Returnable { cell, taken: None } => match cell.lock() {
                Ok(guard) => guard.as_ref().map_or(empty, f),
                Err(_) => empty,
            },
            Source::Gone => empty,
        }
    }
}

impl Drop for CappedBody {
    fn drop(&mut self) {
        if !self.drain_when_abandoned {
            return;
        }
        // Only a stream this body read from: one still in a returnable cell was never
        // read, and the forwarder may take it back for another node.
        let body = match std::mem::replace(&mut self.inner, Source::Gone) {
            Source::Owned(inner)
            | Source::Returnable {
                taken: Some(inner), ..
            } => inner,
            other => {
                self.inner = other;
                return;
            }
        };
        // Read to its end, or cut off for exceeding the limit (the client is over it):
        // nothing to drain, and dropping it here is what would have happened anyway.
        if body.is_end_stream() || self.remaining == 0 {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let budget = self.remaining.min(ABANDONED_DRAIN_MAX_BYTES);
            runtime.spawn(drain_abandoned(body, budget, self.activity.clone()));
        }
    }
}

/// Reads and discards what is left of an abandoned HTTP/2 request body (see
/// [`CappedBody::draining_when_abandoned`]); dropping it on any bound resets the stream.
async fn drain_abandoned(mut body: Incoming, mut budget: u64, activity: Arc<Activity>) {
    use http_body_util::BodyExt;
    let _ = tokio::time::timeout(ABANDONED_DRAIN_TIMEOUT, async {
        while let Some(Ok(frame)) = body.frame().await {
            let n = frame.data_ref().map_or(0, |d| d.len() as u64);
            if n > budget {
                return;
            }
            budget -= n;
            activity.touch();
        }
    })
    .await;
}

/// Why the request body stopped.
#[derive(Debug, thiserror::Error)]
pub enum RequestBodyError {
    /// The client sent more than the limit.
    #[error("request body exceeds the limit")]
    TooLarge,
    /// Reading from the client failed.
    #[error("reading the request body failed: {0}")]
    Client(#[from] hyper::Error),
}

impl CappedBody {
    /// The client's next piece, counted and checked against the cap.
    fn poll_source(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RequestBodyError>>> {
        let inner = match &mut self.inner {
            Source::Owned(inner) => inner,
            Source::Returnable { cell, taken } => {
                if taken.is_none() {
                    *taken = cell.lock().ok().and_then(|mut c| c.take());
                }
                match taken {
                    Some(inner) => inner,
                    // Taken back by the forwarder: this request was abandoned.
                    None => return Poll::Ready(None),
                }
            }
            Source::Gone => return Poll::Ready(None),
        };
        let polled = Pin::new(&mut *inner).poll_frame(cx);
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => inner.is_end_stream(),
            _ => false,
        };
        if ended && self.counted_open {
            self.counted_open = false;
            self.activity.body_finished();
        }
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    if n > self.remaining {
                        if let Some(flag) = &self.over_limit {
                            flag.store(true, Ordering::Relaxed);
                        }
                        return Poll::Ready(Some(Err(RequestBodyError::TooLarge)));
                    }
                    self.remaining -= n;
                    if let Some(c) = &self.counted {
                        c.fetch_add(n, Ordering::Relaxed);
                    }
                    if let Some(c) = &self.method_bytes {
                        c.inc_by(n);
                    }
                }
                self.activity.touch();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    /// The client's pieces through `gather`: held while the upstream could not use them,
    /// then handed on in a run, one per poll.
    fn poll_gathered(
        &mut self,
        gather: &mut Gather,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RequestBodyError>>> {
        loop {
            if let Some(frame) = gather.next_released() {
                return Poll::Ready(Some(Ok(frame)));
            }
            match self.poll_source(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let ended = self.peek(Incoming::is_end_stream, true);
                    if let Some(frame) = gather.offer(frame, ended) {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                }
                Poll::Ready(None) => {
                    if gather.is_empty() {
                        return Poll::Ready(None);
                    }
                    gather.release();
                }
                // What is held goes with the request, which fails.
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                // The source wakes this body when more comes: nothing to arm.
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Body for CappedBody {
    type Data = Bytes;
    type Error = RequestBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match this.gather.take() {
            Some(mut gather) => {
                let polled = this.poll_gathered(&mut gather, cx);
                this.gather = Some(gather);
                polled
            }
            None => this.poll_source(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.gather.as_ref().is_none_or(Gather::is_empty)
            && self.peek(Incoming::is_end_stream, true)
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.peek(Incoming::size_hint, SizeHint::with_exact(0));
        let held = self.gather.as_ref().map_or(0, |g| g.held_bytes() as u64);
        if held > 0 {
            if let Some(upper) = hint.upper() {
                hint.set_upper(upper + held);
            }
            hint.set_lower(hint.lower() + held);
        }
        hint
    }
}

/// One of the upstream's `limits.max_upstream_requests` slots, held until the response
/// body is done: an HTTP/1.1 upstream connection is busy until then.
#[derive(Debug)]
pub struct UpstreamSlot {
    _permit: OwnedSemaphorePermit,
    in_flight: IntGauge,
    node: Option<NodeLease>,
}

impl UpstreamSlot {
    /// Takes a slot, shown in `in_flight` while held.
    pub fn new(permit: OwnedSemaphorePermit, in_flight: IntGauge) -> Self {
        in_flight.inc();
        Self {
            _permit: permit,
            in_flight,
            node: None,
        }
    }

    /// Keeps the node that answered counted as busy for as long as the slot.
    pub fn hold(&mut self, node: NodeLease) {
        self.node = Some(node);
    }
}

impl Drop for UpstreamSlot {
    fn drop(&mut self) {
        self.in_flight.dec();
    }
}

#[derive(Debug)]
enum ResponseSource {
    /// Streamed from the upstream as it arrives.
    Upstream(Incoming),
    /// Generated by the proxy (errors); `None` once sent.
    Local(Option<Bytes>),
}

/// A response body: the upstream's stream (trailers included) or a small local answer.
#[derive(Debug)]
pub struct ResponseBody {
    source: ResponseSource,
    request: Option<RequestGuard>,
    _slot: Option<UpstreamSlot>,
    /// The access log's record of this request, queued when the body is dropped.
    log: Option<PendingRecord>,
    /// A gRPC call's outcome, counted when the body is dropped.
    grpc: Option<GrpcTally>,
    /// The request's method, whose response bytes this body counts.
    method: Option<Arc<MethodHandles>>,
    /// The request's span, finished and queued when this body ends.
    span: Option<Box<SpanTally>>,
}

/// A request's span waiting for its response's end.
#[derive(Debug)]
struct SpanTally {
    span: Box<SpanRecord>,
    tracer: Arc<Tracer>,
    status: http::StatusCode,
    bytes_in: Option<Arc<AtomicU64>>,
    bytes_out: u64,
}

/// A gRPC call waiting for its grpc-status (see [`ResponseBody::count_grpc`]).
#[derive(Debug)]
struct GrpcTally {
    outcomes: GrpcOutcomes,
    status: http::StatusCode,
    grpc_status: Option<&'static str>,
    /// Counted by method too, with per-method metrics on.
    method: Option<Arc<MethodHandles>>,
}

impl ResponseBody {
    /// A local body with these bytes.
    pub fn local(bytes: impl Into<Bytes>) -> Self {
        Self::from_source(ResponseSource::Local(Some(bytes.into())))
    }

    /// An empty local body.
    pub fn empty() -> Self {
        Self::from_source(ResponseSource::Local(None))
    }

    /// The upstream's body; `slot` is released when it is done.
    pub fn upstream(body: Incoming, slot: UpstreamSlot) -> Self {
        Self {
            source: ResponseSource::Upstream(body),
            request: None,
            _slot: Some(slot),
            log: None,
            grpc: None,
            method: None,
            span: None,
        }
    }

    fn from_source(source: ResponseSource) -> Self {
        Self {
            source,
            request: None,
            _slot: None,
            log: None,
            grpc: None,
            method: None,
            span: None,
        }
    }

    /// Completes `record` with this body's bytes and time; it is logged when the body is
    /// dropped (sent, failed or abandoned).
    pub fn log_with(&mut self, record: PendingRecord) {
        self.log = Some(record);
    }

    /// Counts this gRPC call in `outcomes` by its grpc-status: the one already in the
    /// response head (a trailers-only answer) or the one its trailers bring, or
    /// [`GRPC_STATUS_NONE`] if the body ends or is dropped without one; the access log
    /// records the same.
    pub fn count_grpc(
        &mut self,
        outcomes: &GrpcOutcomes,
        status: http::StatusCode,
        in_head: Option<&'static str>,
        method: Option<Arc<MethodHandles>>,
    ) {
        self.grpc = Some(GrpcTally {
            outcomes: outcomes.clone(),
            status,
            grpc_status: in_head,
            method,
        });
    }

    /// Finishes `span` when this body ends: the response's status (and grpc-status), the
    /// body sizes (the request's from `bytes_in`), then queued to `tracer`'s exporter.
    pub fn finish_span(
        &mut self,
        span: Box<SpanRecord>,
        tracer: Arc<Tracer>,
        status: http::StatusCode,
        bytes_in: Option<Arc<AtomicU64>>,
    ) {
        self.span = Some(Box::new(SpanTally {
            span,
            tracer,
            status,
            bytes_in,
            bytes_out: 0,
        }));
    }

    /// Counts the bytes sent to the client in `method`'s response bytes.
    pub fn count_bytes(&mut self, method: Arc<MethodHandles>) {
        self.method = Some(method);
    }

    /// Ties the request's guard to this body: the request stays in flight until the body
    /// has been sent (then it completed) or dropped unsent (then the client cancelled it).
    /// `bodiless`: the client gets no body (HEAD, 204, 304), so the head completes it.
    pub fn track(&mut self, mut request: RequestGuard, bodiless: bool) {
        request.touch();
        if bodiless || self.is_end_stream() {
            request.complete();
        }
        self.request = Some(request);
    }

    fn completed(&mut self) {
        if let Some(r) = &mut self.request {
            r.complete();
        }
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        if let Some(mut t) = self.span.take() {
            let grpc_status = self
                .grpc
                .as_ref()
                .map(|g| g.grpc_status.unwrap_or(GRPC_STATUS_NONE));
            let bytes_in = t.bytes_in.as_ref().map_or(0, |b| b.load(Ordering::Relaxed));
            t.span
                .answered(t.status, grpc_status, (bytes_in, t.bytes_out));
            t.tracer.finish(t.span);
        }
        if let Some(tally) = self.grpc.take() {
            let grpc_status = tally.grpc_status.unwrap_or(GRPC_STATUS_NONE);
            tally.outcomes.count(tally.status, grpc_status);
            if let Some(method) = &tally.method {
                method.count(tally.status, grpc_status);
            }
            if let Some(log) = &mut self.log {
                log.set_grpc_status(grpc_status);
            }
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let polled = match &mut this.source {
            ResponseSource::Upstream(inner) => Pin::new(inner).poll_frame(cx),
            ResponseSource::Local(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
        };
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(r) = &this.request {
                    r.touch();
                }
                if let Some(data) = frame.data_ref() {
                    if let Some(log) = &mut this.log {
                        log.sent(data.len());
                    }
                    if let Some(method) = &this.method {
                        method.response_bytes.inc_by(data.len() as u64);
                    }
                    if let Some(span) = &mut this.span {
                        span.bytes_out += data.len() as u64;
                    }
                }
                if let (Some(tally), Some(trailers)) = (&mut this.grpc, frame.trailers_ref()) {
                    if let Some(v) = trailers.get("grpc-status") {
                        tally.grpc_status = Some(grpc_status_label(v.as_bytes()));
                    }
                }
                if this.is_end_stream() {
                    this.completed();
                }
            }
            // The end, or an upstream failure mid-body: either way not the client's doing.
            Poll::Ready(_) => this.completed(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.source {
            ResponseSource::Upstream(inner) => inner.is_end_stream(),
            ResponseSource::Local(bytes) => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.source {
            ResponseSource::Upstream(inner) => inner.size_hint(),
            ResponseSource::Local(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}
